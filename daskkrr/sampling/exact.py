"""Exact ridge leverage scores and effective dimension (small n: the reference oracle).

For a kernel matrix ``K`` (n x n) and a regularisation ``gamma > 0`` in kernel-matrix
units, the gamma-ridge leverage score (RLS) of row i is

    tau_i(gamma) = (K (K + gamma I)^{-1})_ii,

and the effective dimension is ``d_eff(gamma) = sum_i tau_i = Tr K (K + gamma I)^{-1}``.
FALKON's penalty ``lambda`` corresponds to ``gamma = lambda * n``.

Both need the whole n x n matrix: use them for n up to a few thousand (tests,
benchmarks, :class:`ExactRLSSampler`); SQUEAK/DISQUEAK/BLESS estimate them at scale.

The same small-n setting checks a dictionary's spectral guarantee (Eq. 3 of
SQUEAK/DISQUEAK, :func:`spectral_error_bounds`): the regularised Nystrom
approximation built from it,

    K~ = K S (S^T K S + gamma I)^{-1} S^T K,

satisfies ``0 <= K - K~ <= gamma / (1 - eps) I`` (with high probability). ``S`` has one
column per unique center j, equal to ``sqrt(s_j) e_{i_j}`` with the *selection weight*
``s_j = q_j / (qbar p_j)``; in terms of :attr:`CenterDictionary.weights` (normalised
to the number of centers M), ``s_j = (n / M) w_j``.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.kernels.sparse import as_sparse_rows, dense_rows, is_sparse
from daskkrr.parallel.executor import Executor
from daskkrr.parallel.guards import QuadraticCost, check_quadratic, quadratic_cost
from daskkrr.sampling.base import (
    CenterDictionary,
    CenterSampler,
    register,
    resolve_gamma,
)
from daskkrr.sampling.dictionary import (
    forward_solve,
    lower_cholesky,
    weighted_gram,
)
from daskkrr.sampling.keyed_random import STREAM_EXACT_RLS, keyed_rng, resolve_seed

#: Largest n for which the exact computations build the n x n kernel matrix.
EXACT_MAX_ROWS = 20_000


def as_small_numpy(X: Any, max_rows: int, what: str, executor: Any = None) -> np.ndarray:
    """``X`` (numpy or dask, at most ``max_rows`` rows) as numpy; a dask array is computed
    on ``executor`` (an :class:`Executor`, a client or None for the current context)."""
    n = int(X.shape[0])
    if n > max_rows:
        raise ValueError(
            f"{what} builds the full {n}x{n} kernel matrix; n={n} is above the limit {max_rows}. "
            "Use SqueakSampler/BlessSampler for large n, or pass a subsample"
        )
    if isinstance(X, da.Array):
        X = Executor.coerce(executor).compute(X)[0]
    X = as_sparse_rows(X, "X") if is_sparse(X) else np.asarray(X)  # sparse rows: the kernel reads them as such
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features); got shape {X.shape}")
    return X


def _check_gamma(gamma: float) -> float:
    gamma = float(gamma)
    if not np.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma must be a finite number > 0; got {gamma!r}")
    return gamma


def kernel_spectrum(
    X: Any, kernel: Kernel, *, max_rows: int = EXACT_MAX_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (clipped at 0) and eigenvectors of the full kernel matrix ``k(X, X)``."""
    Xn = as_small_numpy(X, max_rows, "kernel_spectrum")
    K = np.asarray(kernel(Xn, Xn), dtype=np.float64)
    evals, evecs = np.linalg.eigh(0.5 * (K + K.T))
    return np.maximum(evals, 0.0), evecs


def ridge_leverage_scores(
    X: Any, kernel: Kernel, gamma: float, *, max_rows: int = EXACT_MAX_ROWS
) -> np.ndarray:
    """Exact gamma-ridge leverage scores ``tau_i = (K (K + gamma I)^{-1})_ii``.

    Parameters
    ----------
    X : array of shape (n, d)
        Rows (numpy or a small dask array).
    kernel : Kernel
        Kernel object, ``kernel(A, B)`` gives the block ``k(A, B)``.
    gamma : float
        Regularisation in kernel-matrix units (``gamma = lambda * n`` for FALKON's lambda).
    max_rows : int
        Refuse larger n (the n x n matrix is formed).

    Returns
    -------
    tau : ndarray of shape (n,), float64, each in [0, 1).
    """
    gamma = _check_gamma(gamma)
    evals, evecs = kernel_spectrum(X, kernel, max_rows=max_rows)
    return np.clip((evecs**2) @ (evals / (evals + gamma)), 0.0, 1.0)


def effective_dimension(
    X: Any, kernel: Kernel, gamma: float, *, max_rows: int = EXACT_MAX_ROWS
) -> float:
    """Exact effective dimension ``d_eff(gamma) = Tr K (K + gamma I)^{-1}`` (sum of the RLS).

    Parameters
    ----------
    X : array-like of shape (n, d)
        The rows (at most ``max_rows``: the kernel matrix is formed and diagonalised).
    kernel : Kernel
        The kernel.
    gamma : float
        The regularisation (> 0).
    max_rows : int
        Refuse larger ``X``.

    Returns
    -------
    float
        ``d_eff(gamma)``.
    """
    gamma = _check_gamma(gamma)
    evals, _ = kernel_spectrum(X, kernel, max_rows=max_rows)
    return float(np.sum(evals / (evals + gamma)))


def order_sample(
    scores: np.ndarray, size: int, uniforms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pick exactly ``size`` items with inclusion probabilities ~ ``min(1, c * scores)``.

    Sequential Poisson (order) sampling: item i gets the key ``u_i / score_i``; the
    ``size`` smallest keys are kept and ``c`` is the next key, so that item i was
    kept with probability ``min(1, c * score_i)``.

    Returns
    -------
    chosen : ndarray of int64, sorted positions of the kept items.
    inclusion : ndarray of float64, their inclusion probabilities ``min(1, c * score)``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[0]
    if not 0 < size <= n:
        raise ValueError(f"order_sample: size must be in [1, {n}]; got {size}")
    safe = np.maximum(scores, np.finfo(np.float64).tiny)
    keys = uniforms / safe
    order = np.argsort(keys, kind="stable")
    chosen = np.sort(order[:size])
    c = keys[order[size]] if size < n else np.inf
    inclusion = np.minimum(1.0, c * safe[chosen]) if np.isfinite(c) else np.ones(size)
    return chosen.astype(np.int64), inclusion


@register
class ExactRLSSampler(CenterSampler):
    """Centers drawn with the *exact* ridge leverage scores (RLS-SAMPLING, the oracle).

    Two modes:

    - ``n_centers=None``: every row gets ``q_i ~ Binomial(qbar, min(1, tau_i))`` copies,
      the dictionary SQUEAK approximates (same ``qbar`` convention); the probability
      recorded is ``p_i = min(1, tau_i)``.
    - ``n_centers=M``: exactly M distinct rows by order sampling with inclusion
      probabilities ``pi_i ~ min(1, c tau_i)`` (``c`` set by the sample size).

    Weights follow :class:`CenterDictionary`: ``w_j = (M/n) q_j / (qbar p_j)`` in the
    first mode and ``w_j = (M/n) / pi_j`` in the second, so that
    ``(n/M) sum_j w_j k(z_j, .) k(z_j, .)^T`` estimates ``sum_i k(x_i, .) k(x_i, .)^T``.

    Parameters
    ----------
    gamma : float or None
        Regularisation in kernel-matrix units; None means ``penalty * n``.
    qbar : int
        Copies per unit of leverage in the ``n_centers=None`` mode.
    max_rows : int
        The n x n kernel matrix is formed: larger n is refused.
    force : bool
        Run even when the memory estimate exceeds what this machine or the workers
        have (also ``$DASKKRR_FORCE_EXACT=1``; see :mod:`daskkrr.parallel.guards`).

    Notes
    -----
    Before touching the data, :meth:`check_resources` estimates the memory (five
    float64 ``n x n`` matrices: the kernel matrix, its symmetrised copy, the
    eigenvectors, their squares and LAPACK's workspace) and time (about ``6 n^3``
    flops) and refuses what the machine cannot hold, naming the estimate.
    """

    name = "rls"
    #: float64 n x n matrices held at once, and flops / n^3 (see :mod:`daskkrr.parallel.guards`).
    MATRICES = 5
    CUBIC_FLOPS = 6.0

    def __init__(self, gamma: float | None = None, qbar: int = 16, max_rows: int = EXACT_MAX_ROWS,
                 force: bool = False):
        self.gamma = gamma
        self.qbar = qbar
        self.max_rows = max_rows
        self.force = force

    def check_resources(self, n: int, d: int, executor: Any = None) -> QuadraticCost:
        """Refuse ``n`` rows of ``d`` features before any work if the exact scores would not fit.

        Raises ValueError above ``max_rows`` and :class:`~daskkrr.parallel.guards.ResourceGuardError`
        when the memory estimate exceeds this machine's or the workers' (unless ``force``).
        """
        cost = quadratic_cost(type(self).__name__, n, d, matrices=self.MATRICES, cubic=self.CUBIC_FLOPS)
        check_quadratic(cost, alternative="use sampler='squeak' or 'bless' (leverage scores estimated at scale)",
                        executor=executor, force=self.force, max_rows=self.max_rows,
                        raise_hint="pass sampler=ExactRLSSampler(max_rows=N)")
        return cost

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        self.check_resources(int(X.shape[0]), int(X.shape[1]) if len(X.shape) > 1 else 1, executor)
        Xn = as_small_numpy(X, self.max_rows, "ExactRLSSampler", executor)
        n = Xn.shape[0]
        gamma = resolve_gamma(self.gamma, penalty, n)
        seed = resolve_seed(random_state)
        tau = ridge_leverage_scores(Xn, kernel, gamma, max_rows=self.max_rows)
        rng = keyed_rng(seed, STREAM_EXACT_RLS)
        info: dict[str, Any] = {
            "sampler": self.name,
            "gamma": gamma,
            "d_eff": float(tau.sum()),
            "seed": seed,
            "n_rows": n,
        }
        if n_centers is None:
            qbar = int(self.qbar)
            if qbar < 1:
                raise ValueError(f"qbar must be a positive integer; got {self.qbar!r}")
            p = np.minimum(1.0, tau)
            q = rng.binomial(qbar, p)
            keep = np.flatnonzero(q > 0)
            if keep.size == 0:
                keep = np.array([int(np.argmax(tau))])
                q[keep] = 1
            m = keep.size
            weights = (m / n) * q[keep] / (qbar * p[keep])
            info.update(mode="binomial-copies", qbar=qbar)
            return CenterDictionary(
                centers=dense_rows(Xn[keep]), indices=keep, weights=weights, counts=q[keep],
                probabilities=p[keep], info=info,
            )
        n_centers = int(n_centers)
        if not 0 < n_centers <= n:
            raise ValueError(f"n_centers must be in [1, n={n}]; got {n_centers}")
        chosen, inclusion = order_sample(tau, n_centers, rng.random(int(n)))
        weights = (n_centers / n) / inclusion
        info.update(mode="order-sampling")
        return CenterDictionary(
            centers=dense_rows(Xn[chosen]), indices=chosen, weights=weights,
            counts=np.ones(n_centers, dtype=np.int64), probabilities=inclusion, info=info,
        )


# ------------------------------------------------ checks of a dictionary (Eq. 3)
def selection_weights(dictionary: CenterDictionary, n: int) -> np.ndarray:
    """``s_j = (n / M) w_j`` (equal to ``q_j / (qbar p_j)`` for SQUEAK dictionaries).

    Parameters
    ----------
    dictionary : CenterDictionary
        The centers and their weights ``w_j``.
    n : int
        Rows of the data the centers were drawn from.

    Returns
    -------
    ndarray of shape (M,)
        The selection weights ``s_j``.
    """
    return (n / dictionary.size) * dictionary.weights


def regularized_nystrom(
    K: np.ndarray, indices: np.ndarray, sel_weights: np.ndarray, gamma: float
) -> np.ndarray:
    """``K S (S^T K S + gamma I)^{-1} S^T K`` for the full matrix ``K`` (small n)."""
    sw = np.sqrt(np.asarray(sel_weights, dtype=np.float64))
    C = K[:, indices] * sw[None, :]
    L, _ = lower_cholesky(weighted_gram(K[np.ix_(indices, indices)], sw, gamma))
    G = forward_solve(L, C.T)  # L^{-1} S^T K, shape (m, n)
    return G.T @ G


def spectral_error_bounds(
    X: Any,
    kernel: Kernel,
    dictionary: CenterDictionary,
    gamma: float,
    *,
    max_rows: int = EXACT_MAX_ROWS,
) -> tuple[float, float]:
    """Smallest and largest eigenvalue of ``K - K~`` for the dictionary's centers and weights.

    The dictionary is gamma/(1-eps)-accurate when the result lies in
    ``[-tol, gamma / (1 - eps) + tol]``.

    Parameters
    ----------
    X, kernel, max_rows
        As in :func:`effective_dimension`.
    dictionary : CenterDictionary
        Centers (indices into ``X``) and their weights.
    gamma : float
        The regularisation of the Nystrom approximation ``K~``.

    Returns
    -------
    lowest, highest : float
        The extreme eigenvalues of ``K - K~``.
    """
    Xn = as_small_numpy(X, max_rows, "spectral_error_bounds")
    K = np.asarray(kernel(Xn, Xn), dtype=np.float64)
    Kt = regularized_nystrom(K, dictionary.indices, selection_weights(dictionary, Xn.shape[0]), gamma)
    E = K - Kt
    ev = np.linalg.eigvalsh(0.5 * (E + E.T))
    return float(ev[0]), float(ev[-1])
