"""BLESS levels on numpy blocks (Rudi, Calandriello, Carratino & Rosasco, 2018); no Dask here.

BLESS ("bottom-up leverage score sampling") walks a decreasing sequence of
regularisations ``gamma_0 > gamma_1 > ... > gamma_H = gamma`` (``gamma_h = gamma_{h-1} / q``).
At level h it draws a *uniform* candidate set, estimates the candidates' RLS at
``gamma_h`` with the dictionary of level h-1, and samples the next dictionary from
the candidates proportionally to those estimates. Coarse levels have few relevant
points (``d_eff(gamma_h)`` small), so each level is cheap, and each dictionary is good
enough to estimate the RLS of the next, finer level.

We use the Bernoulli form of the level (as in the paper's BLESS-R variant):

- row i is a candidate at level h iff ``u_i < beta_h``, with
  ``beta_h = min(1, q1 kappa^2 / gamma_h)`` (``kappa^2 / gamma_h`` bounds every RLS, so it
  plays the role of the paper's ``d_max / n``). The ``u_i`` are one uniform per row
  for all levels, so candidate sets are nested and each is a uniform sample;
- the estimator is the paper's Eq. 5 with the previous dictionary J (selection
  weights ``s_j = 1 / pi_j``)::

      l~_i = (k_ii - k_J(x_i)^T D (D K_JJ D + gamma_h I)^{-1} D k_J(x_i)) / gamma_h,  D = diag(sqrt(s));

- candidate i joins the new dictionary with probability ``min(1, q2 l~_i / beta_h)``,
  so overall ``pi_i = min(beta_h, q2 l~_i)`` and ``E[size] ~ q2 d_eff(gamma_h)``.

All draws are counter-based hashes of (seed, level, row), so a level gives the same
dictionary whether its candidates are processed in memory or block by block.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.kernels.sparse import dense_rows, is_sparse
from daskkrr.sampling.dictionary import (
    _GAMMA_ADVICE,
    DictionaryState,
    forward_solve,
    lower_cholesky,
    weighted_gram,
)
from daskkrr.sampling.keyed_random import STREAM_BLESS_LEVEL, row_uniforms


@dataclasses.dataclass(frozen=True)
class BlessFactor:
    """What a level needs from the previous dictionary: its points and Cholesky factor."""

    points: np.ndarray
    sqrt_w: np.ndarray
    L: np.ndarray

    @classmethod
    def from_dictionary(cls, d: DictionaryState, gamma: float, kernel: Kernel) -> BlessFactor:
        """``L L^T = S K_JJ S + gamma I`` (``S`` the selection weights' square roots), here in memory."""
        sw = np.sqrt(d.selection_weights(1))
        if not d.size:
            return cls(points=d.points, sqrt_w=sw, L=np.zeros((0, 0)))
        gram = d.gram if d.gram.shape[0] == d.size else np.asarray(kernel(d.points, d.points), dtype=np.float64)
        L, _ = lower_cholesky(weighted_gram(gram, sw, gamma))
        return cls(points=d.points, sqrt_w=sw, L=L)

    def residuals(self, kernel: Kernel, Xc: np.ndarray, kc: np.ndarray) -> np.ndarray:
        """``k(x, x) - ||L^{-1} S k_J(x)||^2`` of the candidates ``Xc`` (``kc`` their kernel diagonal)."""
        K_Jc = np.asarray(kernel(self.points, Xc), dtype=np.float64)
        V = forward_solve(self.L, self.sqrt_w[:, None] * K_Jc)
        return kc - np.einsum("ij,ij->j", V, V)

    def close(self) -> None:
        """Nothing to free (the factor is an array); as :class:`TiledBlessFactor`'s."""


#: Bytes of one column chunk of ``V = T^{-T} S K_Jc`` on the tiled route, at least (the candidates are
#: solved a chunk at a time, so ``V`` is never ``m x candidates`` whole) ...
TILED_SOLVE_BYTES = 64 * 2**20
#: ... or this fraction of the client's memory budget where that is more: each chunk's solve reads every
#: tile of the factor (from Zarr when spilled), so fewer, wider chunks read it fewer times. The client
#: holds a chunk's kernel columns, their scaled copy and its blocks (three chunks) while it is solved.
TILED_SOLVE_CLIENT_FRACTION = 1 / 8


def solve_chunk_bytes(client_bytes: int) -> int:
    """Bytes of one chunk of right-hand sides for :meth:`TiledBlessFactor.residuals` (see the constants)."""
    return int(max(TILED_SOLVE_BYTES, TILED_SOLVE_CLIENT_FRACTION * client_bytes))


@dataclasses.dataclass
class TiledBlessFactor:
    """:class:`BlessFactor` with the factor as tiles (:mod:`daskkrr.parallel.tiled_linalg`), for dictionaries
    whose ``m x m`` Gram, its weighted copy and factor do not fit the client: ``T^T T = S K_JJ S + gamma I``
    (upper ``T = L^T``), the kernel tiles computed from the points inside the factorisation's graph."""

    points: np.ndarray
    sqrt_w: np.ndarray
    T: Any
    store: Any = None
    solve_bytes: int = TILED_SOLVE_BYTES

    @classmethod
    def from_dictionary(cls, d: DictionaryState, gamma: float, kernel: Kernel, *, executor: Any, tile: int,
                        spill: bool = False, solve_bytes: int = TILED_SOLVE_BYTES) -> TiledBlessFactor:
        """``S = diag(sqrt(1 / p))`` (BLESS's one-copy entries); ``solve_bytes``: one chunk of right-hand sides in
        :meth:`residuals` (:func:`solve_chunk_bytes`)."""
        from daskkrr.parallel.tiled_linalg import TileStore, kernel_cholesky

        if not d.size:
            raise ValueError("the tiled BLESS factor needs a non-empty dictionary")
        w = d.selection_weights(1)
        store = TileStore() if spill else None
        T, _, sw = kernel_cholesky(executor, d.points, kernel, tile=tile, weights=w, store=store, regularizer=gamma,
                                   what="regularised dictionary Gram matrix D K D + gamma I", advice=_GAMMA_ADVICE)
        return cls(points=d.points, sqrt_w=sw, T=T, store=store, solve_bytes=int(solve_bytes))

    def residuals(self, kernel: Kernel, Xc: np.ndarray, kc: np.ndarray) -> np.ndarray:
        """As :meth:`BlessFactor.residuals`, the solves a column chunk at a time through the tile graphs."""
        from daskkrr.parallel.tiled_linalg import solve_column_norms

        chunk = max(1, self.solve_bytes // (8 * self.T.layout.M))
        out = np.array(kc, dtype=np.float64)
        for a in range(0, Xc.shape[0], chunk):
            K_Jc = np.asarray(kernel(self.points, Xc[a:a + chunk]), dtype=np.float64)
            out[a:a + chunk] -= solve_column_norms(self.T, self.sqrt_w[:, None] * K_Jc, trans=True)
        return out

    def close(self) -> None:
        """Free the tiles (and the spill store)."""
        self.T.release()
        if self.store is not None:
            self.store.close()


def bless_gammas(gamma: float, gamma_0: float, q: float) -> list[float]:
    """``gamma_0 / q, gamma_0 / q^2, ...`` down to and ending at ``gamma``."""
    if not q > 1:
        raise ValueError(f"BLESS step q must be > 1; got {q!r}")
    if gamma_0 <= gamma:
        return [float(gamma)]
    H = max(1, math.ceil(math.log(gamma_0 / gamma) / math.log(q)))
    return [float(gamma_0 / q**h) for h in range(1, H)] + [float(gamma)]


def diag_max(Xb: np.ndarray, kernel: Kernel) -> float:
    """``max_i k(x_i, x_i)`` over one row block (``kappa^2`` is the max over the blocks)."""
    return float(np.max(np.asarray(kernel.diag(Xb), dtype=np.float64)))


def candidate_rate(gamma_h: float, kappa2: float, q1: float) -> float:
    """``beta_h = min(1, q1 kappa^2 / gamma_h)``."""
    return float(min(1.0, q1 * kappa2 / gamma_h))


def candidate_mask(rows: np.ndarray, seed: int, beta: float) -> np.ndarray:
    """Rows that are candidates at a level with candidate rate ``beta`` (nested in beta)."""
    return row_uniforms(seed, STREAM_BLESS_LEVEL, 0, rows) < beta


@dataclasses.dataclass
class LevelSample:
    """Rows selected by one level from one block, plus the sums needed for d_eff."""

    rows: np.ndarray
    points: np.ndarray
    probs: np.ndarray
    rls: np.ndarray
    rls_sum: float
    n_candidates: int

    @staticmethod
    def concat(parts: list[LevelSample]) -> LevelSample:
        return LevelSample(
            rows=np.concatenate([p.rows for p in parts]),
            points=np.concatenate([p.points for p in parts]),
            probs=np.concatenate([p.probs for p in parts]),
            rls=np.concatenate([p.rls for p in parts]),
            rls_sum=float(sum(p.rls_sum for p in parts)),
            n_candidates=int(sum(p.n_candidates for p in parts)),
        )


def bless_level_rows(
    Xr: np.ndarray,
    rows: np.ndarray,
    factor: BlessFactor | TiledBlessFactor,
    kernel: Kernel,
    gamma_h: float,
    beta_h: float,
    q2: float,
    seed: int,
    level: int,
) -> LevelSample:
    """One BLESS level on the rows ``Xr`` whose global indices are ``rows``.

    Rows that are not candidates at this level (``u_i >= beta_h``) are skipped, so the
    same function serves a whole block and an in-memory superset of candidates.
    """
    rows = np.asarray(rows, dtype=np.int64)
    cand = candidate_mask(rows, seed, beta_h)
    rows, Xc = rows[cand], candidate_rows(Xr, cand)
    kc = np.asarray(kernel.diag(Xc), dtype=np.float64) if rows.size else np.zeros(0)
    if factor.points.shape[0] and rows.size:
        kc = factor.residuals(kernel, Xc, kc)
    ell = np.maximum(kc, 0.0) / gamma_h
    accept_p = np.minimum(1.0, q2 * ell / beta_h)
    keep = row_uniforms(seed, STREAM_BLESS_LEVEL, level + 1, rows) < accept_p
    return LevelSample(
        rows=rows[keep],
        points=Xc[keep],
        probs=beta_h * accept_p[keep],
        rls=ell[keep],
        rls_sum=float(ell.sum()),
        n_candidates=int(rows.size),
    )


def bless_level_block(
    Xb: np.ndarray,
    first_row: int,
    factor: BlessFactor,
    kernel: Kernel,
    gamma_h: float,
    beta_h: float,
    q2: float,
    seed: int,
    level: int,
) -> LevelSample:
    """:func:`bless_level_rows` on a row block starting at global row ``first_row``."""
    rows = first_row + np.arange(np.shape(Xb)[0], dtype=np.int64)
    return bless_level_rows(Xb, rows, factor, kernel, gamma_h, beta_h, q2, seed, level)


def candidates_block(Xb: np.ndarray, first_row: int, seed: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """Global rows and values of the candidates (rate ``beta``) in one block."""
    rows = first_row + np.arange(np.shape(Xb)[0], dtype=np.int64)
    cand = candidate_mask(rows, seed, beta)
    return rows[cand], candidate_rows(Xb, cand)


def candidate_rows(Xb: Any, cand: np.ndarray) -> np.ndarray:
    """The candidate rows (a sample at rate beta) of a block as dense numpy rows (sparse rows densified)."""
    return dense_rows(Xb[cand]) if is_sparse(Xb) else np.asarray(Xb)[cand]


def dictionary_from_sample(sample: LevelSample) -> DictionaryState:
    """A level's selection as a dictionary (one copy each, ``p = pi``), without its Gram (the next level's
    factor computes the kernel matrix it needs, in memory or as tiles, and the last level's is never needed)."""
    order = np.argsort(sample.rows, kind="stable")
    pts = sample.points[order]
    return DictionaryState(
        points=pts,
        indices=sample.rows[order],
        probs=sample.probs[order],
        copies=np.ones(order.size, dtype=np.int64),
        rls=sample.rls[order],
        gram=np.zeros((0, 0)),  # computed by the next level's factor where it is factored in memory
    )
