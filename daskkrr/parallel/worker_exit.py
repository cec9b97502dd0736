"""A Dask worker preload: a worker process that has closed ends without finalising Python.

A worker process of a local cluster has imported some 1 800 to 2 500 modules (numpy, scipy,
dask.array with the xarray and pandas it imports, numba, zarr, daskkrr). Tearing them down at
exit (module clean-up and the last garbage collections) takes a second or more of CPU while its
nanny waits; on a loaded 2-core machine it takes longer than the nanny's 4 s, which then kills it
(``Worker process still alive after 4.0 seconds, killing``). Every cluster closed, and every worker
restarted, paid that.

Once the worker has closed, nothing in its process is left to save. ``dask_teardown`` runs inside
``Worker.close``; the process ends only later, at interpreter exit, after ``Worker.close`` has
finished (it removed the worker's directory with its spilled data, as it always does, and sent the
scheduler its last messages), the nanny's process function has returned and the non-daemon
threads have been joined. Then logging is shut down (its handlers flushed and closed), the
standard streams are flushed, and the process ends at once with status 0. Only a process that a
nanny started does so; a worker inside the calling process (``processes=False``) leaves that
process's exit alone. What is skipped is the interpreter's own clean-up: other exit hooks (none
that daskkrr's tasks need: their files are written and closed by the task that writes them) and
the buffers of files that a task left open and unflushed.

:func:`~daskkrr.parallel.client.local_cluster_kwargs` adds it to the clusters daskkrr starts (the
command line, the benchmarks); the test run names it in ``distributed.worker.preload``.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
from typing import Any

#: The name distributed gives the process a nanny starts its worker in.
NANNY_PROCESS = "Dask Worker process (from Nanny)"

#: This module as a worker preload (``distributed.worker.preload`` takes module names).
PRELOAD = __name__

_closed = False


def end_process() -> None:
    """Flush logging and the standard streams, then end the process at once, with status 0."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to flush into
            pass
    os._exit(0)


def _end_once_closed() -> None:
    """At interpreter exit: end at once if the worker closed, else finalise as usual (and report)."""
    if _closed:
        end_process()


def dask_setup(worker: Any) -> None:
    """Register the early exit, in a nanny's worker process only.

    Parameters
    ----------
    worker : distributed.Worker
        The worker starting in this process (unused: the process's name says who started it).

    Returns
    -------
    None
    """
    if multiprocessing.current_process().name == NANNY_PROCESS:
        atexit.register(_end_once_closed)  # registered last, so run first: before the modules' own exit hooks


def dask_teardown(worker: Any) -> None:
    """The worker is closing (its tasks are done): its process may end without finalising.

    Parameters
    ----------
    worker : distributed.Worker
        The worker closing in this process.

    Returns
    -------
    None
    """
    global _closed
    _closed = True


def with_fast_exit(preload: str | list[str], preload_argv: list[str] | list[list[str]]) -> dict[str, list]:
    """Worker ``preload``/``preload_argv`` (as Dask's configuration gives them) with this module added.

    Parameters
    ----------
    preload : str or list of str
        The worker preloads configured (``distributed.worker.preload``; one may be given as a
        plain string); kept, in order.
    preload_argv : list of str, or list of lists of str
        Their arguments (``distributed.worker.preload-argv``): one list for all, or one per preload.

    Returns
    -------
    dict
        ``preload`` and ``preload_argv`` for :class:`distributed.LocalCluster` (passed on to each
        nanny), with one list of arguments per preload (this module's empty).
    """
    preload = [preload] if isinstance(preload, str) else list(preload)
    if preload_argv and isinstance(preload_argv[0], str):  # one argument list shared by all preloads
        per_preload = [list(preload_argv) for _ in preload]
    else:
        per_preload = [list(argv) for argv in preload_argv] or [[] for _ in preload]
    if PRELOAD not in preload:
        preload.append(PRELOAD)
        per_preload.append([])
    return {"preload": preload, "preload_argv": per_preload}
