"""Where FALKON's ``M x M`` factorisations run: dense on the client, or tiled (pure arithmetic).

The dense route (:class:`~daskkrr.solvers.FalkonPreconditioner`) holds its ``M x M``
matrices in the client process: ``K_MM`` factored in place into ``T``, the inner matrix
factored in place into ``A``, and a working copy (the kept float64 ``D K_MM D`` of float32
factors, or ``K_MM`` before its in-place factorisation): :data:`DENSE_FACTOR_MATRICES`
float64 matrices, ``3 x 8 M^2`` bytes, 2.4 GB at M = 10 000 and 60 GB at M = 50 000.

The tiled route (:class:`~daskkrr.parallel.tiled_falkon.TiledFalkonPreconditioner`) holds
the upper triangles of ``T`` and ``A`` (and, while ``A`` is factored, of the inner matrix)
as ``b x b`` tiles: ``3 x M^2 / 2`` entries of the factors' precision across the workers, and
at most a few tiles per task. With float32 factors the inner matrix's place is then taken by
``D K_MM D`` in float64 tiles (the penalty term's, as the dense route keeps it): ``T``, ``A`` and
twice a float32 triangle, :data:`TILED_FLOAT32_UNITS` float32 triangles. Its tiles stay in the
workers' memory when they fit in :data:`TILE_MEMORY_FRACTION` of it (and of ``memory_budget``),
else they are spilled to a Zarr store on disk; spilled, the kernel tiles are not stored but
recomputed in each CG iteration (:mod:`daskkrr.parallel.tiled_falkon`), so the disk holds
:data:`TILED_MATRICES` triangles (:func:`spilled_bytes`).

``preconditioner_route="auto"`` takes the dense route whenever its matrices fit in
:data:`CLIENT_MEMORY_FRACTION` of the client's memory budget (the memory available to this
process, or ``memory_budget``): it is the faster one on one machine (one LAPACK call per
factorisation, no task overheads, no spill), and it is today's route, so fits that fit keep
their speed. Only when the client cannot hold it is the tiled route taken, and the fitted
model says why (``preconditioner_route_``).

Seconds (for the record; the choice is by memory): ``M^3`` flops in all (two Cholesky
factorisations and ``T T^T``, ``M^3 / 3`` each) at the GEMM rate of the factors' precision,
on the client's cores (dense) or the workers' (tiled), plus for the tiled route
:data:`TASK_OVERHEAD_S` per tile task and, when spilled, each tile task's reads and writes
at the Zarr rate of :data:`~daskkrr.parallel.cost.DEFAULT_RATES`.
"""

from __future__ import annotations

import dataclasses

from daskkrr.parallel.cost import DEFAULT_RATES, Budget, Rates

#: The estimator parameter's values.
ROUTE_CHOICES = ("auto", "dense", "tiled")
#: float64 ``M x M`` matrices the dense route holds on the client at once (see the module docstring).
DENSE_FACTOR_MATRICES = 3
#: Largest share of the client's memory budget the dense route's matrices may take (the rest is the
#: fit's other work: the sketch, the CG vectors, Dask).
CLIENT_MEMORY_FRACTION = 0.5
#: Triangular tile matrices the tiled route holds at once: ``T``, the inner matrix and ``A``.
TILED_MATRICES = 3
#: Float32 triangles held with float32 factors once ``A`` is factored: ``T``, ``A`` and the float64 kernel tiles.
TILED_FLOAT32_UNITS = 4
#: Largest share of the workers' memory (and of ``memory_budget``) the kept tiles may take; beyond it
#: they are spilled to Zarr.
TILE_MEMORY_FRACTION = 0.5
#: Rows of a tile: a float32 tile is 16 MiB, large enough that a task's BLAS call outweighs its
#: scheduling (about 1 ms a task), small enough that a worker holds a few at a time.
TILE_ROWS = 2048
#: Seconds of scheduling per tile task.
TASK_OVERHEAD_S = 1e-3


@dataclasses.dataclass(frozen=True)
class FactorPlan:
    """What :func:`plan_factor` decided and why.

    Attributes
    ----------
    route : str
        "dense" (the client) or "tiled".
    storage : str
        "client" (dense), "memory" (tiles in the workers' memory) or "zarr" (tiles spilled to disk).
    tile : int
        Rows of a tile (0 for the dense route).
    dense_bytes, tiled_bytes : int
        Memory of the dense route's matrices (one process) and of the tiled route's tiles (all workers).
    client_bytes, worker_bytes : int
        The client's memory budget, and the workers' memory the tiles may use.
    dense_s, tiled_s : float
        Expected seconds of the factorisations on each route.
    reason : str
        The choice in words.
    """

    route: str
    storage: str
    tile: int
    dense_bytes: int
    tiled_bytes: int
    client_bytes: int
    worker_bytes: int
    dense_s: float
    tiled_s: float
    reason: str

    def as_dict(self) -> dict[str, int | float | str]:
        """JSON-able record (the fitted model's ``preconditioner_route_``)."""
        return dataclasses.asdict(self)


def dense_bytes(n_centers: int) -> int:
    """Bytes of the dense route's ``M x M`` matrices in the client process."""
    return DENSE_FACTOR_MATRICES * int(n_centers) ** 2 * 8


def tiled_bytes(n_centers: int, tile: int, itemsize: int) -> int:
    """Bytes of the tiled route's triangular tile matrices, all workers together (the most held at once)."""
    from daskkrr.parallel.tiled_linalg import triangle_bytes

    units = TILED_FLOAT32_UNITS if itemsize == 4 else TILED_MATRICES
    return units * triangle_bytes(n_centers, tile, itemsize)


def spilled_bytes(n_centers: int, tile: int, itemsize: int) -> int:
    """Bytes of the tiles a spilled tiled route writes to disk: ``T``, the inner matrix and ``A`` (the kernel
    tiles of float32 factors are recomputed, not spilled)."""
    from daskkrr.parallel.tiled_linalg import triangle_bytes

    return TILED_MATRICES * triangle_bytes(n_centers, tile, itemsize)


def plan_factor(n_centers: int, factor_itemsize: int, budget: Budget, *, route: str = "auto",
                client_memory: int, memory_budget: int | None = None, tile: int | None = None,
                rates: Rates = DEFAULT_RATES) -> FactorPlan:
    """Dense or tiled, and where the tiles live (see the module docstring).

    ``client_memory`` is the memory available to the client process; ``memory_budget`` (the
    estimator's parameter, None: not set) caps it and the workers' memory for the tiles.
    """
    if route not in ROUTE_CHOICES:
        raise ValueError(f"preconditioner_route must be one of {ROUTE_CHOICES}; got {route!r}")
    M = int(n_centers)
    cap = float("inf") if memory_budget is None else float(memory_budget)
    client = int(min(client_memory, cap))
    workers = int(min(TILE_MEMORY_FRACTION * budget.memory_bytes, TILE_MEMORY_FRACTION * cap))
    rows = max(1, min(int(tile or TILE_ROWS), M))
    dense, tiled = dense_bytes(M), tiled_bytes(M, rows, factor_itemsize)
    gemm = rates.gemm_flops[0 if factor_itemsize == 4 else 1]
    flops = float(M) ** 3
    dense_s = flops / (gemm * budget.preconditioner_cores)
    nb = -(-M // rows)
    tasks = nb**3 / 2 + nb**2  # two Cholesky factorisations and T T^T: about nb^3 / 6 tile tasks each
    spill = tiled > workers
    io_s = (3 * tasks * rows * rows * factor_itemsize / rates.read_bytes_per_s) if spill else 0.0
    tiled_s = flops / (gemm * max(1, budget.cores)) + tasks * TASK_OVERHEAD_S + io_s / max(1, budget.cores)
    fits = dense <= CLIENT_MEMORY_FRACTION * client
    need = f"the dense factors need {dense / 2**30:.3g} GiB on the client"
    have = f"{CLIENT_MEMORY_FRACTION:.0%} of its memory budget is {CLIENT_MEMORY_FRACTION * client / 2**30:.3g} GiB"
    if route == "dense" or (route == "auto" and fits):
        reason = (f"dense: asked for; {need}" if route == "dense" else f"dense: {need}, within {have}")
        return FactorPlan("dense", "client", 0, dense, tiled, client, workers, dense_s, tiled_s, reason)
    disk = spilled_bytes(M, rows, factor_itemsize)
    where = (f"spilled to Zarr (the tiles need {tiled / 2**30:.3g} GiB, the workers may hold "
             f"{workers / 2**30:.3g} GiB; {disk / 2**30:.3g} GiB on disk)" if spill else
             f"in the workers' memory ({tiled / 2**30:.3g} GiB of {workers / 2**30:.3g} GiB)")
    why = "asked for" if route == "tiled" else f"{need}, more than {have}"
    reason = f"tiled ({rows} x {rows} tiles) {where}: {why}"
    return FactorPlan("tiled", "zarr" if spill else "memory", rows, dense, tiled, client, workers, dense_s, tiled_s,
                      reason)
