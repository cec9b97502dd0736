"""Outputs that appear whole or not at all: atomic files, directories and symlinks.

Every writer builds its output under a hidden temporary sibling of the
destination, ``.NAME.tmp-<random>`` (same parent, so the final rename stays on
one file system), and renames it into place only once everything has been
written. A failure or interruption at any point (an error, Ctrl-C, a signal
turned into an exception by :mod:`daskkrr.signals`) removes the temporary and
leaves the destination as it was. The temporary's name is chosen before it is
created, so an interruption that lands inside the creating call still finds it
to remove.

With ``durable=True`` a file is also synced to disk before the rename and its
directory after it, so the new content survives a power loss or an OS crash
(the README promises this for checkpoints).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from daskkrr.utils.output_paths import check_destination, check_writable

__all__ = [
    "DiskFullError",
    "atomic_directory",
    "atomic_symlink",
    "atomic_write",
    "atomic_write_bytes",
    "check_destination",
    "fsync_directory",
    "temporary_sibling",
]


class DiskFullError(OSError):
    """An output could not be written: its file system is full. Nothing was left behind.

    The message names the output, says "no space left on device" and what to do;
    ``errno`` is ``ENOSPC``, as for the ``OSError`` it replaces (its ``__cause__``).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        where = Path(path)
        try:
            free = f"{_size(shutil.disk_usage(where.parent).free)} free there now"
        except OSError:  # pragma: no cover - the parent vanished
            free = "its free space unknown"
        self.message = (f"{where}: no space left on device while writing it ({free}); nothing was written "
                        f"and no temporary was left; free space on that file system or write elsewhere")
        super().__init__(errno.ENOSPC, self.message)

    def __str__(self) -> str:
        return self.message  # not OSError's "[Errno 28] ..."


def _size(n_bytes: int) -> str:
    """``n_bytes`` in the largest binary unit that keeps a whole number before the point (KiB .. TiB)."""
    for unit, power in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n_bytes >= 2**power:
            return f"{n_bytes / 2**power:.1f} {unit}"
    return f"{n_bytes / 2**10:.1f} KiB"  # a nearly full disk: "0.0 MiB" would say nothing


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it came from, is "no space left on device" (from any process)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(cause):  # re-raised by a worker without its errno
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def temporary_sibling(path: str | os.PathLike, tag: str = "tmp") -> Path:
    """A fresh hidden name next to ``path``: ``.NAME.<tag>-<16 hex digits>`` (not created)."""
    path = Path(path)
    return path.parent / f".{path.name}.{tag}-{secrets.token_hex(8)}"


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename in the directory ``path`` durable (best effort; not every platform allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike,
    writer: Callable[[BinaryIO], object],
    *,
    durable: bool = True,
    mode: int = 0o666,
) -> Path:
    """Replace the file ``path`` with what ``writer`` writes, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination file; its directory must exist. An existing file is replaced.
    writer : callable
        Called once with a binary file object open on the temporary file.
    durable : bool, default=True
        fsync the file before the rename and the directory after it.
    mode : int, default=0o666
        Permission bits of the new file (the umask applies).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as fh:
            writer(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if disk_full(exc) and not isinstance(exc, DiskFullError):
            raise DiskFullError(path) from exc
        raise
    if durable:
        fsync_directory(path.parent)
    return path


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes, *, durable: bool = True, mode: int = 0o666
) -> Path:
    """Replace the file ``path`` with ``data``, atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda fh: fh.write(data), durable=durable, mode=mode)


def atomic_symlink(target: str | os.PathLike, link: str | os.PathLike) -> Path:
    """Make ``link`` a symlink to ``target``, replacing an existing ``link`` atomically."""
    link = Path(link)
    tmp = temporary_sibling(link)
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return link


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``path`` when the block succeeds.

    The files in it are not synced to disk (outputs are renamed into place, not
    made durable against power loss; see the README's guarantees).

    Parameters
    ----------
    path : str or os.PathLike
        Final location. Its parent directory is created if needed.
    overwrite : bool, default=False
        Replace an existing ``path``. The old content is only removed after the
        new one is in place.

    Yields
    ------
    pathlib.Path
        Hidden sibling directory ``.<name>.tmp-<random>`` to write into.

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False (checked before and after
        writing).
    """
    path = check_destination(path, overwrite)
    check_writable(path)  # a read-only place: one clear error naming the path, not the temporary's
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        tmp.mkdir()  # inside: an interruption right after the mkdir still removes it
        yield tmp
        _move_into_place(tmp, path, overwrite)
    except BaseException as exc:
        _remove(tmp)
        if disk_full(exc) and not isinstance(exc, DiskFullError):
            raise DiskFullError(path) from exc
        raise


def _move_into_place(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``path``, replacing an old ``path`` only when allowed."""
    check_destination(path, overwrite)
    if not (path.exists() or path.is_symlink()):
        os.replace(tmp, path)
        return
    # A directory cannot be replaced by rename while non-empty: move it aside first,
    # put the new one in place, then delete the old one (restore it on failure).
    old = temporary_sibling(path, "old")
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    _remove(old)


def _remove(path: Path, attempts: int = 50) -> None:
    """Delete ``path``. A failed parallel write may still have tasks finishing their
    chunks into it for a moment after the error, so retry until it is really gone."""
    absent = 0
    for _ in range(attempts):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink(missing_ok=True)
        absent = absent + 1 if not (path.exists() or path.is_symlink()) else 0
        if absent == 2:  # gone, and no late writer brought it back
            return
        time.sleep(0.05)
