"""Cores this process may use, and a process-wide limit on BLAS threads."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["available_cores", "blas_has_512bit_kernels", "blas_threads"]


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_CONTROLLER: Any = None
_CONTROLLER_LOCK = threading.Lock()


def _controller() -> Any:
    """One threadpoolctl controller per process: finding the BLAS libraries reads
    ``/proc/self/maps`` (milliseconds), too slow to repeat on every pass."""
    global _CONTROLLER
    with _CONTROLLER_LOCK:
        if _CONTROLLER is None:
            import scipy.linalg  # noqa: F401  (load scipy's BLAS too, so the controller sees it)
            from threadpoolctl import ThreadpoolController

            _CONTROLLER = ThreadpoolController()
        return _CONTROLLER


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Limit BLAS (OpenBLAS/MKL/BLIS, numpy's and scipy's) to ``n`` threads inside the block.

    Process-wide while it lasts, so call it from the thread that owns the
    parallelism (the main thread), not from inside concurrent tasks.
    """
    with _controller().limit(limits=int(n), user_api="blas"):
        yield


#: OpenBLAS core types whose GEMM kernels use 512-bit vectors (AVX-512).
_OPENBLAS_512BIT = ("skylakex", "cooperlake", "sapphirerapids")


@functools.cache
def blas_has_512bit_kernels() -> bool:
    """Whether the BLAS that numpy and scipy load runs 512-bit GEMM kernels: MKL, or
    OpenBLAS on its SkylakeX family (``OPENBLAS_CORETYPE`` may pin another; the CI VM's
    environment pins Haswell, 256-bit, on an AVX-512 CPU). Cached per process."""
    return any(lib.internal_api == "mkl" or str(getattr(lib, "architecture", "") or "").lower() in _OPENBLAS_512BIT
               for lib in _controller().lib_controllers if lib.user_api == "blas")
