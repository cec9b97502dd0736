"""Row-block layout shared by every daskkrr array.

daskkrr always works on *row blocks*: each block holds a contiguous range of rows
and **all** columns, and the target is split at exactly the same row boundaries.
The helpers here choose a block size and bring arrays into that layout lazily.
"""

from __future__ import annotations

import dask.array as da
import numpy as np

from daskkrr.data.validation import check_chunk_rows

#: Target size of one block when the caller does not choose one.
DEFAULT_BLOCK_BYTES = 64 * 2**20

#: Value of the ``daskkrr_format`` group attribute of the Zarr stores daskkrr
#: writes (arrays ``X`` and optional ``y``, chunked by rows); readers refuse newer ones.
FORMAT_VERSION = 1


def auto_chunk_rows(
    n_features: int,
    itemsize: int,
    n_rows: int | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> int:
    """Rows per block so that one ``(rows, n_features)`` block is about ``block_bytes``.

    Parameters
    ----------
    n_features : int
        Number of columns.
    itemsize : int
        Bytes per element.
    n_rows : int or None, default=None
        If given, the result is capped at ``n_rows`` (but is at least 1).
    block_bytes : int, default=64 MiB
        Target block size in bytes.

    Returns
    -------
    int
        At least 1.
    """
    rows = max(1, int(block_bytes) // max(1, int(n_features) * int(itemsize)))
    if n_rows is not None:
        rows = max(1, min(rows, int(n_rows)))
    return rows


def as_row_blocks(X: da.Array, chunk_rows: int | None = None) -> da.Array:
    """Rechunk ``X`` lazily so each block holds all columns.

    Parameters
    ----------
    X : dask array of shape (n,) or (n, d)
    chunk_rows : int or None
        Rows per block; None keeps the current row chunking.
    """
    spec: dict[int, int | tuple[int, ...]] = {}
    if chunk_rows is not None:
        spec[0] = check_chunk_rows(chunk_rows, "chunks")
    if X.ndim == 2:
        spec[1] = -1
    return X.rechunk(spec) if spec else X


def align_rows(y: da.Array, X: da.Array) -> da.Array:
    """Rechunk ``y`` lazily to the row boundaries of ``X`` (all target columns in one block)."""
    spec: dict[int, int | tuple[int, ...]] = {0: X.chunks[0]}
    if y.ndim == 2:
        spec[1] = -1
    return y.rechunk(spec)


def numpy_to_dask(a: np.ndarray, chunk_rows: int | None = None) -> da.Array:
    """Wrap an in-memory array as a row-chunked dask array.

    ``chunk_rows=None`` picks about 64 MiB per block (at least 1 row).
    """
    n = a.shape[0]
    d = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim > 1 else 1
    if chunk_rows is None:
        chunk_rows = auto_chunk_rows(d, a.dtype.itemsize, n_rows=n)
    chunk_rows = max(1, min(check_chunk_rows(chunk_rows, "chunks"), max(n, 1)))
    return da.from_array(a, chunks=(chunk_rows,) + tuple(a.shape[1:]))


def uniform_row_chunks(X: da.Array) -> bool:
    """Whether every row block but the last has the same size (what Zarr needs)."""
    rows = X.chunks[0]
    return len(set(rows[:-1])) <= 1 and (len(rows) < 2 or rows[-1] <= rows[0])
