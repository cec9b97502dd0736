"""Exact kernel ridge regression for small n: the reference every approximation is tested against."""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from daskkrr.utils.linalg import cholesky_jitter, solve_upper


def exact_krr_coefficients(K: np.ndarray, y: np.ndarray, penalty: float,
                           sample_weight: np.ndarray | None = None) -> np.ndarray:
    """Solve ``(K + penalty * n * I) c = y`` (scikit-learn's KernelRidge with alpha = penalty * n).

    With ``sample_weight`` see :func:`exact_krr_solve`.
    """
    return exact_krr_solve(K, y, penalty, sample_weight)[0]


def exact_krr_solve(K: np.ndarray, y: np.ndarray, penalty: float,
                    sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``c`` with ``(K + penalty * n * I) c = y``, and the upper factor ``R^T R = K + penalty * n * I``
    (what the predictive variance needs, :func:`daskkrr.solvers.variance.exact_posterior`).

    With ``sample_weight`` ``w`` (>= 0, not all zero) it minimises
    ``sum_i w_i (y_i - (K c)_i)^2 + penalty * W c^T K c`` (``W = sum w``) through the
    symmetric positive definite system

        (S K S + penalty W I) beta = S y,    c = S beta,    S = diag(sqrt(w)),

    which needs no inverse weight: a row of weight 0 gets ``c_i = 0``. Integer
    weights give the coefficients of the data with each row repeated ``w_i``
    times (summed over the copies). ``R`` is then the factor of ``S K S + penalty W I``.
    """
    K = np.asarray(K, dtype=np.float64)
    n = K.shape[0]
    if K.shape != (n, n):
        raise ValueError(f"K must be square; got shape {K.shape}")
    y = np.asarray(y, dtype=np.float64)
    if y.shape[0] != n:
        raise ValueError(f"y has {y.shape[0]} rows but K has {n}")
    if not penalty > 0:
        raise ValueError(f"penalty must be > 0; got {penalty!r}")
    if sample_weight is None:
        S = K.copy()
        S[np.diag_indices(n)] += penalty * n
        R, _ = cholesky_jitter(S, what="regularised kernel matrix K + lambda n I")
        return solve_upper(R, solve_upper(R, y, trans=True)), R
    w = _checked_weights(sample_weight, n)
    root = np.sqrt(w)
    S = root[:, None] * K * root[None, :]
    S[np.diag_indices(n)] += penalty * w.sum()
    R, _ = cholesky_jitter(S, what="regularised weighted kernel matrix W^1/2 K W^1/2 + lambda W I")
    col = root.reshape((n,) + (1,) * (y.ndim - 1))  # broadcasts over the target columns
    return col * solve_upper(R, solve_upper(R, col * y, trans=True)), R


def _checked_weights(sample_weight: np.ndarray, n: int) -> np.ndarray:
    """``sample_weight`` as ``n`` float64 weights, refused unless finite, >= 0 and not all zero."""
    w = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"sample_weight must be {n} finite weights >= 0, not all zero")
    return w


def exact_krr_path(K: np.ndarray, y: np.ndarray, penalties: np.ndarray,
                   sample_weight: np.ndarray | None = None) -> np.ndarray:
    """:func:`exact_krr_solve`'s coefficients for every penalty at once: ``(n, P)`` for one target.

    One eigendecomposition ``K = V diag(w) V^T`` (of ``S K S`` with weights, ``S =
    diag(sqrt(w))``) gives ``c(lambda) = V (w + lambda n)^{-1} V^T y`` for every
    ``lambda`` (``S V (w + lambda W)^{-1} V^T S y`` with weights), then ``O(n^2)`` a
    penalty. The eigendecomposition took 22x one Cholesky factorisation at n = 5000 on
    the 2-core development machine (9.4 s against 0.43 s): cheaper than factoring for
    every penalty of a long path, dearer than a few. ``w`` is clipped at 0
    (``K`` is positive semi-definite; round-off leaves eigenvalues of order ``-eps ||K||``).
    """
    K = np.asarray(K, dtype=np.float64)
    n = K.shape[0]
    if K.shape != (n, n):
        raise ValueError(f"K must be square; got shape {K.shape}")
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if y.shape != (n,):
        raise ValueError(f"the penalty path takes one target of {n} rows; got y of shape {y.shape}")
    lams = np.asarray(penalties, dtype=np.float64).reshape(-1)
    if lams.size == 0 or not np.all(np.isfinite(lams)) or not np.all(lams > 0):
        raise ValueError(f"penalties must be a non-empty sequence of positive numbers; got {penalties!r}")
    if sample_weight is None:
        root, total = np.ones(n), float(n)
        S = K
    else:
        w = _checked_weights(sample_weight, n)
        root, total = np.sqrt(w), float(w.sum())
        S = root[:, None] * K * root[None, :]
    eig, V = sla.eigh(S, overwrite_a=S is not K, check_finite=False)
    v = V @ ((V.T @ (root * y))[:, None] / (np.maximum(eig, 0.0)[:, None] + total * lams[None, :]))
    return root[:, None] * v


def nystrom_lstsq_coefficients(
    Knm: np.ndarray, Kmm: np.ndarray, y: np.ndarray, penalty: float
) -> np.ndarray:
    """Dense Nystrom KRR from an in-memory ``K_nM`` (small problems and tests only).

    Solves ``(K_nM^T K_nM + lambda n K_MM) alpha = K_nM^T y`` with a symmetric solver.
    """
    n = Knm.shape[0]
    H = Knm.T @ Knm + penalty * n * Kmm
    return sla.solve(H, Knm.T @ y, assume_a="sym")
