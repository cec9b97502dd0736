"""The cost model that picks a solver strategy (pure arithmetic, no Dask).

Three ways to give FALKON's CG its products ``K_nM^T K_nM u``:

``recompute``
    Every iteration recomputes each block's ``k(X_b, Z)`` (fused, never stored).
    Passes over the data: ``1 + I`` (rhs, then one per iteration). Memory: a
    tile per task. Works for any ``n`` and ``M``.
``cache``
    One pass computes every ``K_b = k(X_b, Z)`` and keeps it in worker memory;
    an iteration is then two matrix-vector products per block, reading each
    stored row once. Memory: ``n M itemsize`` across the workers.
``gram``
    One pass accumulates ``G = K_nM^T K_nM`` and ``K_nM^T y`` (``M x M``
    partials, tree-summed); CG then iterates on the client with ``G u``.
    Cost: ``2 n M^2`` flops of GEMM, independent of the number of iterations.
    Memory: ``M^2`` float64 per task and on the client.

Estimated time, in core-seconds, with ``E = n M`` kernel entries, ``I`` CG
iterations (:func:`expected_iterations`: ``max_iter``, or fewer when ``tol`` stops
CG earlier at the rate of FALKON's residual, which the row sketch speeds up:
:mod:`daskkrr.parallel.preconditioner_cost` also chooses the sketch's size by
these costs), and per-core rates from
``workflows/benchmarks/engine_throughput.py`` on the 2-core development machine
(:data:`DEFAULT_RATES`)::

    entry(d)   = entry_base + 2 d / gemm_flops           # one fused kernel entry
    read       = n d itemsize / read_bytes_per_s         # one pass over Zarr (0 if in memory)
    recompute  = (1 + I) (E entry(d) + read)
    cache      = E entry(d) + read + E itemsize / touch_bytes_per_s + I E itemsize / stream_bytes_per_s
    gram       = E (entry(d) + 2 M / gemm_flops_float64) + read

``cache`` is feasible when ``n M itemsize`` is at most :data:`CACHE_MEMORY_FRACTION`
of the workers' memory, or at most :data:`CACHE_LARGE_MEMORY_FRACTION` of it where
recomputing would cost :data:`CACHE_LARGE_SAVING` times as much (many features: at
``d = 784`` a kernel entry costs 30 times its read back; Fashion-MNIST at n = 60 000,
M = 10 000 in float64 needs 4.5 GiB of blocks, refused by the 1/8 of a 24 GB machine,
and its recompute is estimated at 17 times the cache's), ``gram`` when a task's partials
(``(split_every + 1) M (M + t) 8`` bytes) fit in :data:`GRAM_MEMORY_FRACTION` of
one worker's memory and the client can hold a few ``M x M`` matrices. The
cheapest feasible strategy wins, except that ``cache``, which holds ``n M``
entries, must be :data:`CACHE_MARGIN` times cheaper than the best other one;
ties go to the one holding the least memory (recompute, gram, cache). The
estimates need to be right only in ratio: the three costs share ``E entry(d)``.

Persisting the row blocks (``X`` and ``y``) in worker memory saves the reads of
the passes after the first; it is done when the strategy makes more than one
pass over them and they take at most :data:`PERSIST_MEMORY_FRACTION` of the
workers' memory. Reading and decompressing Zarr costs 5-10% of a pass at
``M = 2000``, ``d = 20`` (measured by ``workflows/benchmarks/scaling_zarr.py``),
so the budget is small: persisting would gain little and a large persisted array
would crowd the tasks' working memory; larger data are streamed.
"""

from __future__ import annotations

import dataclasses
import math

STRATEGIES = ("recompute", "cache", "gram")
#: The estimator parameter's values.
STRATEGY_CHOICES = ("auto",) + STRATEGIES

#: Largest share of the workers' memory the cached kernel blocks may take. Large caches
#: did not pay on the development machine: at n = 1e6, M = 1000 (4 GB of float32 blocks)
#: the cache fit took 35 s against 27 s recomputing (first touches of fresh memory are slow
#: in its VM, and memory bandwidth is shared); at n = 1e5, M = 2000 (0.8 GB) it was 1.8x faster.
CACHE_MEMORY_FRACTION = 1 / 8
#: Largest share of one worker's memory the Gram partials of a task may take.
GRAM_MEMORY_FRACTION = 0.25
#: Largest share of the workers' memory persisted row blocks may take.
PERSIST_MEMORY_FRACTION = 1 / 32
#: The cache strategy must be estimated this many times cheaper than the best other one.
CACHE_MARGIN = 1.25
#: Largest share of the workers' memory the cached blocks may take where recomputing them costs
#: :data:`CACHE_LARGE_SAVING` times as much as the cache (see the module docstring): the rest of the
#: memory still holds the dense preconditioner's ``M x M`` matrices (half the client's, at most).
CACHE_LARGE_MEMORY_FRACTION = 1 / 4
#: Estimated recompute-to-cache time ratio from which the cache may take :data:`CACHE_LARGE_MEMORY_FRACTION`.
#: The slow large caches of the development machine (35 s against 27 s recomputing, d = 20) were
#: estimated at a ratio of 1.3; at d = 784 the ratio is 17.
CACHE_LARGE_SAVING = 4.0


@dataclasses.dataclass(frozen=True)
class Rates:
    """Per-core throughputs of the block engine (float32, float64 where they differ)."""

    #: Seconds per fused kernel entry, beyond the distance GEMM (kernel function + products).
    entry_base_s: tuple[float, float] = (0.9e-9, 1.4e-9)
    #: GEMM flop/s of one core.
    gemm_flops: tuple[float, float] = (60e9, 30e9)
    #: Bytes/s one core streams through a stored kernel block (two cores together read about
    #: 10 GB/s of cached blocks in a fit on the development machine).
    stream_bytes_per_s: float = 5e9
    #: Bytes/s one core reads and decompresses from Zarr.
    read_bytes_per_s: float = 4e8
    #: Bytes/s of fresh memory written for the first time (page faults). A fresh process on
    #: the development machine's VM touches new memory at 0.4 GB/s, later reuse at 5-9 GB/s.
    touch_bytes_per_s: float = 5e8
    #: Bytes/s between two machines of a cluster (10 Gbit/s Ethernet; not measured here: a local
    #: cluster's loopback is faster, which only makes the estimates that use it conservative).
    network_bytes_per_s: float = 1.25e9

    def _pick(self, pair: tuple[float, float], itemsize: int) -> float:
        return pair[0] if itemsize == 4 else pair[1]

    def entry_s(self, d: int, itemsize: int) -> float:
        """Seconds per kernel entry on one core at ``d`` features."""
        return self._pick(self.entry_base_s, itemsize) + 2.0 * d / self._pick(self.gemm_flops, itemsize)


DEFAULT_RATES = Rates()

#: Typical factor by which FALKON's relative residual falls per CG iteration with its own
#: preconditioner (0.79 on the synthetic benchmarks of workflows/benchmarks/fit_vs_sklearn.py:
#: 1e-2 after 20 iterations).
TYPICAL_CONVERGENCE_FACTOR = 0.8
# With the row-sketch preconditioner (daskkrr.solvers.sketch) the factor falls with the rows
# per center (1e-3 after 11 iterations at n = 1e5, M = 2000, s = 4 M; after 6 at n = 1e6,
# M = 1000, s = 16 M): daskkrr.parallel.preconditioner_cost.convergence_factor.


def expected_iterations(max_iter: int, tol: float | None = None,
                        factor: float = TYPICAL_CONVERGENCE_FACTOR) -> int:
    """CG iterations to expect: ``max_iter``, or ``log(tol) / log(factor)`` if that is fewer."""
    max_iter = max(1, int(max_iter))
    if tol is None or not 0 < tol < 1:
        return max_iter
    return max(1, min(max_iter, math.ceil(math.log(tol) / math.log(factor))))


#: Blocks per task slot that balancing aims at (so no core idles at the end of a pass;
#: :func:`daskkrr.parallel.strategies.balance_blocks`).
BLOCKS_PER_SLOT = 2


@dataclasses.dataclass(frozen=True)
class Problem:
    """The size of a fit."""

    n: int
    d: int
    n_centers: int
    n_targets: int = 1
    itemsize: int = 8
    iterations: int = 20
    in_memory: bool = False
    split_every: int = 8


@dataclasses.dataclass(frozen=True)
class Budget:
    """Memory and cores available (see :func:`daskkrr.parallel.resources.cluster_resources`)."""

    cores: int
    memory_bytes: int
    n_workers: int = 0
    #: Cores of the client process, which builds the preconditioner (None: ``cores``, as when the
    #: threaded scheduler runs everything in this process). On a cluster they are the client
    #: host's, not the workers' together.
    client_cores: int | None = None

    @property
    def preconditioner_cores(self) -> int:
        return max(1, self.cores if self.client_cores is None else self.client_cores)

    @property
    def worker_memory_bytes(self) -> int:
        return self.memory_bytes // max(1, self.n_workers)


@dataclasses.dataclass(frozen=True)
class StrategyCost:
    """Estimated wall-clock seconds and memory of one strategy, and whether it fits."""

    name: str
    seconds: float
    memory_bytes: int
    feasible: bool
    reason: str = ""


def estimate(problem: Problem, budget: Budget, rates: Rates = DEFAULT_RATES) -> dict[str, StrategyCost]:
    """Cost of every strategy for ``problem`` on ``budget`` (see the module docstring)."""
    p = problem
    E = float(p.n) * p.n_centers
    entry = rates.entry_s(p.d, p.itemsize)
    read = 0.0 if p.in_memory else p.n * p.d * p.itemsize / rates.read_bytes_per_s
    cores = max(1, budget.cores)
    I = max(1, int(p.iterations))
    gemm = rates.gemm_flops[1]  # K^T K is a float64 GEMM whatever the data dtype

    cache_bytes = int(E * p.itemsize)
    gram_task_bytes = int((p.split_every + 1) * p.n_centers * (p.n_centers + p.n_targets) * 8)
    gram_client_bytes = int(4 * p.n_centers * p.n_centers * 8)

    recompute_s = (1 + I) * (E * entry + read) / cores
    cache_s = (E * entry + read + E * p.itemsize / rates.touch_bytes_per_s
               + I * E * p.itemsize / rates.stream_bytes_per_s) / cores
    cache_share = cache_fraction(recompute_s, cache_s)
    costs = {
        "recompute": StrategyCost("recompute", recompute_s, 0, True),
        "cache": StrategyCost(
            "cache", cache_s, cache_bytes,
            cache_bytes <= cache_share * budget.memory_bytes,
            f"kernel blocks need {cache_bytes / 2**20:.0f} MiB; "
            f"{cache_share:.0%} of the workers' memory is "
            f"{cache_share * budget.memory_bytes / 2**20:.0f} MiB",
        ),
        "gram": StrategyCost(
            "gram",
            (E * (entry + 2.0 * p.n_centers / gemm) + read) / cores,
            gram_task_bytes,
            gram_task_bytes <= GRAM_MEMORY_FRACTION * budget.worker_memory_bytes
            and gram_client_bytes <= GRAM_MEMORY_FRACTION * max(budget.worker_memory_bytes, 2**30),
            f"M x M partials need {gram_task_bytes / 2**20:.0f} MiB per task",
        ),
    }
    return costs


def cache_fraction(recompute_s: float, cache_s: float) -> float:
    """Share of the workers' memory the cached blocks may take: :data:`CACHE_MEMORY_FRACTION`, or
    :data:`CACHE_LARGE_MEMORY_FRACTION` where recomputing is estimated :data:`CACHE_LARGE_SAVING` times
    as slow as the cache (many features, many iterations)."""
    if cache_s > 0 and recompute_s >= CACHE_LARGE_SAVING * cache_s:
        return CACHE_LARGE_MEMORY_FRACTION
    return CACHE_MEMORY_FRACTION


def choose_strategy(
    problem: Problem, budget: Budget, rates: Rates = DEFAULT_RATES, exclude: tuple[str, ...] = ()
) -> tuple[str, dict[str, StrategyCost]]:
    """The cheapest feasible strategy and all estimates.

    ``cache`` must be :data:`CACHE_MARGIN` times cheaper than the others to win: it
    holds ``n M`` entries in memory, and the estimates are rough. Ties: recompute,
    then gram, then cache. Strategies in ``exclude`` are infeasible (with that reason).
    """
    costs = estimate(problem, budget, rates)
    for name in exclude:
        costs[name] = dataclasses.replace(costs[name], feasible=False,
                                          reason="the preconditioner is tiled: the client holds no M x M matrix")
    order = {"recompute": 0, "gram": 1, "cache": 2}
    feasible = [c for c in costs.values() if c.feasible]

    def key(c: StrategyCost) -> tuple[float, int]:
        return (round(c.seconds * (CACHE_MARGIN if c.name == "cache" else 1.0), 9), order[c.name])

    best = min(feasible, key=key)
    return best.name, costs


def should_persist(strategy: str, data_bytes: int, budget: Budget, in_memory: bool) -> bool:
    """Persist the row blocks when the strategy reads them more than once and they are small.

    ``recompute`` reads the data on every iteration; ``cache`` and ``gram`` read
    it once after the statistics pass, so persisting would only cost memory.
    """
    if in_memory or strategy != "recompute":
        return False
    return data_bytes <= PERSIST_MEMORY_FRACTION * budget.memory_bytes


def embedding_fits(n: int, width: int, budget: Budget, iterations: int = 2) -> bool:
    """Whether the ``n x width`` float64 Nystrom embedding of the unsupervised fits may be kept in
    the workers' memory: as the cache strategy, within :data:`CACHE_MEMORY_FRACTION` of it, and
    only when it is read more than once (Lloyd's iterations)."""
    return iterations > 1 and n * width * 8 <= CACHE_MEMORY_FRACTION * budget.memory_bytes
