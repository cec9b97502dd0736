"""What the cluster offers: task slots, cores and memory, and each block task's thread budget.

The thread rule (see :mod:`daskkrr.kernels.thread_rule`) is *Dask threads x engine
threads x BLAS threads <= cores* on every host. Dask's slots normally cover the
cores (one single-threaded worker per core, or the threaded scheduler's one
thread per core), so block tasks run the engine on one thread. When a host has
more cores than Dask threads, :attr:`Resources.thread_budget` gives each task
``cores // dask threads`` engine threads, so a one-worker, one-thread cluster
still uses every core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

from daskkrr.kernels.thread_rule import engine_thread_cap
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
        Cores the block tasks can keep busy on all hosts: each host's cores, or fewer where
        its Dask threads times a ``$DASKKRR_ENGINE_THREADS`` cap set on its workers are fewer.
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


def client_budget(available: int, local_workers: list[tuple[int, int]]) -> int:
    """Memory this (client) process may take, of ``available`` bytes free on its host, where
    ``local_workers`` are ``(memory_limit, memory_in_use)`` of the workers on the same host.

    Those workers may still grow to their limits, out of the same free memory: the client counts
    ``available`` less their headroom (``limit - in use``; a worker without a limit, 0, has none to
    count). Where their limits overcommit the host (a LocalCluster's default splits all of its RAM
    among the workers, so the headroom exceeds what is free), the client and the workers cannot all
    reach their limits, and the client takes an equal share of the free memory, ``available / (workers
    + 1)``, rather than none (which would send every fit to the tiled route).
    """
    headroom = sum(max(0, int(limit) - int(used)) for limit, used in local_workers if int(limit) > 0)
    fair_share = int(available) // (len(local_workers) + 1)
    return max(int(available) - headroom, fair_share)


def client_memory_budget(client: Any | None, available: int | None = None) -> int:
    """:func:`client_budget` of this process on ``client``'s cluster (None: the threaded scheduler,
    whose tasks run in this process: all the available memory), of ``available`` bytes free (default:
    read now)."""
    available = _available_memory() if available is None else int(available)
    if client is None:
        return available
    here = _host_addresses()
    local = [(int(info.get("memory_limit") or 0), int((info.get("metrics") or {}).get("memory") or 0))
             for info in cluster_workers(client).values() if info.get("host") in here]
    return client_budget(available, local)


def _host_addresses() -> set[str]:
    """Names and addresses of this host, as the scheduler may report a worker's ``host``."""
    import socket

    found = {"127.0.0.1", "::1", "localhost", socket.gethostname()}
    with contextlib.suppress(ImportError, OSError):  # psutil comes with distributed; without it, loopback only
        import psutil

        found |= {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return found


def cluster_workers(client: Any) -> dict[str, dict[str, Any]]:
    """Every worker of ``client``'s cluster: address -> the scheduler's info on it."""
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) else client.scheduler_info()
    return dict(info["workers"])


def engine_cores() -> tuple[int, int | None]:
    """This process's cores and its engine thread cap (run on each worker by :func:`cluster_resources`)."""
    return available_cores(), engine_thread_cap()


def _host_share(host_cores: int, host_threads: int, cap: int | None) -> tuple[int, int]:
    """Engine threads per task on a host (the thread rule, then the cap) and the cores they keep busy."""
    threads = max(1, host_cores // max(1, host_threads))
    if cap is not None:
        threads = min(threads, cap)
    return threads, max(1, min(host_cores, host_threads * threads))


def cluster_resources(client: Any | None) -> Resources:
    """Slots, cores, memory and per-task thread budget of ``client`` (None: the threaded scheduler)."""
    if client is None:
        import dask

        cores = available_cores()
        slots = int(dask.config.get("num_workers", None) or cores)
        per_task, busy = _host_share(cores, slots, engine_thread_cap())
        return Resources(slots=slots, cores=busy, memory_bytes=_available_memory(), n_workers=0,
                         thread_budget=per_task)
    workers = cluster_workers(client)
    try:
        found = client.run(engine_cores)
    except Exception:  # pragma: no cover - a worker that cannot run functions
        found = {}
    hosts: dict[str, list[str]] = {}
    for addr, info in workers.items():
        hosts.setdefault(info.get("host", addr), []).append(addr)
    cores = slots = 0
    budget: int | None = None
    memory = 0
    for addrs in hosts.values():
        host_threads = sum(int(workers[a].get("nthreads", 1)) for a in addrs)
        host_cores = max(int(found.get(a, (1, None))[0]) for a in addrs)
        caps = [found.get(a, (1, None))[1] for a in addrs]
        cap = None if any(c is None for c in caps) else max(int(c) for c in caps)
        b, busy = _host_share(host_cores, host_threads, cap)
        cores += busy
        slots += host_threads
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

