"""What the cluster offers: task slots, cores and memory, and each block task's thread budget.

The thread rule (see :mod:`daskkrr.kernels.thread_rule`) is *Dask threads x engine
threads x BLAS threads <= cores* on every host. Dask's slots normally cover the
cores (one single-threaded worker per core, or the threaded scheduler's one
thread per core), so block tasks run the engine on one thread. When a host has
more cores than Dask threads, :func:`task_thread_budget` gives each task
``cores // dask threads`` engine threads, so a one-worker, one-thread cluster
still uses every core.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from daskkrr.utils.threads import available_cores

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Resources:
    """Where the block tasks run.

    Attributes
    ----------
    slots : int
        Block tasks that run at once (Dask threads in all).
    cores : int
        Cores on all hosts.
    memory_bytes : int
        Memory the tasks may use in all: the sum of the workers' memory limits,
        or the memory available to this process for the threaded scheduler.
    n_workers : int
        Worker processes (0 for the threaded scheduler).
    thread_budget : int
        Engine threads per block task.
    """

    slots: int
    cores: int
    memory_bytes: int
    n_workers: int
    thread_budget: int


def _available_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # pragma: no cover - psutil comes with distributed
        return 4 * 2**30


def cluster_workers(client: Any) -> dict[str, dict[str, Any]]:
    """Every worker of ``client``'s cluster: address -> the scheduler's info on it."""
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) else client.scheduler_info()
    return dict(info["workers"])


def cluster_resources(client: Any | None) -> Resources:
    """Slots, cores, memory and per-task thread budget of ``client`` (None: the threaded scheduler)."""
    if client is None:
        import dask

        cores = available_cores()
        slots = int(dask.config.get("num_workers", None) or cores)
        return Resources(slots=slots, cores=cores, memory_bytes=_available_memory(), n_workers=0,
                         thread_budget=max(1, cores // slots))
    workers = cluster_workers(client)
    try:
        worker_cores = client.run(available_cores)
    except Exception:  # pragma: no cover - a worker that cannot run functions
        worker_cores = {}
    hosts: dict[str, list[str]] = {}
    for addr, info in workers.items():
        hosts.setdefault(info.get("host", addr), []).append(addr)
    cores = slots = 0
    budget = None
    memory = 0
    for addrs in hosts.values():
        host_threads = sum(int(workers[a].get("nthreads", 1)) for a in addrs)
        host_cores = max(int(worker_cores.get(a, 1)) for a in addrs)
        cores += host_cores
        slots += host_threads
        b = max(1, host_cores // max(1, host_threads))
        budget = b if budget is None else min(budget, b)
        for a in addrs:
            limit = int(workers[a].get("memory_limit") or 0)
            memory += limit if limit > 0 else _available_memory() // max(1, len(addrs))
    return Resources(slots=max(1, slots), cores=max(1, cores), memory_bytes=max(1, memory),
                     n_workers=len(workers), thread_budget=budget or 1)


def _takes_n_workers(client: Any) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def task_thread_budget(client: Any | None) -> int:
    """Engine threads each block task may use on ``client`` (see the module rule)."""
    return cluster_resources(client).thread_budget
