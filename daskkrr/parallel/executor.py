"""The execution layer: the one place where daskkrr schedules work on Dask.

Algorithms hand it pure functions on numpy blocks (from ``kernels/``,
``solvers/``, ``sampling/``); it maps them over the row blocks of a dask array
and brings back small results. Every pattern the fits need is here:

- :meth:`BlockPasses.map_reduce`: map + tree-reduce (sum or max), with or without targets;
- :meth:`BlockPasses.map`: per-block results, in order (small ones: candidate rows, digests);
- :meth:`BlockPasses.fold`: an ordered fold over the blocks (SQUEAK's single pass), in
  segments of bounded memory, with an optional early stop;
- :meth:`BlockPasses.tree_merge`: folds over row ranges merged along a tree (DISQUEAK);
- :meth:`BlockPasses.keep` / :meth:`~BlockPasses.reduce_kept` / :meth:`~BlockPasses.release`:
  per-block results kept in worker memory (the cache strategy);
- :meth:`BlockPasses.gather_rows`: rows by global index;
- :meth:`Executor.broadcast`: small state sent once per fit.

Only ``M``-sized partials move between workers and only final results reach the
client; nothing of size n is gathered. Each pass emits
:class:`~daskkrr.events.PassStarted` / :class:`~daskkrr.events.PassDone`, and its
block tasks carry the key prefix :func:`daskkrr.events.block_task_prefix` (pass
name), which is how the progress bar and the dashboard count blocks.

Threads: block tasks run the engine on ``thread_budget`` threads (1 unless the
cluster has fewer Dask threads than cores, see :mod:`daskkrr.parallel.resources`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed, delayed

from daskkrr.events import NULL_BUS, BlockDone, EventBus, PassDone, PassStarted, block_task_prefix
from daskkrr.kernels.sparse import dense_rows, is_sparse
from daskkrr.kernels.thread_rule import engine_threads
from daskkrr.parallel.backends import Backend, ThreadedBackend, backend_for
from daskkrr.parallel.resources import Resources
from daskkrr.parallel.task_progress import ProgressRelay, TaskProgress
from daskkrr.utils.threads import available_cores, blas_threads

#: Fan-in of the reduction trees.
SPLIT_EVERY = 8


def _sum(*parts: np.ndarray) -> np.ndarray:
    total = np.array(parts[0], dtype=np.float64, copy=True)
    for p in parts[1:]:
        total += p
    return total


def _max(*parts: Any) -> Any:
    return np.max(np.stack([np.asarray(p, dtype=np.float64) for p in parts]), axis=0)


_COMBINE: dict[str, Callable[..., Any]] = {"sum": _sum, "max": _max}


def _with_threads(fn: Callable[..., Any], n_threads: int, *args: Any) -> Any:
    """Run a block task with ``n_threads`` engine threads (a task on a host with spare cores)."""
    with engine_threads(n_threads):
        return fn(*args)


def tree_reduce(parts: Sequence[Delayed], combine: str = "sum", split_every: int = SPLIT_EVERY) -> Delayed:
    """Combine delayed arrays along a tree of fan-in ``split_every`` (``combine``: "sum" or "max")."""
    if not parts:
        raise ValueError("tree_reduce needs at least one part")
    fn = _COMBINE[combine]
    split_every = max(2, int(split_every))
    level = list(parts)
    while len(level) > 1:
        level = [
            delayed(fn, pure=True)(*level[i : i + split_every], dask_key_name=f"daskkrr-{combine}-"
                                   f"{tokenize(combine, *level[i : i + split_every])}")
            for i in range(0, len(level), split_every)
        ]
    return level[0]


def _merge_along(nodes: list[Any], merge_pairs: Callable[[list[tuple[Any, Any]]], list[Any]], tree: str) -> Any:
    """Reduce ``nodes`` (in row order) along pairwise levels or a chain; ``merge_pairs`` merges the
    ``(left, right)`` pairs of one level (one pair at a time along a chain) and returns their merges."""
    if tree == "chain":
        acc = nodes[0]
        for node in nodes[1:]:
            acc = merge_pairs([(acc, node)])[0]
        return acc
    level = list(nodes)
    while len(level) > 1:
        nxt = merge_pairs([(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)])
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


TREES = ("balanced", "chain")


class Executor:
    """Runs the passes of one fit (or one sampler call) on Dask's current scheduler.

    Parameters
    ----------
    client : distributed.Client or None
        None: the current distributed client if there is one, otherwise Dask's
        local scheduler (threads, or what ``dask.config`` names).
    events : EventBus or None
        Where pass events go (None: nowhere).
    """

    def __init__(self, client: Any = None, *, events: EventBus | None = None):
        self.backend: Backend = backend_for(client)
        self.events = events if events is not None else NULL_BUS
        if events is not None and isinstance(self.backend, ThreadedBackend):
            self.backend.on_block = lambda name: self.events.emit(BlockDone(name))
        self._resources: Resources | None = None
        #: Open task-progress channels: flushed before a pass reports its end.
        self._relays: list[ProgressRelay] = []

    @classmethod
    def coerce(cls, executor_or_client: Any = None) -> Executor:
        """An executor from an executor, a distributed client or None (the current context)."""
        if isinstance(executor_or_client, Executor):
            return executor_or_client
        return cls(executor_or_client)

    @property
    def client(self) -> Any:
        """The distributed client, or None on the local scheduler."""
        return self.backend.client

    def resources(self) -> Resources:
        """Slots, cores, memory and per-task thread budget (asked once)."""
        if self._resources is None:
            self._resources = self.backend.resources()
        return self._resources

    def context(self) -> contextlib.AbstractContextManager:
        """Make this executor's scheduler the one of any ``.compute()`` inside the block."""
        return self.backend.context()

    def broadcast(self, value: Any) -> Any:
        """``value`` as a task argument, sent to the workers once."""
        return self.backend.broadcast(value)

    def compute(self, *collections: Any) -> list[Any]:
        """Compute dask collections or Delayed objects here (small results only)."""
        return self.backend.compute(collections)

    @contextlib.contextmanager
    def task_progress(self, make_event: Callable[[dict[str, Any]], Any],
                      interval: float | None) -> Iterator[TaskProgress | None]:
        """A channel for records published from inside block tasks, turned into events here.

        Yields a :class:`~daskkrr.parallel.task_progress.TaskProgress` to pass to the
        tasks, or None when nothing would listen (no event bus, or ``interval`` None):
        the tasks then publish nothing. Each record ``payload`` a task sends becomes the
        event ``make_event(payload)`` on this executor's bus, emitted from a helper thread.
        """
        if interval is None or self.events is NULL_BUS:
            yield None
            return
        relay = ProgressRelay(lambda payload: self.events.emit(make_event(payload)), float(interval), self.client)
        with relay as handle:
            self._relays.append(relay)
            try:
                yield handle
            finally:
                self._relays.remove(relay)

    def passes(self, X: da.Array, Y: da.Array | None = None) -> BlockPasses:
        """Passes over the row blocks of ``X`` (and ``Y``, chunked alike along the rows)."""
        return BlockPasses(self, X, Y)


class BlockPasses:
    """Passes over the row blocks of ``X`` (and optionally ``Y``) on an :class:`Executor`.

    Per-block functions are called as ``fn(X_b, [Y_b,] *args)`` (``map_reduce``,
    ``map``, ``keep``) or ``step(state, X_b, block_index, first_row, *args)``
    (``fold``, ``tree_merge``). They must be module-level functions (workers
    unpickle them) and must not keep references to their inputs.
    """

    def __init__(self, executor: Executor, X: da.Array, Y: da.Array | None = None):
        if X.ndim != 2 or len(X.chunks[1]) != 1:
            raise ValueError(
                f"X must be 2-D with one chunk across the columns; got shape {X.shape} and "
                f"chunks {X.chunks}. Rechunk with X.rechunk({{1: -1}})"
            )
        if any(math.isnan(c) for c in X.chunks[0]):
            raise ValueError("X has unknown chunk sizes along the rows; call X.compute_chunk_sizes() first")
        if Y is not None and Y.chunks[0] != X.chunks[0]:
            raise ValueError(f"Y must be chunked like X along the rows; got {Y.chunks[0]} and {X.chunks[0]}")
        if Y is not None and Y.ndim == 2 and len(Y.chunks[1]) != 1:
            Y = Y.rechunk({1: -1}, method="tasks")
        self.executor = executor
        self.n_rows = int(X.shape[0])
        self.X, self.Y = X, Y
        self._set_blocks(X, Y)
        #: Passes made over the data (reductions over kept results are not passes over X).
        self.n_passes = 0
        #: Engine threads of each block task (set from the cluster by the strategy planner).
        self.thread_budget = 1
        self.persisted = False

    def _set_blocks(self, X: da.Array, Y: da.Array | None) -> None:
        self.x_blocks = list(X.to_delayed().ravel())
        self.y_blocks = None if Y is None else list(Y.to_delayed().reshape(len(Y.chunks[0]), -1)[:, 0])

    @property
    def backend(self) -> Backend:
        return self.executor.backend

    @property
    def n_blocks(self) -> int:
        return len(self.x_blocks)

    @property
    def offsets(self) -> np.ndarray:
        """Global index of the first row of every block (length ``n_blocks + 1``)."""
        return np.concatenate([[0], np.cumsum(self.X.chunks[0])]).astype(np.int64)

    @property
    def max_block_bytes(self) -> int:
        return int(max(self.X.chunks[0]) * self.X.shape[1] * self.X.dtype.itemsize)

    # ------------------------------------------------------------ task building
    def _task(self, fn: Callable[..., Any], name: str, *args: Any, traverse: bool = True) -> Delayed:
        """One block task, keyed ``daskkrr-block-<name>-<token>`` (what progress counts).

        ``traverse=False`` for states passed along a fold: Dask would otherwise take
        dataclass states apart into one task per field.
        """
        key = f"{block_task_prefix(name)}-{tokenize(fn, self.thread_budget, *args)}"
        if self.thread_budget > 1:
            return delayed(_with_threads, pure=True, traverse=traverse)(
                fn, self.thread_budget, *args, dask_key_name=key)
        return delayed(fn, pure=True, traverse=traverse)(*args, dask_key_name=key)

    def _map_tasks(self, fn: Callable[..., Any], name: str, args: tuple, with_y: bool,
                   blocks: Sequence[int] | None = None, per_block: Sequence[tuple] | None = None) -> list[Delayed]:
        """One task per block: ``fn(X_b, [Y_b,] *per_block[i], *args)``."""
        ids = list(range(self.n_blocks) if blocks is None else blocks)
        extra = [()] * len(ids) if per_block is None else per_block
        if with_y:
            if self.y_blocks is None:
                raise ValueError(f"pass {name!r} needs Y, but these passes were made without it")
            return [self._task(fn, name, self.x_blocks[b], self.y_blocks[b], *e, *args) for b, e in zip(ids, extra)]
        return [self._task(fn, name, self.x_blocks[b], *e, *args) for b, e in zip(ids, extra)]

    @contextlib.contextmanager
    def _pass(self, name: str, n_blocks: int, over_data: bool = True) -> Any:
        self.executor.events.emit(PassStarted(name, n_blocks))
        yield
        if over_data:
            self.n_passes += 1
        for relay in list(self.executor._relays):  # records the tasks sent come before the pass's end
            relay.flush()
        self.executor.events.emit(PassDone(name, n_blocks))

    # ------------------------------------------------------------ the patterns
    def map_reduce(self, fn: Callable[..., np.ndarray | float], *args: Any, name: str, with_y: bool = False,
                   combine: str = "sum", with_offsets: bool = False) -> np.ndarray:
        """``combine_b fn(X_b, [Y_b,] [first_row_b,] *args)`` (sum or elementwise max) as a numpy array here."""
        firsts = [(int(first),) for first in self.offsets[:-1]] if with_offsets else None
        with self._pass(name, self.n_blocks):
            total = tree_reduce(self._map_tasks(fn, name, args, with_y, per_block=firsts), combine)
            return self.backend.compute([total])[0]

    def map(self, fn: Callable[..., Any], *args: Any, name: str, with_y: bool = False,
            with_offsets: bool = False, blocks: Sequence[int] | None = None) -> list[Any]:
        """``[fn(X_b, [Y_b,] [first_row_b,] *args) for each block]``, brought here in block order.

        For small per-block results only. ``blocks`` restricts the pass to some block
        indices (not counted as a pass over the data).
        """
        ids = list(range(self.n_blocks)) if blocks is None else list(blocks)
        offs = self.offsets
        if with_offsets:
            tasks = [self._task(fn, name, self.x_blocks[b], int(offs[b]), *args) for b in ids]
        else:
            tasks = self._map_tasks(fn, name, args, with_y, ids)
        if blocks is not None:  # a look at some blocks, not a pass over the data
            return self.backend.compute(tasks)
        with self._pass(name, len(ids)):
            return self.backend.compute(tasks)

    def fold(self, step: Callable[..., Any], init: Any, *args: Any, name: str,
             finish: Callable[[Any], Any] | None = None, segment_bytes: int | None = None,
             stop: Callable[[Any], bool] | None = None) -> Any:
        """Fold the blocks in row order: ``state = step(state, X_b, b, first_row_b, *args)``.

        The chain is computed in segments of consecutive blocks of at most
        ``segment_bytes`` (the scheduler may read a segment's blocks ahead of the
        chain, so this bounds the memory of blocks read but not yet consumed). Between
        segments the state stays where it was computed, and ``stop(state)`` (evaluated
        there) may end the fold early. ``finish(state)`` is applied once at the end.
        Returns the final state, here.
        """
        per_segment = self.n_blocks if segment_bytes is None else max(
            1, int(segment_bytes // max(1, self.max_block_bytes)))
        offs = self.offsets
        state: Any = init
        with self._pass(name, self.n_blocks):
            n_segments = math.ceil(self.n_blocks / per_segment)
            for seg in range(n_segments):
                ids = range(seg * per_segment, min(self.n_blocks, (seg + 1) * per_segment))
                graph = state
                for b in ids:
                    graph = self._task(step, name, graph, self.x_blocks[b], b, int(offs[b]), *args,
                                       traverse=False)
                last = seg == n_segments - 1
                if last and finish is not None:
                    graph = delayed(finish, pure=True, traverse=False)(graph)
                state = self.backend.submit(graph)
                if not last and stop is not None and self.backend.call(stop, state):
                    if finish is not None:
                        state = self.backend.submit(delayed(finish, pure=True, traverse=False)(state))
                    break
            return self.backend.fetch(state)

    def tree_merge(self, step: Callable[..., Any], *args: Any, name: str, bounds: Sequence[int],
                   merge: Callable[[Any, Any], Any], leaf_finish: Callable[[Any], Any] | None = None,
                   root_finish: Callable[[Any], Any] | None = None, tree: str = "balanced",
                   merge_here: Callable[[Any, Any], Callable[[Any, Any], Any] | None] | None = None) -> Any:
        """Fold each row range ``[bounds[i], bounds[i+1])`` independently, then merge along a tree.

        A leaf folds its blocks in order from ``None`` with ``step`` (as :meth:`fold`:
        block numbers count within the leaf, row numbers are global), then applies ``leaf_finish``; adjacent
        leaves are merged pairwise level by level (``tree="balanced"``) or left to
        right (``"chain"``); ``root_finish`` is applied to the root. One graph: leaves
        run in parallel on the workers and only the root comes back.

        ``merge_here(left, right)``, if given, sees each pair before it is merged and may return the
        function that merges it *here* (one that drives graphs of its own, e.g. a factorisation as
        tiles on the workers); None leaves the pair to ``merge`` in a task. The leaves then come back
        first (one graph) and the tree is merged a level at a time (a level's tasks in one graph).
        """
        if tree not in TREES:
            raise ValueError(f"tree must be one of {TREES}; got {tree!r}")
        leaves = []
        n_tasks = 0
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = self.X[int(a) : int(b)]
            offs = np.concatenate([[0], np.cumsum(part.chunks[0])]).astype(np.int64) + int(a)
            state: Any = None
            for k, blk in enumerate(part.to_delayed().ravel()):
                state = self._task(step, name, state, blk, k, int(offs[k]), *args, traverse=False)
                n_tasks += 1
            if leaf_finish is not None:
                state = delayed(leaf_finish, pure=True, traverse=False)(state)
            leaves.append(state)
        if merge_here is not None:
            with self._pass(name, n_tasks):
                states = self.backend.compute(leaves)
            root = _merge_along(states, functools.partial(self._merge_level, merge, merge_here), tree)
            if root_finish is not None:
                root = self.backend.compute([delayed(root_finish, pure=True, traverse=False)(root)])[0]
            return root
        node = delayed(merge, pure=True, traverse=False)
        root = _merge_along(leaves, lambda pairs: [node(left, right) for left, right in pairs], tree)
        if root_finish is not None:
            root = delayed(root_finish, pure=True, traverse=False)(root)
        with self._pass(name, n_tasks):
            return self.backend.compute([root])[0]

    def _merge_level(self, merge: Callable[[Any, Any], Any],
                     merge_here: Callable[[Any, Any], Callable[[Any, Any], Any] | None],
                     pairs: list[tuple[Any, Any]]) -> list[Any]:
        """One level of :meth:`tree_merge`'s tree over states held here: the pairs ``merge_here`` takes are
        merged here, the others by ``merge`` as tasks of one graph."""
        out: list[Any] = [None] * len(pairs)
        tasks, slots = [], []
        for i, (left, right) in enumerate(pairs):
            here = merge_here(left, right)
            if here is not None:
                out[i] = here(left, right)
            else:
                tasks.append(delayed(merge, pure=True, traverse=False)(left, right))
                slots.append(i)
        for i, value in zip(slots, self.backend.compute(tasks) if tasks else []):
            out[i] = value
        return out

    # ------------------------------------------------ results kept in memory
    def keep(self, fn: Callable[..., np.ndarray], *args: Any, name: str, with_y: bool = False) -> list[Any]:
        """Compute ``fn(X_b, [Y_b,] *args)`` for every block and keep the results where they are.

        Returns handles for :meth:`reduce_kept`: futures on a cluster, arrays here on
        the local scheduler. One pass over the data.
        """
        with self._pass(name, self.n_blocks):
            return self.backend.keep(self._map_tasks(fn, name, args, with_y))

    def reduce_kept(self, handles: Sequence[Any], fn: Callable[..., np.ndarray], *args: Any, name: str,
                    with_y: bool = False) -> np.ndarray:
        """``sum_b fn(handle_b, [Y_b,] *args)`` over the results of :meth:`keep` (not a pass over X)."""
        y_blocks = self.y_blocks if with_y else None  # not None exactly when with_y, after this check
        if with_y and y_blocks is None:
            raise ValueError(f"pass {name!r} needs Y, but these passes were made without it")
        with self._pass(name, len(handles), over_data=False):
            if self.backend.is_distributed:
                ys: Sequence[Any] = [None] * len(handles) if y_blocks is None else y_blocks
                parts = [self._task(fn, name, h, *((y,) if with_y else ()), *args) for h, y in zip(handles, ys)]
                return self.backend.compute([tree_reduce(parts)])[0]
            # Local: the kept blocks are arrays in this process; a thread pool beats a graph.
            work: list[tuple] = [(h,) for h in handles]
            if y_blocks is not None:
                ys_local = self.backend.compute(y_blocks)
                work = [(h, y) for h, y in zip(handles, ys_local)]
            local = [np.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            with blas_threads(1), ThreadPoolExecutor(max_workers=available_cores()) as pool:
                parts_local = list(pool.map(lambda w: fn(*w, *local), work))
            return _sum(*parts_local)

    def release(self, handles: Sequence[Any]) -> None:
        """Free what :meth:`keep` holds."""
        self.backend.release(handles)

    def persist(self) -> None:
        """Hold the row blocks of ``X`` (and ``Y``) in memory for the passes to come (one read)."""
        if self.persisted:
            return
        arrays = [self.X] if self.Y is None else [self.X, self.Y]
        with self._pass("persist", self.n_blocks):
            held = self.backend.persist(arrays)
        self.X = held[0]
        self.Y = held[1] if len(held) > 1 else None
        self._set_blocks(self.X, self.Y)
        self.persisted = True

    # ------------------------------------------------------------ rows
    def gather_rows(self, idx: np.ndarray) -> np.ndarray:
        """The rows ``X[idx]`` (a small set) as a numpy array here; rows of sparse blocks are
        densified (``len(idx) x d``: the centers, or the preconditioner's sketch rows)."""
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size == 0:
            return np.empty((0, self.X.shape[1]), dtype=self.X.dtype)
        return dense_rows(self.backend.compute([self.X[idx]])[0])


def gather_rows(X: Any, idx: np.ndarray, executor: Any = None) -> np.ndarray:
    """``X[idx]`` as numpy for a numpy or dask ``X`` (see :meth:`BlockPasses.gather_rows`)."""
    if isinstance(X, np.ndarray) or is_sparse(X):
        return dense_rows(X[np.asarray(idx)])
    return Executor.coerce(executor).passes(X).gather_rows(idx)

