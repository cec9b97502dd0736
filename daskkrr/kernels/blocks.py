"""Per-block kernel products used by every solver pass and by predict.

These are the hot loop of daskkrr: each FALKON iteration calls
:func:`knm_gram_matvec` once per row block, and predict calls
:func:`knm_matvec` once per block. They are pure functions on one block,
bounded in memory by ``max_tile_bytes`` rather than by the block's row count, so
an ``(n_b, M)`` kernel block is never materialised whole when it is large.

Two engines compute them:

- ``"fused"`` (:mod:`daskkrr.kernels.fused`, numba): cache-sized tiles, the
  kernel function and both products fused per row, several times faster;
- ``"numpy"`` (:mod:`daskkrr.kernels.reference`): the plain numpy reference.

``engine="auto"`` (the default) takes the fused engine for the built-in kernels
and the reference for any other :class:`~daskkrr.kernels.Kernel` subclass, with
two exceptions: ``$DASKKRR_ENGINE`` (``fused`` or ``numpy``) overrides it, and a
Dask worker with less than :data:`FUSED_MIN_WORKER_MEMORY` of memory runs the
reference (numba's compiled code and LLVM runtime stay resident, about 100 MB
per process, which such a worker cannot spare). numba is imported on the first
fused call only.
Accumulation is always in float64, whatever the block dtype, so float32 data
do not lose accuracy across many tiles.

``n_threads=None`` follows the rule of :mod:`daskkrr.kernels.threads` (1 inside
Dask tasks, every core on the main thread).

The cached strategy's products on a stored block, :func:`knm_block`,
:func:`cached_gram_matvec` and :func:`cached_t_matvec`, live here too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np

from daskkrr.kernels import reference
from daskkrr.kernels.base import Kernel
from daskkrr.kernels.spec import supports
from daskkrr.kernels.threads import current_engine_threads
from daskkrr.utils.threads import blas_threads

#: Largest kernel tile (rows x centers x itemsize) built at once.
DEFAULT_TILE_BYTES = reference.DEFAULT_TILE_BYTES
#: Engines accepted by the ``engine`` argument.
ENGINES = ("auto", "fused", "numpy")
#: Dask workers with a smaller memory limit use the numpy reference under ``engine="auto"``.
FUSED_MIN_WORKER_MEMORY = 2**30

_FUSED: ModuleType | None = None
_FUSED_ERROR: Exception | None = None


def _fused_engine() -> ModuleType | None:
    """The fused engine module, imported (with numba) on first use; None if numba is missing."""
    global _FUSED, _FUSED_ERROR
    if _FUSED is None and _FUSED_ERROR is None:
        try:
            from daskkrr.kernels import fused
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            _FUSED_ERROR = exc
        else:
            _FUSED = fused
    return _FUSED


def _worker_memory_limit() -> int | None:
    """Memory limit of the Dask worker running this thread, if any.

    The kernels layer does not import Dask: it asks only when ``distributed`` is
    already loaded (as it is in a worker process).
    """
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        worker = distributed.get_worker()
        limit = worker.memory_manager.memory_limit
    except Exception:  # not in a worker task
        return None
    return int(limit) if limit else None


def auto_engine() -> str:
    """What ``engine="auto"`` means here and now: ``$DASKKRR_ENGINE``, else ``"fused"``
    except in a Dask worker with less than :data:`FUSED_MIN_WORKER_MEMORY` of memory."""
    forced = os.environ.get("DASKKRR_ENGINE", "").strip().lower()
    if forced in ("fused", "numpy"):
        return forced
    limit = _worker_memory_limit()
    if limit is not None and limit < FUSED_MIN_WORKER_MEMORY:
        return "numpy"
    return "fused"


def resolve_engine(kernel: Kernel, engine: str = "auto") -> str:
    """``"fused"`` or ``"numpy"``: which engine computes products for ``kernel``."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}")
    if engine == "auto":
        if not supports(kernel) or auto_engine() == "numpy":
            return "numpy"
        return "fused" if _fused_engine() is not None else "numpy"
    if engine == "numpy":
        return "numpy"
    if not supports(kernel):
        raise TypeError(f"the fused engine does not implement {type(kernel).__name__}; use engine='numpy'")
    if _fused_engine() is None:
        raise ImportError(f"the fused engine needs numba: {_FUSED_ERROR}")
    return "fused"


def _threads(n_threads: int | None) -> int:
    return current_engine_threads() if n_threads is None else max(1, int(n_threads))


def _blas_guard(n_threads: int) -> contextlib.AbstractContextManager:
    """Single-threaded BLAS while the engine runs several threads of its own."""
    return blas_threads(1) if n_threads > 1 else contextlib.nullcontext()


def _reshape_out(out: np.ndarray, lead: int, like: Any) -> np.ndarray:
    return out.reshape((lead,) + np.shape(like)[1:])


def knm_gram_matvec(
    kernel: Kernel,
    Xb: np.ndarray,
    Z: np.ndarray,
    U: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
    *,
    engine: str = "auto",
    n_threads: int | None = None,
) -> np.ndarray:
    """``k(Xb, Z)^T (k(Xb, Z) U)`` for one row block, as float64 of shape ``(M, t)``.

    Parameters
    ----------
    kernel : Kernel
    Xb : ndarray of shape (n_b, d)
        Row block (float32 or float64; the products use the common dtype of Xb and Z).
    Z : ndarray of shape (M, d)
        Centers.
    U : ndarray of shape (M,) or (M, t)
    max_tile_bytes : int
        Largest kernel tile built at once.
    engine : {"auto", "fused", "numpy"}
    n_threads : int or None
        Engine threads (None: the rule of :mod:`daskkrr.kernels.threads`).

    Returns
    -------
    ndarray of float64, shaped like ``U``.
    """
    if resolve_engine(kernel, engine) == "numpy":
        return reference.knm_gram_matvec(kernel, Xb, Z, U, max_tile_bytes)
    nt = _threads(n_threads)
    with _blas_guard(nt):
        out = _fused_engine().gram_matvec(kernel, Xb, Z, U, max_tile_bytes=max_tile_bytes, n_threads=nt)
    return _reshape_out(out, out.shape[0], U)


def knm_t_matvec(
    kernel: Kernel,
    Xb: np.ndarray,
    Z: np.ndarray,
    V: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
    *,
    engine: str = "auto",
    n_threads: int | None = None,
) -> np.ndarray:
    """``k(Xb, Z)^T V`` for one row block (V has ``len(Xb)`` rows), as float64 ``(M, t)``."""
    if resolve_engine(kernel, engine) == "numpy":
        return reference.knm_t_matvec(kernel, Xb, Z, V, max_tile_bytes)
    nt = _threads(n_threads)
    with _blas_guard(nt):
        out = _fused_engine().t_matvec(kernel, Xb, Z, V, max_tile_bytes=max_tile_bytes, n_threads=nt)
    return _reshape_out(out, out.shape[0], V)


def knm_matvec(
    kernel: Kernel,
    Xb: np.ndarray,
    Z: np.ndarray,
    alpha: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
    *,
    engine: str = "auto",
    n_threads: int | None = None,
) -> np.ndarray:
    """``k(Xb, Z) alpha`` for one row block (the prediction), float64 ``(n_b,)`` or ``(n_b, t)``."""
    if resolve_engine(kernel, engine) == "numpy":
        return reference.knm_matvec(kernel, Xb, Z, alpha, max_tile_bytes)
    nt = _threads(n_threads)
    with _blas_guard(nt):
        out = _fused_engine().matvec(kernel, Xb, Z, alpha, max_tile_bytes=max_tile_bytes, n_threads=nt)
    return _reshape_out(out, out.shape[0], alpha)


def knm_gram_and_rhs(
    kernel: Kernel,
    Xb: np.ndarray,
    Yb: np.ndarray,
    Z: np.ndarray,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
    *,
    engine: str = "auto",
    n_threads: int | None = None,
    right: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """``[K^T K | K^T Y]`` with ``K = k(Xb, Z)``: the direct Nystrom solve's one pass, ``(M, M + t)``.

    The products are float64 GEMMs (float32 kernel tiles are widened first).
    With ``right = (T, d)`` the first block is ``W^T W`` with ``W = K diag(d) T^{-1}``
    instead (FALKON's preconditioned Gram matrix, see
    :func:`daskkrr.kernels.reference.precondition_tile`).
    """
    if resolve_engine(kernel, engine) == "numpy":
        return reference.knm_gram_and_rhs(kernel, Xb, Yb, Z, max_tile_bytes, right=right)
    nt = _threads(n_threads)
    with _blas_guard(nt):
        return _fused_engine().gram_and_rhs(kernel, Xb, Yb, Z, max_tile_bytes=max_tile_bytes, n_threads=nt,
                                   right=right)


def knm_block(
    kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, *, engine: str = "auto", n_threads: int | None = None
) -> np.ndarray:
    """``k(Xb, Z)`` materialised in the block dtype, ``(n_b, M)``: what the cached strategy keeps."""
    if resolve_engine(kernel, engine) == "numpy":
        Xb, Z = reference._cast(np.asarray(Xb), np.asarray(Z))
        return np.ascontiguousarray(kernel(Xb, Z))
    nt = _threads(n_threads)
    with _blas_guard(nt):
        return _fused_engine().kernel_block(kernel, Xb, Z, n_threads=nt)


def _stored_engine(engine: str) -> str:
    """Engine for products with a stored block (no kernel involved)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}")
    if engine == "auto":
        engine = auto_engine()
    if engine == "fused" and _fused_engine() is None:
        return "numpy"
    return engine


def cached_gram_matvec(
    Kb: np.ndarray, U: np.ndarray, *, engine: str = "auto", n_threads: int | None = None
) -> np.ndarray:
    """``Kb^T (Kb U)`` for a stored kernel block, float64 shaped like ``U``."""
    if _stored_engine(engine) == "numpy":
        U2 = np.asarray(U, dtype=np.float64).reshape(Kb.shape[1], -1)
        out = np.zeros_like(U2)
        for s in range(0, Kb.shape[0], 4096):  # float64 a slice at a time
            K64 = np.asarray(Kb[s : s + 4096], dtype=np.float64)
            out += K64.T @ (K64 @ U2)
    else:
        out = _fused_engine().cached_gram_matvec(Kb, U, n_threads=_threads(n_threads))
    return _reshape_out(out, Kb.shape[1], U)


def cached_t_matvec(
    Kb: np.ndarray, V: np.ndarray, *, engine: str = "auto", n_threads: int | None = None
) -> np.ndarray:
    """``Kb^T V`` for a stored kernel block, float64 ``(M,)`` or ``(M, t)``."""
    if _stored_engine(engine) == "numpy":
        V2 = np.asarray(V, dtype=np.float64).reshape(Kb.shape[0], -1)
        out = np.zeros((Kb.shape[1], V2.shape[1]))
        for s in range(0, Kb.shape[0], 4096):
            out += np.asarray(Kb[s : s + 4096], dtype=np.float64).T @ V2[s : s + 4096]
    else:
        out = _fused_engine().cached_t_matvec(Kb, V, n_threads=_threads(n_threads))
    return _reshape_out(out, Kb.shape[1], V)
