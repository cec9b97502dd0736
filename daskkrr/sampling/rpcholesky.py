"""Randomly pivoted Cholesky (RPCholesky) centers, blockwise and out of core over the row blocks.

RPCholesky (Chen, Epperly, Tropp and Webber, 2023) picks pivot ``s`` with probability
proportional to the *residual* diagonal ``d_s = K_ss - K_sP K_PP^{-1} K_Ps`` of the
pivots ``P`` chosen so far, so each new center is drawn where the current Nystrom
approximation is worst. Their Theorem 3.1 bounds the expected trace-norm error: with
``k >= r / eps + r log(1 / (eps eta))`` pivots, ``E tr(K - K_hat) <= (1 + eps) tr(K - [[K]]_r)``,
where ``[[K]]_r`` is the best rank-``r`` approximation and ``eta = tr(K - [[K]]_r) / tr(K)``.

The sequential algorithm touches all ``n`` rows for every pivot. Here the pivots are
chosen in rounds, as the rejection-sampling form of Epperly, Tropp and Webber (2024,
"accelerated RPCholesky") does, which draws exactly the sequential algorithm's pivots:

1. one pass over the row blocks computes the residual diagonal ``d`` of all ``n`` rows
   for the pivots so far (``n`` floats come back; the kernel columns of the pivots are
   computed block by block where the blocks are, through the executor);
2. on the client, a batch of candidates is drawn i.i.d. in proportion to ``d``; they are
   examined in order, candidate ``s`` being accepted with probability
   ``r_s / d_s``, ``r_s`` its residual given *all* pivots accepted so far (this round's
   too), computed from the candidates' small kernel matrix. Proposal ``d`` times
   acceptance ``r / d`` is proportional to ``r``: each accepted pivot has the
   distribution of the next pivot of sequential RPCholesky.

Only the residual diagonal is kept (no ``n x M`` factor), so a round's pass recomputes
``||L^{-1} K_P,i||^2`` for its rows: ``O(n k (d + k))`` for ``k`` pivots. Rounds are few
because a batch of candidates is cheap (it needs no pass) and a round ends only when the
batch is used up. All draws come from generators keyed by the seed and the round
(:mod:`daskkrr.sampling.keyed_random`), and ``d`` is a function of the row, so the
centers do not depend on the chunking or on the workers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.linalg

from daskkrr.kernels import Kernel
from daskkrr.kernels.sparse import cast_rows
from daskkrr.parallel.executor import BlockPasses, Executor
from daskkrr.sampling.base import (
    CenterDictionary,
    CenterSampler,
    as_row_chunked,
    register,
)
from daskkrr.sampling.keyed_random import STREAM_RPCHOLESKY, keyed_rng, resolve_seed

if TYPE_CHECKING:
    pass

#: A candidate whose residual is below this fraction of the largest kernel diagonal is
#: treated as already covered (its residual is round-off): it keeps the Cholesky factor
#: of the pivots' kernel matrix well conditioned (smallest pivot >= sqrt(tol * kappa^2)).
RESIDUAL_TOL = 1e-10


def residual_diagonal_block(Xb: np.ndarray, kernel: Kernel, pivots: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``d_i = k(x_i, x_i) - ||L^{-1} k_P(x_i)||^2`` (clipped at 0) for the rows of one block.

    ``factor`` is the lower Cholesky factor ``L`` of the pivots' kernel matrix ``K_PP``.
    """
    X = cast_rows(Xb, np.float64)  # sparse rows stay sparse
    diag = np.asarray(kernel.diag(X), dtype=np.float64)
    if pivots.shape[0] == 0:
        return diag
    W = scipy.linalg.solve_triangular(factor, np.asarray(kernel(pivots, X), dtype=np.float64), lower=True,
                                      check_finite=False)
    return np.maximum(diag - np.einsum("ij,ij->j", W, W), 0.0)


def draw_proportional(d: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` row indices drawn i.i.d. with probabilities ``d / sum(d)`` (inverse CDF, in row order)."""
    cdf = np.cumsum(d)
    picks = np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
    return np.minimum(picks, d.size - 1).astype(np.int64)


def accept_candidates(residual: np.ndarray, proposal: np.ndarray, uniforms: np.ndarray, budget: int,
                      floor: float) -> np.ndarray:
    """Positions of the candidates accepted by rejection sampling, in order.

    Parameters
    ----------
    residual : ndarray of shape (c, c)
        The candidates' residual kernel matrix given the pivots before this round (not modified).
    proposal : ndarray of shape (c,)
        The residual diagonal each candidate was drawn with.
    uniforms : ndarray of shape (c,)
        One uniform number per candidate.
    budget : int
        Stop after this many acceptances.
    floor : float
        Residuals at or below it count as zero (never accepted).
    """
    # Left-looking: F holds the eliminated pivots' columns, so a rejected candidate costs one dot product
    # (its residual H_jj - |F_j|^2) and an accepted one a matrix-vector product, not a c x c update.
    H = residual
    F = np.zeros((H.shape[0], min(budget, H.shape[0])))
    accepted: list[int] = []
    for j in range(H.shape[0]):
        k = len(accepted)
        r = H[j, j] - F[j, :k] @ F[j, :k]
        if r <= floor or uniforms[j] * proposal[j] >= r:
            continue
        accepted.append(j)
        if k + 1 == budget:
            break
        root = math.sqrt(r)
        F[j, k] = root
        F[j + 1:, k] = (H[j + 1:, j] - F[j + 1:, :k] @ F[j, :k]) / root
    return np.asarray(accepted, dtype=np.int64)


class PivotFactor:
    """The pivots chosen so far and the lower Cholesky factor ``L`` of their kernel matrix."""

    def __init__(self, dim: int):
        self.points = np.empty((0, dim), dtype=np.float64)
        self.rows = np.empty(0, dtype=np.int64)
        self.L = np.zeros((0, 0))

    @property
    def size(self) -> int:
        return int(self.rows.size)

    def project(self, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
        """``W = L^{-1} K_P,Z`` (k x c)."""
        if self.size == 0:
            return np.zeros((0, Z.shape[0]))
        return scipy.linalg.solve_triangular(self.L, np.asarray(kernel(self.points, Z), dtype=np.float64),
                                             lower=True, check_finite=False)

    def extend(self, rows: np.ndarray, points: np.ndarray, W: np.ndarray, schur: np.ndarray) -> None:
        """Append pivots with ``W = L^{-1} K_P,new`` and their Schur complement ``K_new,new - W^T W``.

        ``L_new = [[L, 0], [W^T, chol(schur)]]`` is the Cholesky factor of the enlarged ``K_PP``.
        """
        k, a = self.size, rows.size
        L = np.zeros((k + a, k + a))
        L[:k, :k] = self.L
        L[k:, :k] = W.T
        L[k:, k:] = np.linalg.cholesky(schur)
        self.L = L
        self.rows = np.concatenate([self.rows, rows])
        self.points = np.concatenate([self.points, points])


@register
class RPCholeskySampler(CenterSampler):
    """Randomly pivoted Cholesky: centers drawn in proportion to the residual kernel diagonal.

    Parameters
    ----------
    max_candidates : int
        Largest batch of candidates per round (their ``c x c`` residual kernel matrix is
        held on the client: 4096 is 128 MiB). A round draws about ``needed / rate``
        candidates, ``rate`` the previous round's acceptance rate (at least 1/4).
    random_state : int or None
        Seed used when ``select`` gets ``random_state=None``.

    Notes
    -----
    The centers are not importance-weighted (all weights one): RPCholesky is an adaptive
    selection, not a sample of the data with known inclusion probabilities. Fewer than
    ``n_centers`` centers come back when the data's kernel matrix has lower numerical
    rank (every residual below ``1e-10 * max_i k(x_i, x_i)``); ``info["stopped"]`` then
    says ``"rank"``.
    """

    name = "rpcholesky"

    def __init__(self, max_candidates: int = 4096, random_state: int | None = None):
        self.max_candidates = max_candidates
        self.random_state = random_state

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        """Choose ``n_centers`` pivots of ``X``'s kernel matrix (``penalty`` is not used)."""
        X = as_row_chunked(X)
        n, dim = int(X.shape[0]), int(X.shape[1])
        if n_centers is None or int(n_centers) < 1:
            raise ValueError(f"RPCholeskySampler needs n_centers >= 1; got {n_centers!r}")
        if int(self.max_candidates) < 1:
            raise ValueError(f"max_candidates must be >= 1; got {self.max_candidates!r}")
        budget = min(int(n_centers), n)
        seed = resolve_seed(random_state if random_state is not None else self.random_state)
        passes = executor.passes(X)
        pivots = PivotFactor(dim)
        d = self._residual_diagonal(passes, kernel, pivots, executor)
        floor = RESIDUAL_TOL * float(d.max())
        rate, stopped = 1.0, None
        rounds: list[dict[str, Any]] = []
        while pivots.size < budget:
            if not float(d.sum()) > floor:
                stopped = "rank"
                break
            needed = budget - pivots.size
            size = int(min(self.max_candidates, math.ceil(needed / max(rate, 0.25))))
            added = self._round(passes, kernel, pivots, d, size, needed, floor, keyed_rng(seed, STREAM_RPCHOLESKY,
                                                                                         len(rounds)))
            rate = added / size
            rounds.append({"candidates": size, "accepted": added, "trace": float(d.sum())})
            if pivots.size < budget:
                d = self._residual_diagonal(passes, kernel, pivots, executor)
        order = np.argsort(pivots.rows, kind="stable")
        info: dict[str, Any] = {
            "sampler": self.name, "seed": seed, "n_rows": n, "rounds": rounds, "passes": passes.n_passes,
            "stopped": stopped, "unique": pivots.size,
        }
        return CenterDictionary(centers=pivots.points[order].astype(X.dtype), indices=pivots.rows[order],
                                weights=np.ones(pivots.size), info=info)

    @staticmethod
    def _residual_diagonal(passes: BlockPasses, kernel: Kernel, pivots: PivotFactor, run: Any) -> np.ndarray:
        """The residual diagonal of all rows (one pass; none for a stationary kernel without pivots)."""
        if pivots.size == 0 and kernel.is_stationary:
            value = float(np.asarray(kernel.diag(np.zeros((1, passes.X.shape[1]))))[0])
            return np.full(int(passes.X.shape[0]), value)
        parts = passes.map(residual_diagonal_block, kernel, run.broadcast(pivots.points), run.broadcast(pivots.L),
                           name="rpcholesky")
        return np.concatenate(parts)

    @staticmethod
    def _round(passes: BlockPasses, kernel: Kernel, pivots: PivotFactor, d: np.ndarray, size: int, needed: int,
               floor: float, rng: np.random.Generator) -> int:
        """Draw ``size`` candidates from ``d``, accept by rejection, add the accepted to ``pivots``."""
        cand = draw_proportional(d, size, rng)
        uniforms = rng.random(size)
        unique, where = np.unique(cand, return_inverse=True)
        Z = np.asarray(passes.gather_rows(unique), dtype=np.float64)[where]
        W = pivots.project(kernel, Z)
        schur = np.asarray(kernel(Z, Z), dtype=np.float64) - W.T @ W
        chosen = accept_candidates(schur, d[cand], uniforms, needed, floor)
        if chosen.size:
            pivots.extend(cand[chosen], Z[chosen], W[:, chosen], schur[np.ix_(chosen, chosen)])
        return int(chosen.size)
