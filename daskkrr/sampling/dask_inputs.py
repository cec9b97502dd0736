"""Input checks and scheduler plumbing shared by the streaming samplers."""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np


def as_row_chunked(X: Any, *, default_rows: int = 8192) -> da.Array:
    """Return ``X`` as a 2-D dask array with one chunk across the columns.

    numpy inputs are wrapped with blocks of ``default_rows`` rows.
    """
    if not isinstance(X, da.Array):
        arr = np.asarray(X)
        if arr.ndim != 2:
            raise ValueError(f"X must be 2-D (rows, features); got shape {arr.shape}")
        return da.from_array(arr, chunks=(min(default_rows, max(1, arr.shape[0])), arr.shape[1]))
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D dask array (rows, features); got shape {X.shape}")
    if X.numblocks[1] != 1:
        raise ValueError(
            f"X has {X.numblocks[1]} chunks across its {X.shape[1]} columns; samplers need each "
            "block to hold all columns: X = X.rechunk({1: -1})"
        )
    if any(np.isnan(c) for c in X.chunks[0]):
        raise ValueError(
            "X has unknown chunk sizes along the rows; call X.compute_chunk_sizes() first"
        )
    if X.shape[0] == 0:
        raise ValueError("X has no rows")
    return X


def row_offsets(X: da.Array) -> np.ndarray:
    """Global index of the first row of every row block (length numblocks + 1)."""
    return np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)


def max_block_bytes(X: da.Array) -> int:
    return int(max(X.chunks[0]) * X.shape[1] * X.dtype.itemsize)


def active_client(client: Any) -> Any | None:
    """``client`` if given, else the current ``distributed`` client if any, else None."""
    if client is not None:
        return client
    from daskkrr.parallel.client import current_client

    return current_client()


def compute_one(obj: Any, client: Any | None) -> Any:
    """Compute a Delayed: to a Future on ``client``, or to its value on the local scheduler."""
    if client is not None:
        return client.compute(obj)
    (value,) = dask.compute(obj)
    return value


def fetch(obj: Any, client: Any | None) -> Any:
    """Bring a computed value (or a Future) to this process."""
    if client is not None and hasattr(obj, "result"):
        return obj.result()
    return obj
