"""Run directories: one per run, named by time and id, with a status that says how it ended.

::

    <runs_dir>/
      .lock                                 held while a run of this workflow is under way
      latest -> 20260101T020000Z-1a2b3c     the last successful run (symlink)
      cache/                                converted / generated data
      20260101T020000Z-1a2b3c/
        status.json    {"status": "running" | "succeeded" | "failed", ...}
        config.json    the resolved configuration (paths absolute, defaults filled in)
        run.log        the run's log (daskkrr loggers, INFO)
        metrics.json   evaluation figures (succeeded runs)
        model/         the model (written at the end, atomically)
        predictions.zarr   held-out predictions, when asked
        FAILED         the error message (failed runs)

A run never touches another run's directory, except to mark one left "running" by
a process that died (it holds no lock any more) as failed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from daskkrr.utils.atomic import DiskFullError, atomic_symlink, atomic_write_bytes, disk_full
from daskkrr.utils.jsonable import dumps_strict

STATUS_FILE = "status.json"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
LOG_FILE = "run.log"
FAILED_FILE = "FAILED"
LATEST = "latest"


def write_json(path: Path, data: Any) -> None:
    """Write strict JSON atomically (NaN and infinities as null; other objects as their str)."""
    text = dumps_strict(data, indent=2, sort_keys=True, default=str) + "\n"
    atomic_write_bytes(path, text.encode(), durable=False)


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The status record of a run directory ({} if it has none).

    Parameters
    ----------
    run_dir : str or os.PathLike
        A run directory made by :func:`run_workflow`.

    Returns
    -------
    dict
        Its ``status.json``: state, times, and where the results are.
    """
    try:
        return json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"


class WorkflowLockedError(RuntimeError):
    """Another run of the same workflow holds the lock."""


@contextlib.contextmanager
def workflow_lock(runs_dir: Path) -> Iterator[None]:
    """Hold ``runs_dir/.lock`` for the run; refuse at once if another process holds it.

    The lock is an ``flock``, released by the kernel when its process dies, so a
    crashed run never blocks the next one.
    """
    runs_dir.mkdir(parents=True, exist_ok=True)
    fh = open(runs_dir / ".lock", "a+")
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkflowLockedError(
                f"another run of this workflow is in progress (it holds {runs_dir / '.lock'}); "
                "wait for it to finish, or give this run its own runs directory with --runs-dir"
            ) from None
        try:
            fh.seek(0)
            fh.truncate()
            # Unbuffered: a write that fails fails here, not again in close() with no path.
            os.write(fh.fileno(), f"{os.getpid()} {socket.gethostname()}\n".encode())
        except OSError as exc:
            if disk_full(exc):  # the path and the free space, not a bare "[Errno 28]"
                raise DiskFullError(runs_dir / ".lock") from exc
            raise
        yield
    finally:
        fh.close()


def mark_interrupted_runs(runs_dir: Path) -> list[str]:
    """Mark runs left "running" (their process died; we hold the lock) as failed; return their ids."""
    marked = []
    for child in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            status = read_status(child)
            if status.get("status") == "running":
                status.update(status="failed", finished=time.time(),
                              error="interrupted: the run's process ended before the run finished")
                write_json(child / STATUS_FILE, status)
                (child / FAILED_FILE).write_text(status["error"] + "\n")
                marked.append(child.name)
    return marked


class RunDirectory:
    """One run's directory and its status file."""

    def __init__(self, runs_dir: Path, run_id: str | None = None):
        self.run_id = run_id or new_run_id()
        self.path = runs_dir / self.run_id
        self.path.mkdir(parents=True, exist_ok=False)
        self._status: dict[str, Any] = {
            "run_id": self.run_id,
            "status": "running",
            "started": time.time(),
            "started_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        try:
            write_json(self.path / STATUS_FILE, self._status)
        except BaseException:
            self.path.rmdir()  # a run directory without a status would read as neither running nor ended
            raise

    def file(self, name: str) -> Path:
        return self.path / name

    def result_header(self, config: dict[str, Any], store: Path, X: Any, blocks: bool = True) -> dict[str, Any]:
        """The first fields of every executor's result: this run, its workflow (``config``'s name), and
        the data it read (``store``, rows and features of ``X``, and its row blocks with ``blocks``)."""
        data = {"store": str(store), "n_rows": int(X.shape[0]), "n_features": int(X.shape[1])}
        if blocks:
            data["n_blocks"] = int(X.numblocks[0])
        return {"run_id": self.run_id, "workflow": config["workflow"]["name"], "status": "succeeded", "data": data}

    def succeed(self, **extra: Any) -> None:
        self._status.update(status="succeeded", finished=time.time(), **extra)
        write_json(self.path / STATUS_FILE, self._status)

    def fail(self, exc: BaseException) -> None:
        message = " ".join(str(exc).split()) or type(exc).__name__
        self._status.update(status="failed", finished=time.time(), error=message,
                            error_type=type(exc).__name__)
        write_json(self.path / STATUS_FILE, self._status)
        (self.path / FAILED_FILE).write_text(
            message + "\n\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        )

    def point_latest(self) -> None:
        """Make ``<runs_dir>/latest`` point at this run (atomically replaced)."""
        atomic_symlink(self.run_id, self.path.parent / LATEST)


@contextlib.contextmanager
def run_log(path: Path) -> Iterator[logging.Handler]:
    """Send the ``daskkrr`` loggers' INFO records to ``path`` for the duration of the run.

    Console output is unchanged: records reach the console handlers only if the
    ``daskkrr`` logger would have let them through before (e.g. ``daskkrr -v``).
    """
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    lib = logging.getLogger("daskkrr")
    old_level, old_propagate = lib.level, lib.propagate
    added: list[logging.Handler] = [handler]
    if old_propagate and lib.getEffectiveLevel() > logging.INFO:
        # INFO goes to the file only; what the console showed before (WARNING and up) it still shows.
        lib.propagate = False
        added.append(_ToRoot(lib.getEffectiveLevel()))
    for h in added:
        lib.addHandler(h)
    lib.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for h in added:
            lib.removeHandler(h)
        lib.setLevel(old_level)
        lib.propagate = old_propagate
        handler.close()


class _ToRoot(logging.Handler):
    """Hands records at or above its level to the root logger's handlers."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)
