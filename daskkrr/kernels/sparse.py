"""Kernel blocks of scipy sparse rows, from sparse dot products.

A row block (or the centers) may be a scipy sparse matrix (CSR or CSC; any other
sparse format is read as CSR). Its kernel block ``k(A, B)`` is dense (``n_b x M``,
the size of a tile the engines bound by ``max_tile_bytes``) and computed without
densifying the rows:

- dot-product kernels from ``A @ B.T`` (sparse-dense or sparse-sparse);
- the Gaussian kernel from the squared norms of the sparse rows and ``A @ B.T``
  (``|a|^2 + |b|^2 - 2 a.b``, clipped at zero; ARD length scales divide the columns,
  which keeps the rows sparse);
- any other kernel (Laplacian, Matern, user kernels) has no dot-product form: its
  rows are densified a piece at a time, each piece at most :data:`DENSE_PIECE_BYTES`,
  and the kernel's own formula runs on the pieces.

Round-off: the dense Gaussian path first shifts both sets by the mean of ``B``; the
sparse one cannot (a shift destroys sparsity), so its squared distances carry an
absolute error of ``~ eps (|a|^2 + |b|^2)`` instead of ``~ eps (|a - m|^2 + |b - m|^2)``;
for the unit-scaled rows the estimators pass (standardised, or tf-idf-like rows of
norm ~1) both are ``~ eps |a|^2``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

#: Largest dense piece (rows x features x itemsize) a sparse block is densified into at once,
#: for kernels without a dot-product form (the engines' default tile size).
DENSE_PIECE_BYTES = 32 * 2**20

_FLOATS = (np.float32, np.float64)


def is_sparse(a: Any) -> bool:
    """True for a scipy sparse matrix or array."""
    return sp.issparse(a)


def as_sparse_rows(a: Any, name: str = "A") -> sp.csr_matrix:
    """``a`` as a 2-D float32/float64 CSR matrix (ints and bools become float64).

    CSR slices rows cheaply, which is all the engines do with a block; a CSC input is
    converted once here (the estimators convert the whole input once, before the blocks).
    """
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, features); got shape {a.shape}")
    out = sp.csr_matrix(a)
    if out.dtype not in _FLOATS:
        if not (np.issubdtype(out.dtype, np.number) or out.dtype == bool):
            raise TypeError(f"{name} must be numeric; got dtype {out.dtype}")
        out = out.astype(np.float64)
    return out


def cast_rows(a: Any, dtype: Any) -> Any:
    """``a`` in ``dtype``: sparse stays sparse (CSR), dense becomes a numpy array."""
    if is_sparse(a):
        return as_sparse_rows(a).astype(dtype, copy=False)
    return np.asarray(a, dtype=dtype)


def row_dot(A: Any, B: Any) -> np.ndarray:
    """``A @ B.T`` as a dense array in the common dtype, for sparse or dense ``A`` and ``B``."""
    dtype = np.result_type(A.dtype, B.dtype)
    if is_sparse(A):
        out = A @ B.T
    elif is_sparse(B):  # dense @ sparse.T: computed as (B @ A.T).T so the sparse operand leads
        out = (B @ A.T).T
    else:
        out = A @ B.T
    if is_sparse(out):
        out = out.toarray()
    return np.ascontiguousarray(np.asarray(out), dtype=dtype)


def row_norms_squared(A: Any) -> np.ndarray:
    """``|a_i|^2`` for each row, from the stored entries only when ``A`` is sparse."""
    if is_sparse(A):
        return np.asarray(A.multiply(A).sum(axis=1), dtype=A.dtype).reshape(-1)
    return np.einsum("ij,ij->i", A, A)


def squared_distances_sparse(A: Any, B: Any) -> np.ndarray:
    """``|a_i - b_j|^2`` by ``|a|^2 + |b|^2 - 2 a.b``, clipped at zero (one operand at least sparse)."""
    D = row_dot(A, B)
    D *= -2
    D += row_norms_squared(A)[:, None].astype(D.dtype, copy=False)
    D += row_norms_squared(B)[None, :].astype(D.dtype, copy=False)
    np.maximum(D, 0, out=D)
    return D


def scale_columns(A: Any, factors: np.ndarray) -> Any:
    """``A`` with column ``j`` multiplied by ``factors[j]``: stays sparse (CSR) for sparse ``A``."""
    f = np.asarray(factors, dtype=A.dtype)
    if is_sparse(A):
        return as_sparse_rows(A @ sp.diags(f, format="csr"))
    return np.ascontiguousarray(A * f)


def dense_pieces(A: Any, piece_bytes: int = DENSE_PIECE_BYTES):
    """``(slice, dense rows)`` of ``A``, each piece at most ``piece_bytes`` when densified."""
    d = max(1, int(A.shape[1]))
    step = max(1, int(piece_bytes) // (d * np.dtype(A.dtype).itemsize))
    for start in range(0, A.shape[0], step):
        sl = slice(start, min(A.shape[0], start + step))
        piece = A[sl]
        yield sl, np.ascontiguousarray(piece.toarray() if is_sparse(piece) else piece)


def blockwise_dense(block: Any, A: Any, B: Any, piece_bytes: int = DENSE_PIECE_BYTES) -> np.ndarray:
    """``block(a, b)`` (a kernel formula on dense rows) over dense pieces of ``A`` and ``B``,
    assembled into the ``(len(A), len(B))`` matrix: for kernels with no dot-product form."""
    dtype = np.result_type(A.dtype, B.dtype)
    out = np.empty((A.shape[0], B.shape[0]), dtype=dtype)
    b_pieces = list(dense_pieces(B, piece_bytes)) if is_sparse(B) else [(slice(None), np.asarray(B))]
    for rows, a in dense_pieces(A, piece_bytes):
        for cols, b in b_pieces:
            out[rows, cols] = block(a.astype(dtype, copy=False), b.astype(dtype, copy=False))
    return out


def sparse_pair(A: Any, B: Any) -> tuple[Any, Any]:
    """``A`` and ``B`` (at least one sparse) checked as rows of equal width, in their common float dtype."""
    A = as_sparse_rows(A, "A") if is_sparse(A) else np.atleast_2d(np.asarray(A))
    B = as_sparse_rows(B, "B") if is_sparse(B) else np.atleast_2d(np.asarray(B))
    if A.shape[1] != B.shape[1]:
        raise ValueError(
            f"k(A, B) needs the same number of features: A has shape {A.shape}, B has shape {B.shape}"
        )
    dtype = np.result_type(A.dtype, B.dtype, np.float32)
    if dtype not in _FLOATS:
        dtype = np.dtype(np.float64)
    return cast_rows(A, dtype), cast_rows(B, dtype)


def dense_rows(rows: Any) -> np.ndarray:
    """Rows as a C-contiguous numpy array (a scipy sparse matrix densified: for small sets of rows only,
    such as gathered centers)."""
    return np.ascontiguousarray(rows.toarray() if is_sparse(rows) else rows)


def take_rows(X: Any, idx: np.ndarray) -> Any:
    """``X[idx]``: CSR rows for sparse ``X``, a C-contiguous numpy array otherwise."""
    if is_sparse(X):
        return as_sparse_rows(X)[np.asarray(idx)]
    return np.ascontiguousarray(np.asarray(X)[idx])
