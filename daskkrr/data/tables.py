"""Stream tables (CSV/TSV, optionally compressed, or Parquet) into a Zarr store.

The table is read ``chunk_rows`` rows at a time and appended to the store, so
memory is bounded by one chunk whatever the file size (for Parquet: one chunk and
one row group). The result has the layout of :func:`daskkrr.data.write_zarr`
(``X`` float64 with every non-target column, ``y`` float64) plus the column names
in the group attributes.
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

from daskkrr.data.parquet import (
    CATEGORICAL_MODES,
    category_values,
    column_kinds,
    is_parquet,
    missing_value_message,
    one_hot,
    one_hot_names,
    open_parquet,
    row_blocks,
)
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
    *,
    categorical: str = "refuse",
    max_categories: int = 1000,
) -> dict[str, Any]:
    """Convert a CSV/TSV or Parquet table into a daskkrr Zarr store, one chunk at a time.

    Parameters
    ----------
    input_path : str or os.PathLike
        Delimited text file with a header row (``.gz``, ``.bz2`` and ``.xz``
        files are decompressed on the fly), or a Parquet table: one file, a
        folder of part files, or an fsspec URL of either (``s3://...``,
        ``file://...``; the protocol's filesystem library must be installed).
        Parquet is recognised by the name (``.parquet``, ``.parq``, ``.pq``), by
        the file's first bytes, or as a folder holding such files.
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
    categorical : {"refuse", "onehot"}, default="refuse"
        Parquet only: what to do with categorical feature columns (pandas
        category, which Parquet dictionary columns become, string or object).
        ``"refuse"`` raises naming the first one; ``"onehot"`` replaces each, in
        place, by one 0/1 column per distinct value, named ``column=value``, the
        values as strings in sorted order (read in one pass over those columns
        before the conversion) and recorded in the store's ``categories``
        attribute.
    max_categories : int, default=1000
        Parquet with ``categorical="onehot"``: most distinct values a column may
        have; a column with more is refused (an identifier, not a category).

    Returns
    -------
    dict
        ``{"rows": int, "features": int, "columns": list of feature names,
        "target": str, "path": str}``, and for Parquet ``"categories"``: each
        one-hot encoded column's values.

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
        rows or without feature columns, or an unreadable file. For Parquet
        also: a categorical column with ``categorical="refuse"`` or more than
        ``max_categories`` values, a categorical target, and a missing (null or
        NaN) value (the column and the rows are named).

    Notes
    -----
    Conversion is atomic: the store is built in a hidden sibling directory and
    renamed into place at the end, so a failure leaves nothing at ``output_path``.
    In CSV/TSV tables missing values become NaN, which
    :class:`daskkrr.data.Standardizer` reports when fitting.
    """
    if categorical not in CATEGORICAL_MODES:
        raise ValueError(f"categorical must be one of {CATEGORICAL_MODES}; got {categorical!r}")
    chunk_rows = check_chunk_rows(chunk_rows)
    max_categories = check_chunk_rows(max_categories, "max_categories")
    if is_parquet(input_path):
        return _convert_parquet(os.fspath(input_path), output_path, target, chunk_rows, overwrite,
                                categorical, max_categories)
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"no table at {source}: the file does not exist")
    if categorical != "refuse":
        raise ValueError(f"categorical={categorical!r} is for Parquet tables; {source} is read as CSV/TSV, whose "
                         f"columns must be numbers")
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
                    X_arr, y_arr = _create_table_store(out, features, target, source.name, chunk_rows)
                if len(frame) == 0:
                    continue
                X_block, y_block = _numeric_block(frame, features, target, source, rows)
                rows = _append_rows(X_arr, y_arr, rows, X_block, y_block)
    except _READ_ERRORS as exc:
        raise ValueError(
            f"cannot read {source} as a table with separator {sep!r}: {exc}; check the file "
            f"and its compression, or pass the right sep="
        ) from exc
    if rows == 0:
        raise ValueError(f"{source} has a header but no data rows; nothing to convert")
    return features, rows


def _append_rows(X_arr: zarr.Array, y_arr: zarr.Array, rows: int, X_block: np.ndarray, y_block: np.ndarray) -> int:
    """Append one block after the first ``rows`` rows of the store; return the new row count."""
    stop = rows + len(X_block)
    X_arr.resize((stop, X_block.shape[1]))
    y_arr.resize((stop,))
    X_arr[rows:stop] = X_block
    y_arr[rows:stop] = y_block
    return stop


def _feature_columns(header: list[Any], target: str, source: Path | str) -> list[str]:
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


def _first(mask: np.ndarray) -> int | None:
    """Position of the first True of a chunk's mask of bad values, or None."""
    return int(np.flatnonzero(mask)[0]) if mask.any() else None


def _numeric_block(
    frame: pd.DataFrame, features: list[str], target: str, source: Path | str, first_row: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` float64 blocks of one chunk; raise naming a non-numeric column."""
    frame.columns = [str(c) for c in frame.columns]
    for name in features + [target]:
        column = frame[name]
        if pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            continue
        pos = _first((pd.to_numeric(column, errors="coerce").isna() & column.notna()).to_numpy())
        where = ""
        if pos is not None:
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
    out: Path, features: list[str], target: str, source_name: str, chunk_rows: int, **extra: Any
) -> tuple[zarr.Array, zarr.Array]:
    """The empty, growable arrays ``X`` and ``y`` of a new store at ``out``."""
    templates = {
        "X": np.empty((0, len(features)), dtype=np.float64),
        "y": np.empty((0,), dtype=np.float64),
    }
    attrs = {"feature_names": features, "target_name": target, "source": source_name, **extra}
    group = create_store(out, templates, chunk_rows, attrs=attrs)
    return cast(zarr.Array, group["X"]), cast(zarr.Array, group["y"])  # create_store made them arrays


# --------------------------------------------------------------------------- Parquet


def _convert_parquet(
    source: str, output_path: str | os.PathLike, target: str, chunk_rows: int, overwrite: bool,
    categorical: str, max_categories: int,
) -> dict[str, Any]:
    """:func:`convert_table` of a Parquet table (a file, a folder of parts or a URL)."""
    # Before reading: an output over the table (or its folder) would replace it with the store.
    check_paths(inputs={"input_path": source}, outputs={"output_path": output_path}, overwrite=overwrite)
    frame = open_parquet(source)  # the footers only
    features = _feature_columns(list(frame.columns), target, source)
    categorical_columns = _parquet_categoricals(column_kinds(frame.dtypes), features, target, source, categorical)
    categories = category_values(frame, categorical_columns, source, max_categories)
    columns = one_hot_names(features, categories)
    rows = 0
    with atomic_directory(output_path, overwrite) as tmp:
        X_arr, y_arr = _create_table_store(tmp, columns, target, _base_name(source), chunk_rows,
                                           categories=categories)
        for block in row_blocks(frame[features + [target]], chunk_rows):
            _refuse_missing(block, source, rows)
            X_block, y_block = _numeric_block(one_hot(block, categories), columns, target, source, rows)
            rows = _append_rows(X_arr, y_arr, rows, X_block, y_block)
        if rows == 0:
            raise ValueError(f"{source} has columns but no rows; nothing to convert")
    return {"rows": rows, "features": len(columns), "columns": columns, "target": target,
            "path": str(output_path), "categories": categories}


def _parquet_categoricals(
    kinds: dict[str, str], features: list[str], target: str, source: str, categorical: str
) -> list[str]:
    """The feature columns to one-hot encode; raise, before reading, for a column that cannot be converted."""
    for name in [target] + features:
        role = "target" if name == target else "feature"
        if kinds[name] == "other" or (role == "target" and kinds[name] == "categorical"):
            raise ValueError(f"{role} column {name!r} of {source} is not numeric; encode it as numbers"
                             + (" or leave it out" if role == "feature" else "") + " before converting")
    found = [name for name in features if kinds[name] == "categorical"]
    if found and categorical == "refuse":
        raise ValueError(
            f"column {found[0]!r} of {source} is categorical (text or dictionary-encoded)"
            + (f", as are {found[1:]}" if len(found) > 1 else "")
            + "; one-hot encode categorical columns with categorical='onehot' (daskkrr convert --categorical "
              "onehot), or leave them out of the table")
    return found


def _refuse_missing(block: pd.DataFrame, source: str, first_row: int) -> None:
    """Raise naming the column and the rows of the chunk if one of its values is missing (null or NaN)."""
    for name in block.columns:
        pos = _first(block[name].isna().to_numpy())
        if pos is not None:
            raise ValueError(missing_value_message(name, source, first_row, first_row + len(block) - 1,
                                                   first_row + pos))


def _base_name(source: str) -> str:
    """The last part of a path or URL, for the store's ``source`` attribute."""
    return source.rstrip("/").rsplit("/", 1)[-1]
