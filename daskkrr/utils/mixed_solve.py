"""Triangular solves with a float32 factor in float64 arithmetic.

A float32 fit may factor FALKON's preconditioner in float32 (see
:mod:`daskkrr.solvers.falkon`), but CG needs the solves with those factors to be
one fixed linear map, which float32 arithmetic on the vectors is not. LAPACK has
no mixed-precision ``trsv``, and upcasting the factor costs an ``M x M`` float64
array (800 MB at M = 10 000, slow to touch for the first time on the development
VMs) or, panel by panel, three times the time of ``dtrsv``. These loops read the
float32 factor and compute in float64, at about ``dtrsv``'s speed on one thread
(it is memory-bound: half the bytes): M = 10 000, 18 ms and 11 ms against 16 ms on
the 2-core AMD EPYC VM. Without numba the factor is upcast (slow, but the same result).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla

from daskkrr.utils.optional import numba_installed

__all__ = ["minus_product_mixed", "solve_upper_mixed"]


def solve_upper_mixed(T: np.ndarray, B: np.ndarray, trans: bool = False) -> np.ndarray:
    """``T^{-1} B`` (``T^{-T} B`` with ``trans``) in float64 for a float32 upper-triangular ``T``."""
    B = np.asarray(B, dtype=np.float64)
    if not numba_installed():
        return sla.solve_triangular(T.astype(np.float64), B, lower=False, trans="T" if trans else "N",
                                    check_finite=False)
    loops = _loops()
    T = np.asfortranarray(T, dtype=np.float32)
    Xt = np.array(B.reshape(B.shape[0], -1).T, order="C")  # a copy: each column contiguous
    return (loops.solve_t if trans else loops.solve)(T, Xt).T.reshape(B.shape)


def minus_product_mixed(acc: np.ndarray, T: np.ndarray, B: np.ndarray, trans: bool = False) -> np.ndarray:
    """``acc - T B`` (``acc - T^T B`` with ``trans``) in float64 for a float32 ``T``: the off-diagonal tile
    products of a tiled triangular solve, reading the tile as it is instead of a float64 copy of it (which
    doubled the bytes each solve moved)."""
    B = np.asarray(B, dtype=np.float64)
    if not numba_installed():
        T64 = np.asarray(T, dtype=np.float64)
        return np.asarray(acc, dtype=np.float64) - (T64.T @ B if trans else T64 @ B)
    loops = _loops()
    T = np.asfortranarray(T, dtype=np.float32)
    Xt = np.ascontiguousarray(B.reshape(B.shape[0], -1).T)
    out = np.array(np.asarray(acc, dtype=np.float64).reshape(-1, Xt.shape[0]).T, order="C")  # a copy: written
    return (loops.minus_product_t if trans else loops.minus_product)(T, Xt, out).T.reshape(np.shape(acc))


def _loops() -> Any:
    from daskkrr.utils import _mixed_loops

    return _mixed_loops
