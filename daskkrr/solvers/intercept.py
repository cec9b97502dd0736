"""An unpenalised intercept for the Nystrom model, as a rank-one correction.

The model ``f(x) = k(x, Z) alpha + b`` with ``b`` free (not penalised) is fitted by
eliminating ``b = mean(y) - mu^T alpha``, ``mu = K_nM^T 1 / n`` (the mean kernel
row). What remains is the usual Nystrom system on centred kernel rows,

    (K_c^T K_c + lambda n K_MM) alpha = K_c^T (y - mean(y)),
    K_c^T K_c = K_nM^T K_nM - n mu mu^T,    K_c^T (y - mean(y)) = K_nM^T (y - mean(y)),

so only the Gram product changes, by a rank-one term. It is what scikit-learn's
``Ridge(fit_intercept=True)`` does with the Nystroem features (which centres the
feature columns), and it matters for kernels such as the Gaussian whose RKHS does
not contain the constants: without it the penalty shrinks the mean level too.

With row weights ``w`` (sum ``W``) the same holds with weighted means:
``b = mean_w(y) - mu^T alpha``, ``mu = K_nM^T w / W``, and
``K_c^T W K_c = K_nM^T W K_nM - W mu mu^T``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def centered_gram_matvec(
    gram_matvec: Callable[[np.ndarray], np.ndarray], mu: np.ndarray, n: float
) -> Callable[[np.ndarray], np.ndarray]:
    """``u -> K_nM^T K_nM u - n mu (mu^T u)`` for ``u`` of shape ``(M,)`` or ``(M, t)``.

    With row weights ``w``: ``gram_matvec`` gives ``K_nM^T W K_nM u``, ``mu`` is
    ``K_nM^T w / n`` and ``n`` the sum of the weights (the weighted centring)."""
    mu = np.asarray(mu, dtype=np.float64).reshape(-1)

    def apply(u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=np.float64)
        out = np.asarray(gram_matvec(u), dtype=np.float64).reshape(u.shape)
        U = u.reshape(mu.shape[0], -1)
        return out - (n * np.outer(mu, mu @ U)).reshape(u.shape)

    return apply
