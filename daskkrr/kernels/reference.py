"""The numpy reference of the per-block kernel products.

Plain numpy, one large kernel tile (up to ``max_tile_bytes``) at a time: build
the tile with the kernel object, then multiply with BLAS. Accumulation is in
float64 whatever the block dtype. :class:`daskkrr.kernels.engine.NumpyEngine`
computes its products with these; the tests compare the fused engine
(:mod:`daskkrr.kernels.fused`) against them, and the throughput benchmark
(``workflows/benchmarks/engine_throughput.py``) uses them as the baseline.
"""

from __future__ import annotations

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.sparse import cast_rows

#: Largest kernel tile (rows x centers x itemsize) built at once.
DEFAULT_TILE_BYTES = 32 * 2**20


def _row_tiles(n_rows: int, n_centers: int, itemsize: int, max_tile_bytes: int):
    step = max(1, int(max_tile_bytes // max(1, n_centers * itemsize)))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


def _cast(Xb: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both in their common float dtype; scipy sparse rows stay sparse (CSR)."""
    dt = np.result_type(Xb.dtype, Z.dtype, np.float32)
    return cast_rows(Xb, dt), cast_rows(Z, dt)


def knm_gram_matvec(
    kernel: Kernel,
    Xb: np.ndarray,
    Z: np.ndarray,
    U: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
) -> np.ndarray:
    """``k(Xb, Z)^T (k(Xb, Z) U)`` for one row block, as float64 of shape ``(M, t)``."""
    Xb, Z = _cast(Xb, Z)
    U2 = np.asarray(U, dtype=np.float64).reshape(Z.shape[0], -1)
    out = np.zeros((Z.shape[0], U2.shape[1]), dtype=np.float64)
    for sl in _row_tiles(Xb.shape[0], Z.shape[0], Xb.dtype.itemsize, max_tile_bytes):
        # float64 products of float32 tiles: float32 GEMMs would make K^T K U inconsistent (not
        # one symmetric matrix) at float32's round-off, which CG amplifies by the condition
        Kt = kernel(Xb[sl], Z).astype(np.float64, copy=False)
        out += Kt.T @ (Kt @ U2)
    return out.reshape((Z.shape[0],) + np.shape(U)[1:])


def knm_t_matvec(
    kernel: Kernel,
    Xb: np.ndarray,
    Z: np.ndarray,
    V: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
) -> np.ndarray:
    """``k(Xb, Z)^T V`` for one row block (V has ``len(Xb)`` rows), as float64 ``(M, t)``."""
    Xb, Z = _cast(Xb, Z)
    V2 = np.asarray(V, dtype=np.float64).reshape(Xb.shape[0], -1)
    out = np.zeros((Z.shape[0], V2.shape[1]), dtype=np.float64)
    for sl in _row_tiles(Xb.shape[0], Z.shape[0], Xb.dtype.itemsize, max_tile_bytes):
        Kt = kernel(Xb[sl], Z)
        out += Kt.T.astype(np.float64, copy=False) @ V2[sl]
    return out.reshape((Z.shape[0],) + np.shape(V)[1:])


def knm_matvec(
    kernel: Kernel,
    Xb: np.ndarray,
    Z: np.ndarray,
    alpha: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
) -> np.ndarray:
    """``k(Xb, Z) alpha`` for one row block (the prediction), float64 ``(n_b,)`` or ``(n_b, t)``."""
    Xb, Z = _cast(Xb, Z)
    A2 = np.asarray(alpha, dtype=np.float64).reshape(Z.shape[0], -1)
    out = np.empty((Xb.shape[0], A2.shape[1]), dtype=np.float64)
    for sl in _row_tiles(Xb.shape[0], Z.shape[0], Xb.dtype.itemsize, max_tile_bytes):
        out[sl] = kernel(Xb[sl], Z).astype(np.float64, copy=False) @ A2
    return out.reshape((Xb.shape[0],) + np.shape(alpha)[1:])


def knm_gram_and_rhs(
    kernel: Kernel,
    Xb: np.ndarray,
    Yb: np.ndarray,
    Z: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
    *,
    right: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """``[W^T W | K^T Y]`` with ``K = k(Xb, Z)``: the direct Nystrom solve's one pass, ``(M, M + t)``.

    ``W = K`` by default; with ``right = (T, d)`` (an upper-triangular ``T`` and a
    positive vector ``d``), ``W = K diag(d) T^{-1}``, see :func:`precondition_tile`.
    """
    Xb, Z = _cast(Xb, Z)
    Y2 = np.asarray(Yb, dtype=np.float64).reshape(Xb.shape[0], -1)
    M = Z.shape[0]
    out = np.zeros((M, M + Y2.shape[1]), dtype=np.float64)
    for sl in _row_tiles(Xb.shape[0], M, Xb.dtype.itemsize, max_tile_bytes):
        Kt = kernel(Xb[sl], Z).astype(np.float64, copy=False)
        Wt = Kt if right is None else precondition_tile(Kt, *right)
        out[:, :M] += Wt.T @ Wt
        out[:, M:] += Kt.T @ Y2[sl]
    return out


def kernel_block(kernel: Kernel, Xb: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """``k(Xb, Z)`` materialised in the common dtype of ``Xb`` and ``Z``, ``(n_b, M)``."""
    Xb, Z = _cast(Xb, Z)
    return np.ascontiguousarray(kernel(Xb, Z))


#: Rows of a stored block widened to float64 at once by the cached products.
CACHED_SLICE_ROWS = 4096


def cached_gram_matvec(K: np.ndarray, U: np.ndarray) -> np.ndarray:
    """``K^T (K U)`` for a stored kernel block ``K``, float64 ``(M, t)``."""
    U2 = np.asarray(U, dtype=np.float64).reshape(K.shape[1], -1)
    out = np.zeros_like(U2)
    for s in range(0, K.shape[0], CACHED_SLICE_ROWS):  # float64 a slice at a time
        K64 = np.asarray(K[s : s + CACHED_SLICE_ROWS], dtype=np.float64)
        out += K64.T @ (K64 @ U2)
    return out


def cached_t_matvec(K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``K^T V`` for a stored kernel block ``K`` (``V`` has ``len(K)`` rows), float64 ``(M, t)``."""
    V2 = np.asarray(V, dtype=np.float64).reshape(K.shape[0], -1)
    out = np.zeros((K.shape[1], V2.shape[1]))
    for s in range(0, K.shape[0], CACHED_SLICE_ROWS):
        out += np.asarray(K[s : s + CACHED_SLICE_ROWS], dtype=np.float64).T @ V2[s : s + CACHED_SLICE_ROWS]
    return out


def precondition_tile(K: np.ndarray, T: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``K diag(d) T^{-1}`` for a float64 kernel tile (one triangular solve).

    Accumulating ``W^T W = T^-T D K^T K D T^-1`` instead of ``K^T K`` is what
    FALKON's CG needs, and it avoids squaring the condition number of ``K_MM``:
    an explicit ``K^T K`` carries round-off ``eps ||K||^2`` that ``T^{-1}`` then
    amplifies by ``1 / lambda_min(K_MM)``.
    """
    from scipy.linalg import solve_triangular

    return solve_triangular(T, (K * d[None, :]).T, trans="T", lower=False, check_finite=False).T
