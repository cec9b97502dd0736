"""Oracles for tests and benchmarks: slow or in-memory versions of the samplers (not public API).

- :func:`squeak_reference`: SQUEAK point by point, exactly as Alg. 1 of Calandriello,
  Lazaric & Valko (2016). The slow reference (O(n Q^3) time for a dictionary of Q
  copies, and the full n x n kernel matrix is formed for convenience) that the
  batched, out-of-core :class:`~daskkrr.sampling.SqueakSampler` is tested against.
- :func:`squeak_numpy`: the batched SQUEAK pass of the sampler on an in-memory array,
  block by block, without Dask (the same functions its block tasks run).

One step of :func:`squeak_reference`, for the new point t (0-based; all indices are rows of ``X``):

1. ``S_bar`` = the current selection matrix (one column ``(qbar p_j)^{-1/2} e_j`` per
   *copy* of entry j) with ``qbar`` copies of ``qbar^{-1/2} e_t`` appended.
2. Eq. 5, for every entry i of the dictionary and for t::

       tau~_i = (1 + eps) / (alpha gamma) * (k_ii - k_i^T S_bar (S_bar^T K S_bar + gamma I)^{-1} S_bar^T k_i),

   with ``alpha = (1 + eps) / (1 - eps)`` (so the prefactor is ``(1 - eps) / gamma``).
3. ``p_i <- max(min(tau~_i, p_i), p_i / 2)``, with ``p_t = 1`` before the step.
4. SHRINK: ``q_i ~ Binomial(q_i, p_new / p_old)`` for every entry; EXPAND:
   ``q_t ~ Binomial(qbar, p_t)``. Entries with no copies left are dropped for good.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg import cholesky, solve_triangular

from daskkrr.kernels import Kernel
from daskkrr.sampling.base import CenterDictionary
from daskkrr.sampling.exact import EXACT_MAX_ROWS, as_small_numpy
from daskkrr.sampling.squeak_core import (
    SqueakParams,
    StreamState,
    stream_block,
    stream_finish,
)

__all__ = ["squeak_numpy", "squeak_reference"]


def _eq5_estimates(
    K: np.ndarray,
    col_rows: np.ndarray,
    col_scale: np.ndarray,
    query_rows: np.ndarray,
    gamma: float,
    eps: float,
) -> np.ndarray:
    """Eq. 5 for the rows ``query_rows`` with the selection matrix given column by column."""
    Ks = K[np.ix_(col_rows, col_rows)] * col_scale[:, None] * col_scale[None, :]
    Ks[np.diag_indices_from(Ks)] += gamma
    L = cholesky(Ks, lower=True, check_finite=False)
    B = K[np.ix_(col_rows, query_rows)] * col_scale[:, None]  # S_bar^T k_i, one column per query
    LB = solve_triangular(L, B, lower=True, check_finite=False)
    quad = np.einsum("ij,ij->j", LB, LB)  # k_i^T S_bar (S_bar^T K S_bar + gamma I)^{-1} S_bar^T k_i
    alpha = (1.0 + eps) / (1.0 - eps)
    resid = np.maximum(K[query_rows, query_rows] - quad, 0.0)
    return (1.0 + eps) / (alpha * gamma) * resid


def squeak_reference(
    X: Any,
    kernel: Kernel,
    gamma: float,
    qbar: int,
    eps: float,
    random_state: int | None = None,
    *,
    max_rows: int = EXACT_MAX_ROWS,
) -> CenterDictionary:
    """Run SQUEAK (Alg. 1) one point at a time on a small data set.

    Parameters
    ----------
    X : array of shape (n, d)
        The rows, processed in order.
    kernel : Kernel
        The kernel.
    gamma : float
        Regularisation in kernel-matrix units (> 0).
    qbar : int
        Copies drawn for a new point (``Binomial(qbar, p)``).
    eps : float
        Accuracy parameter in (0, 1).
    random_state : int or None
        Seed of the single random stream.

    Returns
    -------
    CenterDictionary
        Unique centers with ``counts`` = q_j, ``probabilities`` = p_j and
        ``weights`` = ``(M/n) q_j / (qbar p_j)``; ``info["rls_estimates"]`` holds the
        last Eq. 5 estimate of each center and ``info["sizes"]`` the number of copies
        after every step.
    """
    Xn = as_small_numpy(X, max_rows, "squeak_reference")
    n = Xn.shape[0]
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be in (0, 1); got {eps!r}")
    if int(qbar) < 1:
        raise ValueError(f"qbar must be a positive integer; got {qbar!r}")
    qbar = int(qbar)
    K = np.asarray(kernel(Xn, Xn), dtype=np.float64)
    rng = np.random.default_rng(random_state)

    rows = np.zeros(0, dtype=np.int64)  # dictionary entries (unique rows)
    q = np.zeros(0, dtype=np.int64)
    p = np.zeros(0)
    rls = np.zeros(0)
    sizes = []
    for t in range(n):
        # S_bar: q_j copies of (qbar p_j)^{-1/2} e_j per entry, then qbar copies of
        # qbar^{-1/2} e_t. Only S_bar S_bar^T enters Eq. 5 (A (A^T A + gamma I)^{-1} A^T
        # = A A^T (A A^T + gamma I)^{-1}), so the copies of one row are merged into a
        # single column of squared norm q_j / (qbar p_j) (the new point: qbar / qbar = 1).
        col_rows = np.append(rows, t)
        col_scale = np.append(np.sqrt(q / (qbar * p)), 1.0)
        query = np.append(rows, t)
        tau = _eq5_estimates(K, col_rows, col_scale, query, gamma, eps)
        p_old = np.append(p, 1.0)
        p_new = np.maximum(np.minimum(tau, p_old), p_old / 2.0)
        # SHRINK the existing entries, then EXPAND with the new point.
        q_old_entries = rng.binomial(q, p_new[:-1] / p_old[:-1]) if q.size else q
        q_t = rng.binomial(qbar, p_new[-1])
        rows = np.append(rows, t)
        q = np.append(q_old_entries, q_t)
        p = p_new
        rls = tau
        keep = q > 0
        rows, q, p, rls = rows[keep], q[keep], p[keep], rls[keep]
        sizes.append(int(q.sum()))

    m = rows.size
    if m == 0:
        raise RuntimeError("squeak_reference ended with an empty dictionary; increase qbar")
    weights = (m / n) * q / (qbar * p)
    return CenterDictionary(
        centers=Xn[rows],
        indices=rows,
        weights=weights,
        counts=q,
        probabilities=p,
        info={
            "sampler": "squeak-reference",
            "gamma": float(gamma),
            "qbar": qbar,
            "eps": float(eps),
            "n_rows": n,
            "rls_estimates": rls.tolist(),
            "sizes": sizes,
        },
    )


def squeak_numpy(
    X: np.ndarray,
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    *,
    block_rows: int | None = None,
    first_row: int = 0,
    max_dictionary: int | None = None,
) -> StreamState:
    """The SQUEAK pass of :class:`~daskkrr.sampling.SqueakSampler` on an in-memory array
    (blocks of ``block_rows``), without Dask."""
    X = np.asarray(X)
    step = X.shape[0] if block_rows is None else max(1, int(block_rows))
    state = StreamState.start(X.shape[1], X.dtype, first_row)
    for k, start in enumerate(range(0, X.shape[0], step)):
        state = stream_block(state, X[start : start + step], k, first_row + start, kernel,
                             params, seed, max_dictionary)
    return stream_finish(state, kernel, params, seed, max_dictionary)
