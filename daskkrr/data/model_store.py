"""A model's large arrays (centers, coefficients) as a Zarr group in its folder, read without trusting it.

A model with many centers keeps ``centers`` and ``coef`` in ``MODEL/arrays.zarr``
(Zarr v3, one array each, chunked by rows, the same rows for both) instead of in
``arrays.npz``, so that loading it reads no more than one chunk at a time and
``predict`` streams the chunks to the tasks that use them (:mod:`daskkrr.parallel.center_chunks`).

The store is read as hostile, like the ``.npz`` (:mod:`daskkrr.utils.safe_files`),
before Zarr opens anything:

- the store, the arrays' folders and every chunk are real directories and regular
  files in the model folder: a symlink anywhere (which could make ``load`` or a worker
  read any file) or a special file (a FIFO would block the reader) is refused;
- each array's ``zarr.json`` is bounded JSON and must be, field by field, what
  :func:`write_model_arrays` writes: a float32/float64 array, a regular row-chunked
  grid, the "bytes" codec only (no compressor or filter: nothing is decoded, so no
  decompression bomb and no codec from the file runs), fill value 0, no attributes;
- the shape and chunk size are bounded before anything is allocated, and every
  chunk file must be there with exactly the bytes its chunk holds (a missing chunk
  would silently read as zeros), and nothing else may be in the store;
- :func:`first_non_finite` reads the arrays chunk by chunk (one chunk in memory).

Every refusal is the caller's :class:`~daskkrr.utils.safe_files.FileFieldError`
subclass naming the file and the field.

A posterior fitted on the tiled preconditioner route (``compute_std`` with many centers) keeps its
two triangular ``M x M`` factors ``T`` and ``R`` in ``MODEL/posterior.zarr`` (:data:`TILES_STORE_NAME`),
chunked by ``b x b`` tiles, only the upper triangle's chunks written (:func:`write_tile_arrays`). They are
read with the same checks (:func:`open_tile_arrays`: the metadata field by field with square tile chunks,
exactly the upper triangle's chunk files, each of one tile's bytes), then tile by tile (one tile in memory):
finite, with a positive diagonal (a triangular factor with a zero or negative pivot is not one ``save`` wrote).
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import zarr

from daskkrr.data.loading import checked_from_zarr
from daskkrr.solvers.tiled_factor import TileFile
from daskkrr.utils.safe_files import MAX_ARRAY_BYTES, FileFieldError, read_json_object

__all__ = ["CHUNK_BYTES", "MAX_CHUNK_BYTES", "STORE_NAME", "TILES_STORE_NAME", "chunk_rows", "first_non_finite",
           "open_model_arrays", "open_tile_arrays", "write_model_arrays", "write_tile_arrays"]

#: The Zarr group's folder inside the model folder.
STORE_NAME = "arrays.zarr"
#: The Zarr group of a tiled posterior's triangular factors inside the model folder.
TILES_STORE_NAME = "posterior.zarr"
#: Bytes of a chunk of the widest array (the centers) that :func:`chunk_rows` aims at: large enough that
#: a predict task's kernel block outweighs its scheduling, small enough that a worker holds a few.
CHUNK_BYTES = 16 * 2**20
#: Largest chunk read (a reader allocates one whole chunk).
MAX_CHUNK_BYTES = 2**30
_META = "zarr.json"
_GROUP_META = {"attributes": {}, "zarr_format": 3, "node_type": "group"}
_DTYPES = ("float32", "float64")


def chunk_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per chunk: about :data:`CHUNK_BYTES` of rows of ``row_bytes`` bytes (at least 1, at most ``n_rows``)."""
    return max(1, min(int(n_rows), CHUNK_BYTES // max(1, int(row_bytes))))


def _array_meta(shape: tuple[int, ...], rows: int, dtype: str, tiled: bool = False) -> dict[str, Any]:
    """The ``zarr.json`` of an array as written here (Zarr 3 writes exactly these fields); row chunks, or square
    ``rows x rows`` tiles (``tiled``)."""
    return {
        "shape": list(shape), "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [rows, rows] if tiled
                                                            else [rows, *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "attributes": {}, "zarr_format": 3, "node_type": "array", "storage_transformers": [],
    }


def write_model_arrays(folder: Path, arrays: dict[str, Any], rows: int) -> None:
    """Write ``arrays`` (numpy or dask, same first dimension) as :data:`STORE_NAME` in ``folder``.

    Parameters
    ----------
    folder : Path
        The (temporary) model folder.
    arrays : dict of str to array
        Float arrays of 1 or 2 dimensions; a dask array is written chunk by chunk (never whole in
        this process).
    rows : int
        Rows per chunk, the same for every array (predict pairs the centers' chunk ``j`` with
        the coefficients' chunk ``j``).
    """
    group = zarr.open_group(str(folder / STORE_NAME), mode="w", zarr_format=3)
    for name, value in arrays.items():
        target = group.create_array(name, shape=value.shape, chunks=(rows, *value.shape[1:]), dtype=value.dtype,
                                    compressors=None, fill_value=0.0, config={"write_empty_chunks": True})
        if isinstance(value, da.Array):
            value.rechunk({0: rows, **{axis: -1 for axis in range(1, value.ndim)}}).store(target, lock=False)
        else:
            target[...] = np.asarray(value)


def _checked_group(root: Path, names: tuple[str, ...], error: type[FileFieldError]) -> Path:
    """``root``, checked to be the Zarr group save() writes holding exactly the arrays ``names``."""
    _check_dir(root, error)
    _check_entries(root, {_META, *names}, error, required=(_META, *names))
    if read_json_object(root / _META, error) != _GROUP_META:
        raise error(root / _META, "json", f"is not the Zarr group save() writes ({_GROUP_META})")
    return root


def open_model_arrays(folder: Path, names: tuple[str, ...], error: type[FileFieldError]) -> dict[str, da.Array]:
    """The arrays ``names`` of the store in ``folder``, checked (see the module docstring), as dask arrays.

    Parameters
    ----------
    folder : Path
        The model folder.
    names : tuple of str
        The arrays the store must hold (and nothing else).
    error : type
        The :class:`~daskkrr.utils.safe_files.FileFieldError` subclass raised.

    Returns
    -------
    dict of str to dask.array.Array
        One lazy array per name, chunked by rows as stored (the same rows for all).
    """
    root = _checked_group(folder / STORE_NAME, names, error)
    out: dict[str, da.Array] = {}
    rows: int | None = None
    for name in names:
        where = root / name
        _check_dir(where, error)
        _check_entries(where, {_META, "c"}, error, required=(_META, "c"))
        shape, chunk, dtype = _checked_meta(where / _META, name, error)
        _check_chunk_files(where, name, shape, chunk, np.dtype(dtype).itemsize, error)
        if rows is not None and chunk != rows:
            raise error(where / _META, f"{name}.chunk_grid", f"chunks of {chunk} rows, the other arrays' of {rows}: "
                                                             "save() writes every array in the same row chunks")
        rows = chunk
        array = zarr.open_array(str(where), mode="r", zarr_format=3)
        out[name] = checked_from_zarr(array, str(where), name)
    return out


def write_tile_arrays(folder: Path, factors: dict[str, TileFile]) -> None:
    """Write the upper-triangle tiles of ``factors`` as :data:`TILES_STORE_NAME` in ``folder``, one tile in memory.

    Parameters
    ----------
    folder : Path
        The (temporary) model folder.
    factors : dict of str to TileFile
        Upper-triangular factors; each is written with its own tiles and dtype.
    """
    group = zarr.open_group(str(folder / TILES_STORE_NAME), mode="w", zarr_format=3)
    for name, F in factors.items():
        # every upper chunk is written, zeros included, so that a missing one is a damaged file
        target = group.create_array(name, shape=F.shape, chunks=(F.b, F.b), dtype=F.dtype, compressors=None,
                                    fill_value=0.0, config={"write_empty_chunks": True})
        for i in range(F.nb):
            for j in range(i, F.nb):
                target[slice(*F.bounds(i)), slice(*F.bounds(j))] = F.tile(i, j)


def open_tile_arrays(folder: Path, names: tuple[str, ...], error: type[FileFieldError]) -> dict[str, TileFile]:
    """The triangular factors ``names`` of :data:`TILES_STORE_NAME` in ``folder``, checked (see the module
    docstring) and opened as :class:`~daskkrr.solvers.tiled_factor.TileFile`.

    Parameters
    ----------
    folder : Path
        The model folder.
    names : tuple of str
        The arrays the store must hold (and nothing else).
    error : type
        The :class:`~daskkrr.utils.safe_files.FileFieldError` subclass raised.

    Returns
    -------
    dict of str to TileFile
    """
    root = _checked_group(folder / TILES_STORE_NAME, names, error)
    out: dict[str, TileFile] = {}
    for name in names:
        where = root / name
        _check_dir(where, error)
        _check_entries(where, {_META, "c"}, error, required=(_META, "c"))
        shape, tile, dtype = _checked_meta(where / _META, name, error, tiled=True)
        factor = TileFile(str(where), shape[0], tile)
        _check_tile_files(where, name, factor, np.dtype(dtype).itemsize, error)
        _check_tile_values(where, name, factor, error)
        out[name] = factor
    return out


def _check_tile_files(where: Path, name: str, factor: TileFile, itemsize: int, error: type[FileFieldError]) -> None:
    """Exactly the chunk files ``c/I/J`` of the upper triangle (``I <= J``), each of one whole tile's bytes."""
    chunks = where / "c"
    _check_dir(chunks, error)
    rows = _check_entries(chunks, {str(i) for i in range(factor.nb)}, error)
    nbytes = factor.b * factor.b * itemsize  # edge tiles are stored whole, padded with the fill value
    for i in range(factor.nb):
        info = rows.get(str(i))
        if info is None or not stat.S_ISDIR(info.st_mode):
            raise error(chunks / str(i), name, f"tile row {i} is missing: the store is incomplete")
        found = _check_entries(chunks / str(i), {str(j) for j in range(i, factor.nb)}, error)
        for j in range(i, factor.nb):
            tile = found.get(str(j))
            if tile is None or not stat.S_ISREG(tile.st_mode) or tile.st_size != nbytes:
                size = "missing" if tile is None else f"{tile.st_size} bytes, expected {nbytes}"
                raise error(chunks / str(i) / str(j), name, f"tile ({i}, {j}) (rows {factor.bounds(i)[0]}-"
                                                            f"{factor.bounds(i)[1] - 1}) is {size}: the file is "
                                                            "truncated, incomplete or forged")


def _check_tile_values(where: Path, name: str, factor: TileFile, error: type[FileFieldError]) -> None:
    """Every upper tile finite and every diagonal entry positive, read one tile at a time."""
    for i in range(factor.nb):
        for j in range(i, factor.nb):
            tile = factor.tile(i, j)
            if not np.all(np.isfinite(tile)):
                raise error(where, name, f"holds NaN or inf in tile ({i}, {j}) ({_tile_span(factor, i, j)}); a "
                                         "model holding them predicts NaN")
            if i == j and not np.all(np.diag(tile) > 0):
                raise error(where, name, f"has a diagonal entry <= 0 in tile ({i}, {i}) ({_tile_span(factor, i, i)}); "
                                         "a triangular factor save() writes has a positive diagonal")


def _tile_span(factor: TileFile, i: int, j: int) -> str:
    (r0, r1), (c0, c1) = factor.bounds(i), factor.bounds(j)
    return f"rows {r0}-{r1 - 1}, columns {c0}-{c1 - 1}"


def first_non_finite(array: da.Array) -> tuple[int, tuple[int, ...]] | None:
    """``(count, index of the first)`` of the NaN/inf values of ``array``, read one row chunk at a time; None if all
    are finite."""
    count, first, start = 0, None, 0
    for block in array.blocks.ravel():  # one column chunk: the row chunks in order
        values = np.asarray(block.compute(scheduler="sync"))
        bad = ~np.isfinite(values)
        if bad.any():
            count += int(bad.sum())
            if first is None:
                where = np.unravel_index(int(np.flatnonzero(bad.reshape(-1))[0]), values.shape)
                first = (start + int(where[0]), *(int(i) for i in where[1:]))
        start += values.shape[0]
    return None if first is None else (count, first)


def _check_dir(path: Path, error: type[FileFieldError]) -> None:
    """``path`` is a real directory (not a symlink to one)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise error(path, "file", f"cannot be read ({exc}); the model's Zarr store is incomplete") from exc
    if not stat.S_ISDIR(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a directory"
        raise error(path, "path", f"is {kind}; the model's Zarr store holds real folders only (copy the real files)")


def _check_entries(folder: Path, allowed: set[str], error: type[FileFieldError],
                   required: tuple[str, ...] = ()) -> dict[str, os.stat_result]:
    """The entries of ``folder`` (``lstat``), refused when one is not in ``allowed``, is a symlink or a special
    file, or one of ``required`` is missing; the folder is listed, not walked, so a forged tree costs what is
    really on disk."""
    found: dict[str, os.stat_result] = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name not in allowed:
                raise error(folder / entry.name, "path", "is not part of the Zarr store save() writes (only "
                                                         f"{sorted(allowed)[:4]}{'...' if len(allowed) > 4 else ''} "
                                                         f"in {folder.name}); remove it")
            info = entry.stat(follow_symlinks=False)
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "a special file"
                raise error(folder / entry.name, "path", f"is {kind}; the model's Zarr store holds regular files "
                                                         "only (a link could point out of the model folder)")
            found[entry.name] = info
    for name in required:
        if name not in found:
            raise error(folder / name, "file", "is missing: the model's Zarr store is incomplete (save it again)")
    return found


def _checked_meta(path: Path, name: str, error: type[FileFieldError],
                  tiled: bool = False) -> tuple[tuple[int, ...], int, str]:
    """Shape, chunk rows and dtype of an array's ``zarr.json``, refused unless it is what save() writes (a square
    matrix in square tiles with ``tiled``)."""
    meta = read_json_object(path, error)
    shape, dtype = meta.get("shape"), meta.get("data_type")
    if not (isinstance(shape, list) and len(shape) in (1, 2) and all(type(s) is int and s >= 1 for s in shape)):
        raise error(path, f"{name}.shape", f"is {shape!r}; expected 1 or 2 positive integers")
    if tiled and (len(shape) != 2 or shape[0] != shape[1]):
        raise error(path, f"{name}.shape", f"is {shape!r}; a triangular factor is square")
    if dtype not in _DTYPES:
        raise error(path, f"{name}.data_type", f"is {dtype!r}; expected one of {_DTYPES} (the precision of the fit)")
    grid = meta.get("chunk_grid")
    chunk = grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None
    rows = chunk[0] if isinstance(chunk, list) and chunk else None
    if type(rows) is not int or rows < 1:
        raise error(path, f"{name}.chunk_grid", f"is {grid!r}; expected row chunks of a positive number of rows")
    size = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: a forged shape cannot overflow
    chunk_bytes = rows * (rows if tiled else math.prod(shape[1:])) * np.dtype(dtype).itemsize
    if size > MAX_ARRAY_BYTES or chunk_bytes > MAX_CHUNK_BYTES:
        raise error(path, f"{name}.shape", f"claims {size} bytes in chunks of {chunk_bytes}; at most {MAX_ARRAY_BYTES} "
                                           f"and {MAX_CHUNK_BYTES} are read: the file is forged")
    expected = _array_meta(tuple(shape), rows, dtype, tiled)
    for key in sorted(set(meta) | set(expected)):
        if meta.get(key) != expected.get(key):
            raise error(path, f"{name}.{key}", f"is {meta.get(key)!r}; save() writes {expected.get(key)!r} (no "
                                               "compressor, filter, attribute or other encoding is read)")
    return tuple(shape), rows, dtype


def _check_chunk_files(where: Path, name: str, shape: tuple[int, ...], rows: int, itemsize: int,
                       error: type[FileFieldError]) -> None:
    """Every chunk file ``c/I`` (``c/I/0`` for 2-D arrays) present, regular, of exactly one chunk's bytes."""
    n_chunks = -(-shape[0] // rows)
    keys = {str(i) for i in range(n_chunks)}
    chunks = where / "c"
    _check_dir(chunks, error)
    found = _check_entries(chunks, keys, error)
    nbytes = rows * math.prod(shape[1:]) * itemsize  # edge chunks are stored whole, padded with the fill value
    for i in range(n_chunks):
        key, info = str(i), found.get(str(i))
        if len(shape) == 2:  # c/I/0: the folder of row chunk I holds its one column chunk
            info = _chunk_dir_entry(chunks / key, info, error)
            key = f"{i}/0"
        if info is None or not stat.S_ISREG(info.st_mode):
            raise error(chunks / key, name, f"chunk {i} (rows {i * rows}-{min(shape[0], (i + 1) * rows) - 1}) is "
                                            "missing: the store is incomplete")
        if info.st_size != nbytes:
            raise error(chunks / key, name, f"chunk {i} holds {info.st_size} bytes, expected {nbytes} (rows x "
                                            "columns x itemsize): the file is truncated or forged")


def _chunk_dir_entry(folder: Path, info: os.stat_result | None, error: type[FileFieldError]) -> os.stat_result | None:
    """The ``lstat`` of ``folder/0`` (None when ``folder`` is missing or not a directory: reported as missing)."""
    if info is None or not stat.S_ISDIR(info.st_mode):
        return None
    return _check_entries(folder, {"0"}, error).get("0")
