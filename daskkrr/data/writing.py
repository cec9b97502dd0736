"""Write features and targets to a daskkrr Zarr store.

Layout of a daskkrr store (Zarr format 3)::

    <path>/            group, attrs {"daskkrr_format": 1, ...}
        X              (n, d) array, chunks (chunk_rows, d)
        y              (n,) or (n, t) array, chunks (chunk_rows,) / (chunk_rows, t); optional

:func:`daskkrr.data.open_dataset` reads it back. :func:`write_array_zarr`
stores a single array (e.g. predictions) the same way under a name of choice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import dask.array as da
import numpy as np
import xarray as xr
import zarr
import zarr.codecs

from daskkrr.data.chunking import FORMAT_VERSION, as_row_blocks, numpy_to_dask, uniform_row_chunks
from daskkrr.data.loading import as_array, open_dataset
from daskkrr.data.validation import check_features
from daskkrr.utils.atomic import atomic_directory, check_destination

__all__ = ["DEFAULT_COMPRESSORS", "FORMAT_VERSION", "create_store", "write_array_zarr", "write_zarr"]

#: Compression of new arrays: Blosc LZ4 with byte shuffle. Streamed FALKON passes re-read
#: the store on every CG iteration; with Zarr's default (Zstd level 0) reading and
#: decompressing took ~18% of a pass (n = 1e6, d = 20, float32, M = 2000, 2 cores;
#: workflows/benchmarks/scaling_zarr.py). LZ4+shuffle decodes 2-2.5x faster (1.9 vs 0.9 GB/s
#: per core on random float32 features) at the same size there (0.94 vs 0.92 of raw), and
#: still compresses discrete real features (1203_BNG_pwLinear: 0.26 vs 0.14 of raw).
DEFAULT_COMPRESSORS = (zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)

def write_zarr(
    X: Any,
    y: Any | None,
    path: str | os.PathLike,
    chunk_rows: int | None = None,
    overwrite: bool = False,
    *,
    attrs: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``X`` (and ``y``) atomically to a row-chunked Zarr v3 store.

    Parameters
    ----------
    X : array of shape (n, d)
        numpy, dask, zarr or xarray array. A dask array is written block by block,
        never loaded whole.
    y : array of shape (n,) or (n, t), or None
        Target; None writes ``X`` only.
    path : str or os.PathLike
        Directory of the new store.
    chunk_rows : int or None, default=None
        Rows per Zarr chunk (every chunk holds all columns). None keeps the row
        chunking of a dask ``X`` (irregular blocks are rechunked to the largest
        block size) and chooses about 64 MiB per chunk for in-memory data.
    overwrite : bool, default=False
        Replace an existing ``path``.
    attrs : mapping, optional
        Extra JSON-serialisable group attributes (``daskkrr_format`` is reserved).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False.
    TypeError, ValueError
        For invalid arrays (see :func:`open_dataset`).

    Notes
    -----
    The store is built in a hidden sibling directory and renamed to ``path`` at
    the end; if anything fails, nothing is left at ``path``.
    """
    if isinstance(X, (str, os.PathLike, xr.Dataset, zarr.Group)):
        raise TypeError(
            f"write_zarr takes arrays, not a {type(X).__name__}; open the source first: "
            f"X, y = daskkrr.data.open_dataset(source)"
        )
    if isinstance(y, str):
        raise TypeError(f"y must be an array or None, not the name {y!r}")
    check_destination(path, overwrite)
    X, y = open_dataset(X, y=y, chunks=chunk_rows)
    arrays = {"X": X} if y is None else {"X": X, "y": y}
    return _write_arrays(arrays, path, overwrite, attrs)


def write_array_zarr(
    array: Any,
    path: str | os.PathLike,
    name: str = "array",
    chunk_rows: int | None = None,
    overwrite: bool = False,
    *,
    attrs: Mapping[str, Any] | None = None,
) -> Path:
    """Write one row-chunked array (e.g. predictions) atomically to a Zarr v3 store.

    Parameters
    ----------
    array : array of shape (n,) or (n, t)
        numpy, dask, zarr or xarray array; a dask array is written block by block.
    path : str or os.PathLike
        Directory of the new store.
    name : str, default="array"
        Name of the array inside the store's root group.
    chunk_rows, overwrite, attrs
        As in :func:`write_zarr`.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name must be a non-empty array name without '/'; got {name!r}")
    check_destination(path, overwrite)
    array = as_array(array, name)
    if array.ndim not in (1, 2):
        raise ValueError(
            f"{name} must be 1-D or 2-D (rows first); got shape {tuple(array.shape)}"
        )
    check_features(array.reshape(-1, 1) if array.ndim == 1 else array, name)
    if isinstance(array, np.ndarray):
        array = numpy_to_dask(array, chunk_rows)
    else:
        array = as_row_blocks(array, chunk_rows)
    return _write_arrays({name: array}, path, overwrite, attrs)


def _write_arrays(
    arrays: dict[str, da.Array],
    path: str | os.PathLike,
    overwrite: bool,
    attrs: Mapping[str, Any] | None,
) -> Path:
    """Store row-aligned dask arrays as a daskkrr group at ``path``, atomically."""
    first = next(iter(arrays.values()))
    rows = max(first.chunks[0])
    if not uniform_row_chunks(first):  # Zarr chunks are regular; dask blocks may not be
        arrays = {key: a.rechunk({0: rows}) for key, a in arrays.items()}
    with atomic_directory(path, overwrite) as tmp:
        group = create_store(tmp, arrays, rows, attrs)
        targets = [cast(zarr.Array, group[key]) for key in arrays]  # create_store made them arrays
        _store(list(arrays.values()), targets)
    return Path(path)


def _store(sources: list[da.Array], targets: list[zarr.Array]) -> None:
    """``da.store`` the blocks; on a failure, return only once no worker still writes one of them.

    Tasks already running when one fails (a full disk) go on writing their chunks after the
    error reaches here; removing the temporary store before they end would let them create it
    again. So the computation is cancelled and its running tasks are waited for.
    """
    import dask
    from dask.base import get_scheduler

    # dask types the targets as array-likes; it only needs __setitem__, which zarr arrays have.
    stored = da.store(sources, targets, lock=False, compute=False)  # type: ignore[arg-type]
    parts = list(stored) if isinstance(stored, (tuple, list)) else [stored]  # one or one per array
    # The client dask would use (a distributed Client's bound ``get``); not with scheduler="sync" & co.
    scheduler = get_scheduler(collections=parts)
    client = getattr(scheduler, "__self__", None)
    if client is None or not hasattr(client, "cancel"):
        _store_locally(parts, scheduler)
        return
    # Optimised here, so that the keys waited for below are the keys the workers run (fusion renames tasks).
    parts = list(dask.optimize(*parts))
    futures = client.compute(parts, optimize_graph=False)
    try:
        client.gather(futures)
    except BaseException:
        keys = [key for part in parts for key in part.__dask_graph__()]
        client.cancel(futures, force=True)
        _wait_until_idle(client, keys)
        raise


def _store_locally(parts: list[Any], scheduler: Any) -> None:
    """Compute the stores without a distributed client; on a failure, return only once no thread writes.

    Dask's threaded scheduler raises the first task's error at once, while the tasks already
    handed to its (shared, long-lived) thread pool go on writing chunks. So the threaded case
    runs on a pool of its own, whose shutdown drops the tasks not yet started and waits for
    the running ones: when the error reaches :func:`atomic_directory`, nothing writes any more.
    """
    import dask
    import dask.threaded

    if scheduler is not dask.threaded.get:  # e.g. "sync": one task at a time, in this thread, none after its error
        dask.compute(*parts)
        return
    from concurrent.futures import ThreadPoolExecutor

    from dask.system import CPU_COUNT

    # The pool dask itself would make (it passes context variables on; newer dask only), else a plain one.
    executor = getattr(dask.threaded, "ContextAwareThreadPoolExecutor", ThreadPoolExecutor)
    pool = executor(dask.config.get("num_workers", None) or CPU_COUNT)
    try:
        dask.compute(*parts, scheduler="threads", pool=pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: Worker task states in which a task may still run, or start, and write.
_BUSY_STATES = frozenset({"waiting", "ready", "constrained", "executing", "long-running", "cancelled", "resumed"})


def _wait_until_idle(client: Any, keys: list[Any], timeout: float = 60.0) -> None:
    """Wait (up to ``timeout`` seconds) until no worker holds one of ``keys`` running or about to run."""
    import time

    wanted = set(keys)

    def busy(dask_worker: Any) -> int:
        tasks = dask_worker.state.tasks
        return sum(1 for key in wanted if key in tasks and tasks[key].state in _BUSY_STATES)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not any(client.run(busy, on_error="ignore").values()):
                return
        except Exception:  # a lost connection: nothing more to wait for from here  # noqa: BLE001
            return
        time.sleep(0.05)


def create_store(
    path: str | os.PathLike,
    templates: Mapping[str, Any],
    chunk_rows: int,
    attrs: Mapping[str, Any] | None = None,
) -> zarr.Group:
    """Create a daskkrr group of empty arrays shaped and typed like ``templates``.

    Parameters
    ----------
    path : str or os.PathLike
        Directory to create the group in (overwritten).
    templates : mapping of str to objects with ``shape`` and ``dtype``
        Name and template of each array. A leading dimension of 0 creates an
        array to be grown with ``resize``.
    chunk_rows : int
        Rows per chunk; every chunk holds all columns.
    attrs : mapping, optional
        Extra group attributes (``daskkrr_format`` is set by this function).

    Returns
    -------
    zarr.Group
        Opened for writing.
    """
    group = zarr.open_group(path, mode="w", zarr_format=3)
    group.attrs.update({**dict(attrs or {}), "daskkrr_format": FORMAT_VERSION})
    for name, like in templates.items():
        shape = tuple(int(s) for s in like.shape)
        group.create_array(name, shape=shape, chunks=(chunk_rows,) + shape[1:], dtype=like.dtype,
                           compressors=DEFAULT_COMPRESSORS)
    return group
