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
"""

from __future__ import annotations

import contextlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import dask
from dask.delayed import Delayed, delayed

from daskkrr.parallel.resources import Resources, cluster_resources
from daskkrr.utils.threads import blas_threads


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


def local_scheduler() -> Any:
    """The scheduler named by ``dask.config`` (e.g. ``with dask.config.set(scheduler="sync")``),
    else Dask's threaded scheduler."""
    configured = dask.config.get("scheduler", None)
    return threaded_get() if configured in (None, "threads", "threading") else configured


class ThreadedBackend(Backend):
    """Dask's local scheduler in this process: threads, unless ``dask.config`` names another."""

    client = None

    def _blas(self) -> contextlib.AbstractContextManager:
        return blas_threads(1)

    def compute(self, graphs: Sequence[Any]) -> list[Any]:
        with self._blas():
            return list(dask.compute(*graphs, scheduler=local_scheduler()))

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
            return list(dask.persist(*arrays, scheduler=local_scheduler()))

    def context(self) -> contextlib.AbstractContextManager:
        # Name the threaded scheduler outright unless the user configured one: Dask would
        # otherwise import distributed on every compute to look for a client.
        if "distributed" not in sys.modules and dask.config.get("scheduler", None) is None:
            return dask.config.set(scheduler=threaded_get())
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
        from distributed import wait

        futures = self.client.compute(list(graphs))
        with self.client.as_current():  # wait() looks for the default client
            wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()  # raises the task's exception
        return list(futures)

    def release(self, handles: Sequence[Any]) -> None:
        self.client.cancel(list(handles))

    def broadcast(self, value: Any) -> Any:
        return self.client.scatter(value, broadcast=True, hash=False)

    def persist(self, arrays: Sequence[Any]) -> list[Any]:
        from distributed import futures_of, wait

        held = self.client.persist(list(arrays))
        with self.client.as_current():
            wait(futures_of(held))
        return list(held)

    def context(self) -> contextlib.AbstractContextManager:
        return self.client.as_current()


def backend_for(client: Any | None = None) -> Backend:
    """The backend of ``client``; None: the current distributed client if any, else threads."""
    if client is None:
        client = current_client()
    elif not _is_client(client):
        raise TypeError(f"client must be a distributed.Client or None; got {type(client).__name__}")
    return ThreadedBackend() if client is None else DistributedBackend(client)


def _is_client(obj: Any) -> bool:
    from distributed import Client

    return isinstance(obj, Client)
