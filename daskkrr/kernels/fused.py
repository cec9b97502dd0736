"""The fused, cache-tiled kernel block engine (numba).

Every FALKON iteration needs ``k(X_b, Z)^T (k(X_b, Z) u)`` for each row block and
predict needs ``k(X_b, Z) alpha``. The numpy reference
(:mod:`daskkrr.kernels.reference`) builds a large kernel tile, then makes four
more passes over it in memory (``exp``, a cast, two GEMVs). Here the block is
processed a small tile of rows at a time (``tile_rows x M`` entries, about
128 KiB, so it stays in the L2 cache):

1. the cross products ``X_t Z^T`` of the tile (dot-product kernels and squared
   Euclidean distances ``|x|^2 + |z|^2 - 2 x.z``), by loops that take four rows
   and four features per pass over a column chunk of the centers (faster than a
   BLAS GEMM on such thin tiles; BLAS above :func:`loop_cross_max_features`
   features). For the Gaussian kernel the last pass also applies
   ``exp`` (the vectorised one of :mod:`daskkrr.kernels._vexp`) while the sums are
   in registers. The Laplacian's L1 distances have their own vectorised loop;
2. for each row of the tile, while it sits in L1: the kernel function for the
   other kernels, then the row's contribution to the products (``v = K_i u``,
   ``out += K_i^T v``).

So a kernel entry is computed once, read from cache twice, and never written to
memory. Products accumulate in float64 whatever the block dtype (float32 kernel
values are widened before they are multiplied), so float32 blocks keep about
float32 accuracy in each entry and lose nothing more across tiles or blocks.

Accuracy of the distances: for stationary kernels, ``X`` and ``Z`` are first
centred on the mean of ``Z`` (kernels are translation invariant, and the GEMM
expansion loses ``eps (|x|^2 + |z|^2)`` to cancellation); entries with a squared
distance below ``2^-10 (|x|^2 + |z|^2)`` -- near-coincident pairs, such as a
center and the row it was drawn from, where ``sqrt`` would magnify the
cancellation for the Matern kernels -- are recomputed from exact differences.

Threads: these functions take ``n_threads`` and split the rows into that many
contiguous ranges, run concurrently on a shared thread pool (the compiled loops
release the GIL); the caller decides the number (see
:mod:`daskkrr.kernels.thread_rule`). No numba threading layer is used, so the engine
is safe to call from any number of threads at once (Dask's threaded scheduler).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from daskkrr.kernels._vexp import SAFE_FASTMATH, exp_neg, exp_neg_scalar
from daskkrr.kernels.base import Kernel
from daskkrr.kernels.block_layout import (
    PreparedCenters,
    as_2d,
    prepare,
    rows_for_bytes,
    run_parts,
    split_rows,
    sum_parts,
)
from daskkrr.kernels.reference import precondition_tile
from daskkrr.kernels.spec import (  # noqa: F401  (re-exported)
    GAUSSIAN,
    LAPLACIAN,
    LINEAR,
    MATERN05,
    MATERN15,
    MATERN25,
    POLYNOMIAL,
    KernelSpec,
    ard_inputs,
    kernel_spec,
    supports,
)
from daskkrr.utils.threads import blas_has_512bit_kernels

#: Bytes of one kernel tile processed by the fused loops: 16 rows at M = 2000 in float32
#: (32 to 128 KiB ran equally fast with the cross-product loops on the AMD EPYC VM).
CACHE_TILE_BYTES = 128 * 2**10
#: Bytes of one kernel tile for ``K^T K`` (a GEMM; larger tiles keep BLAS efficient).
GRAM_TILE_BYTES = 8 * 2**20
#: The tile loops form the cross products themselves up to this many features when the
#: BLAS runs 256-bit GEMM kernels; above it, one BLAS GEMM per tile. OpenBLAS's GEMM on a
#: 16-row tile spends much of its time packing ``Z`` and storing the tile: with its
#: 256-bit (Haswell) kernels on one AMD EPYC Zen 5 core the loops below (512-bit vectors)
#: were 3.3x (float32) and 2.5x (float64) faster at d = 20, 1.5x and 1.3x at d = 100,
#: 1.2x and 1.4x at d = 784 (``engine_throughput.py``).
LOOP_CROSS_MAX_FEATURES = 1024
#: The same limit when the BLAS runs 512-bit kernels (MKL, OpenBLAS SkylakeX): measured on
#: the same core with ``OPENBLAS_CORETYPE=SkylakeX``, the loops were 1.2-1.5x faster up
#: to 64 features in float32 and level with BLAS at 8-20 in float64, where BLAS was
#: 1.1-1.2x faster at 32-48 features.
LOOP_CROSS_MAX_FEATURES_512BIT_BLAS = {"float32": 64, "float64": 16}
#: Features per pass of those loops: centers and rows are padded with zero features to a
#: multiple (zeros add nothing to a dot product).
CROSS_GROUP = 4
#: Bytes of centers (padded features x columns) per column chunk of those loops, half of
#: an L2 cache; chunks are 256 to 2048 columns (measured best at d = 5 to 100).
CROSS_CHUNK_BYTES = 512 * 2**10
#: Near-coincident pairs: squared distance below this times ``|x|^2 + |z|^2``.
NEAR_COINCIDENT = 2.0**-10

# Reductions may be reassociated (that is what lets LLVM vectorise them).
_REDUCE_FASTMATH = SAFE_FASTMATH | {"reassoc"}


# --------------------------------------------------------------------------- compiled loops
@njit(nogil=True, fastmath=_REDUCE_FASTMATH, cache=True)
def _row_dot(row, u):  # pragma: no cover - compiled
    """``sum_j row[j] u[j]`` in float64."""
    s = 0.0
    for j in range(row.shape[0]):
        s += np.float64(row[j]) * u[j]
    return s


@njit(nogil=True, fastmath=_REDUCE_FASTMATH, cache=True)
def _row_axpy(out, row, a):  # pragma: no cover - compiled
    """``out += a row`` with float64 ``out``."""
    for j in range(row.shape[0]):
        out[j] += np.float64(row[j]) * a


@njit(nogil=True, fastmath=_REDUCE_FASTMATH, cache=True)
def _rows4_dot(K, i, u):  # pragma: no cover - compiled
    """``K[i:i+4] u`` in float64, reading ``u`` once for four rows."""
    r0 = K[i]
    r1 = K[i + 1]
    r2 = K[i + 2]
    r3 = K[i + 3]
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for j in range(r0.shape[0]):
        uj = u[j]
        s0 += np.float64(r0[j]) * uj
        s1 += np.float64(r1[j]) * uj
        s2 += np.float64(r2[j]) * uj
        s3 += np.float64(r3[j]) * uj
    return s0, s1, s2, s3


@njit(nogil=True, fastmath=_REDUCE_FASTMATH, cache=True)
def _rows4_axpy(out, K, i, a0, a1, a2, a3):  # pragma: no cover - compiled
    """``out += K[i:i+4]^T a`` in float64, one read-modify-write of ``out`` for four rows."""
    r0 = K[i]
    r1 = K[i + 1]
    r2 = K[i + 2]
    r3 = K[i + 3]
    for j in range(r0.shape[0]):
        out[j] += (np.float64(r0[j]) * a0 + np.float64(r1[j]) * a1) + (
            np.float64(r2[j]) * a2 + np.float64(r3[j]) * a3
        )


@njit(nogil=True, cache=True)
def _tile_products(op, Kt, s, W, outT, out):  # pragma: no cover - compiled
    """The products of one tile ``Kt`` of kernel rows ``s .. s + len(Kt)`` (see :func:`_block_rows`).

    Rows go four at a time, so each pass over ``u`` or ``out`` serves four rows.
    """
    r = Kt.shape[0]
    r4 = r - r % 4
    if op == _OP_GRAM_MATVEC:
        t = W.shape[0]
        for c in range(t):
            for i in range(0, r4, 4):
                a0, a1, a2, a3 = _rows4_dot(Kt, i, W[c])
                _rows4_axpy(outT[c], Kt, i, a0, a1, a2, a3)
            for i in range(r4, r):
                _row_axpy(outT[c], Kt[i], _row_dot(Kt[i], W[c]))
    elif op == _OP_T_MATVEC:
        t = W.shape[1]
        for c in range(t):
            for i in range(0, r4, 4):
                _rows4_axpy(outT[c], Kt, i, W[s + i, c], W[s + i + 1, c], W[s + i + 2, c], W[s + i + 3, c])
            for i in range(r4, r):
                _row_axpy(outT[c], Kt[i], W[s + i, c])
    else:
        t = W.shape[0]
        for c in range(t):
            for i in range(0, r4, 4):
                a0, a1, a2, a3 = _rows4_dot(Kt, i, W[c])
                out[s + i, c] = a0
                out[s + i + 1, c] = a1
                out[s + i + 2, c] = a2
                out[s + i + 3, c] = a3
            for i in range(r4, r):
                out[s + i, c] = _row_dot(Kt[i], W[c])


@njit(nogil=True, fastmath=_REDUCE_FASTMATH, cache=True)
def _row_sq(x):  # pragma: no cover - compiled
    s = x[0] * 0
    for k in range(x.shape[0]):
        s += x[k] * x[k]
    return s


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def _exact_sq(xi, ZT, j):  # pragma: no cover - compiled
    """``|x_i - z_j|^2`` from the differences (no cancellation)."""
    s = xi[0] * 0
    for k in range(xi.shape[0]):
        diff = xi[k] - ZT[k, j]
        s += diff * diff
    return s


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def _stationary_row(row, xi, ZT, zn, xn, kind, p0, tmp):  # pragma: no cover - compiled
    """Turn ``row = x_i . Z^T`` (centred) into ``k(x_i, Z)`` for a Euclidean stationary kernel.

    The first loop forms the squared distances (times ``-gamma`` for the Gaussian,
    saving a pass) and, for the Matern kernels, counts near-coincident pairs; only
    when there are any does a scalar loop recompute them from exact differences.
    """
    M = row.shape[0]
    f = row.dtype.type
    two = f(2.0)
    zero = f(0.0)
    tau = f(NEAR_COINCIDENT)
    g = f(p0)
    # Scale applied to the squared distance in the first loop.
    a = -g if kind == GAUSSIAN else f(1.0)
    near = 0
    if kind == GAUSSIAN:
        # exp(-g d2) is insensitive to the expansion's absolute error eps (|x|^2 + |z|^2)
        # in d2 (the reference computes it the same way): no recomputation needed.
        for j in range(M):
            row[j] = a * max(xn + zn[j] - two * row[j], zero)
    else:
        for j in range(M):
            v = max(xn + zn[j] - two * row[j], zero)
            row[j] = v
            near += 1 if v < tau * (xn + zn[j]) else 0
    if near > 0:  # rare: near-coincident pairs, from exact differences
        for j in range(M):
            if row[j] / a < tau * (xn + zn[j]):
                row[j] = a * _exact_sq(xi, ZT, j)
    if kind == GAUSSIAN:
        exp_neg(row)
    elif kind == MATERN05:
        for j in range(M):
            row[j] = -g * np.sqrt(row[j])
        exp_neg(row)
    else:
        one = f(1.0)
        third = f(1.0 / 3.0)
        for j in range(M):
            s = g * np.sqrt(row[j])
            if kind == MATERN15:
                tmp[j] = one + s
            else:
                tmp[j] = one + s + s * s * third
            row[j] = -s
        exp_neg(row)
        for j in range(M):
            row[j] *= tmp[j]


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def _cross_rows4(xbuf, i, ZT, j0, j1, K, b, bz, two_g):  # pragma: no cover - compiled
    """``K[i:i+4, j0:j1] = xbuf[i:i+4] . ZT[:, j0:j1]``, four features per pass.

    ``ZT`` has a multiple of four rows. Each load of the centers serves four rows and
    four features, so the loop is bound by multiply-adds, not by loads and stores.
    With ``bz`` non-empty (the Gaussian kernel: ``bz = -g |z|^2`` of the chunk, ``b``
    the rows' ``-g |x|^2``) the last pass stores ``exp(-g |x - z|^2)`` instead, while
    the sums are in registers.
    """
    d = ZT.shape[0]
    m = j1 - j0
    gauss = bz.shape[0] > 0
    zero = K.dtype.type(0.0)
    r0 = K[i, j0:j1]
    r1 = K[i + 1, j0:j1]
    r2 = K[i + 2, j0:j1]
    r3 = K[i + 3, j0:j1]
    x0 = xbuf[i]
    x1 = xbuf[i + 1]
    x2 = xbuf[i + 2]
    x3 = xbuf[i + 3]
    for k in range(0, d, 4):
        z1 = ZT[k, j0:j1]
        z2 = ZT[k + 1, j0:j1]
        z3 = ZT[k + 2, j0:j1]
        z4 = ZT[k + 3, j0:j1]
        a1, a2, a3, a4 = x0[k], x0[k + 1], x0[k + 2], x0[k + 3]
        b1, b2, b3, b4 = x1[k], x1[k + 1], x1[k + 2], x1[k + 3]
        c1, c2, c3, c4 = x2[k], x2[k + 1], x2[k + 2], x2[k + 3]
        e1, e2, e3, e4 = x3[k], x3[k + 1], x3[k + 2], x3[k + 3]
        if gauss and k + 4 == d:
            if k == 0:
                K[i : i + 4, j0:j1] = 0
            for j in range(m):
                w1, w2, w3, w4 = z1[j], z2[j], z3[j], z4[j]
                s0 = r0[j] + ((a1 * w1 + a2 * w2) + (a3 * w3 + a4 * w4))
                s1 = r1[j] + ((b1 * w1 + b2 * w2) + (b3 * w3 + b4 * w4))
                s2 = r2[j] + ((c1 * w1 + c2 * w2) + (c3 * w3 + c4 * w4))
                s3 = r3[j] + ((e1 * w1 + e2 * w2) + (e3 * w3 + e4 * w4))
                bj = bz[j]
                r0[j] = exp_neg_scalar(min(two_g * s0 + (b[0] + bj), zero))
                r1[j] = exp_neg_scalar(min(two_g * s1 + (b[1] + bj), zero))
                r2[j] = exp_neg_scalar(min(two_g * s2 + (b[2] + bj), zero))
                r3[j] = exp_neg_scalar(min(two_g * s3 + (b[3] + bj), zero))
        elif k == 0:
            for j in range(m):
                w1, w2, w3, w4 = z1[j], z2[j], z3[j], z4[j]
                r0[j] = (a1 * w1 + a2 * w2) + (a3 * w3 + a4 * w4)
                r1[j] = (b1 * w1 + b2 * w2) + (b3 * w3 + b4 * w4)
                r2[j] = (c1 * w1 + c2 * w2) + (c3 * w3 + c4 * w4)
                r3[j] = (e1 * w1 + e2 * w2) + (e3 * w3 + e4 * w4)
        else:
            for j in range(m):
                w1, w2, w3, w4 = z1[j], z2[j], z3[j], z4[j]
                r0[j] += (a1 * w1 + a2 * w2) + (a3 * w3 + a4 * w4)
                r1[j] += (b1 * w1 + b2 * w2) + (b3 * w3 + b4 * w4)
                r2[j] += (c1 * w1 + c2 * w2) + (c3 * w3 + c4 * w4)
                r3[j] += (e1 * w1 + e2 * w2) + (e3 * w3 + e4 * w4)


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def _cross_tile(xbuf, ZT, K, jc, bxs, bz, two_g, spare):  # pragma: no cover - compiled
    """``K = xbuf . ZT`` by :func:`_cross_rows4`, four rows and ``jc`` columns at a time.

    With ``bz`` non-empty (the Gaussian kernel), ``K = exp(-g |x - z|^2)`` instead
    (``bxs``: the rows' ``-g |x|^2``). The last one to three rows go through
    ``spare`` (4 x (d + 1 + M) scratch): copied in, formed, copied out.
    """
    r, d = xbuf.shape
    M = ZT.shape[1]
    r4 = r - r % 4
    for j0 in range(0, M, jc):
        j1 = min(M, j0 + jc)
        bzc = bz[j0:j1]  # empty stays empty: not the Gaussian kernel
        for i in range(0, r4, 4):
            _cross_rows4(xbuf, i, ZT, j0, j1, K, bxs[i : i + 4], bzc, two_g)
    if r4 < r:
        xs = spare[:, :d]
        bs = spare[:, d]
        Ks = spare[:, d + 1 :]
        for q in range(4):
            row = min(r4 + q, r - 1)
            xs[q] = xbuf[row]
            bs[q] = bxs[row]
        for j0 in range(0, M, jc):
            j1 = min(M, j0 + jc)
            bzc = bz[j0:j1]
            _cross_rows4(xs, 0, ZT, j0, j1, Ks, bs, bzc, two_g)
        K[r4:r] = Ks[: r - r4]


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def _fill_tile(Xt, center, ZT, zn, kind, p0, p1, degree, jc, bz, K, xbuf, bxs, tmp, spare):  # pragma: no cover
    """``K = k(Xt, Z)`` for one tile of rows.

    ``Xt`` (r, d) rows; ``center`` (d,) subtracted from them (the mean of Z for
    stationary kernels); ``ZT`` (d', M) centred centers, transposed, ``d' >= d``
    zero-padded; ``zn`` (M,) their squared norms; ``jc`` columns per chunk of the
    cross-product loops (0: one BLAS GEMM instead); ``bz`` (M,) ``-g zn`` for the
    Gaussian kernel on the loops (else empty); ``K`` (r, M) C-contiguous output;
    ``xbuf`` (r, d') scratch with zero padding, ``bxs`` (r,), ``tmp`` (M,) and ``spare``
    (4, d' + 1 + M) scratch.
    """
    r, d = Xt.shape
    M = ZT.shape[1]
    f = K.dtype.type
    for i in range(r):
        for k in range(d):
            xbuf[i, k] = Xt[i, k] - center[k]
    if kind == LAPLACIAN:
        g = f(p0)
        for i in range(r):
            row = K[i]
            row[:] = 0
            for k in range(d):
                xk = xbuf[i, k]
                zk = ZT[k]
                for j in range(M):
                    row[j] += abs(xk - zk[j])
            for j in range(M):
                row[j] = -g * row[j]
            exp_neg(row)
        return
    if jc == 0:
        np.dot(xbuf, ZT, K)
    elif bz.shape[0] > 0:  # the Gaussian kernel, finished chunk by chunk
        g = f(p0)
        for i in range(r):
            bxs[i] = -g * _row_sq(xbuf[i])
        _cross_tile(xbuf, ZT, K, jc, bxs, bz, f(2.0) * g, spare)
        return
    else:
        _cross_tile(xbuf, ZT, K, jc, bxs, bz, f(0.0), spare)
    if kind == LINEAR:
        return
    if kind == POLYNOMIAL:
        g = f(p0)
        c0 = f(p1)
        for i in range(r):
            row = K[i]
            for j in range(M):
                tmp[j] = g * row[j] + c0
                row[j] = tmp[j]
            for _ in range(degree - 1):
                for j in range(M):
                    row[j] *= tmp[j]
        return
    for i in range(r):
        xi = xbuf[i]
        _stationary_row(K[i], xi, ZT, zn, _row_sq(xi), kind, p0, tmp)


# Operations of the block driver.
_OP_GRAM_MATVEC, _OP_T_MATVEC, _OP_MATVEC, _OP_FILL = range(4)


@njit(nogil=True, cache=True)
def _block_rows(op, X, center, ZT, zn, kind, p0, p1, degree, jc, bz, W, outT, out, K, rt):  # pragma: no cover
    """One pass over the rows of ``X``, ``rt`` rows per tile; ``op`` picks the product.

    - gram matvec: ``outT += (k(X, Z)^T k(X, Z) U)^T`` with ``W = U^T`` (t, M);
    - t matvec: ``outT += (k(X, Z)^T V)^T`` with ``W = V`` (n, t);
    - matvec: ``out = k(X, Z) A`` with ``W = A^T`` (t, M), ``out`` (n, t);
    - fill: ``K = k(X, Z)`` (n, M) in the block dtype.

    Accumulators are float64. (One driver rather than four keeps numba's
    compile time down: the tile code is compiled once per dtype.)
    """
    n = X.shape[0]
    M = ZT.shape[1]
    xbuf = np.zeros((rt, ZT.shape[0]), dtype=ZT.dtype)  # padding features stay zero
    bxs = np.empty(rt, dtype=ZT.dtype)
    tmp = np.empty(M, dtype=ZT.dtype)
    spare = np.zeros((4, ZT.shape[0] + 1 + M), dtype=ZT.dtype)
    tile = np.empty((rt if op != _OP_FILL else 0, M), dtype=ZT.dtype)
    for s in range(0, n, rt):
        e = min(n, s + rt)
        r = e - s
        Kt = K[s:e] if op == _OP_FILL else tile[:r]
        _fill_tile(X[s:e], center, ZT, zn, kind, p0, p1, degree, jc, bz, Kt, xbuf[:r], bxs[:r], tmp, spare)
        if op != _OP_FILL:
            _tile_products(op, Kt, s, W, outT, out)


@njit(nogil=True, cache=True)
def _cached_rows(op, K, W, outT):  # pragma: no cover - compiled
    """Products with a stored kernel block, reading each row once.

    gram matvec: ``outT += (K^T K U)^T`` with ``W = U^T``; t matvec:
    ``outT += (K^T V)^T`` with ``W = V``.
    """
    n = K.shape[0]
    for s in range(0, n, 64):
        _tile_products(op, K[s : min(n, s + 64)], s, W, outT, outT)


# --------------------------------------------------------------------------- Python side
def tile_rows(n_centers: int, itemsize: int, max_tile_bytes: int | None = None,
              target_bytes: int | None = None, n_features: int = 0) -> int:
    """Rows per tile: about ``target_bytes`` (default :data:`CACHE_TILE_BYTES`) of kernel
    entries, at least 8 and at most 512 rows, never more than ``max_tile_bytes``.

    When the tile's cross products are one BLAS GEMM (more than
    :func:`loop_cross_max_features` features), it dominates and
    runs faster on taller tiles: the default target grows by ``n_features // 25`` (at
    most 4 times).
    """
    if target_bytes is None:
        dtype = np.dtype(np.float32 if itemsize == 4 else np.float64)
        grow = n_features // 25 if n_features > loop_cross_max_features(dtype) else 1
        target_bytes = CACHE_TILE_BYTES * max(1, min(4, grow))
    return rows_for_bytes(n_centers, itemsize, target_bytes, 8, 512, max_tile_bytes)


_NONE2 = np.empty((0, 0))  # placeholder for the driver's unused float64 arguments


def loop_cross_max_features(dtype: np.dtype) -> int:
    """Most features for which the tile loops form the cross products themselves: see
    :data:`LOOP_CROSS_MAX_FEATURES` and :data:`LOOP_CROSS_MAX_FEATURES_512BIT_BLAS`."""
    if blas_has_512bit_kernels():
        return LOOP_CROSS_MAX_FEATURES_512BIT_BLAS[np.dtype(dtype).name]
    return LOOP_CROSS_MAX_FEATURES


def cross_chunk(n_features: int, itemsize: int) -> int:
    """Columns per chunk of the cross-product loops for ``n_features`` (padded) features:
    about :data:`CROSS_CHUNK_BYTES` of centers, a multiple of 64 from 256 to 2048."""
    return min(2048, max(256, CROSS_CHUNK_BYTES // (n_features * itemsize) // 64 * 64))


#: The driver's layout arguments: center, ZT, zn, kind, p0, p1, degree, jc, bz.
_Layout = tuple[np.ndarray, np.ndarray, np.ndarray, int, float, float, int, int, np.ndarray]


def _prepare(kernel: Kernel, Xb: Any, Z: Any) -> tuple[np.ndarray, PreparedCenters, _Layout]:
    """:func:`~daskkrr.kernels.block_layout.prepare`, plus the driver's arguments.

    Kernels built on dot products with at most :func:`loop_cross_max_features`
    features get the centers zero-padded to a multiple of :data:`CROSS_GROUP`
    features and a column chunk for the cross-product loops; the Gaussian kernel also
    gets ``-g |z|^2``. Other kernels get ``jc = 0`` (a BLAS GEMM per tile, or the
    Laplacian's own loop).
    """
    Xb, P = prepare(kernel, Xb, Z, "fused")
    Xb = _loop_input(Xb)  # the centers' arrays are new ones, computed by prepare
    center, ZT, zn, kind, p0, p1, degree = P.args()
    d, M = ZT.shape
    jc = 0
    bz = zn[:0]
    if kind != LAPLACIAN and d <= loop_cross_max_features(ZT.dtype):
        pad = -d % CROSS_GROUP
        if pad:
            ZT = np.concatenate([ZT, np.zeros((pad, M), dtype=ZT.dtype)])
        jc = cross_chunk(ZT.shape[0], ZT.dtype.itemsize)
        if kind == GAUSSIAN:
            bz = (-ZT.dtype.type(p0)) * zn
    return Xb, P, (center, ZT, zn, kind, p0, p1, degree, jc, bz)


def _loop_input(a: np.ndarray) -> np.ndarray:
    """``a`` in C order and writable, as the compiled loops take every array.

    numba types a read-only array (a memory-mapped input, or the coefficients of a model
    loaded with ``joblib.load(path, mmap_mode="r")``) apart from a writable one and would
    compile the driver's whole call tree once more for it (seconds of LLVM), in the middle of a
    fit or predict and outside what :mod:`daskkrr.kernels.warmup` compiles. A copy
    costs one pass over the array, against the ``rows x centers x features`` of the loops.
    """
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


def _none_k(Xb: np.ndarray) -> np.ndarray:
    return np.empty((0, 0), dtype=Xb.dtype)


def gram_matvec(kernel: Kernel, Xb: Any, Z: Any, U: Any, *, max_tile_bytes: int | None = None,
                n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z)^T (k(Xb, Z) U)`` as float64 of shape ``(M, t)`` (``U``: ``(M,)`` or ``(M, t)``)."""
    Xb, P, args = _prepare(kernel, Xb, Z)
    M = P.n_centers
    UT = _loop_input(as_2d(U, M).T)
    rt = tile_rows(M, Xb.dtype.itemsize, max_tile_bytes, n_features=Xb.shape[1])

    def work(sl: slice) -> np.ndarray:
        outT = np.zeros((UT.shape[0], M))
        _block_rows(_OP_GRAM_MATVEC, Xb[sl], *args, UT, outT, _NONE2, _none_k(Xb), rt)
        return outT

    return np.ascontiguousarray(sum_parts(run_parts(split_rows(Xb.shape[0], n_threads, rt), work)).T)


def t_matvec(kernel: Kernel, Xb: Any, Z: Any, V: Any, *, max_tile_bytes: int | None = None,
             n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z)^T V`` as float64 of shape ``(M, t)`` (``V``: ``(n_b,)`` or ``(n_b, t)``)."""
    Xb, P, args = _prepare(kernel, Xb, Z)
    M = P.n_centers
    V2 = _loop_input(as_2d(V, Xb.shape[0]))
    rt = tile_rows(M, Xb.dtype.itemsize, max_tile_bytes, n_features=Xb.shape[1])

    def work(sl: slice) -> np.ndarray:
        outT = np.zeros((V2.shape[1], M))
        _block_rows(_OP_T_MATVEC, Xb[sl], *args, V2[sl], outT, _NONE2, _none_k(Xb), rt)
        return outT

    return np.ascontiguousarray(sum_parts(run_parts(split_rows(Xb.shape[0], n_threads, rt), work)).T)


def matvec(kernel: Kernel, Xb: Any, Z: Any, A: Any, *, max_tile_bytes: int | None = None,
           n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z) A`` as float64 of shape ``(n_b, t)`` (``A``: ``(M,)`` or ``(M, t)``)."""
    Xb, P, args = _prepare(kernel, Xb, Z)
    M = P.n_centers
    AT = _loop_input(as_2d(A, M).T)
    out = np.empty((Xb.shape[0], AT.shape[0]))
    rt = tile_rows(M, Xb.dtype.itemsize, max_tile_bytes, n_features=Xb.shape[1])

    def work(sl: slice) -> None:
        _block_rows(_OP_MATVEC, Xb[sl], *args, AT, _NONE2, out[sl], _none_k(Xb), rt)

    run_parts(split_rows(Xb.shape[0], n_threads, rt), work)
    return out


def kernel_block(kernel: Kernel, Xb: Any, Z: Any, *, n_threads: int = 1) -> np.ndarray:
    """``k(Xb, Z)`` materialised, in the block dtype (for the cached strategy)."""
    Xb, P, args = _prepare(kernel, Xb, Z)
    M = P.n_centers
    K = np.empty((Xb.shape[0], M), dtype=Xb.dtype)
    rt = tile_rows(M, Xb.dtype.itemsize, n_features=Xb.shape[1])

    def work(sl: slice) -> None:
        _block_rows(_OP_FILL, Xb[sl], *args, _NONE2, _NONE2, _NONE2, K[sl], rt)

    run_parts(split_rows(Xb.shape[0], n_threads, rt), work)
    return K


def gram_and_rhs(kernel: Kernel, Xb: Any, Yb: Any, Z: Any, *, max_tile_bytes: int | None = None,
                 n_threads: int = 1, right: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``[W^T W | K^T Y]`` with ``K = k(Xb, Z)``, float64 ``(M, M + t)``.

    ``W = K``, or ``K diag(d) T^{-1}`` with ``right = (T, d)`` (see
    :func:`daskkrr.kernels.reference.precondition_tile`).

    Tiles of ``K`` (about :data:`GRAM_TILE_BYTES`) are built by the fused fill and
    multiplied by one float64 BLAS ``K_t^T K_t`` each (float32 tiles are widened
    first: a float32 GEMM's round-off is not that of any kernel matrix, and the
    preconditioner's ``T^-1`` amplifies it in the directions of small eigenvalues
    of ``K_MM``, so the solve would drift from the CG strategies' solution).
    """
    Xb, P, args = _prepare(kernel, Xb, Z)
    M = P.n_centers
    Y2 = np.ascontiguousarray(as_2d(Yb, Xb.shape[0]))
    rt_fill = tile_rows(M, Xb.dtype.itemsize, n_features=Xb.shape[1])
    rt = max(rt_fill, tile_rows(M, Xb.dtype.itemsize, max_tile_bytes, GRAM_TILE_BYTES))
    if max_tile_bytes is not None:
        rt = min(rt, max(1, int(max_tile_bytes) // (M * Xb.dtype.itemsize)))

    def work(sl: slice) -> np.ndarray:
        out = np.zeros((M, M + Y2.shape[1]))
        buf = np.empty((min(rt, sl.stop - sl.start), M), dtype=Xb.dtype)
        for s in range(sl.start, sl.stop, rt):
            e = min(sl.stop, s + rt)
            Kt = buf[: e - s]
            _block_rows(_OP_FILL, Xb[s:e], *args, _NONE2, _NONE2, _NONE2, Kt, min(rt_fill, e - s))
            K64 = Kt if Kt.dtype == np.float64 else Kt.astype(np.float64)
            W = K64 if right is None else precondition_tile(K64, *right)
            out[:, :M] += W.T @ W
            out[:, M:] += K64.T @ Y2[s:e]
        return out

    return sum_parts(run_parts(split_rows(Xb.shape[0], n_threads, rt), work))


def cached_gram_matvec(K: np.ndarray, U: Any, *, n_threads: int = 1) -> np.ndarray:
    """``K^T (K U)`` for a stored block ``K`` (one read of ``K``), float64 ``(M, t)``."""
    K = _loop_input(K)
    M = K.shape[1]
    UT = _loop_input(as_2d(U, M).T)

    def work(sl: slice) -> np.ndarray:
        outT = np.zeros((UT.shape[0], M))
        _cached_rows(_OP_GRAM_MATVEC, K[sl], UT, outT)
        return outT

    return np.ascontiguousarray(sum_parts(run_parts(split_rows(K.shape[0], n_threads, 64), work)).T)


def cached_t_matvec(K: np.ndarray, V: Any, *, n_threads: int = 1) -> np.ndarray:
    """``K^T V`` for a stored block ``K``, float64 ``(M, t)``."""
    K = _loop_input(K)
    M = K.shape[1]
    V2 = _loop_input(as_2d(V, K.shape[0]))

    def work(sl: slice) -> np.ndarray:
        outT = np.zeros((V2.shape[1], M))
        _cached_rows(_OP_T_MATVEC, K[sl], V2[sl], outT)
        return outT

    return np.ascontiguousarray(sum_parts(run_parts(split_rows(K.shape[0], n_threads, 64), work)).T)
