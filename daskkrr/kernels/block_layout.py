"""What the block engines share, without numba: the centers laid out for the tile
loops, and the split of a block's rows into ranges run on a shared thread pool.

:mod:`daskkrr.kernels.fused` (numba) and :mod:`daskkrr.kernels.blas` (numpy and
BLAS) both process a row block as contiguous row ranges, one per engine thread,
each range a tile of rows at a time. Kept apart from the numba module so that the
BLAS engine runs while numba has not been imported (or compiled) yet.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.spec import KernelSpec, ard_inputs, kernel_spec


@dataclasses.dataclass
class PreparedCenters:
    """Centers laid out for the tile loops (computed once per call)."""

    spec: KernelSpec
    center: np.ndarray  # (d,) subtracted from every row
    ZT: np.ndarray  # (d, M), centred
    zn: np.ndarray  # (M,) squared norms of the centred centers

    @property
    def n_centers(self) -> int:
        return self.ZT.shape[1]

    def args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, float, float, int]:
        s = self.spec
        return (self.center, self.ZT, self.zn, s.kind, s.p0, s.p1, s.degree)


def check_blocks(Xb: np.ndarray, Z: np.ndarray) -> None:
    """Refuse blocks that are not 2-D with the same number of features."""
    if Xb.ndim != 2 or Z.ndim != 2 or Xb.shape[1] != Z.shape[1]:
        raise ValueError(
            f"k(Xb, Z) needs 2-D blocks with the same number of features: Xb has shape {Xb.shape}, "
            f"Z has shape {Z.shape}"
        )


def rows_for_bytes(n_centers: int, itemsize: int, target_bytes: int, lowest: int, highest: int,
                   max_tile_bytes: int | None = None) -> int:
    """Rows per tile: about ``target_bytes`` of kernel entries, from ``lowest`` to ``highest``
    rows, never more than ``max_tile_bytes``."""
    row_bytes = max(1, n_centers * itemsize)
    rows = min(highest, max(lowest, target_bytes // row_bytes))
    if max_tile_bytes is not None:
        rows = min(rows, max(1, int(max_tile_bytes) // row_bytes))
    return int(rows)


def prepare(kernel: Kernel, Xb: Any, Z: Any, engine: str) -> tuple[np.ndarray, PreparedCenters]:
    """The block in the common dtype (C order) and the centers, for a built-in kernel.

    Stationary kernels are translation invariant, so rows and centers are centred
    on the centers' mean: the GEMM expansion of squared distances then loses less
    to cancellation. ARD kernels see inputs divided by their length scales.
    """
    spec = kernel_spec(kernel)
    if spec is None:
        raise TypeError(f"the {engine} engine does not implement {type(kernel).__name__}; use engine='numpy'")
    Xb, Z = ard_inputs(kernel, np.asarray(Xb), np.asarray(Z))
    check_blocks(Xb, Z)
    dt = np.result_type(Xb.dtype, Z.dtype, np.float32)
    Xb = np.ascontiguousarray(Xb, dtype=dt)
    Z = np.asarray(Z, dtype=dt)
    center = Z.mean(axis=0, dtype=np.float64).astype(dt) if spec.stationary else np.zeros(Z.shape[1], dt)
    Zc = Z - center
    ZT = np.ascontiguousarray(Zc.T)
    zn = np.einsum("ij,ij->i", Zc, Zc).astype(dt)
    return Xb, PreparedCenters(spec, center, ZT, zn)


def as_2d(a: Any, rows: int) -> np.ndarray:
    """``a`` as float64 of shape ``(rows, t)``."""
    return np.asarray(a, dtype=np.float64).reshape(rows, -1)


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1), thread_name_prefix="daskkrr-engine")
    return _POOL


def split_rows(n_rows: int, n_threads: int, align: int) -> list[slice]:
    """Up to ``n_threads`` contiguous row ranges, multiples of ``align`` rows except the last."""
    n_threads = max(1, min(int(n_threads), -(-n_rows // max(1, align))))
    per = -(-n_rows // n_threads)
    per = -(-per // align) * align
    return [slice(s, min(n_rows, s + per)) for s in range(0, n_rows, per)] or [slice(0, 0)]


def run_parts(parts: list[slice], work: Callable[[slice], Any]) -> list[Any]:
    """``work(part)`` for every part: inline for one, on the shared pool for several.

    The engines' loops release the GIL (numba's ``nogil``, numpy's ufuncs and BLAS),
    so the parts run in parallel.
    """
    if len(parts) == 1:
        return [work(parts[0])]
    futures = [_pool().submit(work, p) for p in parts]
    return [f.result() for f in futures]


def sum_parts(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of the parts' partial products (in place in the first)."""
    total = parts[0]
    for p in parts[1:]:
        total += p
    return total
