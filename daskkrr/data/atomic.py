"""All-or-nothing creation of output directories.

Writers build their output in a hidden temporary sibling of the destination
(same parent, so the final rename stays on one file system) and move it into
place only once everything has been written. A failure at any point removes the
temporary and leaves the destination as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_directory", "check_destination"]


def check_destination(path: str | os.PathLike, overwrite: bool) -> Path:
    """Return ``path`` as a Path, or raise FileExistsError if it exists and may not be replaced."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    return path


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``path`` when the block succeeds.

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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir()  # inside: an interruption right after the mkdir still removes it
        yield tmp
        _move_into_place(tmp, path, overwrite)
    except BaseException:
        _remove(tmp)
        raise


def _move_into_place(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``path``, replacing an old ``path`` only when allowed."""
    check_destination(path, overwrite)
    if not (path.exists() or path.is_symlink()):
        os.replace(tmp, path)
        return
    # A directory cannot be replaced by rename while non-empty: move it aside first,
    # put the new one in place, then delete the old one (restore it on failure).
    old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
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
