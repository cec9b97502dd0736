"""The BLAS engine: the block products from cache-sized tiles with numpy and BLAS only.

It does what :mod:`daskkrr.kernels.fused` does, a tile of rows at a time (about
1 MiB of kernel entries, so each tile stays in the L2 cache between its passes),
but each step of a tile is one numpy or BLAS call instead of a compiled loop:

1. for the Gaussian kernel, the exponent ``-gamma |x - z|^2`` in base 2 by one GEMM of
   rows ``[2 c x, -c |x|^2, 1]`` and columns ``[z, 1, -c |z|^2]`` with
   ``c = gamma log2(e)`` (rows and centers centred on the centers' mean first),
   then numpy's vectorised ``exp2`` in place (1.8x faster than ``exp`` in float32
   with numpy 2.4 on AMD EPYC; no clip at 0, see :meth:`_Tiles.fill`); for the dot-product kernels ``X_t Z^T`` by
   GEMM and the polynomial; for the other kernels, the kernel object's own formula;
2. the products by BLAS GEMV/GEMM.

It needs no compiler, so it is ready the moment daskkrr is imported: under
``engine="auto"`` it computes the products while the fused engine is compiled in
the background, where the install brought no usable compiled code
(:mod:`daskkrr.kernels.warmup`), and it serves
Dask workers too small to keep numba resident. On the AMD EPYC VM it ran the Gaussian
``K^T K u`` at 0.5-0.6x the fused engine's speed (d = 20, M = 1000, float32: the fused
engine forms cross products with 512-bit vectors, OpenBLAS with 256-bit ones) and 5x
the numpy reference's; the kernels without a fast path here (Laplacian, Matern) are
slower.

Accuracy: tile products are formed in the block dtype (float32 GEMV for float32
blocks, as the reference does) and summed across tiles in float64; the
prediction and the right-hand side (:func:`matvec`, :func:`t_matvec`) widen each
tile to float64 first, since their coefficients may cancel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.block_layout import (
    PreparedCenters,
    as_2d,
    check_blocks,
    prepare,
    rows_for_bytes,
    run_parts,
    split_rows,
    sum_parts,
)
from daskkrr.kernels.reference import cached_gram_matvec as _cached_gram
from daskkrr.kernels.reference import cached_t_matvec as _cached_t
from daskkrr.kernels.reference import precondition_tile
from daskkrr.kernels.spec import GAUSSIAN, LINEAR, POLYNOMIAL, kernel_spec

#: Kernel entries per tile: about 1 MiB (fastest of 64-512 rows at M = 1000, d = 20,
#: both dtypes, on the development machine).
TILE_BYTES = 2**20
#: Bytes of one kernel tile for ``K^T K`` (a GEMM; larger tiles keep BLAS efficient).
GRAM_TILE_BYTES = 8 * 2**20
_LOG2E = 1.0 / np.log(2.0)
#: Kinds whose tiles this module computes itself (others use the kernel object).
_OWN_KINDS = (GAUSSIAN, LINEAR, POLYNOMIAL)


def tile_rows(n_centers: int, itemsize: int, max_tile_bytes: int | None = None,
              target_bytes: int = TILE_BYTES) -> int:
    """Rows per tile: about ``target_bytes`` of entries, 16 to 4096 rows, within ``max_tile_bytes``."""
    return rows_for_bytes(n_centers, itemsize, target_bytes, 16, 4096, max_tile_bytes)


class _Tiles:
    """Kernel tiles ``k(X[s:e], Z)`` of one block, for any kernel."""

    def __init__(self, kernel: Kernel, Xb: Any, Z: Any) -> None:
        spec = kernel_spec(kernel)
        self.own = spec is not None and spec.kind in _OWN_KINDS
        if self.own:
            self.X, self.P = prepare(kernel, Xb, Z, "blas")
            P: PreparedCenters = self.P
            self.dtype = self.X.dtype
            if P.spec.kind == GAUSSIAN:
                # -c |x - z|^2 = [2c x, -c |x|^2, 1] . [z, 1, -c |z|^2]: one GEMM with d + 2
                # columns, in base 2 (c = g log2 e), so that exp2 gives the kernel
                c = P.spec.p0 * _LOG2E
                n, d = self.X.shape
                Xc = self.X - P.center
                self.Xa = np.empty((n, d + 2), dtype=self.dtype)
                np.multiply(Xc, 2.0 * c, out=self.Xa[:, :d], casting="same_kind")
                self.Xa[:, d] = -c * np.einsum("ij,ij->i", Xc, Xc, dtype=np.float64)
                self.Xa[:, d + 1] = 1.0
                self.ZTa = np.empty((d + 2, P.n_centers), dtype=self.dtype)
                self.ZTa[:d] = P.ZT
                self.ZTa[d] = 1.0
                self.ZTa[d + 1] = -c * P.zn.astype(np.float64)
        else:
            Xb, Z = np.asarray(Xb), np.asarray(Z)
            check_blocks(Xb, Z)
            self.dtype = np.result_type(Xb.dtype, Z.dtype, np.float32)
            self.X, self.Z, self.kernel = np.asarray(Xb, self.dtype), np.asarray(Z, self.dtype), kernel
        self.n_rows = self.X.shape[0]
        self.n_centers = self.P.n_centers if self.own else self.Z.shape[0]

    def rows(self, max_tile_bytes: int | None, target_bytes: int = TILE_BYTES) -> int:
        return tile_rows(self.n_centers, self.dtype.itemsize, max_tile_bytes, target_bytes)

    def buffer(self, rows: int) -> np.ndarray:
        return np.empty((rows, self.n_centers), dtype=self.dtype)

    def fill(self, s: int, e: int, out: np.ndarray) -> np.ndarray:
        """``k(X[s:e], Z)`` written into ``out[: e - s]`` (returned)."""
        K = out[: e - s]
        if not self.own:
            K[...] = self.kernel(self.X[s:e], self.Z)
            return K
        P = self.P
        kind = P.spec.kind
        if kind == GAUSSIAN:  # the base-2 exponent by one GEMM, then exp2
            # Not clipped at 0: for near-coincident pairs round-off may leave the exponent a few
            # ulps of c (|x|^2 + |z|^2) above 0, so an entry may exceed 1 by as much as it may fall
            # short of its true value. The clip cost 13% of the tile (7-12% of a fit) for nothing more.
            np.matmul(self.Xa[s:e], self.ZTa, out=K)
            np.exp2(K, out=K)
            return K
        np.matmul(self.X[s:e], P.ZT, out=K)  # dot-product kernels: not centred (centre is 0)
        if kind == POLYNOMIAL:
            f = self.dtype.type
            K *= f(P.spec.p0)
            K += f(P.spec.p1)
            np.power(K, P.spec.degree, out=K)
        return K


def _tiled(tiles: _Tiles, rt: int, n_threads: int, work: Any) -> list[Any]:
    """``work(rows)`` over the row ranges of the block, one range per thread."""
    return run_parts(split_rows(tiles.n_rows, n_threads, rt), work)


def _summed(tiles: _Tiles, rt: int, n_threads: int, shape: tuple[int, int],
            add: Callable[[np.ndarray, int, int, np.ndarray], None]) -> np.ndarray:
    """The float64 sum over tiles of what ``add(K, s, e, out)`` adds to ``out`` for the tile
    ``K = k(X[s:e], Z)``: one partial sum per thread, then their sum."""

    def work(sl: slice) -> np.ndarray:
        buf = tiles.buffer(rt)
        out = np.zeros(shape)
        for s in range(sl.start, sl.stop, rt):
            e = min(sl.stop, s + rt)
            add(tiles.fill(s, e, buf), s, e, out)
        return out

    return sum_parts(_tiled(tiles, rt, n_threads, work))


def gram_matvec(kernel: Kernel, Xb: Any, Z: Any, U: Any, *, max_tile_bytes: int | None = None,
                n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z)^T (k(Xb, Z) U)`` as float64 of shape ``(M, t)`` (``U``: ``(M,)`` or ``(M, t)``)."""
    T = _Tiles(kernel, Xb, Z)
    U2 = as_2d(U, T.n_centers)

    def add(K: np.ndarray, s: int, e: int, out: np.ndarray) -> None:
        # float64 products of the (float32) tile, as in the other engines: a float32 GEMM's
        # round-off is not that of any kernel matrix, so the operator would stop being one
        # symmetric matrix and CG would stall far above float32's accuracy (penalty 1e-6).
        K64 = K.astype(np.float64, copy=False)
        out += K64.T @ (K64 @ U2)

    return _summed(T, T.rows(max_tile_bytes), n_threads, (T.n_centers, U2.shape[1]), add)


def t_matvec(kernel: Kernel, Xb: Any, Z: Any, V: Any, *, max_tile_bytes: int | None = None,
             n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z)^T V`` as float64 of shape ``(M, t)`` (``V``: ``(n_b,)`` or ``(n_b, t)``)."""
    T = _Tiles(kernel, Xb, Z)
    V2 = as_2d(V, T.n_rows)

    def add(K: np.ndarray, s: int, e: int, out: np.ndarray) -> None:
        out += K.T.astype(np.float64) @ V2[s:e]

    return _summed(T, T.rows(max_tile_bytes), n_threads, (T.n_centers, V2.shape[1]), add)


def matvec(kernel: Kernel, Xb: Any, Z: Any, A: Any, *, max_tile_bytes: int | None = None,
           n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z) A`` as float64 of shape ``(n_b, t)`` (``A``: ``(M,)`` or ``(M, t)``)."""
    T = _Tiles(kernel, Xb, Z)
    A2 = as_2d(A, T.n_centers)
    out = np.empty((T.n_rows, A2.shape[1]))
    rt = T.rows(max_tile_bytes)

    def work(sl: slice) -> None:
        buf = T.buffer(rt)
        for s in range(sl.start, sl.stop, rt):
            e = min(sl.stop, s + rt)
            np.matmul(T.fill(s, e, buf).astype(np.float64), A2, out=out[s:e])

    _tiled(T, rt, n_threads, work)
    return out


def kernel_block(kernel: Kernel, Xb: Any, Z: Any, *, n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z)`` materialised, in the block dtype."""
    T = _Tiles(kernel, Xb, Z)
    K = np.empty((T.n_rows, T.n_centers), dtype=T.dtype)
    rt = T.rows(None)

    def work(sl: slice) -> None:
        for s in range(sl.start, sl.stop, rt):
            T.fill(s, min(sl.stop, s + rt), K[s:])

    _tiled(T, rt, n_threads, work)
    return K


def gram_and_rhs(kernel: Kernel, Xb: Any, Yb: Any, Z: Any, *, max_tile_bytes: int | None = None,
                 n_threads: int = 1, right: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``[W^T W | K^T Y]`` with ``K = k(Xb, Z)``, float64 ``(M, M + t)`` (as in the fused engine:
    float64 tiles, ``W = K`` or ``K diag(d) T^{-1}`` with ``right = (T, d)``)."""
    T = _Tiles(kernel, Xb, Z)
    M = T.n_centers
    Y2 = as_2d(Yb, T.n_rows)

    def add(K: np.ndarray, s: int, e: int, out: np.ndarray) -> None:
        K64 = K.astype(np.float64)
        W = K64 if right is None else precondition_tile(K64, *right)
        out[:, :M] += W.T @ W
        out[:, M:] += K64.T @ Y2[s:e]

    return _summed(T, T.rows(max_tile_bytes, GRAM_TILE_BYTES), n_threads, (M, M + Y2.shape[1]), add)


def cached_gram_matvec(K: np.ndarray, U: Any, *, n_threads: int = 1) -> np.ndarray:
    """``K^T (K U)`` for a stored block ``K``, float64 ``(M, t)`` (the reference's, by row range)."""
    U2 = as_2d(U, K.shape[1])
    parts = split_rows(K.shape[0], n_threads, 64)
    return sum_parts(run_parts(parts, lambda sl: _cached_gram(K[sl], U2)))


def cached_t_matvec(K: np.ndarray, V: Any, *, n_threads: int = 1) -> np.ndarray:
    """``K^T V`` for a stored block ``K``, float64 ``(M, t)`` (the reference's, by row range)."""
    V2 = as_2d(V, K.shape[0])
    parts = split_rows(K.shape[0], n_threads, 64)
    return sum_parts(run_parts(parts, lambda sl: _cached_t(K[sl], V2[sl])))
