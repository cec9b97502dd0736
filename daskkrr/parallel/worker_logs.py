"""The workers' log on a full disk: one clear error instead of a traceback per failed chunk.

daskkrr's writers turn a full disk into one :class:`~daskkrr.utils.atomic.DiskFullError`
naming the output and the free space. Dask's workers also log each failed task as
"Compute Failed" with its traceback (at ERROR, so ``-q`` does not hide it); the workers
of a cluster the command line starts share its terminal, where that report would follow
the one line the command prints. :class:`DiskFullComputeFailed` drops just those
records; every other failure is still logged.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["DiskFullComputeFailed", "QuietDiskFull", "quiet_disk_full_failures"]


class DiskFullComputeFailed(logging.Filter):
    """Drops ``distributed.worker``'s "Compute Failed" record of a task that found its disk full."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith("Compute Failed") and "No space left on device" in record.getMessage())


def quiet_disk_full_failures() -> None:
    """Add :class:`DiskFullComputeFailed` to the ``distributed.worker`` logger of this process (once)."""
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, DiskFullComputeFailed) for f in worker_log.filters):
        worker_log.addFilter(DiskFullComputeFailed())


class QuietDiskFull(WorkerPlugin):
    """A worker plugin: :func:`quiet_disk_full_failures` in each worker's process, restarted ones included."""

    def setup(self, worker: Any) -> None:
        quiet_disk_full_failures()
