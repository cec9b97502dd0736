"""``k(X, Z) C`` with the centers ``Z`` and coefficients ``C`` in row chunks no process holds whole.

A model whose centers are stored in Zarr (:mod:`daskkrr.data.model_store`) loads them as a
dask array chunked by rows. Its predictions are the sum over the center chunks ``j`` of
``k(X, Z_j) C_j``:

- :func:`chunked_decision` (dask ``X``): one task per (row block ``i``, center chunk ``j``), reading
  that one chunk (on the worker that runs it), then a tree sum over ``j``; no task sees more
  than one chunk of the centers, and the client none;
- :func:`chunked_matvec` (``X`` in memory, hence on the client already): the chunks read one
  after the other, one in memory at a time.

The sums run in another order than one ``k(X, Z) C`` product, so the results differ from the
dense product by round-off (at most about the number of chunks times the dtype's eps, relative to
``|k(X, Z)| |C|``).
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for

__all__ = ["chunked_decision", "chunked_matvec"]


def _aligned(centers: da.Array, coef: da.Array) -> tuple[da.Array, da.Array]:
    """The centers with all columns in each chunk, and the 2-D coefficients in the centers' row chunks."""
    Z = centers.rechunk({1: -1})
    C = coef.reshape(coef.shape[0], -1).rechunk({0: Z.chunks[0], 1: -1})
    return Z, C


def _chunk_product(Xb: np.ndarray, Zj: np.ndarray, Cj: np.ndarray, kernel: Kernel) -> np.ndarray:
    """``k(Xb, Zj) Cj`` of one row block and one center chunk, as a ``(n_b, 1, t)`` block."""
    return np.asarray(engine_for(kernel).matvec(kernel, Xb, Zj, Cj), dtype=np.float64)[:, None, :]


def chunked_decision(X: da.Array, kernel: Kernel, centers: da.Array, coef: da.Array) -> da.Array:
    """``k(X, centers) coef`` of shape ``(n, t)`` (float64), lazily, one task per row block and center chunk.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d)
        Rows (scaled as in fit), chunked by rows.
    kernel : Kernel
        The model's kernel.
    centers : dask.array.Array of shape (M, d)
        The centers, chunked by rows.
    coef : dask.array.Array of shape (M,) or (M, t)
        The coefficients (rechunked to the centers' rows where they differ).

    Returns
    -------
    dask.array.Array of shape (n, t)
        The sum over the center chunks, a tree reduction of ``(n_b, t)`` blocks.
    """
    Z, C = _aligned(centers, coef)
    parts = da.blockwise(_chunk_product, "ijl", X.rechunk({1: -1}), "ik", Z, "jk", C, "jl", kernel=kernel,
                         dtype=np.float64, adjust_chunks={"j": 1}, concatenate=True)
    return parts.sum(axis=1)


def chunked_matvec(X: Any, kernel: Kernel, centers: da.Array, coef: da.Array) -> np.ndarray:
    """``k(X, centers) coef`` of shape ``(n, t)`` (float64) for in-memory ``X``, one center chunk at a time.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (n, d)
        Rows in memory (scaled as in fit).
    kernel : Kernel
        The model's kernel.
    centers : dask.array.Array of shape (M, d)
        The centers, chunked by rows.
    coef : dask.array.Array of shape (M,) or (M, t)
        The coefficients.

    Returns
    -------
    ndarray of shape (n, t)
    """
    Z, C = _aligned(centers, coef)
    engine = engine_for(kernel)
    out = np.zeros((X.shape[0], C.shape[1]))
    for Zb, Cb in zip(Z.blocks.ravel(), C.blocks.ravel()):
        Zj, Cj = dask.compute(Zb, Cb)
        out += engine.matvec(kernel, X, np.asarray(Zj), np.asarray(Cj))
    return out
