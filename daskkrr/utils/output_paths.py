"""Output paths checked before any work: no output may destroy an input, and none fails only at the end.

Every command of the command line, and the Python ``save``/``fit(checkpoint=)``,
calls :func:`check_paths` with the paths it will read and write, before it reads
any data. It refuses:

- an output equal to, inside, or containing an input, the checkpoint or another
  output (``daskkrr predict --data S --out S --overwrite`` would otherwise replace
  the store it reads with its predictions);
- a destination that cannot be written (a read-only directory or file system,
  a parent that is a file), found by creating and removing a probe file where the
  output will go, so that a read-only file system is refused even for root;
- an existing output without ``overwrite`` (:class:`FileExistsError`, as
  :func:`check_destination`).

Paths are compared after resolving symbolic links and ``..``, so a link to the
input is the input, and so is a ``file://`` URL of it. Remote URLs (``s3://...``) are not
checked here.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["OutputPathError", "check_destination", "check_paths", "check_writable"]


class OutputPathError(ValueError):
    """An output path would destroy an input, or cannot be written; the message names both paths and the fix."""


def _local(path: Any) -> Path | None:
    """``path`` resolved (a ``file://`` URL as its path), or None for None, a non-path (an array) or a remote URL."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    text = os.fspath(path)
    if text.startswith("file://"):  # the local file system by another name: an output over it destroys it too
        text = text[len("file://"):]
    elif "://" in text:
        return None
    return Path(os.path.realpath(text))


def _relation(output: Path, other: Path) -> str | None:
    """How ``output`` overlaps ``other``: "is", "is inside", "contains", or None."""
    if output == other:
        return "is"
    if other in output.parents:
        return "is inside"
    if output in other.parents:
        return "contains"
    return None


def check_destination(path: str | os.PathLike, overwrite: bool) -> Path:
    """Return ``path`` as a Path, or raise FileExistsError if it exists and may not be replaced."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    return path


def check_writable(path: str | os.PathLike, label: str = "output") -> None:
    """Raise :class:`OutputPathError` unless ``path`` can be created (or replaced) where it is.

    The nearest existing ancestor must be a directory in which a file can be
    created: a probe file is made there and removed at once. This catches a
    read-only file system (``EROFS``), missing permissions and a parent that is a
    file, before any work; ``os.access`` alone says yes to root on a read-only mount.
    """
    target = Path(os.path.abspath(os.fspath(path)))
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{label} {path}: {parent} is a file, not a directory; choose a path "
                              f"in a directory")
    probe = parent / f".{target.name}.probe-{secrets.token_hex(8)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        why = "the file system is read-only" if exc.errno == errno.EROFS else (exc.strerror or str(exc)).lower()
        raise OutputPathError(f"{label} {path} cannot be written: {why} ({parent}); choose a writable "
                              f"place for it") from exc
    os.close(fd)
    probe.unlink(missing_ok=True)


def check_paths(
    *,
    inputs: Mapping[str, Any] | None = None,
    outputs: Mapping[str, Any] | None = None,
    states: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> None:
    """Refuse output paths that would destroy an input, cannot be written, or exist without ``overwrite``.

    Parameters
    ----------
    inputs : mapping of str to path, optional
        What is read, by the name the user gave it (``"--data"``, ``"X"``); None
        values and non-paths (arrays) are skipped.
    outputs : mapping of str to path, optional
        What is written and must not exist unless ``overwrite``.
    states : mapping of str to path, optional
        What is written and may exist already (a checkpoint directory, a runs
        directory): checked for writability and overlaps only.
    overwrite : bool, default=False
        Whether existing ``outputs`` may be replaced.

    Raises
    ------
    OutputPathError
        An output or state is, is inside, or contains another given path, or
        cannot be written.
    FileExistsError
        An output exists and ``overwrite`` is False.
    """
    written = {**dict(outputs or {}), **dict(states or {})}
    named = [(label, resolved, path) for label, path in {**dict(inputs or {}), **written}.items()
             if (resolved := _local(path)) is not None]
    for i, first in enumerate(named):
        for second in named[i + 1:]:
            if first[0] not in written and second[0] not in written:
                continue  # two inputs may overlap
            out, other = (first, second) if first[0] in written else (second, first)  # name the written one first
            relation = _relation(out[1], other[1])
            if relation is not None:
                what = "an input" if other[0] not in written else "another output"
                raise OutputPathError(
                    f"{out[0]} {out[2]} {relation} {other[0]} {other[2]}: writing it would destroy {what}; "
                    f"choose {out[0]} outside {other[0]} (and not containing it)")
    for label, path in written.items():
        if _local(path) is None or "://" in os.fspath(path):  # outputs are written as local paths only
            continue
        if label in (outputs or {}):
            check_destination(path, overwrite)
        check_writable(path, label)
