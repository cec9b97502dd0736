"""The per-block kernel products of a fit with row weights ``w``.

With weights the Nystrom system is ``(K^T W K + lambda W_sum K_MM) alpha = K^T W y``
(``W = diag(w)``), so a block contributes

- ``K^T (w * Y)`` to the right-hand side (:meth:`KernelEngine.t_matvec` of ``w * Y``);
- ``K^T (w * (K U))`` to a CG product (:func:`weighted_gram_matvec`);
- ``W^T diag(w) W`` and ``K^T (w * Y)`` to the Gram strategy's one pass
  (:func:`weighted_gram_and_rhs`);
- ``sqrt(w) * K`` to the cache strategy's stored block (:func:`weighted_kernel_block`),
  on which the unweighted cached products give the weighted ones
  (``(sqrt(w) K)^T (sqrt(w) K) = K^T W K``).

The kernel tiles come from the block's engine (:func:`~daskkrr.kernels.engine.engine_for`,
the fused fill when available) and are multiplied by float64 BLAS products, a
tile of at most ``max_tile_bytes`` at a time, so a weighted product computes each
kernel value once, as the unweighted one does. Pure numpy: the execution layer
(:mod:`daskkrr.parallel.weighted`) maps these over the row blocks.
"""

from __future__ import annotations

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import DEFAULT_TILE_BYTES, engine_for
from daskkrr.kernels.reference import precondition_tile


def _tiles(n_rows: int, n_centers: int, max_tile_bytes: int | None):
    step = max(1, int((max_tile_bytes or DEFAULT_TILE_BYTES) // max(1, n_centers * 8)))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


def _kernel_tile(kernel: Kernel, Xb: np.ndarray, Z: np.ndarray) -> np.ndarray:
    return np.asarray(engine_for(kernel).kernel_block(kernel, Xb, Z), dtype=np.float64)


def _weights(w: np.ndarray, rows: int) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    if w.shape[0] != rows:
        raise ValueError(f"the block has {rows} rows but {w.shape[0]} weights")
    return w


def weighted_t_matvec(kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, V: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``K^T (w * V)`` with ``K = k(Xb, Z)``, float64 ``(M, t)`` (``V``: ``(n_b, t)``)."""
    V2 = np.asarray(V, dtype=np.float64).reshape(Xb.shape[0], -1)
    return engine_for(kernel).t_matvec(kernel, Xb, Z, _weights(w, Xb.shape[0])[:, None] * V2)


def weighted_gram_matvec(kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, U: np.ndarray, w: np.ndarray,
                         max_tile_bytes: int | None = None) -> np.ndarray:
    """``K^T (w * (K U))`` with ``K = k(Xb, Z)``: a weighted CG product, float64 shaped like ``U``."""
    w = _weights(w, Xb.shape[0])
    U2 = np.asarray(U, dtype=np.float64).reshape(Z.shape[0], -1)
    out = np.zeros_like(U2)
    for sl in _tiles(Xb.shape[0], Z.shape[0], max_tile_bytes):
        if not np.any(w[sl]):
            continue  # rows that weigh nothing add nothing
        K = _kernel_tile(kernel, Xb[sl], Z)
        out += K.T @ (w[sl, None] * (K @ U2))
    return out.reshape(np.shape(U))


def weighted_gram_and_rhs(kernel: Kernel, Xb: np.ndarray, Yb: np.ndarray, Z: np.ndarray, w: np.ndarray,
                          right: tuple[np.ndarray, np.ndarray] | None = None,
                          max_tile_bytes: int | None = None) -> np.ndarray:
    """``[V^T diag(w) V | K^T (w * Y)]``, float64 ``(M, M + t)``, with ``V = K`` or, with
    ``right = (T, d)``, ``V = K diag(d) T^{-1}`` (see :func:`~daskkrr.kernels.reference.precondition_tile`)."""
    w = _weights(w, Xb.shape[0])
    Y2 = np.asarray(Yb, dtype=np.float64).reshape(Xb.shape[0], -1)
    M = Z.shape[0]
    out = np.zeros((M, M + Y2.shape[1]))
    for sl in _tiles(Xb.shape[0], M, max_tile_bytes):
        K = _kernel_tile(kernel, Xb[sl], Z)
        V = K if right is None else precondition_tile(K, *right)
        root = np.sqrt(w[sl])[:, None]
        Vw = root * V
        out[:, :M] += Vw.T @ Vw
        out[:, M:] += K.T @ (w[sl, None] * Y2[sl])
    return out


def weighted_kernel_block(kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sqrt(w) * k(Xb, Z)`` in the block dtype, ``(n_b, M)``: the cache strategy's weighted block."""
    K = engine_for(kernel).kernel_block(kernel, Xb, Z)
    root = np.sqrt(_weights(w, Xb.shape[0])).astype(K.dtype)
    return np.ascontiguousarray(K * root[:, None])
