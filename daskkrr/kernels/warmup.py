"""Having the fused engine compiled before the first fit.

numba compiles :mod:`daskkrr.kernels.fused` on its first call (about 9 s per
dtype on the AMD EPYC VM, most of it LLVM on the four-row cross-product loops) and
caches the machine code on disk, keyed on the sources' contents, the numba and
Python versions and the CPU. Three ways the cache gets filled:

- **at install**: the package build (``setup.py``) compiles the engine into the
  built package's ``__pycache__`` and writes the marker below, so that after
  ``pip install`` (or ``pip install -e``) on the machine that built it, the first
  fit loads compiled code;
- ``python -m daskkrr.kernels.precompile`` (for an image build or CI);
- **in the background**: ``engine="auto"`` asks :func:`fused_ready`, and without a
  valid marker (a wheel built on another CPU, ``$NUMBA_CACHE_DIR`` pointing
  elsewhere, a read-only site-packages) the products run on the BLAS engine
  (:mod:`daskkrr.kernels.blas`, no compiler needed) while :func:`start_background`
  starts, once per process, ``python -m daskkrr.kernels.precompile --background``:
  a low-priority process that compiles every signature the engine uses (both
  dtypes), then writes the marker. A file lock makes concurrent processes (Dask
  workers) compile once. Later products in every process pick up the fused engine.

The marker (a file beside numba's cache, named by :func:`cache_key`) records the CPU
the code was compiled for; one written for another CPU does not count.
``$DASKKRR_BACKGROUND_COMPILE=0`` turns the background compile off
(``engine="auto"`` then compiles inline on first use, as numba does).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from daskkrr.utils.atomic import atomic_write_bytes

#: Source files whose compiled code the cache holds (the marker is keyed on their contents).
_SOURCES = ("kernels/fused.py", "kernels/_vexp.py", "kernels/spec.py", "kernels/block_layout.py",
            "utils/_mixed_loops.py")
#: Seconds between two looks for the marker while the fused engine is not ready.
_RECHECK_SECONDS = 1.0

_ready = False
_last_check = -_RECHECK_SECONDS
_started = False
_start_lock = threading.Lock()  # engine_for runs in many Dask threads at once
_check_lock = threading.Lock()  # one look for the marker at a time; the others wait for its answer


def background_allowed() -> bool:
    """False when ``$DASKKRR_BACKGROUND_COMPILE`` is ``0``, ``false`` or ``no``."""
    return os.environ.get("DASKKRR_BACKGROUND_COMPILE", "1").strip().lower() not in ("0", "false", "no")


@functools.cache
def cache_key() -> str:
    """A hash of the compiled sources and of the numba and Python versions."""
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((package / name).read_bytes())
    h.update(importlib.metadata.version("numba").encode())
    h.update(f"{sys.version_info[0]}.{sys.version_info[1]}".encode())
    return h.hexdigest()[:20]


def _cache_dir() -> Path:
    """Where the marker lives: beside numba's cache of this package.

    numba writes to ``$NUMBA_CACHE_DIR`` when set, else to ``__pycache__`` beside
    the source when writable, else to a per-user cache folder.
    """
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return Path(env) / "daskkrr"
    tree = Path(__file__).resolve().parent / "__pycache__"
    if os.access(tree if tree.exists() else tree.parent, os.W_OK):
        return tree
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "daskkrr"


def marker_path() -> Path:
    """The file that says the fused engine's cache is complete for :func:`cache_key`."""
    return _cache_dir() / f"daskkrr-engine-{cache_key()}.ready"


def host_target() -> list[str]:
    """What numba compiles for here: target triple, CPU name and features (its cache key's
    ``magic_tuple``, which honours ``$NUMBA_CPU_NAME`` and ``$NUMBA_CPU_FEATURES``)."""
    from numba.core.registry import cpu_target

    return [str(part) for part in cpu_target.target_context.codegen().magic_tuple()]


def _marker_valid(marker: Path) -> bool:
    """Whether ``marker`` exists and was written for this machine's CPU.

    A marker built into a wheel on another machine names another CPU: numba's cache
    beside it holds no code for this one, so the engine would compile inline.
    Only an existing marker imports numba.
    """
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False  # absent, or from an older daskkrr (plain text): compile once more
    return isinstance(recorded, dict) and recorded.get("target") == host_target()


def fused_ready() -> bool:
    """Whether the fused engine can run without compiling (looks at most once a second)."""
    global _ready, _last_check
    if _ready:
        return True
    # Under the lock, and the answer before the time of the look: a thread that read a
    # fresh timestamp beside a stale False would run its block on the BLAS engine and
    # start a needless background compile while the marker was being read.
    with _check_lock:
        if not _ready and time.monotonic() - _last_check >= _RECHECK_SECONDS:
            _ready = _marker_valid(marker_path())
            _last_check = time.monotonic()
        return _ready


def start_background() -> bool:
    """Start the background compile once per process; False when it was started before.

    The compiler waits until this process is idle (see :func:`wait_until_idle`): run
    beside the fit that needed it, it would take the cores and caches that the fit's
    BLAS engine is using.
    """
    global _started
    with _start_lock:
        if _started:
            return False
        _started = True
    # `-m` puts the working directory first on sys.path: run from the folder that holds
    # this very package, so the child compiles the same daskkrr (not a checkout in cwd).
    subprocess.Popen(  # noqa: S603 - our own module, with this interpreter
        [sys.executable, "-m", "daskkrr.kernels.precompile", "--background", "--after-idle", str(os.getpid())],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )
    return True


def wait_until_idle(pid: int, max_wait: float = 120.0, window: float = 0.5, busy: float = 0.2) -> None:
    """Return once process ``pid`` has used less than ``busy`` of a core over two
    consecutive ``window``-second windows, or has exited, or after ``max_wait`` seconds."""
    import psutil

    try:
        proc = psutil.Process(pid)
        deadline = time.monotonic() + max_wait
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:
            before = sum(proc.cpu_times()[:2])
            time.sleep(window)
            quiet = quiet + 1 if sum(proc.cpu_times()[:2]) - before < busy * window else 0
    except psutil.NoSuchProcess:
        return


def compile_engine() -> None:
    """Compile every signature of the fused engine's loops (float32 and float64 blocks), and the
    mixed-precision triangular solves."""
    import numpy as np

    from daskkrr.kernels import fused
    from daskkrr.kernels.stationary import GaussianKernel

    kernel = GaussianKernel(sigma=1.0)
    for dtype in (np.float32, np.float64):
        X = np.linspace(0.0, 1.0, 48 * 3, dtype=dtype).reshape(48, 3)
        Z = X[:8].copy()
        U, V = np.ones(8), np.ones(48)
        fused.gram_matvec(kernel, X, Z, U)
        fused.t_matvec(kernel, X, Z, V)
        fused.matvec(kernel, X, Z, U)
        fused.gram_and_rhs(kernel, X, V, Z)
        K = fused.kernel_block(kernel, X, Z)
        fused.cached_gram_matvec(K, U)
        fused.cached_t_matvec(K, V)
    # the float64 solves with a float32-factored preconditioner (daskkrr.utils.mixed_solve)
    from daskkrr.utils.mixed_solve import solve_upper_mixed

    T = np.eye(4, dtype=np.float32)
    solve_upper_mixed(T, np.ones(4))
    solve_upper_mixed(T, np.ones(4), trans=True)


@contextlib.contextmanager
def _exclusive(lock: Path, wait: bool) -> Iterator[bool]:
    """Hold an exclusive lock on ``lock``; yields False if another process holds it and not ``wait``."""
    import fcntl

    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def warm_up(wait: bool = True) -> bool:
    """Compile the engine and write the marker, unless done already; True when the marker exists.

    With ``wait=False``, returns False at once if another process is compiling.
    """
    marker = marker_path()
    if _marker_valid(marker):
        return True
    with _exclusive(marker.with_suffix(".lock"), wait) as held:
        if not held:
            return False
        if not _marker_valid(marker):
            compile_engine()
            record = {"numba": importlib.metadata.version("numba"), "target": host_target()}
            atomic_write_bytes(marker, json.dumps(record).encode(), durable=False)
    return True
