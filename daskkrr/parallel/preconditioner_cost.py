"""The cost model that sizes the preconditioner's row sketch (pure arithmetic, no Dask).

``preconditioner_rows="auto"`` takes the sketch size ``s`` (0: FALKON's own
preconditioner, from the centers) that minimises the expected time of the fit to
the tolerance, among :func:`sketch_candidates`::

    total(s) = preconditioner(s) + solve(I(s))

``preconditioner(s)``, on the client (or with the sketch summed on the workers, below):

- the kernel rows of the sketch, ``s M`` entries at the engine's rate, plus one
  pass over the data to gather the ``s`` rows (a read, when not in memory);
- the sketch Gram, ``2 s M^2`` flops (a triangular solve and a rank-k update,
  :func:`daskkrr.solvers.falkon.sketch_gram`) at the GEMM rate of its precision
  (float32 for a float32 fit: twice the float64 rate);
- what every candidate pays: ``T T^T`` (``M^3 / 3`` flops, LAPACK ``lauum`` at the GEMM
  rate) and the two Cholesky factorisations (``M^3 / 3`` flops each, at
  :data:`CHOLESKY_GEMM_FRACTION` of the GEMM rate), in float64, or in float32 where the
  fit factors in float32 (:func:`daskkrr.solvers.falkon.factor_precision`).

``solve(I)`` is the strategy cost of :mod:`daskkrr.parallel.cost` (the cheapest
feasible strategy for ``strategy="auto"``, else the one asked for) plus ``I``
times the client's own work per iteration (:func:`client_iteration_seconds`: the
four triangular solves of the preconditioner, memory-bound, and the bookkeeping
of an iteration), with ``I`` expected CG iterations, ``I(s) = min(max_iter, log(tol) / log(f(s)))``
(:func:`~daskkrr.parallel.cost.expected_iterations`), where the residual falls by
``f(s)`` per iteration (:func:`convergence_factor`). With a fixed iteration
budget (``tol`` too small to stop CG before ``max_iter``, for every candidate)
the sketch saves nothing and FALKON's own preconditioner wins; with the "gram"
strategy an iteration costs only ``M^2`` flops on the client, so it wins as well.
Ties go to the fewest rows.

Where the sketch is summed: on the client, as above, or on the workers
(:mod:`daskkrr.parallel.sketch_pass`: each row block sums its own sketch rows, the
``M x M`` partial sums add along a tree). There the kernel rows and the ``2 s M^2``
flops run on the workers' cores, and each block also writes one ``M x M`` float64
partial sum, which the tree adds and the client receives once
(:func:`worker_sketch_overhead_seconds`). It needs about ``(4 + split_every) M^2``
float64 per worker. For each sketch size the cheaper place is taken (ties: the
client), or the one ``on`` asks for.

Rates: the per-core GEMM rates of :data:`~daskkrr.parallel.cost.DEFAULT_RATES`
(60 and 30 GFlop/s in float32 and float64, measured by
``workflows/benchmarks/engine_throughput.py`` on the 2-core development
machine), times the cores of the process that builds the preconditioner, the
client (``Budget.client_cores``); the gathering pass and CG's passes run on the
workers' cores together (``Budget.cores``). On a cluster the two differ: a
sketch Gram priced at the workers' rate would look 30x cheaper than it is on a
64-core cluster driven from a 2-core client, and the model would take sketches
whose serial Gram outweighs the iterations they save.

Measured again on the development machine (two cores, shared with another job):
``strsm`` / ``ssyrk`` with 1024 right-hand sides at M = 5000 ran at 120 / 139 GFlop/s,
``dtrsm`` / ``dsyrk`` at 55 / 74, ``sgemm`` / ``dgemm`` at 147 / 72; a single-threaded
``dpotrf`` at 0.54-0.68 of a single-threaded ``dgemm`` (at M = 2000 and 4000; OpenBLAS's
threaded one was slower on the busy machine). They are constants, not a measurement at
fit time: a timing on a shared machine moves by 2x from one second to the next, and the
same data and parameters must give the same model.

Checked by ``workflows/benchmarks/sketch_cost.py`` (n = 1e5, d = 20, float32, penalty
1e-6, the machine busy with another job): at M = 5000, ``max_iter=20``, ``tol=1e-4`` the
model takes FALKON's own (expected 13.0 s, ``4 M`` rows 21.0 s) and the fit took 0.72x
the time of the previous default (``4 M`` rows, float64) at the same test error; at
M = 2000, ``max_iter=100``, ``tol=1e-4`` it takes ``8 M`` rows (10 iterations) and the fit
took 0.80x the previous default's time (15 iterations) and 0.72x FALKON's own (61). The
expected seconds were about 2.5x below the measured ones on the busy machine: the
estimates rank the candidates, they do not predict the wall time.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from daskkrr.parallel.cost import (
    BLOCKS_PER_SLOT,
    DEFAULT_RATES,
    TYPICAL_CONVERGENCE_FACTOR,
    Budget,
    Problem,
    Rates,
    choose_strategy,
    estimate,
    expected_iterations,
)
from daskkrr.solvers.falkon import factor_precision

#: Where a sketch's Gram can be summed (see :mod:`daskkrr.parallel.sketch_pass`).
SKETCH_PLACES = ("client", "workers")
#: Sketch sizes ``r M`` weighed by ``preconditioner_rows="auto"`` (besides none), at most ``n``.
SKETCH_ROWS_PER_CENTER = (2, 4, 8, 16)
#: ``-log f`` grows as ``(1 + s / M)`` to this power (see :func:`convergence_factor`).
CONVERGENCE_EXPONENT = 0.65
#: Rate of a Cholesky factorisation as a share of the float64 GEMM rate.
CHOLESKY_GEMM_FRACTION = 0.5
#: Seconds of bookkeeping per CG iteration on the client (events, vector updates, submitting a
#: pass): about 8 ms per iteration in a fit with the "gram" strategy at M = 300 on the development
#: machine, where the products themselves take microseconds.
ITERATION_OVERHEAD_S = 5e-3


def sketch_candidates(n: int, n_centers: int) -> tuple[int, ...]:
    """Sketch sizes to weigh: 0 (FALKON's own) and ``r M`` for ``r`` in :data:`SKETCH_ROWS_PER_CENTER`,
    each at most ``n`` (duplicates dropped), in increasing order."""
    rows = {min(int(n), r * int(n_centers)) for r in SKETCH_ROWS_PER_CENTER}
    return (0,) + tuple(sorted(r for r in rows if r > 0))


def convergence_factor(rows: int, n_centers: int) -> float:
    """Expected factor by which CG's relative residual falls per iteration with ``rows`` sketch rows.

    ``f(s) = 0.8 ** ((1 + s / M) ** 0.65)``: FALKON's own preconditioner (``s = 0``)
    has :data:`~daskkrr.parallel.cost.TYPICAL_CONVERGENCE_FACTOR` (0.8), and the
    sketch's ``A`` is built from ``M + s`` rows. Fitted to the residual 1e-3 on the
    synthetic benchmark (d = 20, penalty 1e-6): FALKON's own 36 iterations (n = 1e5,
    M = 2000), ``s = 2 M`` 21, ``4 M`` 11, ``8 M`` 7, and ``16 M`` 6 at n = 1e6,
    M = 1000 (measured 0.72, 0.53, 0.37, 0.32 per iteration; the fit gives 0.63,
    0.53, 0.40, 0.25).
    """
    ratio = 1.0 + max(0, int(rows)) / max(1, int(n_centers))
    return float(TYPICAL_CONVERGENCE_FACTOR ** (ratio ** CONVERGENCE_EXPONENT))


def preconditioner_seconds(rows: int, problem: Problem, budget: Budget, sketch_itemsize: int,
                           rates: Rates = DEFAULT_RATES, on: str = "client") -> float:
    """Expected seconds to build the preconditioner from ``rows`` sketch rows (see the module docstring).

    The factorisations run on the client, on ``budget.preconditioner_cores``; the pass
    over the data reads it on the workers' ``budget.cores``; the sketch's kernel rows and
    Gram run on the client's cores (``on="client"``) or the workers' (``on="workers"``).
    """
    if on not in SKETCH_PLACES:
        raise ValueError(f"the sketch is summed on one of {SKETCH_PLACES}; got {on!r}")
    M = float(problem.n_centers)
    cores = budget.preconditioner_cores
    single = factor_precision(np.float32 if problem.itemsize == 4 else np.float64, problem.n_centers) == "float32"
    gemm_factor = rates.gemm_flops[0 if single else 1] * cores
    gemm_sketch = rates.gemm_flops[0 if sketch_itemsize == 4 else 1] * cores
    fixed = (M ** 3 / 3) / gemm_factor + 2 * (M ** 3 / 3) / (CHOLESKY_GEMM_FRACTION * gemm_factor)
    fixed += M * M * rates.entry_s(problem.d, 8) / cores  # K_MM, float64
    if rows <= 0:
        return fixed
    worker_cores = max(1, budget.cores)
    gather = 0.0 if problem.in_memory else problem.n * problem.d * problem.itemsize / (rates.read_bytes_per_s
                                                                                         * worker_cores)
    where = cores
    if on == "workers":
        where = worker_cores
        gemm_sketch *= worker_cores / cores
        fixed += worker_sketch_overhead_seconds(problem, budget, rates)
    entries = rows * M * rates.entry_s(problem.d, problem.itemsize) / where
    return fixed + gather + entries + 2.0 * rows * M * M / gemm_sketch


def worker_sketch_overhead_seconds(problem: Problem, budget: Budget, rates: Rates = DEFAULT_RATES) -> float:
    """Seconds the workers' sketch spends on moving and adding ``M x M`` matrices.

    - every block (about :data:`~daskkrr.parallel.cost.BLOCKS_PER_SLOT` per core)
      writes its partial sum into fresh memory, and the tree adds them, the workers'
      cores together;
    - ``T`` reaches every worker, the workers passing it on (``log2 W`` rounds), and
      each level of the reduction tree brings ``split_every`` partial sums to one
      worker, at :attr:`~daskkrr.parallel.cost.Rates.network_bytes_per_s`;
    - the client receives the total and adds it once.
    """
    size = 8.0 * problem.n_centers ** 2
    cores = max(1, budget.cores)
    blocks = BLOCKS_PER_SLOT * cores
    memory = blocks * size * (1 / rates.touch_bytes_per_s + 3 / rates.stream_bytes_per_s) / cores
    return memory + worker_sketch_network_seconds(problem, budget, blocks, rates) + 3 * size / rates.stream_bytes_per_s


def worker_sketch_network_seconds(problem: Problem, budget: Budget, blocks: int,
                                  rates: Rates = DEFAULT_RATES) -> float:
    """The network part of :func:`worker_sketch_overhead_seconds`: ``T`` to the ``W`` workers
    (``log2 W`` rounds), ``split_every`` partial sums into one worker per level of the
    reduction tree over ``blocks``, and the total to the client, ``M x M`` float64 each."""
    size = 8.0 * problem.n_centers ** 2
    fan_in = max(2, problem.split_every)
    levels = max(1, math.ceil(math.log(blocks) / math.log(fan_in))) if blocks > 1 else 0
    spread = math.ceil(math.log2(budget.n_workers)) if budget.n_workers > 1 else 0
    return (spread + levels * fan_in + 1) * size / rates.network_bytes_per_s


def worker_sketch_fits(problem: Problem, budget: Budget, split_every: int | None = None) -> bool:
    """Whether a worker has room for the workers' sketch: ``T``, its partial sum, their float32
    copies and the reduction's ``split_every`` inputs, ``M x M`` each, in half its memory."""
    k = problem.split_every if split_every is None else split_every
    need = (4 + k) * 8.0 * problem.n_centers ** 2
    return budget.n_workers > 0 and need <= budget.worker_memory_bytes / 2


def client_iteration_seconds(problem: Problem, strategy: str, rates: Rates = DEFAULT_RATES) -> float:
    """The client's seconds per CG iteration beyond the strategy's products.

    Applying the preconditioner is four triangular solves with ``T`` and ``A``
    (``M^2 / 2`` float64 entries read each, memory-bound with a few targets); the
    "gram" strategy's product on the client reads ``G`` and multiplies by ``T`` and
    ``T^T`` as well (as many bytes again).
    """
    M = float(problem.n_centers)
    read = 4 * (M * M / 2) * 8 * (2 if strategy == "gram" else 1)
    return ITERATION_OVERHEAD_S + read / rates.stream_bytes_per_s


@dataclasses.dataclass(frozen=True)
class SketchCost:
    """Expected time of a fit with ``rows`` sketch rows: preconditioner, then ``iterations`` CG steps."""

    rows: int
    iterations: int
    strategy: str
    preconditioner_s: float
    solve_s: float
    #: Where the sketch is summed: "client" or "workers" (see the module docstring).
    on: str = "client"

    @property
    def seconds(self) -> float:
        return self.preconditioner_s + self.solve_s

    def as_dict(self) -> dict[str, int | float | str]:
        """JSON-able record (what the fitted model keeps in ``preconditioner_costs_``)."""
        return {"rows": int(self.rows), "iterations": int(self.iterations), "strategy": self.strategy,
                "preconditioner_s": float(self.preconditioner_s), "solve_s": float(self.solve_s),
                "seconds": float(self.seconds), "on": self.on}


def sketch_cost(rows: int, problem: Problem, budget: Budget, *, max_iter: int, tol: float | None,
                strategy: str = "auto", sketch_itemsize: int = 8, rates: Rates = DEFAULT_RATES,
                on: str = "auto") -> SketchCost:
    """Expected time of the fit with ``rows`` sketch rows (``problem.iterations`` is ignored), its
    sketch summed ``on`` the client, the workers, or (``"auto"``) the cheaper of the two."""
    its = expected_iterations(max_iter, tol, convergence_factor(rows, problem.n_centers))
    sized = dataclasses.replace(problem, iterations=its)
    if strategy == "auto":
        name, costs = choose_strategy(sized, budget, rates)
    else:
        name, costs = strategy, estimate(sized, budget, rates)
    solve = costs[name].seconds + its * client_iteration_seconds(sized, name, rates)
    if on not in ("auto", *SKETCH_PLACES):
        raise ValueError(f"on must be 'auto' or one of {SKETCH_PLACES}; got {on!r}")
    if rows <= 0 or on == "client":
        places = ["client"]  # FALKON's own has no sketch to place
    elif on == "workers":
        places = ["workers"]
    else:
        places = ["client", "workers"] if worker_sketch_fits(problem, budget) else ["client"]
    built = {w: preconditioner_seconds(rows, problem, budget, sketch_itemsize, rates, on=w) for w in places}
    where = min(places, key=lambda w: round(built[w], 9))  # ties: the first, the client
    return SketchCost(int(rows), its, name, built[where], solve, on=where)


def choose_sketch_rows(problem: Problem, budget: Budget, *, max_iter: int, tol: float | None,
                       strategy: str = "auto", sketch_itemsize: int = 8, rates: Rates = DEFAULT_RATES,
                       candidates: tuple[int, ...] | None = None, on: str = "auto") -> tuple[int, list[SketchCost]]:
    """The sketch size of least expected time to the tolerance, and the cost of every candidate
    (each summed where it is cheaper, or ``on`` the place asked for).

    ``candidates`` defaults to :func:`sketch_candidates`; ties go to the fewest rows.
    """
    rows = sketch_candidates(problem.n, problem.n_centers) if candidates is None else tuple(candidates)
    costs = [sketch_cost(r, problem, budget, max_iter=max_iter, tol=tol, strategy=strategy,
                         sketch_itemsize=sketch_itemsize, rates=rates, on=on) for r in rows]
    best = min(costs, key=lambda c: (round(c.seconds, 9), c.rows))
    return best.rows, costs
