"""Where task graphs run: Dask's threaded scheduler or a ``distributed`` cluster.

The execution layer (:mod:`daskkrr.parallel.executor`) builds graphs of per-block
tasks; a backend computes them. Both backends offer the same few operations:

- ``compute(graphs)``: values on the client;
- ``submit(graph)`` / ``fetch(handle)``: a result left where it was computed (a
  Future on a cluster, the value itself on threads), brought back later;
- ``keep(graphs)`` / ``release(handles)``: per-block results kept in worker memory;
- ``broadcast(value)``: small state sent to the workers once;
- ``persist(arrays)``: dask arrays held in (worker) memory.

The threaded backend limits BLAS to one thread while it runs (one task per core
already uses every core); a cluster's workers set that limit themselves.

Where a fit runs
----------------
Estimators hold no client: :func:`backend_for` asks Dask's current context, as
dask-ml does. In order:

1. an explicit client given to the execution layer (the CLI and workflows name
   a cluster by making its client current: ``cluster_client``, ``as_current()``);
2. **inside a Dask task that holds a worker thread** (joblib's dask backend,
   ``dask.delayed``, dask-ml's searches): the local scheduler, in that task;
3. a local scheduler named by ``dask.config``
   (``with dask.config.set(scheduler="sync")``), which wins over a client as it
   does for any Dask ``compute``;
4. the current ``distributed`` client (``get_client()``: the default client or
   ``with client.as_current()``);
5. Dask's threaded scheduler.

Rule 2 is what keeps a fit inside a task from deadlocking. Such a task would
otherwise find the worker's client and submit the fit's passes to the cluster
it runs on, then wait on them from a thread that holds a worker slot: with a
``GridSearchCV(n_jobs=-1)`` under ``joblib.parallel_backend("dask")`` every slot
holds a waiting fit and no pass can start. Two ways out were possible:

- (a) run the passes on the local threaded scheduler inside the task (chosen);
- (b) ``worker_client()``, which secedes the task's thread from the worker's pool
  and submits the passes to the cluster.

We chose (a). The parallelism is already in the outer search: one fit per slot
keeps every core busy, so spreading each fit's passes over the cluster too only
adds scheduler round trips (a FALKON fit makes a pass per CG iteration, each a
few milliseconds of work per block on a small fold) and moves the fold, which
is in the task's memory, back to other workers. On the issue's search (500
rows, ``n_centers=50``, 2 sigmas x 3 folds + refit, a ``LocalCluster`` of 2
single-thread worker processes on a shared 2-core machine, 5 warm runs each)
(a) took a median 1.5 s (best 1.05 s), (b) a median 4.1 s (best 2.9 s), with
the same best parameters. (b) also lets
seceded threads outnumber the worker's slots, so the worker oversubscribes
its cores. A task that wants the cluster can still have it: inside
``with worker_client():`` the thread has seceded and holds no slot, so rule 2
does not apply and the fit goes to the worker's client (rule 4).

Inside a task the local scheduler gets ``cores // worker threads`` threads
(at least one), so the fits running side by side on one host share its cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import dask
from dask.callbacks import Callback
from dask.delayed import Delayed, delayed
from dask.utils import key_split

from daskkrr.events import BLOCK_PREFIX
from daskkrr.parallel.resources import Resources, cluster_resources, cluster_workers
from daskkrr.utils.threads import available_cores, blas_threads


def threaded_get() -> Any:
    """Dask's threaded scheduler as a function: naming it ``"threads"`` instead makes Dask
    import ``distributed`` (about 50 MB) to look for a client on every compute."""
    import dask.threaded

    return dask.threaded.get


def current_client() -> Any | None:
    """The current ``distributed`` client, or None.

    Without ``distributed`` imported there can be no client, and importing it just
    to find out would add about 50 MB to every threaded fit.
    """
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


class Backend(ABC):
    """Computes task graphs for the execution layer."""

    #: The distributed client, or None on threads.
    client: Any = None

    @property
    def is_distributed(self) -> bool:
        return self.client is not None

    @abstractmethod
    def compute(self, graphs: Sequence[Any]) -> list[Any]:
        """Compute Delayed objects or dask collections; their values, in order."""

    @abstractmethod
    def submit(self, graph: Any) -> Any:
        """Compute one graph and leave its result where it was computed."""

    @abstractmethod
    def fetch(self, handle: Any) -> Any:
        """Bring a result left by :meth:`submit` or :meth:`keep` to the client."""

    @abstractmethod
    def call(self, fn: Callable[..., Any], handle: Any) -> Any:
        """``fn(value)`` evaluated where the handle's value lives; the (small) result comes back."""

    @abstractmethod
    def keep(self, graphs: Sequence[Delayed]) -> list[Any]:
        """Compute per-block results and keep them where they are; handles, in order."""

    @abstractmethod
    def release(self, handles: Sequence[Any]) -> None:
        """Free what :meth:`keep` holds."""

    @abstractmethod
    def broadcast(self, value: Any) -> Any:
        """``value`` as an argument every task can use, sent to the workers once."""

    @abstractmethod
    def persist(self, arrays: Sequence[Any]) -> list[Any]:
        """Dask collections held in memory (the workers')."""

    def resources(self) -> Resources:
        """Task slots, cores, memory and per-task thread budget."""
        return cluster_resources(self.client)

    @abstractmethod
    def context(self) -> contextlib.AbstractContextManager:
        """Make this backend the scheduler of any ``.compute()`` inside the block."""


#: ``dask.config`` scheduler names that mean "the distributed client": inside a task
#: they would send the passes back to the cluster the task runs on.
_DISTRIBUTED_NAMES = frozenset({"dask.distributed", "distributed"})


def local_scheduler(in_task: bool = False) -> Any:
    """The scheduler named by ``dask.config`` (e.g. ``with dask.config.set(scheduler="sync")``),
    else Dask's threaded scheduler.

    ``in_task``: we run inside a Dask task, where a configured distributed scheduler
    (a default client in the worker's process) is replaced by threads (see the module).
    """
    configured = dask.config.get("scheduler", None)
    if configured in (None, "threads", "threading") or (in_task and configured in _DISTRIBUTED_NAMES):
        return threaded_get()
    return configured


def in_worker_slot() -> bool:
    """Whether this thread runs a Dask task that holds one of its worker's thread slots.

    False outside a worker, and in a task whose thread has seceded (``worker_client``,
    ``secede``): that thread no longer holds a slot and may wait on the cluster.
    """
    if "distributed" not in sys.modules:
        return False
    try:
        from distributed import get_worker
        from distributed.threadpoolexecutor import thread_state  # where secede() marks the thread

        get_worker()
    except (ImportError, ValueError):
        return False
    return bool(getattr(thread_state, "proceed", True))


def task_local_threads() -> int:
    """Threads for the local scheduler inside a worker task: the host's cores shared
    by the worker's task slots (at least one)."""
    from distributed import get_worker

    slots = max(1, int(getattr(get_worker().state, "nthreads", 1) or 1))
    return max(1, available_cores() // slots)


class _BlockReporter(Callback):
    """A local-scheduler callback: reports each finished block task by its pass name.

    On a cluster the daskkrr scheduler plugin counts them instead (:mod:`daskkrr.dashboard`).
    """

    def __init__(self, on_block: Callable[[str], None]):
        super().__init__()
        self.on_block = on_block

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        prefix = key_split(key)
        if prefix.startswith(BLOCK_PREFIX + "-"):
            self.on_block(prefix[len(BLOCK_PREFIX) + 1 :])


class ThreadedBackend(Backend):
    """Dask's local scheduler in this process: threads, unless ``dask.config`` names another.

    Parameters
    ----------
    num_workers : int or None
        Threads of the threaded scheduler (None: Dask's default, one per core).
    in_task : bool
        We run inside a Dask task (see the module): the threaded scheduler is named
        outright, so that no ``compute`` inside the fit goes to the worker's client.
    """

    client = None

    def __init__(self, num_workers: int | None = None, *, in_task: bool = False):
        self.num_workers = num_workers
        self.in_task = in_task

    #: Called with the pass name of every block task that finishes (set by the executor).
    on_block: Callable[[str], None] | None = None

    def _blas(self) -> contextlib.ExitStack:
        """BLAS on one thread (each task has a core) and, if asked, block-task reports."""
        stack = contextlib.ExitStack()
        stack.enter_context(blas_threads(1))
        if self.on_block is not None:
            stack.enter_context(_BlockReporter(self.on_block))
        return stack

    def _options(self) -> dict[str, Any]:
        scheduler = local_scheduler(self.in_task)
        if self.num_workers is not None and scheduler is threaded_get():
            return {"scheduler": scheduler, "num_workers": self.num_workers}
        return {"scheduler": scheduler}

    def resources(self) -> Resources:
        found = cluster_resources(None)
        if self.num_workers is None:
            return found
        return dataclasses.replace(found, slots=self.num_workers, cores=self.num_workers, thread_budget=1)

    def compute(self, graphs: Sequence[Any]) -> list[Any]:
        with self._blas():
            return list(dask.compute(*graphs, **self._options()))

    def submit(self, graph: Any) -> Any:
        return self.compute([graph])[0]

    def fetch(self, handle: Any) -> Any:
        return handle

    def call(self, fn: Callable[..., Any], handle: Any) -> Any:
        return fn(handle)

    def keep(self, graphs: Sequence[Delayed]) -> list[Any]:
        return self.compute(graphs)

    def release(self, handles: Sequence[Any]) -> None:
        pass

    def broadcast(self, value: Any) -> Any:
        return delayed(value, traverse=False)

    def persist(self, arrays: Sequence[Any]) -> list[Any]:
        with self._blas():
            return list(dask.persist(*arrays, **self._options()))

    def context(self) -> contextlib.AbstractContextManager:
        # Name the threaded scheduler outright unless the user configured one: Dask would
        # otherwise import distributed on every compute to look for a client (and, inside
        # a task, find the worker's and wait on the cluster from a worker slot).
        if self.in_task or ("distributed" not in sys.modules and dask.config.get("scheduler", None) is None):
            return dask.config.set(self._options())
        return contextlib.nullcontext()


class DistributedBackend(Backend):
    """A ``distributed`` cluster, through its client."""

    def __init__(self, client: Any):
        self.client = client

    def compute(self, graphs: Sequence[Any]) -> list[Any]:
        return list(self.client.gather(self.client.compute(list(graphs))))

    def submit(self, graph: Any) -> Any:
        return self.client.compute(graph)

    def fetch(self, handle: Any) -> Any:
        return handle.result() if hasattr(handle, "result") else handle

    def call(self, fn: Callable[..., Any], handle: Any) -> Any:
        return self.client.submit(fn, handle).result()

    def keep(self, graphs: Sequence[Delayed]) -> list[Any]:
        return self._placed(list(graphs))

    def release(self, handles: Sequence[Any]) -> None:
        self.client.cancel(list(handles))

    def broadcast(self, value: Any) -> Any:
        return self.client.scatter(value, broadcast=True, hash=False)

    def persist(self, arrays: Sequence[Any]) -> list[Any]:
        from distributed import futures_of, wait

        if all(_row_blocked(a) for a in arrays):
            return [self._persist_rows(a) for a in arrays]
        held = self.client.persist(list(arrays))
        with self.client.as_current():
            wait(futures_of(held))
        return list(held)

    def context(self) -> contextlib.AbstractContextManager:
        return self.client.as_current()

    # Where kept results live decides where the later tasks on them run: left to the
    # scheduler, the blocks of a persisted array landed 6 and 2 on two workers (whoever
    # was free first read more of them), and every later pass took the time of the
    # busier worker: 1.3x over one worker instead of 1.8x. So block i goes to the
    # i-th task slot, round robin over the workers' threads.
    def _slots(self) -> list[str]:
        workers = cluster_workers(self.client)
        threads = {addr: int(info.get("nthreads", 1)) for addr, info in sorted(workers.items())}
        return [addr for r in range(max(threads.values(), default=0)) for addr, n in threads.items() if n > r]

    def _placed(self, graphs: list[Any]) -> list[Any]:
        """Futures of ``graphs``, graph ``i`` computed on (and kept by) task slot ``i``."""
        from distributed import wait

        slots = self._slots()
        if len(set(slots)) > 1:
            futures = [self.client.compute(g, workers=[slots[i % len(slots)]], allow_other_workers=True)
                       for i, g in enumerate(graphs)]
        else:
            futures = self.client.compute(graphs)
        with self.client.as_current():  # wait() looks for the default client
            wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()  # raises the task's exception
        return list(futures)

    def _persist_rows(self, arr: Any) -> Any:
        """A row-blocked dask array held on the workers, its row blocks spread over the task slots."""
        futures = self._placed(list(arr.to_delayed().ravel()))
        return _rows_of_futures(futures, arr.chunks[0], arr.shape[1:], arr.dtype, arr._meta)

    def n_slots(self) -> int:
        """Task slots of the cluster (worker threads, all workers)."""
        return len(self._slots())

    def scatter_rows(self, a: Any, rows: Sequence[int]) -> Any:
        """The in-memory array ``a`` as a dask array of row blocks ``rows``, each sent to a worker once.

        Block ``i`` goes to task slot ``i`` as :meth:`_placed` puts block tasks, so the blocks of
        ``X`` and ``y`` of the same rows share a worker, and the passes' graphs name the blocks
        (keys) instead of carrying the data: embedded, every graph of every pass would ship it
        and the one block would run on one worker.
        """
        import numpy as np

        slots = self._slots()
        bounds = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        blocks = [a[bounds[i]:bounds[i + 1]] for i in range(len(rows))]
        by_worker: dict[str, list[int]] = {}
        for i in range(len(blocks)):
            by_worker.setdefault(slots[i % len(slots)] if slots else "", []).append(i)
        futures: list[Any] = [None] * len(blocks)
        for worker, ids in by_worker.items():
            sent = self.client.scatter([blocks[i] for i in ids], workers=[worker] if worker else None, hash=False)
            for i, f in zip(ids, sent, strict=True):
                futures[i] = f
        return _rows_of_futures(futures, tuple(rows), a.shape[1:], a.dtype, a[:0])


def _rows_of_futures(futures: Sequence[Any], rows: Sequence[int], tail: tuple[int, ...], dtype: Any,
                     meta: Any) -> Any:
    """One dask array of the row blocks held by ``futures`` (``rows[i]`` rows each)."""
    import dask.array as da

    parts = [da.from_delayed(delayed(f), shape=(n, *tail), dtype=dtype, meta=meta)
             for f, n in zip(futures, rows, strict=True)]
    return parts[0] if len(parts) == 1 else da.concatenate(parts, axis=0)


def _row_blocked(arr: Any) -> bool:
    """A dask array split along its rows only (every array the passes read is)."""
    import dask.array as da

    return isinstance(arr, da.Array) and arr.ndim >= 1 and all(n == 1 for n in arr.numblocks[1:])


def backend_for(client: Any | None = None) -> Backend:
    """The backend of ``client``; None: Dask's current context (see "Where a fit runs" in
    the module): the local scheduler inside a worker task, else a local scheduler named
    by ``dask.config``, else the current distributed client if any, else threads."""
    if client is None:
        if in_worker_slot():
            return ThreadedBackend(task_local_threads(), in_task=True)
        if dask.config.get("scheduler", None) not in (None, *_DISTRIBUTED_NAMES):
            return ThreadedBackend()  # e.g. scheduler="sync": Dask's own precedence over a client
        client = current_client()
    elif not _is_client(client):
        raise TypeError(f"client must be a distributed.Client or None; got {type(client).__name__}")
    return ThreadedBackend() if client is None else DistributedBackend(client)


def _is_client(obj: Any) -> bool:
    from distributed import Client

    return isinstance(obj, Client)
