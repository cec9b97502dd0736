"""Wall time of a fit on W Dask workers, from costs measured on one (pure arithmetic).

A fit is a serial part on the client (the centers, the preconditioner's
factorisations, CG's M-sized vector work) plus passes over the row blocks. Each
pass ``p`` over ``n`` rows in ``B`` blocks costs ``r_p`` core-seconds per row in
its block tasks, and the scheduler adds ``o_task`` seconds per task (it
dispatches them one after another) and ``o_pass`` per pass (the reduction tree
and the round trip to the client). On ``W`` workers of ``T`` threads whose hosts
have ``C`` cores, ``S = W T`` tasks run at once, each on ``k`` engine threads, on
``c = min(S k, C)`` busy cores, each core at the hardware's parallel efficiency
``e(c)`` (the throughput of ``c`` single-threaded copies of the engine over ``c``
times one copy's, which memory bandwidth and the VM's neighbours set)::

    blocks(W)  = max(B_store, BLOCKS_PER_SLOT * S)            # daskkrr.parallel.strategies.balance_blocks
    task_s     = (n / blocks) r_p * max(1, S k / C) / (k e(c))
    pass_s(W)  = ceil(blocks / S) task_s + blocks o_task + o_pass
    fit_s(W)   = serial_s + sum over passes of pass_s(W)

:func:`profile_from_run` derives ``r_p`` and ``serial_s`` from a one-worker,
one-thread fit (its pass and stage times, from the fit's events), and
:func:`predict` evaluates the formula for any ``W``;
``workflows/benchmarks/workers_scaling.py`` measures ``e``, ``o_task`` and
``o_pass``, validates the prediction at 2 and 4 workers and prints the plan for
16 and 64. The model ignores the network (the only data a pass moves are M-sized
vectors and the block reads, local on each worker) and assumes the blocks are
equal in cost.

One kind of pass does not grow with ``n``: the preconditioner's sketch summed on the
workers (:mod:`daskkrr.parallel.sketch_pass`) does the same work, ``s`` sketch rows,
whatever the number of rows, split among the blocks (:data:`FIXED_WORK_PASSES`). Its
``M x M`` partial sums, one per block, are counted in its work, which is right at the
measured number of blocks and low above it (they add ``M^2`` writes and additions a
block, and the reduction tree moves ``M^2`` floats per edge, which over a network
this model does not see).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from daskkrr.parallel.cost import BLOCKS_PER_SLOT

#: Passes whose total work does not grow with the rows (see the module docstring).
FIXED_WORK_PASSES = frozenset({"sketch"})


@dataclasses.dataclass(frozen=True)
class Overheads:
    """The scheduler's costs and the hardware's parallel efficiency (measured)."""

    #: Seconds the scheduler adds per task.
    task_s: float
    #: Seconds a pass adds beyond its tasks (reduction tree, round trip to the client).
    pass_s: float
    #: ``e(k)`` for ``k`` busy cores (``e(1) = 1``); cores beyond the largest measured ``k`` take its value.
    efficiency: Mapping[int, float] = dataclasses.field(default_factory=lambda: {1: 1.0})

    def efficiency_at(self, cores: int) -> float:
        known = sorted(k for k in self.efficiency if k <= cores)
        return float(self.efficiency[known[-1]]) if known else 1.0


@dataclasses.dataclass(frozen=True)
class FitProfile:
    """One fit's costs: its serial seconds, and per pass the core-seconds per row and the count."""

    n: int
    serial_s: float
    #: ``{pass name: (core-seconds per row, number of such passes)}``.
    passes: Mapping[str, tuple[float, int]]
    store_blocks: int
    #: Passes whose work stays that of ``n`` rows at any size (:data:`FIXED_WORK_PASSES`).
    fixed: frozenset[str] = frozenset()


def profile_from_run(n: int, fit_s: float, pass_s: Mapping[str, float], pass_count: Mapping[str, int],
                     blocks: int, overheads: Overheads) -> FitProfile:
    """The profile of a fit measured on one worker with one thread (``S = 1``, ``e = 1``).

    ``pass_s`` holds the wall seconds spent in each kind of pass (all of its
    occurrences), ``pass_count`` how many there were, ``blocks`` the blocks per pass.
    """
    per_row = {}
    for name, seconds in pass_s.items():
        count = max(1, int(pass_count.get(name, 1)))
        work = seconds - count * (blocks * overheads.task_s + overheads.pass_s)
        per_row[name] = (max(work, 0.0) / count / n, count)
    return FitProfile(n=n, serial_s=max(0.0, fit_s - sum(pass_s.values())), passes=per_row, store_blocks=blocks,
                      fixed=frozenset(FIXED_WORK_PASSES & set(per_row)))


def predict(profile: FitProfile, overheads: Overheads, workers: int, threads_per_worker: int = 1,
            engine_threads: int = 1, cores: int | None = None, n: int | None = None) -> dict[str, float]:
    """Predicted wall seconds of the fit on ``workers`` workers (total and per part).

    ``engine_threads``: threads each block task's engine runs on. ``cores``: the
    cores of all hosts together (None: enough for every thread). ``n``: rows, to
    scale the profile to another size (same ``d`` and ``M``; the serial part is kept).
    """
    slots = max(1, workers * threads_per_worker)
    k = max(1, engine_threads)
    cores = slots * k if cores is None else max(1, cores)
    rows = profile.n if n is None else n
    blocks = max(round(profile.store_blocks * rows / profile.n), BLOCKS_PER_SLOT * slots, 1)
    busy = min(slots * k, cores)
    slowdown = max(1.0, slots * k / cores) / (k * overheads.efficiency_at(busy))
    out = {"serial_s": profile.serial_s}
    for name, (row_s, count) in profile.passes.items():
        work_rows = profile.n if name in profile.fixed else rows
        task_s = work_rows / blocks * row_s * slowdown
        out[f"{name}_s"] = count * (math.ceil(blocks / slots) * task_s + blocks * overheads.task_s + overheads.pass_s)
    out["fit_s"] = sum(out.values())
    out["blocks"] = blocks
    return out
