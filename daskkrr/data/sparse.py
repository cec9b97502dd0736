"""scipy sparse features as row-chunked dask arrays whose blocks are CSR matrices.

A CSR or CSC matrix passed to ``fit``/``predict`` becomes a dask array of CSR row
blocks (CSR slices rows cheaply; a CSC input is converted once). Blocks are sized
by their stored bytes (values, column indices and row pointers), about
:data:`~daskkrr.data.chunking.DEFAULT_BLOCK_BYTES` each, as dense blocks are by
``rows x d x itemsize``. The kernel blocks of sparse rows are computed from sparse
dot products (:mod:`daskkrr.kernels.sparse`); the statistics pass summarises the
stored entries (:func:`sparse_moments`).

Standardisation of sparse features scales the columns and does not centre them
(centering would fill in every zero), as scikit-learn's
``StandardScaler(with_mean=False)``: see :func:`refuse_centering`.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from daskkrr.data.chunking import DEFAULT_BLOCK_BYTES
from daskkrr.data.validation import check_chunk_rows
from daskkrr.kernels.sparse import as_sparse_rows, is_sparse, scale_columns

#: Bytes of one stored entry's column index in a CSR matrix (int32, scipy's default).
INDEX_BYTES = 4


def is_sparse_array(X: Any) -> bool:
    """True for a scipy sparse matrix or a dask array whose blocks are scipy sparse matrices."""
    if is_sparse(X):
        return True
    return isinstance(X, da.Array) and is_sparse(getattr(X, "_meta", None))


def sparse_chunk_rows(X: Any, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    """Rows per block so that one CSR block stores about ``block_bytes`` (at least 1 row)."""
    n = max(int(X.shape[0]), 1)
    per_row = (X.nnz / n) * (np.dtype(X.dtype).itemsize + INDEX_BYTES) + INDEX_BYTES
    return max(1, min(n, int(block_bytes // max(per_row, 1.0))))


def sparse_to_dask(X: Any, chunk_rows: int | None = None) -> da.Array:
    """A scipy sparse matrix as a dask array of CSR row blocks (all columns in each block).

    Parameters
    ----------
    X : scipy sparse matrix or array of shape (n, d)
        CSR, CSC or any other scipy format (converted to CSR once).
    chunk_rows : int or None, default=None
        Rows per block; None sizes blocks by their stored bytes (:func:`sparse_chunk_rows`).

    Returns
    -------
    dask array of shape (n, d)
        Its blocks are ``scipy.sparse.csr_matrix`` row blocks.
    """
    csr = as_sparse_rows(X, "X")
    csr.sort_indices()  # canonical order: the same matrix gives the same blocks and digests
    rows = sparse_chunk_rows(csr) if chunk_rows is None else check_chunk_rows(chunk_rows, "chunks")
    rows = max(1, min(rows, csr.shape[0]))
    return da.from_array(csr, chunks=(rows, csr.shape[1]), asarray=False, fancy=False)


def refuse_centering(estimator: str, kernel: Any, standardize: bool) -> None:
    """TypeError for ``standardize=True`` with a dot-product kernel on sparse input.

    Sparse features are scaled, not centred. The stationary kernels (Gaussian,
    Laplacian, Matern) depend on differences of rows only, which a shift does not
    change, so their model is the one of the centred dense data; a dot-product
    kernel's model would not be.
    """
    if standardize and not getattr(kernel, "is_stationary", False):
        raise TypeError(
            f"{estimator}: X is sparse and standardize=True, but centering sparse features would fill in their "
            f"zeros and the {type(kernel).__name__} depends on the centering; pass standardize=False (the raw "
            "features), use a stationary kernel (gaussian, laplacian, matern: sparse features are then scaled "
            "without centering, the same model), or pass X.toarray() if it fits in memory"
        )


def sparse_moments(x: Any, weights: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray]:
    """``(count, column means, sums of squared deviations)`` of a CSR block, in float64.

    Two passes over the stored entries only: the means, then ``sum (x - mean)^2`` over the stored
    entries plus ``mean^2`` for each implicit zero (the same sums as on the dense block, in another
    order). With ``weights`` the weighted moments (count = the sum of the weights).
    """
    x = as_sparse_rows(x).astype(np.float64)
    n, d = x.shape
    rows = np.repeat(np.arange(n), np.diff(x.indptr))
    w_entry = np.ones(x.nnz) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)[rows]
    total = float(n) if weights is None else float(np.sum(weights))
    if total == 0:
        return 0.0, np.zeros(d), np.zeros(d)
    mean = np.bincount(x.indices, weights=w_entry * x.data, minlength=d) / total
    dev = x.data - mean[x.indices]
    m2 = np.bincount(x.indices, weights=w_entry * dev * dev, minlength=d).astype(np.float64)
    stored_weight = np.bincount(x.indices, weights=w_entry, minlength=d)  # rows with a stored entry
    m2 += (total - stored_weight) * mean * mean
    return total, mean, m2


def column_absmax(x: Any) -> np.ndarray:
    """``max |x_ij|`` per column of a sparse block, float64 (NaN entries ignored)."""
    x = as_sparse_rows(x)
    out = np.zeros(x.shape[1])
    data = np.abs(x.data.astype(np.float64))
    keep = ~np.isnan(data)
    np.maximum.at(out, x.indices[keep], data[keep])
    return out


def first_non_finite_row(x: Any) -> int | None:
    """Index (in the block) of the first row with a NaN or inf stored entry, or None."""
    x = as_sparse_rows(x)
    bad = ~np.isfinite(x.data)
    if not bad.any():
        return None
    return int(np.searchsorted(x.indptr, int(np.argmax(bad)), side="right") - 1)


def csr_parts(x: Any) -> tuple[np.ndarray, ...]:
    """The arrays that define a CSR block (canonical index order): values, column indices, row pointers,
    and its shape (for a digest of its content)."""
    x = as_sparse_rows(x).copy()
    x.sort_indices()
    return x.data, x.indices, x.indptr, np.asarray(x.shape, dtype=np.int64)


def scale_sparse(X: Any, factors: np.ndarray) -> Any:
    """Columns of sparse ``X`` (scipy, or a dask array of sparse blocks) times ``factors``, still sparse."""
    if isinstance(X, da.Array):
        return da.map_blocks(scale_columns, X, factors, dtype=X.dtype, meta=sp.csr_matrix((0, 0), dtype=X.dtype))
    return scale_columns(as_sparse_rows(X), factors)
