"""Map-reduce passes over the row blocks of a dask array.

This is where blocks are scheduled: every pass maps a pure per-block function
(from :mod:`daskkrr.kernels.blocks`) over the row blocks of ``X`` (and ``y``) and
sums the small per-block results along a tree, so only ``M``-sized partials move
between workers and only the final sum reaches the client. Nothing of size n is
ever gathered.

Small state every block needs (the centers) is sent to the workers once per fit
with :meth:`RowBlockPasses.broadcast`.

Per-block results that later passes reuse (the cached strategy's kernel blocks)
stay where they were computed: :meth:`RowBlockPasses.keep` returns handles
(futures on a cluster, arrays in this process for the threaded scheduler) and
:meth:`RowBlockPasses.reduce_kept` maps over them. :meth:`RowBlockPasses.persist`
holds the row blocks themselves in memory.

Threads: block tasks run the engine on ``thread_budget`` threads (1 unless the
cluster has fewer Dask threads than cores; see :mod:`daskkrr.parallel.threads`),
and BLAS is limited to one thread while the threaded scheduler runs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed, delayed

from daskkrr.kernels.threads import engine_threads
from daskkrr.parallel.client import threaded_get
from daskkrr.utils.threads import available_cores, blas_threads


def _sum(*parts: np.ndarray) -> np.ndarray:
    total = np.array(parts[0], dtype=np.float64, copy=True)
    for p in parts[1:]:
        total += p
    return total


def _with_threads(fn: Callable[..., np.ndarray], n_threads: int, *args: Any) -> np.ndarray:
    """Run a block task with ``n_threads`` engine threads (a task on a host with spare cores)."""
    with engine_threads(n_threads):
        return fn(*args)


def tree_sum(parts: Sequence[Delayed], split_every: int = 8) -> Delayed:
    """Sum delayed arrays along a tree of fan-in ``split_every``."""
    if not parts:
        raise ValueError("tree_sum needs at least one part")
    split_every = max(2, int(split_every))
    level = list(parts)
    while len(level) > 1:
        level = [
            delayed(_sum, pure=True)(*level[i : i + split_every])
            for i in range(0, len(level), split_every)
        ]
    return level[0]


class RowBlockPasses:
    """Repeated reductions over the row blocks of ``X`` (and optionally ``Y``).

    Parameters
    ----------
    X : dask array of shape (n, d)
        Row-chunked, one chunk across the columns.
    Y : dask array of shape (n,) or (n, t), optional
        Chunked like ``X`` along the rows.
    client : distributed.Client or None
        None runs on Dask's local threaded scheduler.
    split_every : int
        Fan-in of the reduction tree.
    """

    def __init__(self, X: da.Array, Y: da.Array | None = None, client: Any = None, split_every: int = 8):
        if X.ndim != 2 or len(X.chunks[1]) != 1:
            raise ValueError(
                f"X must be 2-D with one chunk across the columns; got shape {X.shape} and "
                f"chunks {X.chunks}. Rechunk with X.rechunk({{1: -1}})"
            )
        if Y is not None and Y.chunks[0] != X.chunks[0]:
            raise ValueError(
                f"Y must be chunked like X along the rows; got {Y.chunks[0]} and {X.chunks[0]}"
            )
        self.client = client
        self.split_every = split_every
        self.n_rows = int(X.shape[0])
        if Y is not None and Y.ndim == 2 and len(Y.chunks[1]) != 1:
            Y = Y.rechunk({1: -1}, method="tasks")
        self.X = X
        self.Y = Y
        self._set_blocks(X, Y)
        self.n_passes = 0
        #: Engine threads of each block task (set from the cluster by the strategy planner).
        self.thread_budget = 1
        self.persisted = False

    def _set_blocks(self, X: da.Array, Y: da.Array | None) -> None:
        self.x_blocks = list(X.to_delayed().ravel())
        self.y_blocks = None
        if Y is not None:
            self.y_blocks = list(Y.to_delayed().reshape(len(Y.chunks[0]), -1)[:, 0])

    @property
    def n_blocks(self) -> int:
        return len(self.x_blocks)

    def broadcast(self, value: np.ndarray) -> Any:
        """Make ``value`` available to every block task, sending it to the workers once."""
        if self.client is not None:
            return self.client.scatter(value, broadcast=True, hash=False)
        return delayed(value, traverse=False)

    def reduce(self, fn: Callable[..., np.ndarray], *args: Any, with_y: bool = False) -> np.ndarray:
        """``sum_b fn(X_b, [Y_b,] *args)`` as a numpy array on the client."""
        if with_y and self.y_blocks is None:
            raise ValueError("this pass needs Y, but RowBlockPasses was built without it")
        parts = self._map(fn, args, with_y)
        total = tree_sum(parts, self.split_every)
        self.n_passes += 1
        if self.client is not None:
            return self.client.gather(self.client.compute(total))
        with self._local_blas():
            return dask.compute(total, scheduler=threaded_get())[0]

    # ------------------------------------------------------------ helpers
    def _task(self, fn: Callable[..., np.ndarray]) -> Callable[..., Delayed]:
        if self.thread_budget > 1:
            wrapped = delayed(_with_threads, pure=True)
            budget = self.thread_budget

            def call(*a: Any) -> Delayed:  # keeps fn's name as the task prefix (progress counts it)
                key = f"{getattr(fn, '__name__', 'block_task')}-{tokenize(fn, budget, *a)}"
                return wrapped(fn, budget, *a, dask_key_name=key)

            return call
        return delayed(fn, pure=True)

    def _map(self, fn: Callable[..., np.ndarray], args: tuple, with_y: bool) -> list[Delayed]:
        if with_y and self.y_blocks is None:
            raise ValueError("this pass needs Y, but RowBlockPasses was built without it")
        task = self._task(fn)
        if with_y:
            return [task(xb, yb, *args) for xb, yb in zip(self.x_blocks, self.y_blocks)]
        return [task(xb, *args) for xb in self.x_blocks]

    def _local_blas(self) -> contextlib.AbstractContextManager:
        """Single-threaded BLAS while the threaded scheduler runs one task per core."""
        return blas_threads(1) if self.client is None else contextlib.nullcontext()

    # ------------------------------------------------ data held in memory
    def persist(self) -> None:
        """Hold the row blocks of ``X`` (and ``Y``) in memory (the workers') for the passes to come.

        This is one read of the data; later passes read memory instead of the store.
        """
        if self.persisted:
            return
        arrays = (self.X,) if self.Y is None else (self.X, self.Y)
        if self.client is not None:
            held = self.client.persist(list(arrays))
            from distributed import futures_of, wait

            with self.client.as_current():  # wait() looks for the default client
                wait(futures_of(held))
        else:
            with self._local_blas():
                held = dask.persist(*arrays, scheduler=threaded_get())
        self.X = held[0]
        self.Y = held[1] if len(held) > 1 else None
        self._set_blocks(self.X, self.Y)
        self.persisted = True
        self.n_passes += 1

    def keep(self, fn: Callable[..., np.ndarray], *args: Any, with_y: bool = False) -> list[Any]:
        """Compute ``fn(X_b, [Y_b,] *args)`` for every block and keep the results where they are.

        Returns handles for :meth:`reduce_kept`: futures on the workers with a
        client, numpy arrays in this process otherwise. One pass over the data.
        """
        parts = self._map(fn, args, with_y)
        self.n_passes += 1
        if self.client is not None:
            futures = self.client.compute(parts)
            from distributed import wait

            with self.client.as_current():
                wait(futures)
            for f in futures:
                if f.status == "error":
                    f.result()  # raises the task's exception
            return list(futures)
        with self._local_blas():
            return list(dask.compute(*parts, scheduler=threaded_get()))

    def reduce_kept(self, handles: Sequence[Any], fn: Callable[..., np.ndarray], *args: Any,
                    with_y: bool = False) -> np.ndarray:
        """``sum_b fn(handle_b, [Y_b,] *args)`` over the results of :meth:`keep`.

        Not a pass over ``X`` (``with_y`` reads ``Y``'s blocks).
        """
        if with_y and self.y_blocks is None:
            raise ValueError("this reduction needs Y, but RowBlockPasses was built without it")
        if self.client is not None:
            task = self._task(fn)
            if with_y:
                parts = [task(h, yb, *args) for h, yb in zip(handles, self.y_blocks)]
            else:
                parts = [task(h, *args) for h in handles]
            return self.client.gather(self.client.compute(tree_sum(parts, self.split_every)))
        if with_y:
            ys = dask.compute(*self.y_blocks, scheduler=threaded_get())
            work = [(h, y) for h, y in zip(handles, ys)]
        else:
            work = [(h,) for h in handles]
        local = [np.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        with self._local_blas(), ThreadPoolExecutor(max_workers=available_cores()) as pool:
            parts = list(pool.map(lambda w: fn(*w, *local), work))
        return _sum(*parts)

    def release(self, handles: Sequence[Any]) -> None:
        """Free what :meth:`keep` holds."""
        if self.client is not None:
            self.client.cancel(list(handles))
