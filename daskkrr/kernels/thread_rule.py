"""How many threads one call of the block engine may use.

The rule: **Dask threads x engine threads x BLAS threads <= cores**. Parallelism
comes from one place at a time:

- Inside a Dask task (any thread other than the main thread: Dask's threaded
  scheduler runs one task per core, a ``LocalCluster`` started by daskkrr one
  single-threaded worker per core) the engine runs on **1 thread**, and BLAS is
  single-threaded too (distributed's nanny sets ``OPENBLAS_NUM_THREADS=1`` in
  worker processes; the threaded backend of :mod:`daskkrr.parallel.backends` limits BLAS around
  the threaded scheduler's compute).
- When a cluster has fewer Dask threads than cores on a host (one worker with
  one thread on a 2-core machine), the orchestrator hands each task the spare
  cores with :func:`engine_threads` (see :attr:`daskkrr.parallel.resources.Resources.thread_budget`).
- A direct call on the main thread (predict on a numpy array, the benchmarks)
  uses **every core** the process may run on, with BLAS limited to 1 thread
  while the engine's own threads run.

:func:`engine_threads` overrides the choice for the code it wraps (a context
variable, so it follows Dask's threaded scheduler into its tasks), and the
environment variable ``DASKKRR_ENGINE_THREADS`` caps it in any process.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator

from daskkrr.utils.threads import available_cores

_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("daskkrr_engine_threads", default=None)


def engine_thread_cap() -> int | None:
    """``$DASKKRR_ENGINE_THREADS`` in this process (None: no cap)."""
    raw = os.environ.get("DASKKRR_ENGINE_THREADS", "").strip()
    return max(1, int(raw)) if raw.isdigit() else None


def current_engine_threads() -> int:
    """Threads the engine uses for a call made here and now (see the module rule).

    ``$DASKKRR_ENGINE_THREADS`` caps it (e.g. to leave cores to others on a shared machine).
    """
    value = _THREADS.get()
    if value is not None:
        n = max(1, int(value))
    elif threading.current_thread() is threading.main_thread():
        n = available_cores()
    else:
        n = 1
    cap = engine_thread_cap()
    return n if cap is None else min(n, cap)


@contextlib.contextmanager
def engine_threads(n: int | None) -> Iterator[None]:
    """Use ``n`` engine threads for block products called inside the ``with`` block (None: the rule)."""
    if n is not None and (isinstance(n, bool) or int(n) < 1):
        raise ValueError(f"engine threads must be a positive integer or None; got {n!r}")
    token = _THREADS.set(None if n is None else int(n))
    try:
        yield
    finally:
        _THREADS.reset(token)
