"""How one block is processed: the kernel engine interface and its two implementations.

These products are the hot loop of daskkrr: each FALKON iteration calls
:meth:`KernelEngine.gram_matvec` once per row block, and predict calls
:meth:`KernelEngine.matvec` once per block. They are pure functions of one block,
bounded in memory by ``max_tile_bytes`` rather than by the block's row count, so
an ``(n_b, M)`` kernel block is never materialised whole when it is large.

Three engines implement :class:`KernelEngine`:

- :class:`FusedEngine` (:mod:`daskkrr.kernels.fused`, numba): cache-sized tiles,
  the kernel function and both products fused per row, several times faster;
  numba is imported on its first call only;
- :class:`BlasEngine` (:mod:`daskkrr.kernels.blas`): cache-sized tiles, each step
  one numpy or BLAS call; no compiler, about 0.9x the fused engine's speed for
  the Gaussian kernel at d = 20;
- :class:`NumpyEngine` (:mod:`daskkrr.kernels.reference`): the plain numpy
  reference, for any :class:`~daskkrr.kernels.Kernel` subclass.

:func:`engine_for` picks one. ``engine="auto"`` (the default) takes the fused
engine for the built-in kernels and the reference for any other kernel, with these
exceptions: blocks with more than :data:`FUSED_MAX_FEATURES` features compute their
kernel with the BLAS engine (:class:`AutoFusedEngine`); ``$DASKKRR_ENGINE`` (``fused``,
``blas`` or ``numpy``) overrides the choice; a
Dask worker with less than :data:`FUSED_MIN_WORKER_MEMORY` of memory runs the BLAS
engine (numba's compiled code and LLVM runtime stay resident, about 100 MB per
process, which such a worker cannot spare); and until the fused engine has been
compiled into numba's cache on this machine (the package build does that: see
:mod:`daskkrr.kernels.warmup`), or without numba, the BLAS engine runs while a
background process compiles, so that no fit waits for the compiler.

Every product accumulates in float64, whatever the block dtype, so float32 data
do not lose accuracy across many tiles. ``n_threads=None`` follows the rule of
:mod:`daskkrr.kernels.thread_rule` (1 inside Dask tasks, every core on the main
thread); the base class applies it, and holds BLAS to one thread while an engine
runs threads of its own.

>>> import numpy as np
>>> from daskkrr.kernels import GaussianKernel, engine_for
>>> engine = engine_for(GaussianKernel(sigma=1.0), "numpy")
>>> engine.matvec(GaussianKernel(sigma=1.0), np.zeros((3, 2)), np.zeros((1, 2)), np.ones(1))
array([1., 1., 1.])
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import os
import sys
from types import ModuleType
from typing import Any, ClassVar, Self

import numpy as np

from daskkrr.kernels import blas, reference, warmup
from daskkrr.kernels.base import Kernel
from daskkrr.kernels.sparse import is_sparse
from daskkrr.kernels.spec import supports
from daskkrr.kernels.thread_rule import current_engine_threads
from daskkrr.utils.optional import numba_installed
from daskkrr.utils.threads import blas_threads

#: Largest kernel tile (rows x centers x itemsize) built at once when ``max_tile_bytes`` is None.
DEFAULT_TILE_BYTES = reference.DEFAULT_TILE_BYTES
#: Engines accepted by :func:`engine_for`.
ENGINES = ("auto", "fused", "blas", "numpy")
#: Dask workers with a smaller memory limit use the BLAS engine under ``engine="auto"``.
FUSED_MIN_WORKER_MEMORY = 2**30
#: Under ``engine="auto"``, blocks with more features than this compute their kernel with the BLAS engine.
#: Past it the distance GEMM (2 d flops an entry) outweighs the kernel function, and OpenBLAS's
#: GEMM beats the fused loops' inner products (the performance guide's "The kernel engine",
#: ``workflows/benchmarks/results/engine_throughput_width.json``: single-thread fused / BLAS 1.20
#: at d = 64, 0.94 at 100, 0.79 at 784 in float32). Products on a stored block (the cache
#: strategy's) stay fused: they read the block once, the BLAS pair twice.
FUSED_MAX_FEATURES = 64


_NO_GUARD = contextlib.nullcontext()  # stateless, so one instance serves every call


def _tile(max_tile_bytes: int | None) -> int:
    return DEFAULT_TILE_BYTES if max_tile_bytes is None else int(max_tile_bytes)


def _shaped(out: np.ndarray, lead: int, like: Any) -> np.ndarray:
    """``out`` reshaped to ``(lead,)`` followed by the trailing shape of the operand ``like``."""
    return out.reshape((lead,) + np.shape(like)[1:])


class KernelEngine(abc.ABC):
    """The per-block kernel products, as one engine computes them.

    Engines are stateless singletons (``NumpyEngine() is NumpyEngine()``), so they
    are cheap to pass around and to pickle into Dask tasks. Subclasses implement
    the ``_``-prefixed hooks; the public methods resolve ``n_threads`` and
    ``max_tile_bytes``, guard BLAS, and give the results their documented shapes.

    The methods share their arguments: ``kernel`` (a :class:`~daskkrr.kernels.Kernel`);
    ``Xb``, a row block ``(n_b, d)`` (float32 or float64; the kernel uses the
    common dtype of ``Xb`` and ``Z``); ``Z``, the centers ``(M, d)``;
    ``n_threads``, the engine's threads (None: the rule of
    :mod:`daskkrr.kernels.thread_rule`; an engine without threads of its own ignores
    it); ``max_tile_bytes``, the largest kernel tile built at once (None:
    :data:`DEFAULT_TILE_BYTES`).
    """

    #: The name :func:`engine_for` knows this engine by.
    name: ClassVar[str]
    #: Whether the engine runs threads of its own (then BLAS is held to one thread meanwhile).
    threaded: ClassVar[bool]

    _instances: ClassVar[dict[type, KernelEngine]] = {}

    def __new__(cls) -> Self:
        instance = KernelEngine._instances.get(cls)
        if instance is None:
            instance = KernelEngine._instances[cls] = super().__new__(cls)
        return instance  # type: ignore[return-value]  # stored per class

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def _threads(self, n_threads: int | None) -> tuple[int, contextlib.AbstractContextManager]:
        """The engine's thread count for one call, and the BLAS guard to hold while it runs.

        BLAS is single-threaded while the engine runs threads of its own (the rule
        of :mod:`daskkrr.kernels.thread_rule`: engine threads x BLAS threads <= cores).
        """
        if not self.threaded:
            return 1, _NO_GUARD
        nt = current_engine_threads() if n_threads is None else max(1, int(n_threads))
        return nt, (blas_threads(1) if nt > 1 else _NO_GUARD)

    def _for_block(self, Xb: Any, Z: Any) -> KernelEngine:
        """The engine that computes this block: scipy sparse rows (or centers) go to the numpy
        reference, whose tiles are kernel calls on sparse row slices (:mod:`daskkrr.kernels.sparse`);
        the compiled engines read dense rows only."""
        return _NUMPY if is_sparse(Xb) or is_sparse(Z) else self

    # ------------------------------------------------------------------ public products
    def gram_matvec(self, kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, U: np.ndarray, *,
                    n_threads: int | None = None, max_tile_bytes: int | None = None) -> np.ndarray:
        """``K^T (K U)`` with ``K = k(Xb, Z)``: FALKON's per-block product.

        ``U`` has shape ``(M,)`` or ``(M, t)``; returns float64 shaped like ``U``.
        """
        eng = self._for_block(Xb, Z)
        nt, guard = eng._threads(n_threads)
        with guard:
            out = eng._gram_matvec(kernel, Xb, Z, U, nt, _tile(max_tile_bytes))
        return _shaped(out, out.shape[0], U)

    def t_matvec(self, kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, V: np.ndarray, *,
                 n_threads: int | None = None, max_tile_bytes: int | None = None) -> np.ndarray:
        """``K^T V`` with ``K = k(Xb, Z)``: the right-hand side ``K_nM^T y``, block by block.

        ``V`` has shape ``(n_b,)`` or ``(n_b, t)``; returns float64 ``(M,)`` or ``(M, t)``.
        """
        eng = self._for_block(Xb, Z)
        nt, guard = eng._threads(n_threads)
        with guard:
            out = eng._t_matvec(kernel, Xb, Z, V, nt, _tile(max_tile_bytes))
        return _shaped(out, out.shape[0], V)

    def matvec(self, kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, A: np.ndarray, *,
               n_threads: int | None = None, max_tile_bytes: int | None = None) -> np.ndarray:
        """``K A`` with ``K = k(Xb, Z)``: the prediction of one block.

        ``A`` has shape ``(M,)`` or ``(M, t)``; returns float64 ``(n_b,)`` or ``(n_b, t)``.
        """
        eng = self._for_block(Xb, Z)
        nt, guard = eng._threads(n_threads)
        with guard:
            out = eng._matvec(kernel, Xb, Z, A, nt, _tile(max_tile_bytes))
        return _shaped(out, out.shape[0], A)

    def gram_and_rhs(self, kernel: Kernel, Xb: np.ndarray, Yb: np.ndarray, Z: np.ndarray,
                     right: tuple[np.ndarray, np.ndarray] | None = None, *,
                     n_threads: int | None = None, max_tile_bytes: int | None = None) -> np.ndarray:
        """``[W^T W | K^T Y]`` with ``K = k(Xb, Z)``: the Gram strategy's one pass, float64 ``(M, M + t)``.

        ``W = K`` by default; with ``right = (T, d)`` (FALKON's upper-triangular
        factor and positive scaling) ``W = K diag(d) T^{-1}``, the preconditioned
        Gram matrix (see :func:`daskkrr.kernels.reference.precondition_tile`).
        The products are float64 GEMMs (float32 kernel tiles are widened first).
        ``Yb`` has shape ``(n_b,)`` or ``(n_b, t)``.
        """
        eng = self._for_block(Xb, Z)
        nt, guard = eng._threads(n_threads)
        with guard:
            return eng._gram_and_rhs(kernel, Xb, Yb, Z, right, nt, _tile(max_tile_bytes))

    def kernel_block(self, kernel: Kernel, Xb: np.ndarray, Z: np.ndarray, *,
                     n_threads: int | None = None) -> np.ndarray:
        """``K = k(Xb, Z)`` materialised in the block dtype, ``(n_b, M)``: what the cache strategy keeps."""
        eng = self._for_block(Xb, Z)
        nt, guard = eng._threads(n_threads)
        with guard:
            return eng._kernel_block(kernel, Xb, Z, nt)

    def cached_gram_matvec(self, K: np.ndarray, U: np.ndarray, *, n_threads: int | None = None) -> np.ndarray:
        """``K^T (K U)`` for a stored block ``K`` (from :meth:`kernel_block`), float64 shaped like ``U``."""
        nt, guard = self._threads(n_threads)
        with guard:
            out = self._cached_gram_matvec(K, U, nt)
        return _shaped(out, K.shape[1], U)

    def cached_t_matvec(self, K: np.ndarray, V: np.ndarray, *, n_threads: int | None = None) -> np.ndarray:
        """``K^T V`` for a stored block ``K`` (``V``: ``(n_b,)`` or ``(n_b, t)``), float64 ``(M,)`` or ``(M, t)``."""
        nt, guard = self._threads(n_threads)
        with guard:
            out = self._cached_t_matvec(K, V, nt)
        return _shaped(out, K.shape[1], V)

    # ------------------------------------------------------------------ hooks
    # Each receives a resolved thread count and tile size and returns float64 ``(rows, t)``
    # (the public method reshapes), except the stored block and ``[W^T W | K^T Y]``.
    @abc.abstractmethod
    def _gram_matvec(self, kernel: Kernel, Xb: Any, Z: Any, U: Any, n_threads: int,
                     max_tile_bytes: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _t_matvec(self, kernel: Kernel, Xb: Any, Z: Any, V: Any, n_threads: int,
                  max_tile_bytes: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _matvec(self, kernel: Kernel, Xb: Any, Z: Any, A: Any, n_threads: int,
                max_tile_bytes: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _gram_and_rhs(self, kernel: Kernel, Xb: Any, Yb: Any, Z: Any,
                      right: tuple[np.ndarray, np.ndarray] | None, n_threads: int,
                      max_tile_bytes: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _kernel_block(self, kernel: Kernel, Xb: Any, Z: Any, n_threads: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _cached_gram_matvec(self, K: np.ndarray, U: Any, n_threads: int) -> np.ndarray: ...

    @abc.abstractmethod
    def _cached_t_matvec(self, K: np.ndarray, V: Any, n_threads: int) -> np.ndarray: ...


class NumpyEngine(KernelEngine):
    """The numpy reference (:mod:`daskkrr.kernels.reference`): large tiles, BLAS with its own threads.

    Works for any :class:`~daskkrr.kernels.Kernel` subclass; runs no threads of its own.
    """

    name = "numpy"
    threaded = False

    def _gram_matvec(self, kernel, Xb, Z, U, n_threads, max_tile_bytes):
        return reference.knm_gram_matvec(kernel, Xb, Z, U, max_tile_bytes)

    def _t_matvec(self, kernel, Xb, Z, V, n_threads, max_tile_bytes):
        return reference.knm_t_matvec(kernel, Xb, Z, V, max_tile_bytes)

    def _matvec(self, kernel, Xb, Z, A, n_threads, max_tile_bytes):
        return reference.knm_matvec(kernel, Xb, Z, A, max_tile_bytes)

    def _gram_and_rhs(self, kernel, Xb, Yb, Z, right, n_threads, max_tile_bytes):
        return reference.knm_gram_and_rhs(kernel, Xb, Yb, Z, max_tile_bytes, right=right)

    def _kernel_block(self, kernel, Xb, Z, n_threads):
        return reference.kernel_block(kernel, Xb, Z)

    def _cached_gram_matvec(self, K, U, n_threads):
        return reference.cached_gram_matvec(K, U)

    def _cached_t_matvec(self, K, V, n_threads):
        return reference.cached_t_matvec(K, V)


class BlasEngine(KernelEngine):
    """Cache-sized tiles, each step one numpy or BLAS call (:mod:`daskkrr.kernels.blas`).

    Fast paths for the Gaussian and dot-product kernels; any other kernel's tiles
    come from its own formula. Needs no compiler.
    """

    name = "blas"
    threaded = True

    def _gram_matvec(self, kernel, Xb, Z, U, n_threads, max_tile_bytes):
        return blas.gram_matvec(kernel, Xb, Z, U, max_tile_bytes=max_tile_bytes, n_threads=n_threads)

    def _t_matvec(self, kernel, Xb, Z, V, n_threads, max_tile_bytes):
        return blas.t_matvec(kernel, Xb, Z, V, max_tile_bytes=max_tile_bytes, n_threads=n_threads)

    def _matvec(self, kernel, Xb, Z, A, n_threads, max_tile_bytes):
        return blas.matvec(kernel, Xb, Z, A, max_tile_bytes=max_tile_bytes, n_threads=n_threads)

    def _gram_and_rhs(self, kernel, Xb, Yb, Z, right, n_threads, max_tile_bytes):
        return blas.gram_and_rhs(kernel, Xb, Yb, Z, max_tile_bytes=max_tile_bytes, n_threads=n_threads,
                                 right=right)

    def _kernel_block(self, kernel, Xb, Z, n_threads):
        return blas.kernel_block(kernel, Xb, Z, n_threads=n_threads)

    def _cached_gram_matvec(self, K, U, n_threads):
        return blas.cached_gram_matvec(K, U, n_threads=n_threads)

    def _cached_t_matvec(self, K, V, n_threads):
        return blas.cached_t_matvec(K, V, n_threads=n_threads)


_FUSED_CORE: ModuleType | None = None
_FUSED_ERROR: ImportError | None = None


def _fused_core() -> ModuleType | None:
    """:mod:`daskkrr.kernels.fused`, imported (with numba) on first use; None if numba is missing."""
    global _FUSED_CORE, _FUSED_ERROR
    if _FUSED_CORE is None and _FUSED_ERROR is None:
        try:
            _FUSED_CORE = importlib.import_module("daskkrr.kernels.fused")
        except ImportError as exc:
            _FUSED_ERROR = exc
    return _FUSED_CORE


class FusedEngine(KernelEngine):
    """The fused, cache-tiled numba engine (:mod:`daskkrr.kernels.fused`) for the built-in kernels.

    numba is imported on the first product; without it every product raises
    ImportError (:func:`engine_for` then picks :class:`NumpyEngine` under ``"auto"``).
    """

    name = "fused"
    threaded = True

    @staticmethod
    def available() -> bool:
        """True when numba, hence this engine, can be loaded."""
        return _fused_core() is not None

    @staticmethod
    def _core() -> ModuleType:
        core = _fused_core()
        if core is None:
            raise ImportError(f"the fused engine needs numba: {_FUSED_ERROR}; use engine='numpy'")
        return core

    def _gram_matvec(self, kernel, Xb, Z, U, n_threads, max_tile_bytes):
        return self._core().gram_matvec(kernel, Xb, Z, U, max_tile_bytes=max_tile_bytes, n_threads=n_threads)

    def _t_matvec(self, kernel, Xb, Z, V, n_threads, max_tile_bytes):
        return self._core().t_matvec(kernel, Xb, Z, V, max_tile_bytes=max_tile_bytes, n_threads=n_threads)

    def _matvec(self, kernel, Xb, Z, A, n_threads, max_tile_bytes):
        return self._core().matvec(kernel, Xb, Z, A, max_tile_bytes=max_tile_bytes, n_threads=n_threads)

    def _gram_and_rhs(self, kernel, Xb, Yb, Z, right, n_threads, max_tile_bytes):
        return self._core().gram_and_rhs(kernel, Xb, Yb, Z, max_tile_bytes=max_tile_bytes,
                                         n_threads=n_threads, right=right)

    def _kernel_block(self, kernel, Xb, Z, n_threads):
        return self._core().kernel_block(kernel, Xb, Z, n_threads=n_threads)

    def _cached_gram_matvec(self, K, U, n_threads):
        return self._core().cached_gram_matvec(K, U, n_threads=n_threads)

    def _cached_t_matvec(self, K, V, n_threads):
        return self._core().cached_t_matvec(K, V, n_threads=n_threads)


class AutoFusedEngine(FusedEngine):
    """The fused engine as ``engine="auto"`` runs it: wide blocks go to the BLAS engine.

    A dense block with more than :data:`FUSED_MAX_FEATURES` columns computes its
    kernel products with :class:`BlasEngine` (the distance GEMM dominates there);
    narrower blocks and the products on a stored block run the fused loops.
    ``engine="fused"`` asks for the fused loops at every width.
    """

    def _for_block(self, Xb: Any, Z: Any) -> KernelEngine:
        chosen = super()._for_block(Xb, Z)
        if chosen is self and np.shape(Xb)[-1] > FUSED_MAX_FEATURES:
            return _BLAS
        return chosen


# --------------------------------------------------------------------------- resolution
_NUMPY = NumpyEngine()
_BLAS = BlasEngine()
_FUSED = FusedEngine()
#: :func:`_auto_choice`'s name for :class:`AutoFusedEngine` (``$DASKKRR_ENGINE=fused`` forces the plain one);
#: not in :data:`ENGINES`, so only ``"auto"`` resolves to it.
_WIDTH_AWARE = "fused-auto"
_BY_NAME: dict[str, KernelEngine] = {"numpy": _NUMPY, "blas": _BLAS, "fused": _FUSED,
                                     _WIDTH_AWARE: AutoFusedEngine()}


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


def _auto_choice(kernel: Kernel | None) -> str:
    """What ``engine="auto"`` means for ``kernel`` here and now (see the module docstring)."""
    if kernel is not None and not supports(kernel):
        return "numpy"
    forced = os.environ.get("DASKKRR_ENGINE", "").strip().lower()
    if forced in ("numpy", "blas"):
        return forced
    if forced == "fused":
        return "fused" if FusedEngine.available() else "numpy"
    limit = _worker_memory_limit()
    if limit is not None and limit < FUSED_MIN_WORKER_MEMORY:
        return "blas"
    if not numba_installed():
        return "blas"
    if warmup.fused_ready() or _fused_compiled_here() or not warmup.background_allowed():
        return _WIDTH_AWARE if FusedEngine.available() else "blas"
    warmup.start_background()
    return "blas"


def _fused_compiled_here() -> bool:
    """Whether this process has the fused engine's loops loaded already."""
    core = sys.modules.get("daskkrr.kernels.fused")
    return core is not None and bool(core._block_rows.signatures)


def engine_for(kernel: Kernel | None, engine: str = "auto") -> KernelEngine:
    """The engine that computes the block products of ``kernel``.

    Call it where the products run (inside the Dask task), so that the worker's
    memory and environment decide ``"auto"``.

    Parameters
    ----------
    kernel : Kernel or None
        The kernel, or None for the products on a stored block
        (:meth:`KernelEngine.cached_gram_matvec`, :meth:`KernelEngine.cached_t_matvec`),
        which involve no kernel function.
    engine : {"auto", "fused", "blas", "numpy"}
        ``"auto"``: :class:`FusedEngine` for the built-in kernels and
        :class:`NumpyEngine` for any other Kernel subclass, unless ``$DASKKRR_ENGINE``
        (``fused``, ``blas`` or ``numpy``) says otherwise for a built-in kernel.
        Without that variable, :class:`BlasEngine` computes the kernel of blocks with
        more than :data:`FUSED_MAX_FEATURES` features, and runs instead of the fused engine
        when the caller is a Dask worker with less than
        :data:`FUSED_MIN_WORKER_MEMORY` of memory, when numba is missing, and until
        the fused engine is compiled on this machine (a background process
        compiles it: :mod:`daskkrr.kernels.warmup`).

    Returns
    -------
    KernelEngine
        A stateless singleton.

    Raises
    ------
    ValueError
        For an unknown ``engine``.
    TypeError
        For ``engine="fused"`` with a kernel the fused engine does not implement.
    ImportError
        For ``engine="fused"`` without numba.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}; got {engine!r}")
    if engine == "auto":
        return _BY_NAME[_auto_choice(kernel)]
    if engine in ("numpy", "blas"):
        return _BY_NAME[engine]
    if kernel is not None and not supports(kernel):
        raise TypeError(f"the fused engine does not implement {type(kernel).__name__}; use engine='numpy'")
    FusedEngine._core()
    return _FUSED
