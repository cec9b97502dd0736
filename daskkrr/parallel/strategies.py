"""Solver strategies: who computes FALKON's ``K_nM^T y`` and ``K_nM^T K_nM u``, and how.

Each strategy is an operator with the same two methods, so the solver does not
know which one runs:

- ``rhs()`` -> ``K_nM^T Y`` (``(M, t)``, float64);
- ``gram_matvec(u)`` -> ``K_nM^T K_nM u``;
- ``close()`` frees what the strategy holds.

:class:`RecomputeOperator` recomputes kernel blocks on every call (true
out-of-core), :class:`CachedOperator` keeps each block's ``k(X_b, Z)`` in worker
memory, :class:`GramOperator` accumulates ``K_nM^T K_nM`` in one pass and
multiplies on the client. :func:`plan_strategy` picks one with the cost model
of :mod:`daskkrr.parallel.cost`; :func:`make_operator` builds it. All three give
the same products up to round-off, so the same CG iterates.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import dask.array as da
import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.parallel.cost import (
    BLOCKS_PER_SLOT,
    STRATEGY_CHOICES,
    Budget,
    Problem,
    StrategyCost,
    choose_strategy,
    estimate,
    expected_iterations,
    should_persist,
)
from daskkrr.parallel.executor import BlockPasses, Executor
from daskkrr.parallel.factor_cost import FactorPlan, plan_factor
from daskkrr.parallel.preconditioner_cost import (
    SKETCH_PLACES,
    SketchCost,
    choose_sketch_rows,
    convergence_factor,
    sketch_cost,
)
from daskkrr.parallel.resources import Resources, client_memory_budget
from daskkrr.utils.threads import available_cores

logger = logging.getLogger("daskkrr")

#: Fewest rows per block after balancing (smaller blocks cost more scheduling than work).
MIN_BLOCK_ROWS = 4096


def check_strategy(strategy: str) -> str:
    """Validate the ``strategy`` parameter."""
    if strategy not in STRATEGY_CHOICES:
        raise ValueError(f"strategy must be one of {STRATEGY_CHOICES}; got {strategy!r}")
    return strategy


@dataclasses.dataclass
class StrategyPlan:
    """What :func:`plan_strategy` decided and why."""

    strategy: str
    persist: bool
    costs: dict[str, StrategyCost]
    resources: Resources

    def describe(self) -> str:
        parts = [
            f"{c.name}: {c.seconds:.1f}s" + ("" if c.feasible else f" (infeasible: {c.reason})")
            for c in self.costs.values()
        ]
        return f"strategy {self.strategy} ({'; '.join(parts)}); persist data: {self.persist}"


def plan_strategy(
    strategy: str,
    X: da.Array,
    *,
    n_centers: int,
    n_targets: int,
    iterations: int,
    executor: Executor | None = None,
    tol: float | None = None,
    in_memory: bool = False,
    resources: Resources | None = None,
    sketch_rows: int = 0,
    tiled_factor: bool = False,
) -> StrategyPlan:
    """Choose the strategy (``"auto"`` uses the cost model) and whether to persist the data.

    ``iterations`` is CG's ``max_iter``; with ``tol`` the cost model expects
    :func:`~daskkrr.parallel.cost.expected_iterations` of them, at the rate
    :func:`~daskkrr.parallel.preconditioner_cost.convergence_factor` of a
    preconditioner built from ``sketch_rows`` sampled rows (0: FALKON's own).

    ``tiled_factor``: the preconditioner's factors are tiled (:mod:`daskkrr.parallel.factor_cost`)
    because the client cannot hold ``M x M`` matrices, so neither can the "gram" strategy: it is
    infeasible, and refused when asked for.
    """
    check_strategy(strategy)
    if tiled_factor and strategy == "gram":
        raise ValueError("strategy='gram' keeps M x M matrices on the client, which the tiled preconditioner "
                         "(preconditioner_route='tiled', or a memory_budget too small for the dense one) avoids; "
                         "use strategy='auto', 'recompute' or 'cache', or preconditioner_route='dense'")
    res = resources or (executor or Executor()).resources()
    its = expected_iterations(int(iterations), tol, convergence_factor(sketch_rows, n_centers))
    problem, budget = _problem_and_budget(X, n_centers, n_targets, its, in_memory, res)
    n, d = problem.n, problem.d
    if strategy == "auto":
        chosen, costs = choose_strategy(problem, budget, exclude=("gram",) if tiled_factor else ())
    else:
        chosen, costs = strategy, estimate(problem, budget)
    data_bytes = n * d * X.dtype.itemsize + n * n_targets * 8
    persist = should_persist(chosen, data_bytes, budget, in_memory)
    return StrategyPlan(chosen, persist, costs, res)


def _problem_and_budget(X: da.Array, n_centers: int, n_targets: int, iterations: int, in_memory: bool,
                        res: Resources) -> tuple[Problem, Budget]:
    n, d = (int(s) for s in X.shape)
    problem = Problem(n=n, d=d, n_centers=int(n_centers), n_targets=int(n_targets),
                      itemsize=X.dtype.itemsize, iterations=int(iterations), in_memory=in_memory)
    # The preconditioner is built in this process: on a cluster, on the client host's cores.
    return problem, Budget(cores=res.cores, memory_bytes=res.memory_bytes, n_workers=res.n_workers,
                           client_cores=available_cores())


def plan_factor_route(n_centers: int, factor_precision: str, *, route: str = "auto",
                      memory_budget: int | None = None, executor: Executor | None = None,
                      resources: Resources | None = None) -> FactorPlan:
    """Dense or tiled preconditioner factors (:func:`~daskkrr.parallel.factor_cost.plan_factor`), by the
    memory of this process (the client, which holds the dense factors) and of the workers."""
    executor = executor or Executor()
    res = resources or executor.resources()
    budget = Budget(cores=res.cores, memory_bytes=res.memory_bytes, n_workers=res.n_workers,
                    client_cores=available_cores())
    plan = plan_factor(int(n_centers), np.dtype(factor_precision).itemsize, budget, route=route,
                       client_memory=client_memory_budget(executor.client), memory_budget=memory_budget)
    logger.info("preconditioner factors: %s", plan.reason)
    return plan


@dataclasses.dataclass
class SketchPlan:
    """What :func:`plan_sketch` decided: the sketch rows and the expected cost of each candidate."""

    rows: int
    costs: list[SketchCost]

    @property
    def on(self) -> str:
        """Where the chosen sketch is summed: "client" or "workers" (:mod:`daskkrr.parallel.sketch_pass`)."""
        return next((c.on for c in self.costs if c.rows == self.rows), "client")

    def describe(self) -> str:
        parts = [f"{c.rows}: {c.seconds:.1f}s ({c.iterations} it, {c.strategy}, on the {c.on})" for c in self.costs]
        return f"preconditioner rows {self.rows} (expected {'; '.join(parts)})"


def sketch_place() -> str:
    """``$DASKKRR_SKETCH_ON``: "client" or "workers" to force where the sketch is summed, else "auto"."""
    raw = os.environ.get("DASKKRR_SKETCH_ON", "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw not in SKETCH_PLACES:
        raise ValueError(f"DASKKRR_SKETCH_ON must be 'client', 'workers' or 'auto'; got {raw!r}")
    return raw


def plan_sketch(
    requested: int | str | None,
    X: da.Array,
    *,
    n_centers: int,
    n_targets: int,
    max_iter: int,
    tol: float | None,
    strategy: str = "auto",
    sketch_itemsize: int = 8,
    executor: Executor | None = None,
    in_memory: bool = False,
    resources: Resources | None = None,
    on: str | None = None,
) -> SketchPlan:
    """Rows of the preconditioner's sketch: ``requested`` (an int, at most n; None: 0, FALKON's own),
    or with ``"auto"`` the candidate of least expected time to ``tol`` by
    :func:`~daskkrr.parallel.preconditioner_cost.choose_sketch_rows`.

    The expected costs of the candidates are computed either way (and of the
    requested size when it is not one of them), for the record. ``on`` ("client" or
    "workers": a resumed fit's) fixes where the sketch is summed; None: ``$DASKKRR_SKETCH_ON``,
    else the cost model's choice.
    """
    check_strategy(strategy)
    res = resources or (executor or Executor()).resources()
    problem, budget = _problem_and_budget(X, n_centers, n_targets, max_iter, in_memory, res)
    on = sketch_place() if on is None else on
    if res.n_workers == 0 and on == "auto":
        on = "client"  # no workers: the blocks run in this process, on the same cores
    rows, costs = choose_sketch_rows(problem, budget, max_iter=int(max_iter), tol=tol, strategy=strategy,
                                     sketch_itemsize=int(sketch_itemsize), on=on)
    if requested != "auto":
        rows = 0 if requested is None else min(int(requested), problem.n)
        if rows not in {c.rows for c in costs}:
            extra = sketch_cost(rows, problem, budget, max_iter=int(max_iter), tol=tol, strategy=strategy,
                                sketch_itemsize=int(sketch_itemsize), on=on)
            costs = sorted([*costs, extra], key=lambda c: c.rows)
    plan = SketchPlan(rows, costs)
    logger.info("%s", plan.describe())
    return plan


def balance_blocks(X: da.Array, Y: da.Array | None, slots: int) -> tuple[da.Array, da.Array | None]:
    """Split the row blocks so there are at least ``BLOCKS_PER_SLOT * slots`` of them.

    A store written with 64 MiB chunks has a single block at n = 1e5 (d = 20,
    float32), which would leave all but one core idle. Blocks are never made
    smaller than :data:`MIN_BLOCK_ROWS` rows.
    """
    n = int(X.shape[0])
    want = BLOCKS_PER_SLOT * max(1, slots)
    if len(X.chunks[0]) >= want or n < 2 * MIN_BLOCK_ROWS:
        return X, Y
    rows = max(MIN_BLOCK_ROWS, -(-n // want))
    X = X.rechunk({0: rows}, method="tasks")
    if Y is not None:
        Y = Y.rechunk({0: rows}, method="tasks")
    return X, Y


# --------------------------------------------------------------------------- block tasks
# BlockPasses calls fn(X_b, [Y_b,] *args); module-level so workers can unpickle them.
def _rhs_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
    return engine_for(kernel).t_matvec(kernel, Xb, Z, Yb)


def _gram_matvec_task(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, U: np.ndarray) -> np.ndarray:
    return engine_for(kernel).gram_matvec(kernel, Xb, Z, U)


def _gram_rhs_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray,
                   right: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    return engine_for(kernel).gram_and_rhs(kernel, Xb, Yb, Z, right=right)


def _kernel_block_task(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
    return engine_for(kernel).kernel_block(kernel, Xb, Z)


def _cached_rhs_task(Kb: np.ndarray, Yb: np.ndarray) -> np.ndarray:
    return engine_for(None).cached_t_matvec(Kb, Yb)


def _cached_gram_matvec_task(Kb: np.ndarray, U: np.ndarray) -> np.ndarray:
    return engine_for(None).cached_gram_matvec(Kb, U)


# --------------------------------------------------------------------------- operators
class RecomputeOperator:
    """Recompute ``k(X_b, Z)`` on every pass: memory of a tile per task, any n and M."""

    name = "recompute"

    def __init__(self, passes: BlockPasses, kernel: Kernel, Z: Any):
        self.passes, self.kernel, self.Z = passes, kernel, Z

    def rhs(self) -> np.ndarray:
        return self.passes.map_reduce(_rhs_task, self.kernel, self.Z, name="rhs", with_y=True)

    def gram_matvec(self, u: np.ndarray) -> np.ndarray:
        return self.passes.map_reduce(_gram_matvec_task, self.kernel, self.Z, u, name="matvec")

    def close(self) -> None:
        pass


class CachedOperator:
    """Keep every ``K_b = k(X_b, Z)`` in worker memory; an iteration reads them once."""

    name = "cache"

    def __init__(self, passes: BlockPasses, kernel: Kernel, Z: Any):
        self.passes = passes
        self.blocks = passes.keep(_kernel_block_task, kernel, Z, name="cache")

    def rhs(self) -> np.ndarray:
        return self.passes.reduce_kept(self.blocks, _cached_rhs_task, name="rhs", with_y=True)

    def gram_matvec(self, u: np.ndarray) -> np.ndarray:
        return self.passes.reduce_kept(self.blocks, _cached_gram_matvec_task, np.asarray(u), name="matvec")

    def close(self) -> None:
        self.passes.release(self.blocks)
        self.blocks = []


class GramOperator:
    """One pass accumulates the Gram matrix and ``K_nM^T Y``; products are then ``M x M`` on the client.

    Without a preconditioner it keeps ``G = K_nM^T K_nM`` (what the direct solve
    factors). With FALKON's factors ``(T, d)`` it keeps the preconditioned
    ``G' = T^-T D G D T^-1`` instead, accumulated from ``W_b = K_b D T^-1``, and
    answers ``G u = D^-1 T^T G' T D^-1 u``: the explicit ``K^T K`` would square
    the condition number of ``K_MM`` in its round-off, which CG on an
    ill-conditioned problem (all points as centers, a tiny penalty) cannot
    converge through; ``G'`` is as accurate as recomputing the products.
    """

    name = "gram"

    def __init__(self, passes: BlockPasses, kernel: Kernel, Z: Any, n_centers: int,
                 preconditioner: Any | None = None):
        self.factor = None
        right = None
        if preconditioner is not None:
            self.factor = (np.asarray(preconditioner.T, dtype=np.float64),
                           np.asarray(preconditioner.d, dtype=np.float64))
            right = passes.executor.broadcast(self.factor)
        GB = passes.map_reduce(self._block_task(), kernel, Z, right, name="gram", with_y=True)
        self.gram = np.ascontiguousarray(GB[:, :n_centers])
        self.knm_t_y = np.ascontiguousarray(GB[:, n_centers:])

    @staticmethod
    def _block_task() -> Any:
        """The per-block task of the Gram pass: ``[G_b | K_b^T Y_b]`` (a weighted subclass weighs the rows)."""
        return _gram_rhs_task

    def rhs(self) -> np.ndarray:
        return self.knm_t_y

    def gram_matvec(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=np.float64)
        U = u.reshape(self.gram.shape[0], -1)
        if self.factor is None:
            return (self.gram @ U).reshape(u.shape)
        T, d = self.factor
        out = (T.T @ (self.gram @ (T @ (U / d[:, None])))) / d[:, None]
        return out.reshape(u.shape)

    def close(self) -> None:
        pass


Operator = RecomputeOperator | CachedOperator | GramOperator


def make_operator(strategy: str, passes: BlockPasses, kernel: Kernel, Z: Any, n_centers: int,
                  preconditioner: Any | None = None) -> Operator:
    """Build the operator of a concrete strategy (``"recompute"``, ``"cache"`` or ``"gram"``).

    ``preconditioner`` (a :class:`~daskkrr.solvers.FalkonPreconditioner`) makes
    the gram strategy accumulate the preconditioned Gram matrix (for CG); without
    it the plain ``K_nM^T K_nM`` is kept (for the direct solve).
    """
    if strategy == "recompute":
        return RecomputeOperator(passes, kernel, Z)
    if strategy == "cache":
        return CachedOperator(passes, kernel, Z)
    if strategy == "gram":
        return GramOperator(passes, kernel, Z, n_centers, preconditioner)
    raise ValueError(f"strategy must be one of 'recompute', 'cache', 'gram'; got {strategy!r}")


def prepare_passes(X: da.Array, Y: da.Array | None, executor: Executor, plan: StrategyPlan) -> BlockPasses:
    """Row-block passes laid out for ``plan``: balanced blocks, thread budget, persisted if planned."""
    X, Y = balance_blocks(X, Y, plan.resources.slots)
    passes = executor.passes(X, Y)
    passes.thread_budget = plan.resources.thread_budget
    if plan.persist:
        passes.persist()
    logger.info("%s; %d blocks, %d engine thread(s) per task", plan.describe(), passes.n_blocks,
                passes.thread_budget)
    return passes
