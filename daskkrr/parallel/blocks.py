"""Map-reduce passes over the row blocks of a dask array.

This is where blocks are scheduled: every pass maps a pure per-block function
(from :mod:`daskkrr.kernels.blocks`) over the row blocks of ``X`` (and ``y``) and
sums the small per-block results along a tree, so only ``M``-sized partials move
between workers and only the final sum reaches the client. Nothing of size n is
ever gathered.

Small state every block needs (the centers) is sent to the workers once per fit
with :meth:`RowBlockPasses.broadcast`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.delayed import Delayed, delayed


def _sum(*parts: np.ndarray) -> np.ndarray:
    total = np.array(parts[0], dtype=np.float64, copy=True)
    for p in parts[1:]:
        total += p
    return total


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
        self.x_blocks = list(X.to_delayed().ravel())
        self.y_blocks = None
        if Y is not None:
            if Y.ndim == 2 and len(Y.chunks[1]) != 1:
                Y = Y.rechunk({1: -1})
            self.y_blocks = list(Y.to_delayed().reshape(len(Y.chunks[0]), -1)[:, 0])
        self.n_passes = 0

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
        task = delayed(fn, pure=True)
        if with_y:
            parts = [task(xb, yb, *args) for xb, yb in zip(self.x_blocks, self.y_blocks)]
        else:
            parts = [task(xb, *args) for xb in self.x_blocks]
        total = tree_sum(parts, self.split_every)
        self.n_passes += 1
        if self.client is not None:
            return self.client.gather(self.client.compute(total))
        return dask.compute(total, scheduler="threads")[0]
