"""Stream delimited text tables (CSV/TSV, optionally compressed) into a Zarr store.

The table is read ``chunk_rows`` rows at a time and appended to the store, so
memory is bounded by one chunk whatever the file size. The result has the
layout of :func:`daskkrr.data.write_zarr` (``X`` float64 with every non-target
column, ``y`` float64) plus the column names in the group attributes.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import lzma
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pandas as pd
import zarr

from daskkrr.data.validation import check_chunk_rows
from daskkrr.data.writing import create_store
from daskkrr.utils.atomic import atomic_directory
from daskkrr.utils.output_paths import check_paths

__all__ = ["convert_table", "infer_separator"]

_OPENERS: dict[str, Callable[..., IO[Any]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_SEPARATORS = {".tsv": "\t", ".tab": "\t", ".csv": ","}
_SNIFF_BYTES = 64 * 1024
_READ_ERRORS = (
    pd.errors.ParserError,
    pd.errors.EmptyDataError,
    UnicodeDecodeError,
    EOFError,
    gzip.BadGzipFile,
    lzma.LZMAError,
)


def convert_table(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    target: str,
    chunk_rows: int = 100_000,
    sep: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Convert a CSV/TSV table into a daskkrr Zarr store, one chunk at a time.

    Parameters
    ----------
    input_path : str or os.PathLike
        Delimited text file with a header row; ``.gz``, ``.bz2`` and ``.xz``
        files are decompressed on the fly.
    output_path : str or os.PathLike
        Directory of the new Zarr store.
    target : str
        Name of the target column; every other column becomes a feature.
    chunk_rows : int, default=100_000
        Rows read at a time, and rows per Zarr chunk.
    sep : str or None, default=None
        Field separator. None infers it from the extension (``.tsv`` -> tab,
        ``.csv`` -> comma, before any compression suffix) or, failing that, by
        sniffing the first lines.
    overwrite : bool, default=False
        Replace an existing ``output_path``.

    Returns
    -------
    dict
        ``{"rows": int, "features": int, "columns": list of feature names,
        "target": str, "path": str}``.

    Raises
    ------
    FileNotFoundError
        If ``input_path`` does not exist.
    FileExistsError
        If ``output_path`` exists and ``overwrite`` is False.
    OutputPathError
        If ``output_path`` is, is inside or contains ``input_path``, or cannot be
        written (checked before the table is read).
    KeyError
        If ``target`` is not a column (the message lists the columns).
    ValueError
        For a non-numeric column (named in the message), a table without data
        rows or without feature columns, or an unreadable file.

    Notes
    -----
    Conversion is atomic: the store is built in a hidden sibling directory and
    renamed into place at the end, so a failure leaves nothing at ``output_path``.
    Missing values become NaN; :class:`daskkrr.data.Standardizer` reports them.
    """
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"no table at {source}: the file does not exist")
    chunk_rows = check_chunk_rows(chunk_rows)
    # Before reading: an output over the table (or its folder) would replace it with the store.
    check_paths(inputs={"input_path": input_path}, outputs={"output_path": output_path}, overwrite=overwrite)
    sep = infer_separator(source) if sep is None else sep

    with atomic_directory(output_path, overwrite) as tmp:
        features, rows = _stream_table(source, tmp, target, sep, chunk_rows)
    return {
        "rows": rows,
        "features": len(features),
        "columns": features,
        "target": target,
        "path": str(output_path),
    }


def infer_separator(path: str | os.PathLike) -> str:
    """Field separator of a delimited text file, from its extension or its first lines.

    ``.tsv``/``.tab`` give a tab and ``.csv`` a comma (a trailing ``.gz``,
    ``.bz2`` or ``.xz`` is ignored); other files are sniffed among
    comma, tab, semicolon, pipe and space.

    Raises
    ------
    ValueError
        If the separator cannot be determined; pass ``sep=`` explicitly then.
    """
    path = Path(path)
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _OPENERS:
        suffixes = suffixes[:-1]
    if suffixes and suffixes[-1] in _SEPARATORS:
        return _SEPARATORS[suffixes[-1]]
    opener = _OPENERS.get(path.suffix.lower(), open)
    try:
        with opener(path, "rt", newline="") as fh:
            sample = fh.read(_SNIFF_BYTES)
        return csv.Sniffer().sniff(sample, delimiters=",\t;| ").delimiter
    except (csv.Error, OSError, UnicodeDecodeError, EOFError) as exc:
        raise ValueError(
            f"cannot infer the field separator of {path}; pass it explicitly, "
            f"e.g. sep=',' or sep='\\t'"
        ) from exc


# --------------------------------------------------------------------------- helpers


def _stream_table(
    source: Path, out: Path, target: str, sep: str, chunk_rows: int
) -> tuple[list[str], int]:
    """Append the table to a new store at ``out`` chunk by chunk; return (features, rows)."""
    features: list[str] = []
    rows = 0
    X_arr: zarr.Array | None = None
    y_arr: zarr.Array | None = None
    try:
        with pd.read_csv(source, sep=sep, chunksize=chunk_rows, compression="infer") as reader:
            for frame in reader:
                if X_arr is None or y_arr is None:  # both are set together, on the first frame
                    features = _feature_columns(list(frame.columns), target, source)
                    group = _create_table_store(out, features, target, source, chunk_rows)
                    # cast: _create_table_store made "X" and "y" arrays
                    X_arr, y_arr = cast(zarr.Array, group["X"]), cast(zarr.Array, group["y"])
                if len(frame) == 0:
                    continue
                X_block, y_block = _numeric_block(frame, features, target, source, rows)
                stop = rows + len(frame)
                X_arr.resize((stop, len(features)))
                y_arr.resize((stop,))
                X_arr[rows:stop] = X_block
                y_arr[rows:stop] = y_block
                rows = stop
    except _READ_ERRORS as exc:
        raise ValueError(
            f"cannot read {source} as a table with separator {sep!r}: {exc}; check the file "
            f"and its compression, or pass the right sep="
        ) from exc
    if rows == 0:
        raise ValueError(f"{source} has a header but no data rows; nothing to convert")
    return features, rows


def _feature_columns(header: list[Any], target: str, source: Path) -> list[str]:
    """Feature column names (all but ``target``), or raise if the layout is unusable."""
    columns = [str(c) for c in header]
    if target not in columns:
        raise KeyError(
            f"target column {target!r} not found in {source}; its columns are {columns} "
            f"(check the name, or the separator if that list looks like one merged column)"
        )
    features = [c for c in columns if c != target]
    if not features:
        raise ValueError(f"{source} has only the target column {target!r}; no features")
    return features


def _numeric_block(
    frame: pd.DataFrame, features: list[str], target: str, source: Path, first_row: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` float64 blocks of one chunk; raise naming a non-numeric column."""
    frame.columns = [str(c) for c in frame.columns]
    for name in features + [target]:
        column = frame[name]
        if pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            continue
        unparsable = (pd.to_numeric(column, errors="coerce").isna() & column.notna()).to_numpy()
        where = ""
        if unparsable.any():
            pos = int(np.flatnonzero(unparsable)[0])
            # +2: one for the header line, one for 1-based line numbers.
            where = f" (line {first_row + pos + 2} holds {column.iloc[pos]!r})"
        raise ValueError(
            f"column {name!r} of {source} is not numeric{where}; drop it or encode it "
            f"as numbers before converting"
        )
    X = frame[features].to_numpy(dtype=np.float64, na_value=np.nan)
    y = frame[target].to_numpy(dtype=np.float64, na_value=np.nan)
    return X, y


def _create_table_store(
    out: Path, features: list[str], target: str, source: Path, chunk_rows: int
) -> zarr.Group:
    templates = {
        "X": np.empty((0, len(features)), dtype=np.float64),
        "y": np.empty((0,), dtype=np.float64),
    }
    attrs = {"feature_names": features, "target_name": target, "source": source.name}
    return create_store(out, templates, chunk_rows, attrs=attrs)
