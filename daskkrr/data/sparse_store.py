"""Sparse features in a Zarr store: LIBSVM/svmlight files to CSR row blocks, and back as a dask array.

Layout (a daskkrr store, ``daskkrr_format`` 1): the features are a *group* ``X`` whose
attributes say ``daskkrr_sparse = "csr"``, ``shape = [n, d]`` and ``chunk_rows``, holding
three 1-D arrays, those of one CSR matrix over all rows:

- ``data`` (nnz,): the stored values;
- ``indices`` (nnz,), int32: their columns;
- ``indptr`` (n + 1,), int64: where each row starts in ``data``, chunked by ``chunk_rows``.

The target ``y`` is an ordinary array at the root, chunked by ``chunk_rows``. Row block
``k`` (rows ``k r .. (k+1) r``) reads ``r + 1`` entries of ``indptr`` and then exactly its own
entries of ``data`` and ``indices``, so :func:`open_sparse_group` keeps the row-block
chunking and reads each block once, where it is used.
"""

from __future__ import annotations

import os
from typing import Any, cast

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
import zarr
import zarr.codecs

from daskkrr.data.chunking import FORMAT_VERSION
from daskkrr.data.validation import check_chunk_rows
from daskkrr.kernels.sparse import as_sparse_rows

#: The group attribute that marks sparse features, and its value for CSR row blocks.
SPARSE_ATTR = "daskkrr_sparse"
#: Stored entries per chunk of ``data`` and ``indices``.
ENTRY_CHUNK = 2**20
#: The codec of :data:`daskkrr.data.writing.DEFAULT_COMPRESSORS` (not imported from there: writing
#: imports loading, which opens these stores).
COMPRESSORS = (zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)


def write_sparse_zarr(path: str | os.PathLike, X: Any, y: Any, chunk_rows: int, *,
                      attrs: dict[str, Any] | None = None) -> zarr.Group:
    """Write sparse ``X`` (any scipy format; stored as CSR) and its target ``y`` to a new Zarr store.

    Parameters
    ----------
    path : str or os.PathLike
        The store to create (replaced if it exists: callers check ``overwrite`` first).
    X : scipy sparse matrix of shape (n, d)
    y : array-like of shape (n,) or (n, t)
    chunk_rows : int
        Rows per block of the store (and of the dask array :func:`open_sparse_group` opens).
    attrs : dict, optional
        Extra attributes of the root group.

    Returns
    -------
    zarr.Group
        The root group.
    """
    rows = check_chunk_rows(chunk_rows, "chunk_rows")
    csr = as_sparse_rows(X, "X")
    csr.sort_indices()
    y = np.asarray(y)
    if y.shape[0] != csr.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows but X has {csr.shape[0]}; pass one target per row")
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.attrs.update({**dict(attrs or {}), "daskkrr_format": FORMAT_VERSION})
    group = root.create_group("X")
    group.attrs.update({SPARSE_ATTR: "csr", "shape": [int(s) for s in csr.shape], "chunk_rows": rows})
    parts = {"data": csr.data, "indices": csr.indices.astype(np.int32),
             "indptr": csr.indptr.astype(np.int64)}
    for name, values in parts.items():
        chunk = rows + 1 if name == "indptr" else ENTRY_CHUNK
        arr = group.create_array(name, shape=values.shape, chunks=(max(1, min(chunk, max(values.size, 1))),),
                                 dtype=values.dtype, compressors=COMPRESSORS)
        arr[:] = values
    target = root.create_array("y", shape=y.shape, chunks=(rows,) + y.shape[1:], dtype=y.dtype,
                               compressors=COMPRESSORS)
    target[...] = y
    return root


def is_sparse_group(node: Any) -> bool:
    """True for a Zarr group written by :func:`write_sparse_zarr` as features."""
    return isinstance(node, zarr.Group) and node.attrs.get(SPARSE_ATTR) == "csr"


def open_sparse_group(group: zarr.Group, where: str) -> da.Array:
    """The sparse features of ``group`` (see the module docstring) as a dask array of CSR row blocks."""
    try:
        attrs: dict[str, Any] = dict(group.attrs)  # JSON values, checked by the conversions
        n, d = (int(v) for v in attrs["shape"])
        rows = int(attrs["chunk_rows"])
        data, indices, indptr = (cast(zarr.Array, group[name]) for name in ("data", "indices", "indptr"))
    except Exception as exc:
        raise ValueError(
            f"{where}: the sparse feature group {group.path or '/'!r} is damaged ({exc}); write it again with "
            "daskkrr convert --sparse"
        ) from exc
    dtype = np.dtype(data.dtype)
    meta = sp.csr_matrix((0, d), dtype=dtype)
    read = dask.delayed(read_csr_rows, pure=True)
    blocks = [
        da.from_delayed(read(data, indices, indptr, start, min(n, start + rows), d),
                        shape=(min(n, start + rows) - start, d), dtype=dtype, meta=meta)
        for start in range(0, n, rows)
    ]
    return da.concatenate(blocks, axis=0) if len(blocks) > 1 else blocks[0]


def read_csr_rows(data: Any, indices: Any, indptr: Any, start: int, stop: int, d: int) -> sp.csr_matrix:
    """Rows ``start .. stop`` of the stored CSR matrix, reading only their entries."""
    ptr = np.asarray(indptr[start : stop + 1], dtype=np.int64)
    lo, hi = int(ptr[0]), int(ptr[-1])
    return sp.csr_matrix((np.asarray(data[lo:hi]), np.asarray(indices[lo:hi]), ptr - lo), shape=(stop - start, d))


def convert_svmlight(source: str | os.PathLike, output: str | os.PathLike, chunk_rows: int,
                     n_features: int | None = None) -> dict[str, int]:
    """Convert a LIBSVM/svmlight file (``label index:value ...`` per line) to a sparse daskkrr store.

    The file is read by scikit-learn's ``load_svmlight_file`` (into memory, as its sparse rows:
    about 12 bytes per stored entry), then written as CSR row blocks (:func:`write_sparse_zarr`).

    Parameters
    ----------
    source : path
        The LIBSVM file (``.gz`` and ``.bz2`` are read as such).
    output : path
        The Zarr store to write.
    chunk_rows : int
        Rows per block.
    n_features : int or None
        The number of features (None: one past the largest index in the file); give it when
        test and training files must agree.

    Returns
    -------
    dict
        ``{"rows": n, "features": d, "stored": nnz}``.
    """
    from sklearn.datasets import load_svmlight_file

    try:
        X, y = load_svmlight_file(os.fspath(source), n_features=n_features)
    except ValueError as exc:
        raise ValueError(
            f"{source} is not a LIBSVM/svmlight file ({exc}); each line must be 'label index:value ...'"
        ) from exc
    write_sparse_zarr(output, X, y, chunk_rows, attrs={"source": os.fspath(source)})
    return {"rows": int(X.shape[0]), "features": int(X.shape[1]), "stored": int(X.nnz)}
