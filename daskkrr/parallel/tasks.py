"""Independent whole-function tasks (one model fit each), run side by side on the cluster.

The passes of :mod:`daskkrr.parallel.executor` split one fit over row blocks;
these tasks instead run many small fits at once, one per task slot, as a
hyperparameter search does. Where they run follows :func:`backend_for`:

- on a ``distributed`` cluster, each call is a task on a worker; the shared data
  is scattered once to every worker, and a fit inside the task runs on the
  worker's local threads (rule 2 of :mod:`daskkrr.parallel.backends`);
- otherwise the calls run one after the other in this process, each fit using
  every core through its own threaded passes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from daskkrr.parallel.backends import backend_for


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """The value of one task, or the exception it raised, and its wall time in seconds."""

    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _timed(fn: Callable[[Any, Any], Any], shared: Any, item: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn(shared, item)
    return value, time.perf_counter() - t0


def task_slots(client: Any | None = None) -> int:
    """How many tasks run at once: the cluster's worker threads, 1 in this process."""
    backend = backend_for(client)
    return max(1, int(backend.resources().slots)) if backend.is_distributed else 1


class TaskRunner:
    """Runs ``fn(shared, item)`` for many items, with ``shared`` sent to the workers once.

    Parameters
    ----------
    fn : callable
        ``fn(shared, item) -> value``; must be importable by the workers (a module-level function).
    shared : object
        Data every call needs (the training arrays).
    client : distributed.Client or None
        None: Dask's current context (see :func:`~daskkrr.parallel.backends.backend_for`).
    """

    def __init__(self, fn: Callable[[Any, Any], Any], shared: Any, client: Any | None = None):
        self.fn = fn
        self.backend = backend_for(client)
        self._shared = shared
        self._handle: Any = None

    @property
    def is_distributed(self) -> bool:
        return self.backend.is_distributed

    def run(self, items: Sequence[Any]) -> list[TaskOutcome]:
        """Outcomes in the order of ``items``; a failing call does not stop the others."""
        if not self.backend.is_distributed:
            return [self._local(item) for item in items]
        client = self.backend.client
        if self._handle is None:
            self._handle = client.scatter(self._shared, broadcast=True, hash=False)
        futures = [client.submit(_timed, self.fn, self._handle, item, pure=False) for item in items]
        outcomes = []
        for future in futures:
            try:
                value, seconds = future.result()
                outcomes.append(TaskOutcome(value=value, seconds=seconds))
            except Exception as exc:  # the task's own exception, re-raised by result()
                outcomes.append(TaskOutcome(error=exc))
        return outcomes

    def _local(self, item: Any) -> TaskOutcome:
        try:
            value, seconds = _timed(self.fn, self._shared, item)
        except Exception as exc:
            return TaskOutcome(error=exc)
        return TaskOutcome(value=value, seconds=seconds)

    def close(self) -> None:
        """Free the scattered data on the workers."""
        if self._handle is not None:
            # Scattering a tuple gives a tuple of futures, one per element.
            handles = self._handle if isinstance(self._handle, (list, tuple)) else [self._handle]
            self.backend.release(list(handles))
            self._handle = None
