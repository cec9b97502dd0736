"""Turning what users pass to ``fit``/``predict`` into validated dask arrays."""

from __future__ import annotations

import math
import os
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp
from dask.base import is_dask_collection

from daskkrr.data.chunking import auto_chunk_rows
from daskkrr.data.loading import frame_rows, is_dask_frame, open_dataset
from daskkrr.data.validation import check_feature_columns


def is_in_memory(X: Any) -> bool:
    """True for numpy arrays, lists, pandas objects, scipy sparse matrices and other
    array-likes that are already in memory (the estimators check them as scikit-learn does).

    Dask collections (arrays, DataFrames, Series) are lazy although they have ``__array__``:
    ``np.asarray`` would compute them on the client."""
    if isinstance(X, (np.ndarray, list, tuple)) or sp.issparse(X):
        return True
    lazy = is_dask_collection(X) or _module_of(X) in ("xarray", "zarr")
    return hasattr(X, "__array__") and not lazy


def _module_of(X: Any) -> str:
    return type(X).__module__.split(".", 1)[0]


def is_store(X: Any) -> bool:
    """True for a path to (or an open) Zarr store / xarray Dataset."""
    if isinstance(X, (str, os.PathLike)):
        return True
    return _module_of(X) == "zarr" or type(X).__name__ == "Dataset"


def load_training_data(X: Any, y: Any, chunks: int | None) -> tuple[da.Array, da.Array]:
    """Open ``(X, y)`` from anything :func:`daskkrr.data.open_dataset` takes.

    numpy ``X`` under a distributed client is split into one block per task slot (at
    most about 64 MiB each, or ``chunks`` rows) and scattered to the workers once
    (:meth:`~daskkrr.parallel.backends.DistributedBackend.scatter_rows`), with the rows of a numpy ``y``.
    """
    refuse_unknown_chunks(X, "X")
    refuse_unknown_chunks(y, "y")
    backend = scatter_backend(X)
    if backend is not None:
        X = np.asarray(X)
        chunks = chunks or rows_per_slot(X, backend.n_slots())
    if is_store(X):
        Xd, yd = open_dataset(X, y="y" if y is None else y, chunks=chunks)
    else:
        if y is None:
            raise ValueError("y is required when X is an array; pass fit(X, y)")
        Xd, yd = open_dataset(X, y=y, chunks=chunks)
    if yd is None:
        raise ValueError("the training data has no target y")
    if backend is not None:
        Xd = backend.scatter_rows(X, Xd.chunks[0])
        if isinstance(y, np.ndarray) or is_in_memory(y):
            yd = backend.scatter_rows(np.asarray(y), Xd.chunks[0])
    return Xd, yd


def load_features(X: Any, chunks: int | None = None, *, for_fit: bool = False) -> da.Array:
    """Open features only (for predict, or ``for_fit`` for an unsupervised fit).

    For predict a dask DataFrame becomes its lazy values, row counts unknown: a prediction
    is one task per partition and needs no row count, so nothing is computed here (its
    result has the frame's partitions as blocks). A fit needs the counts (one pass).
    """
    if is_dask_frame(X) and not for_fit:
        return frame_features(X, chunks)
    refuse_unknown_chunks(X, "X")
    Xd, _ = open_dataset(X, y=None, chunks=chunks)
    return Xd


def frame_features(X: Any, chunks: int | None) -> da.Array:
    """A dask DataFrame's values for a blockwise pass, checked on metadata only (2-D, numeric)."""
    Xd = X.to_dask_array()
    check_feature_columns(Xd, "X")
    if chunks is not None:  # rows per block given: the lengths are needed to rechunk
        return open_dataset(frame_rows(X), y=None, chunks=chunks)[0]
    return Xd


def refuse_unknown_chunks(a: Any, name: str) -> None:
    """ValueError for a dask array whose row count is unknown (after boolean masking, say).

    The passes need every block's row count (to place the rows and size the graphs), and
    finding them reads all the data once: that read is left to the user, who may persist
    the result instead of computing it twice.
    """
    if isinstance(a, da.Array) and any(math.isnan(c) for c in a.chunks[0]):
        raise ValueError(
            f"{name} is a dask array with unknown chunk sizes along its rows (shape {a.shape}), as after "
            f"boolean masking; daskkrr needs the row count of every block: call {name}.compute_chunk_sizes() "
            f"(or {name}.persist().compute_chunk_sizes() to read the data once) before fit or predict"
        )


def scatter_backend(X: Any) -> Any:
    """The distributed backend the fit will run on when ``X`` is in memory; None otherwise."""
    if not is_in_memory(X) or sp.issparse(X):
        return None
    from daskkrr.parallel.backends import backend_for

    backend = backend_for()
    return backend if backend.is_distributed else None


def rows_per_slot(X: np.ndarray, n_slots: int) -> int:
    """Rows per block for in-memory ``X`` on a cluster of ``n_slots`` task slots: one block per
    slot so that every pass keeps every slot busy, and at most about 64 MiB per block."""
    n = max(int(X.shape[0]), 1)
    d = int(np.prod(X.shape[1:], dtype=np.int64)) if X.ndim > 1 else 1
    cap = auto_chunk_rows(d, max(X.dtype.itemsize, 1), n_rows=n)
    return max(1, min(cap, math.ceil(n / max(n_slots, 1))))
