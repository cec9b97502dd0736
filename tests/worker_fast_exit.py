"""A Dask worker preload for the test run: a worker process that has closed ends without finalising Python.

A worker process of a local cluster has imported some 2 500 modules (numpy, scipy, pandas,
scikit-learn, numba, zarr, daskkrr). Tearing them down at exit (module clean-up and the last
garbage collections) takes a second or more of CPU, while its nanny waits; on a loaded 2-core
machine it takes longer than the nanny's 4 s, which then kills it (``Worker process still alive
after 4.0 seconds, killing``). Every cluster the tests close, and every worker restart, paid that.

Once the worker has closed (``dask_teardown``, called at the end of ``Worker.close``), nothing in
its process is left to save: at interpreter exit the streams and logging are flushed and the
process ends at once. Only a process started by a nanny does so; a worker inside the test
process itself (``processes=False``) leaves that process's exit, and pytest's exit status, alone.
``tests/conftest.py`` names this file in ``distributed.worker.preload``.
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

_closed = False


def end_process() -> None:
    """Flush logging and the standard streams, then end the process at once, with status 0."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _end_once_closed() -> None:
    """At interpreter exit: end at once if the worker closed, else finalise as usual (and report)."""
    if _closed:
        end_process()


def dask_setup(worker: Any) -> None:
    """Register the early exit, in a nanny's worker process only."""
    if multiprocessing.current_process().name == NANNY_PROCESS:
        atexit.register(_end_once_closed)  # registered last, so run first: before the modules' own exit hooks


def dask_teardown(worker: Any) -> None:
    """The worker has closed: its process may now end without finalising."""
    global _closed
    _closed = True
