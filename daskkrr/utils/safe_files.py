"""Reading files daskkrr wrote without trusting them: bounded JSON, bounded ``.npz`` arrays, contained paths.

A model or checkpoint file may come from anyone. What is read from it is checked
before memory is allocated or code runs: a ``.npy`` header's shape and dtype are
checked against the bytes the member really holds (so a header claiming 3 TB is
refused, not allocated), object, complex and text dtypes are refused unless asked
for (object arrays would need pickle), JSON nesting is bounded before parsing (no
``RecursionError``), and a file that is a symlink resolving out of its folder is
refused. Every refusal is a :class:`FileFieldError` naming the file and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MAX_ARRAY_BYTES", "MAX_JSON_BYTES", "MAX_JSON_DEPTH", "FileFieldError", "contained_file",
           "read_json_object", "read_npz", "parse_json_bounded"]

#: Deepest JSON nesting read (daskkrr's own files nest at most ~6 levels).
MAX_JSON_DEPTH = 64
#: Largest JSON metadata file read (feature names of a very wide model fit in a few MB).
MAX_JSON_BYTES = 256 * 2**20
#: Largest single array read, whatever the file claims (1 TiB: no model or checkpoint comes near).
MAX_ARRAY_BYTES = 2**40
#: Deflate's largest compression ratio (zlib's technical limit is 1032:1); a member claiming more is forged.
_MAX_DEFLATE_RATIO = 1032
#: Names of arrays: what ``np.savez`` keywords give (no path separators, no ``..``).
_ARRAY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PICKLE_MAGIC = b"\x80"
_CHUNK = 1 << 24


class FileFieldError(ValueError):
    """A file's content is refused; ``file`` and ``field`` say where, the message what and the fix."""

    #: Appended to every message of the class: what the user can do.
    fix = ""

    def __init__(self, file: str | os.PathLike, field: str, problem: str, fix: str | None = None) -> None:
        self.file = str(file)
        self.field = field
        self.problem = problem
        fix = self.fix if fix is None else fix
        super().__init__(f"{file}: {field}: {problem}" + (f"; {fix}" if fix else ""))


def contained_file(folder: Path, name: str, error: type[FileFieldError] = FileFieldError) -> Path:
    """``folder / name``, refused when ``name`` has path parts or the file resolves out of ``folder``.

    A symlink inside the folder that points elsewhere is refused: a model folder
    copied from someone else could otherwise make ``load`` read any file.
    """
    if Path(name).name != name or name in ("", ".", ".."):
        raise error(folder / name, "path", "a file of the folder may not have path components ('/' or '..')")
    path = folder / name
    root = folder.resolve()
    target = path.resolve()
    if target.parent != root:
        raise error(path, "path", f"resolves to {target}, outside the folder {root} (a symlink out of the folder); "
                                  "copy the real file into the folder")
    return path


def _json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text, outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json_bounded(text: str, file: str | os.PathLike, field: str = "json",
                       error: type[FileFieldError] = FileFieldError) -> Any:
    """JSON ``text`` parsed after checking its nesting depth (Python's parser recurses per level)."""
    depth = _json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(file, field, f"JSON nested {depth} levels deep; at most {MAX_JSON_DEPTH} are read")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        raise error(file, exc.key, "appears twice in one JSON object; readers disagree on which value counts "
                                   "(Python's takes the last, others the first)") from exc
    except (json.JSONDecodeError, RecursionError) as exc:
        raise error(file, field, f"is not valid JSON: {exc}") from exc


class _DuplicateKeyError(ValueError):
    """A JSON object with a key twice (raised inside the parser, turned into the caller's error)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refused when a key repeats (``json`` would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def read_json_object(path: Path, error: type[FileFieldError] = FileFieldError) -> dict[str, Any]:
    """The JSON object in ``path``, size and depth bounded; ``error`` for anything else."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise error(path, "json", f"{size} bytes; metadata files larger than {MAX_JSON_BYTES} bytes are not read")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(path, "json", f"is not valid JSON (not UTF-8 text: {exc})") from exc
    value = parse_json_bounded(text, path, "json", error)
    if not isinstance(value, dict):
        raise error(path, "json", f"must be a JSON object; it is a JSON {type(value).__name__}")
    return value


def read_npz(path: Path, error: type[FileFieldError] = FileFieldError, kinds: str = "biuf") -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file ``path``, each checked before it is allocated.

    Parameters
    ----------
    path : Path
        The archive (``np.savez`` output).
    error : type
        The :class:`FileFieldError` subclass raised (the field is the array's name).
    kinds : str
        Accepted dtype kinds (numpy's ``dtype.kind``): numbers by default; object
        arrays are always refused (they need pickle).
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(1)
            archive_size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise error(path, "file", f"cannot be read: {exc}") from exc
    if head == _PICKLE_MAGIC:
        raise error(path, "file", "holds pickled objects (a pickle, not an .npz archive); refusing to load it. "
                                  "daskkrr never writes pickles")
    try:
        with zipfile.ZipFile(path) as archive:
            arrays: dict[str, np.ndarray] = {}
            for info in archive.infolist():
                name = _array_name(info, path, error)
                if name in arrays:  # zipfile reads one, numpy's loader another: the file means two things
                    raise error(path, name, "is in the archive twice; np.savez writes each array once")
                arrays[name] = _read_member(archive, info, archive_size, path, error, kinds)
            return arrays
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError) as exc:
        raise error(path, "file", f"cannot be read: not a complete .npz (zip) archive ({exc})") from exc


def _array_name(info: zipfile.ZipInfo, path: Path, error: type[FileFieldError]) -> str:
    name = info.filename[:-4] if info.filename.endswith(".npy") else ""
    if not _ARRAY_NAME.fullmatch(name):
        raise error(path, repr(info.filename), "is not an array member np.savez writes (NAME.npy, no path parts)")
    return name


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, archive_size: int, path: Path,
                 error: type[FileFieldError], kinds: str) -> np.ndarray:
    name = info.filename[:-4]
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else _MAX_DEFLATE_RATIO
    if info.compress_size > archive_size or info.file_size > info.compress_size * ratio:
        raise error(path, name, f"claims {info.file_size} bytes in {info.compress_size} stored bytes of a "
                                f"{archive_size}-byte file: the archive is forged or damaged")
    with archive.open(info) as fp:
        try:
            version = np.lib.format.read_magic(fp)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
            else:
                raise ValueError(f"npy format version {version} is not one np.save writes for numbers")
        except ValueError as exc:
            raise error(path, name, f"has no valid .npy header ({exc})") from exc
        if dtype.hasobject:
            raise error(path, name, f"holds pickled objects (dtype {dtype}); refusing to load it. "
                                    "daskkrr never writes pickles")
        if dtype.kind not in kinds or dtype.fields is not None or dtype.subdtype is not None:
            raise error(path, name, f"has dtype {dtype}; expected a plain array of kind {sorted(kinds)} "
                                    "(numbers: not complex, text or records)")
        if any(n < 0 for n in shape):
            raise error(path, name, f"its header claims the negative shape {shape}: the file is forged")
        count = math.prod(shape)  # Python ints: no overflow for a forged shape
        nbytes = count * dtype.itemsize
        held = info.file_size - fp.tell()
        if nbytes != held or nbytes > MAX_ARRAY_BYTES:
            raise error(path, name, f"its header claims shape {shape} of {dtype} ({nbytes} bytes) but the member "
                                    f"holds {held} bytes of data: the file is truncated or forged")
        out = np.empty(count, dtype=dtype)
        view = out.view(np.uint8).data  # bytes of any dtype (text too), filled in place: one allocation
        done = 0
        while done < nbytes:
            chunk = fp.read(min(nbytes - done, _CHUNK))
            if not chunk:
                raise error(path, name, f"ends after {done} of {nbytes} bytes: the file is truncated")
            view[done:done + len(chunk)] = chunk
            done += len(chunk)
    return out.reshape(shape, order="F" if fortran else "C")
