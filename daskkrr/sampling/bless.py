"""BLESS sampler: coarse-to-fine leverage-score sampling with uniform candidate sets.

The numerical work of a level is :func:`~daskkrr.sampling.bless_core.bless_level_rows`;
this module decides where it runs (through the execution layer):

- levels whose candidate set is small (at most ``max_candidate_bytes``) run in
  memory, on the candidates gathered by a single pass over ``X`` (the candidate sets
  are nested, so the largest in-memory level's set serves all coarser ones);
- finer levels run as one pass each (:meth:`~daskkrr.parallel.executor.BlockPasses.map`):
  every row block computes its candidates' estimates against the previous
  dictionary (broadcast once per level) and returns only the rows it selects.

The result does not depend on the chunking or on the workers (all draws are keyed
by global row and level).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.parallel.executor import BlockPasses, Executor
from daskkrr.sampling.base import (
    CenterDictionary,
    CenterSampler,
    as_row_chunked,
    register,
    resolve_gamma,
)
from daskkrr.sampling.bless_core import (
    BlessFactor,
    LevelSample,
    TiledBlessFactor,
    bless_gammas,
    bless_level_block,
    bless_level_rows,
    candidate_rate,
    candidates_block,
    diag_max,
    dictionary_from_sample,
    solve_chunk_bytes,
)
from daskkrr.sampling.dictionary import DictionaryState, thin_to_size
from daskkrr.sampling.keyed_random import STREAM_THINNING, keyed_rng, resolve_seed

if TYPE_CHECKING:
    pass

#: Default RLS oversampling: a level's dictionary has about q2 d_eff(gamma_h) rows.
DEFAULT_Q2 = 8.0


def kernel_sup(passes: BlockPasses, kernel: Kernel) -> float:
    """``kappa^2 = max_i k(x_i, x_i)`` (stationary kernels: ``k(0, 0)``, without a pass)."""
    X = passes.X
    if kernel.is_stationary:
        return float(np.asarray(kernel.diag(np.zeros((1, X.shape[1]), dtype=X.dtype)))[0])
    return float(passes.map_reduce(diag_max, kernel, name="kernelsup", combine="max"))


@register
class BlessSampler(CenterSampler):
    """BLESS: ridge-leverage-score centers by a coarse-to-fine sequence of regularisations.

    Parameters
    ----------
    gamma : float or None
        Final regularisation in kernel-matrix units; None means ``penalty * n``. With a
        center budget ``n_centers`` and gamma = None, the descent stops at the first
        level whose dictionary exceeds the budget (BLESS's path of regularisations
        gives the budgeted gamma for free), and the dictionary is then thinned.
    q : float
        Ratio of successive regularisations, ``gamma_h = gamma_{h-1} / q`` (default 2).
    q2 : float
        RLS oversampling: row i is kept with probability ``min(beta_h, q2 l~_i)``, so a
        level keeps about ``q2 d_eff(gamma_h)`` rows (default 8: see the benchmarks).
    q1 : float or None
        Candidate oversampling, ``beta_h = min(1, q1 kappa^2 / gamma_h)``; None means
        ``q2``, the smallest value for which the candidate rate never caps
        ``q2 l~_i`` (every RLS estimate is at most ``kappa^2 / gamma_h``).
    gamma_0 : float or None
        First (coarsest) regularisation; None means ``kappa^2 n`` (``lambda_0 = kappa^2``
        in the paper's per-sample units), where ``d_eff <= 1``.
    random_state : int or None
        Seed used when ``select`` gets ``random_state=None``.
    max_candidate_bytes : int
        Levels whose candidate rows fit in this many bytes run in memory.
    budget_overshoot : float
        With a budget and gamma = None, stop descending once a level keeps more than
        ``budget_overshoot * n_centers`` rows (default 2), then thin to the budget.
    factor_route : {"auto", "dense", "tiled"}
        Where a level factors the previous dictionary's ``m x m`` matrix: on the client
        ("dense": its Gram, weighted copy and factor, ``3 x 8 m^2`` bytes) or as tiles on the
        workers or spilled to Zarr ("tiled", :mod:`daskkrr.parallel.tiled_linalg`); "auto" asks
        FALKON's factor cost model (:func:`~daskkrr.parallel.factor_cost.plan_factor`), which
        takes the tiled route only when the dense one does not fit half the client's memory.
    memory_budget : int or None
        Bytes that cap the client's (and the workers') memory in that choice (None: what is
        available).

    Notes
    -----
    Weights follow :class:`CenterDictionary`: ``w_j = (M/n) / pi_j`` with ``pi_j`` the
    probability row j was selected with at the last level (stored in
    ``probabilities``; ``counts`` are all one).
    """

    name = "bless"

    def __init__(
        self,
        gamma: float | None = None,
        q: float = 2.0,
        q2: float = DEFAULT_Q2,
        q1: float | None = None,
        gamma_0: float | None = None,
        random_state: int | None = None,
        max_candidate_bytes: int = 64 * 2**20,
        budget_overshoot: float = 2.0,
        factor_route: str = "auto",
        memory_budget: int | None = None,
    ):
        self.gamma = gamma
        self.q = q
        self.q2 = q2
        self.q1 = q1
        self.gamma_0 = gamma_0
        self.random_state = random_state
        self.max_candidate_bytes = max_candidate_bytes
        self.budget_overshoot = budget_overshoot
        self.factor_route = factor_route
        self.memory_budget = memory_budget

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        """Run the BLESS levels and return the last level's dictionary."""
        X = as_row_chunked(X)
        n, dim = int(X.shape[0]), int(X.shape[1])
        seed = resolve_seed(random_state if random_state is not None else self.random_state)
        gamma = resolve_gamma(self.gamma, penalty, n)
        if not self.q2 > 0:
            raise ValueError(f"q2 must be > 0; got {self.q2!r}")
        q1 = float(self.q2 if self.q1 is None else self.q1)
        passes = executor.passes(X)
        kappa2 = kernel_sup(passes, kernel)
        gamma_0 = float(self.gamma_0) if self.gamma_0 is not None else kappa2 * n
        gammas = bless_gammas(gamma, gamma_0, float(self.q))
        betas = [candidate_rate(g, kappa2, q1) for g in gammas]
        budget = None if n_centers is None else int(n_centers)
        if budget is not None and budget < 1:
            raise ValueError(f"n_centers must be >= 1 or None; got {n_centers!r}")

        row_bytes = dim * X.dtype.itemsize
        in_memory = [b * n * row_bytes * 1.2 + 8 * row_bytes <= self.max_candidate_bytes for b in betas]
        n_mem = int(np.argmin(in_memory)) if not all(in_memory) else len(betas)
        # The in-memory levels' candidates (none drawn when n_mem == 0, and then unused).
        cand_rows = np.empty(0, dtype=np.int64)
        cand_points = np.empty((0, dim), dtype=X.dtype)
        n_passes = 0  # passes over X for the levels (kappa^2 of a non-stationary kernel not counted)
        if n_mem:
            parts = passes.map(candidates_block, seed, betas[n_mem - 1], name="blesscandidates",
                               with_offsets=True)
            n_passes += 1
            cand_rows = np.concatenate([p[0] for p in parts])
            cand_points = np.concatenate([p[1] for p in parts])

        d = DictionaryState.empty(dim, X.dtype)
        levels: list[dict[str, Any]] = []
        stopped = None
        for h, (g, b) in enumerate(zip(gammas, betas)):
            factor, route = self._factor(d, g, kernel, executor)
            try:
                if h < n_mem:
                    sample = bless_level_rows(cand_points, cand_rows, factor, kernel, g, b, self.q2, seed, h)
                elif isinstance(factor, TiledBlessFactor):  # the tile graphs run from here: candidates come here
                    rows_pts = passes.map(candidates_block, seed, b, name="blesscandidates", with_offsets=True)
                    sample = bless_level_rows(np.concatenate([p[1] for p in rows_pts]),
                                              np.concatenate([p[0] for p in rows_pts]), factor, kernel, g, b,
                                              self.q2, seed, h)
                    n_passes += 1
                else:
                    sample = LevelSample.concat(passes.map(
                        bless_level_block, executor.broadcast(factor), kernel, g, b, self.q2, seed, h,
                        name="blesslevel", with_offsets=True))
                    n_passes += 1
            finally:
                factor.close()
            d = dictionary_from_sample(sample)
            levels.append({
                "level": h, "gamma": g, "beta": b, "candidates": sample.n_candidates,
                "selected": d.size, "d_eff_estimate": sample.rls_sum / b,
                "in_memory": h < n_mem, "factor_route": route,
            })
            if (budget is not None and self.gamma is None and h < len(gammas) - 1
                    and d.size > self.budget_overshoot * budget):
                stopped = "n_centers"
                break
        if d.size == 0:
            raise RuntimeError(
                f"BLESS selected no row at gamma={gammas[-1]:.3g}; increase q2 or lower gamma"
            )
        info: dict[str, Any] = {
            "sampler": self.name, "gamma": levels[-1]["gamma"], "gamma_target": gamma,
            "q": float(self.q), "q1": q1, "q2": float(self.q2), "seed": seed, "n_rows": n,
            "kappa2": kappa2, "levels": levels, "passes": n_passes, "stopped": stopped,
            "d_eff_estimate": levels[-1]["d_eff_estimate"], "unique": d.size,
        }
        if budget is not None and d.size > budget:
            d = thin_to_size(d, budget, keyed_rng(seed, STREAM_THINNING))
            info["thinned_to"] = budget
        return d.to_center_dictionary(1, n, info)

    def _factor(self, d: Any, gamma: float, kernel: Kernel, executor: Any) -> tuple[Any, str]:
        """The previous dictionary's factor for a level, dense or tiled as the factor cost model says."""
        if not d.size:
            return BlessFactor.from_dictionary(d, gamma, kernel), "none"
        from daskkrr.parallel.strategies import plan_factor_route

        plan = plan_factor_route(d.size, "float64", route=self.factor_route, memory_budget=self.memory_budget,
                                 executor=executor)
        if plan.route == "dense":
            return BlessFactor.from_dictionary(d, gamma, kernel), "dense"
        factor = TiledBlessFactor.from_dictionary(d, gamma, kernel, executor=executor, tile=plan.tile,
                                                  spill=plan.storage == "zarr",
                                                  solve_bytes=solve_chunk_bytes(plan.client_bytes))
        return factor, f"tiled ({plan.storage})"
