"""A vectorisable ``exp`` for the non-positive arguments of kernel functions (numba).

LLVM turns ``np.exp`` inside a numba loop into one scalar libm call per element
(no vector math library is linked), which makes ``exp`` the bottleneck of the
fused kernel loop. Here ``exp(x)`` for ``x <= 0`` is computed as ``2^t p(f)``
with ``t = round(x / ln 2)``, ``f = x - t ln 2`` in ``[-ln2/2, ln2/2]`` (Cody-Waite:
``ln 2`` split in a short exactly-multipliable head and a tail) and ``p`` a
polynomial for ``exp`` on that interval (float32: degree 6, near-minimax, error
2e-9 relative; float64: the Taylor polynomial of degree 13, below 1e-17), and ``2^t`` built
from its IEEE bits (a scalar bit cast). Every step is a plain arithmetic loop, so LLVM vectorises it
(16 float32 lanes with AVX-512).

Arguments below the smallest normal result (``-87.3`` in float32, ``-708`` in
float64) give exactly 0, like the numpy reference up to subnormals.

These functions are compiled without ``reassoc``: reassociating
``(x - t c1) - t c2`` would undo the split of ``ln 2``.

numba caches compiled code per source file: after editing this module, delete
``daskkrr/kernels/__pycache__/*.nb[ci]`` so that :mod:`daskkrr.kernels.fused`,
which inlines these functions, is recompiled.
"""

from __future__ import annotations

import math
from decimal import Decimal

import numba
import numpy as np
from numba import njit
from numba.extending import overload

#: numba fastmath flags that keep the order of operations (FMA contraction only).
SAFE_FASTMATH = set({"contract", "nsz", "arcp"})

# ln 2 to 36 digits: the tails below must be exact to well beyond double precision.
_LN2_DEC = Decimal("0.693147180559945309417232121458176568")
_LN2 = float(_LN2_DEC)
_LOG2E = 1.0 / _LN2
# ln 2 = head + tail; the heads have few significant bits so that t * head is exact
# for every |t| the clamped range allows (7 bits in float32, 10 bits in float64).
_HEAD32 = 0.693359375  # 355 / 512
_TAIL32 = float(_LN2_DEC - Decimal(_HEAD32))
_HEAD64 = 0.693145751953125  # 22713 / 32768
_TAIL64 = float(_LN2_DEC - Decimal(_HEAD64))
_LO32 = -87.3
_LO64 = -708.0
_INV_FACT = tuple(1.0 / math.factorial(k) for k in range(14))
# float32: a degree-6 near-minimax polynomial for exp on [-ln2/2, ln2/2] with p(0) = 1
# exactly (so k(x, x) = 1), relative error 2e-9 (1e-7 after float32 rounding, like numpy's
# expf); one multiply-add fewer than Taylor's degree 7. Fitted to (exp(f) - 1) / f by
# Lawson's iteratively reweighted least squares on 2000 Chebyshev nodes with relative
# weights (300 iterations); coefficients of 1, f, ..., f^6.
_P32 = (1.0, 1.0000000321650833, 0.4999999420904117, 0.16666431262527415, 0.0416680020363972,
        0.008374155317288167, 0.0013843653489477932)


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def exp_neg32_scalar(x):  # pragma: no cover - compiled
    """``exp(x)`` for a float32 ``x <= 0`` (inlined into vectorised loops by LLVM)."""
    f32 = np.float32
    lo = f32(_LO32)
    keep = x >= lo
    x = max(x, lo)
    t = np.floor(x * f32(_LOG2E) + f32(0.5))
    f = x - t * f32(_HEAD32)
    f = f - t * f32(_TAIL32)
    p = f32(_P32[6])
    p = p * f + f32(_P32[5])
    p = p * f + f32(_P32[4])
    p = p * f + f32(_P32[3])
    p = p * f + f32(_P32[2])
    p = p * f + f32(_P32[1])
    p = p * f + f32(_P32[0])
    scale = np.int32((np.int32(t) + np.int32(127)) << np.int32(23)).view(np.float32)
    return p * scale if keep else f32(0.0)


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def exp_neg64_scalar(x):  # pragma: no cover - compiled
    """``exp(x)`` for a float64 ``x <= 0``."""
    lo = _LO64
    c = _INV_FACT
    keep = x >= lo
    x = max(x, lo)
    t = np.floor(x * _LOG2E + 0.5)
    f = x - t * _HEAD64
    f = f - t * _TAIL64
    p = c[13]
    p = p * f + c[12]
    p = p * f + c[11]
    p = p * f + c[10]
    p = p * f + c[9]
    p = p * f + c[8]
    p = p * f + c[7]
    p = p * f + c[6]
    p = p * f + c[5]
    p = p * f + c[4]
    p = p * f + c[3]
    p = p * f + c[2]
    p = p * f + 1.0
    p = p * f + 1.0
    scale = np.int64((np.int64(t) + np.int64(1023)) << np.int64(52)).view(np.float64)
    return p * scale if keep else 0.0


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def exp_neg32(row: np.ndarray) -> None:  # pragma: no cover - compiled
    """``row[:] = exp(row)`` in place for a float32 row of non-positive values."""
    for j in range(row.shape[0]):
        row[j] = exp_neg32_scalar(row[j])


@njit(nogil=True, fastmath=SAFE_FASTMATH, cache=True)
def exp_neg64(row: np.ndarray) -> None:  # pragma: no cover - compiled
    """``row[:] = exp(row)`` in place for a float64 row of non-positive values."""
    for j in range(row.shape[0]):
        row[j] = exp_neg64_scalar(row[j])


def exp_neg(row: np.ndarray) -> None:
    """``row[:] = exp(row)`` for non-positive values; dispatches on the dtype (also inside numba)."""
    if row.dtype == np.float32:
        exp_neg32(row)
    else:
        exp_neg64(row)


# numba's _JITOptions TypedDict lacks "cache", which overload's jit_options accept.
@overload(exp_neg, jit_options={"nogil": True, "cache": True})  # type: ignore[typeddict-unknown-key]
def _exp_neg_overload(row):  # pragma: no cover - compile-time dispatch
    if row.dtype == numba.float32:
        return lambda row: exp_neg32(row)
    return lambda row: exp_neg64(row)


def exp_neg_scalar(x: float) -> float:
    """``exp(x)`` for ``x <= 0`` in the precision of ``x``; dispatches on the type (also inside numba)."""
    return float(exp_neg64_scalar(float(x)))


@overload(exp_neg_scalar, jit_options={"nogil": True, "cache": True})  # type: ignore[typeddict-unknown-key]
def _exp_neg_scalar_overload(x):  # pragma: no cover - compile-time dispatch
    if x == numba.float32:
        return lambda x: exp_neg32_scalar(x)
    return lambda x: exp_neg64_scalar(x)
