"""Parquet tables as dask DataFrames: one file, a folder of part files, or an fsspec URL.

:func:`open_parquet` opens a table with ``dask.dataframe.read_parquet``, one
partition per row group, so that whoever reads it one partition at a time holds
one row group in memory, never the table. The rest serves the two ways a table
is used:

* converted to a Zarr store (:func:`daskkrr.data.convert_table`), read partition by
  partition on this process (:func:`row_blocks`), categorical columns one-hot
  encoded (:func:`category_values`, :func:`one_hot`) or refused;
* fitted from directly (:func:`parquet_training_data`, :func:`parquet_features`):
  its columns become the lazy dask DataFrame the estimators take.

A URL (``s3://``, ``gs://``, ``memory://``, ``file://``) is opened by the fsspec
filesystem library of its protocol, which the user installs (``s3fs`` for S3).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "CATEGORICAL_MODES",
    "PARQUET_SUFFIXES",
    "category_values",
    "column_kinds",
    "is_parquet",
    "one_hot",
    "one_hot_names",
    "missing_value_message",
    "open_parquet",
    "ParquetColumns",
    "parquet_columns",
    "parquet_training_data",
    "row_blocks",
]

#: File name endings taken as Parquet without looking inside the file.
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
#: Files of a folder that make it a Zarr store (a store is never read as Parquet).
_ZARR_MARKERS = ("zarr.json", ".zgroup", ".zarray")
#: What the first bytes of a Parquet file are.
_MAGIC = b"PAR1"
#: What ``categorical=`` takes: refuse categorical columns, or one-hot encode them.
CATEGORICAL_MODES = ("refuse", "onehot")


def is_parquet(source: Any) -> bool:
    """Whether ``source`` names a Parquet table rather than a CSV/TSV file or a Zarr store.

    Parameters
    ----------
    source : str, os.PathLike or anything else
        A local path or an fsspec URL; anything that is not a path is not Parquet.

    Returns
    -------
    bool
        True for a name ending in ``.parquet``/``.parq``/``.pq`` (whether it exists or
        not, so that a missing table is reported as one), a file that starts with
        Parquet's magic bytes, and a folder that is not a Zarr store and holds such
        files (or a ``_metadata`` file) at any depth.
    """
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source).rstrip("/")
    if text.lower().endswith(PARQUET_SUFFIXES):
        return True
    fs, path = _filesystem(text)
    if fs.isdir(path):
        if any(fs.exists(f"{path}/{marker}") for marker in _ZARR_MARKERS):
            return False
        return any(_is_part_file(name) for name in fs.find(path))
    if not fs.isfile(path):
        return False
    with fs.open(path, "rb") as fh:
        return bool(fh.read(len(_MAGIC)) == _MAGIC)


def _is_part_file(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.lower().endswith(PARQUET_SUFFIXES) or base in ("_metadata", "_common_metadata")


def _filesystem(text: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``text``; ImportError saying which package a protocol needs."""
    import fsspec.core

    try:
        return fsspec.core.url_to_fs(text)
    except ImportError as exc:
        raise ImportError(_missing_filesystem(text, exc)) from exc
    except ValueError as exc:  # an unknown protocol
        raise ValueError(f"cannot open {text}: {exc}; use a local path or a URL of a protocol fsspec "
                         f"knows (s3://, gs://, file://, ...)") from exc


def _missing_filesystem(text: str, exc: BaseException) -> str:
    protocol = text.split("://", 1)[0] if "://" in text else "file"
    return (f"cannot open {text}: the fsspec filesystem for {protocol}:// is not installed ({exc}); install "
            f"it (s3fs for s3://, gcsfs for gs://, adlfs for az://) or copy the table to a local folder")


def open_parquet(source: str | os.PathLike, columns: Sequence[str] | None = None) -> Any:
    """Open a Parquet table as a lazy dask DataFrame with one partition per row group.

    Parameters
    ----------
    source : str or os.PathLike
        A Parquet file, a folder of part files (read in the order of their names,
        sub-folders of a ``key=value`` layout included), or an fsspec URL of either.
    columns : sequence of str or None, default=None
        Columns to read; None reads all of them.

    Returns
    -------
    dask.dataframe.DataFrame
        Reads nothing yet: opening reads the files' footers only.

    Raises
    ------
    FileNotFoundError
        If nothing is at ``source``.
    ImportError
        If the filesystem library of the URL's protocol is not installed.
    ValueError
        If ``source`` is not a Parquet table (the reader's message is kept).
    """
    import dask.dataframe as dd

    from daskkrr.data.parquet_engine import QuietArrowEngine

    text = os.fspath(source)
    try:
        # split_row_groups=True: a partition is one row group, so one partition in memory is one row group.
        return dd.read_parquet(text, columns=None if columns is None else list(columns), split_row_groups=True,
                               engine=QuietArrowEngine)  # dask's engine, without pandas 3.1's warning per read
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no Parquet table at {text}: nothing is there ({exc})") from exc
    except ImportError as exc:
        raise ImportError(_missing_filesystem(text, exc)) from exc
    except Exception as exc:  # pyarrow's ArrowInvalid and the like: not a Parquet file
        raise ValueError(f"cannot read {text} as a Parquet table ({type(exc).__name__}: {exc}); check that "
                         f"it is a Parquet file or a folder of them") from exc


def column_kinds(dtypes: pd.Series) -> dict[str, str]:
    """Each column's kind from its dtype: ``"numeric"`` (bool, integer, float), ``"categorical"``
    (pandas category, which is how dictionary columns are read, string or object) or ``"other"``
    (dates, times, intervals: nothing a kernel takes)."""
    kinds = {}
    for name, dtype in dtypes.items():
        if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_numeric_dtype(dtype):
            kinds[str(name)] = "numeric"
        elif isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dtype) \
                or pd.api.types.is_object_dtype(dtype):
            kinds[str(name)] = "categorical"
        else:
            kinds[str(name)] = "other"
    return kinds


def row_blocks(frame: Any, rows: int) -> Iterator[pd.DataFrame]:
    """The rows of a dask DataFrame as pandas frames of ``rows`` rows (the last one shorter).

    The partitions are computed one after the other on this process (the synchronous
    scheduler: no cluster, and an in-memory ``memory://`` table is visible), so at
    most one partition and one block are held at a time.
    """
    pending: list[pd.DataFrame] = []
    held = 0
    for part in _partitions(frame):
        start = 0
        while start < len(part):
            take = min(rows - held, len(part) - start)
            pending.append(part.iloc[start:start + take])
            held += take
            start += take
            if held == rows:
                yield pd.concat(pending, ignore_index=True) if len(pending) > 1 else pending[0]
                pending, held = [], 0
    if pending:
        yield pd.concat(pending, ignore_index=True) if len(pending) > 1 else pending[0]


def _partitions(frame: Any) -> Iterator[pd.DataFrame]:
    # Not optimised: dask's optimiser fuses the Parquet partitions of a few columns up to about 75 MB
    # (dataframe.parquet.minimum-partition-size), and one partition is to stay one row group.
    for part in _delayed_partitions(frame):
        with warnings.catch_warnings():
            # dask's reader calls reset_index(inplace=True), which pandas 3.1 deprecates: nothing the user can do
            warnings.filterwarnings("ignore", message="The inplace keyword in DataFrame.reset_index")
            block = part.compute(scheduler="sync")
        yield block


def category_values(frame: Any, columns: Sequence[str], where: str, max_categories: int) -> dict[str, list[str]]:
    """The distinct values of each categorical column, as sorted strings: one pass over those columns only.

    Parameters
    ----------
    frame : dask.dataframe.DataFrame
        The table.
    columns : sequence of str
        Its categorical columns.
    where : str
        The table's name in error messages.
    max_categories : int
        Most distinct values a column may have (each becomes a column of the store).

    Returns
    -------
    dict of str to list of str
        Column name -> its values (missing values left out: they are refused when converting).

    Raises
    ------
    ValueError
        A column with more than ``max_categories`` distinct values (named, with the fix).
    """
    seen: dict[str, set[str]] = {name: set() for name in columns}
    if not columns:
        return {}
    for part in _partitions(frame[list(columns)]):
        for name in columns:
            seen[name].update(part[name].dropna().astype(str).unique().tolist())
            if len(seen[name]) > max_categories:
                raise ValueError(
                    f"categorical column {name!r} of {where} has more than {max_categories} distinct values; "
                    f"one-hot encoding would add a column for each: drop the column, encode it as numbers, "
                    f"or raise max_categories")
    return {name: sorted(values) for name, values in seen.items()}


def one_hot(block: pd.DataFrame, categories: dict[str, list[str]]) -> pd.DataFrame:
    """``block`` with each column of ``categories`` replaced, in place, by one 0/1 column per value.

    The new columns are named ``column=value`` and come in the order of ``categories[column]``.

    Raises
    ------
    ValueError
        A value not among the column's categories (the table changed since they were read).
    """
    if not categories:
        return block
    parts: list[pd.DataFrame | pd.Series] = []
    for name in block.columns:
        if name not in categories:
            parts.append(block[name])
            continue
        values = categories[name]
        codes = pd.Categorical(block[name].astype(str), categories=values).codes
        if (codes < 0).any():
            unknown = block[name].iloc[int(np.flatnonzero(codes < 0)[0])]
            raise ValueError(f"column {name!r} holds {unknown!r}, which was not there when its categories "
                             f"were read: the table changed while it was converted; convert it again")
        encoded = np.zeros((len(block), len(values)), dtype=np.float64)
        encoded[np.arange(len(block)), codes] = 1.0
        parts.append(pd.DataFrame(encoded, columns=[f"{name}={v}" for v in values], index=block.index))
    return pd.concat(parts, axis=1)


def one_hot_names(columns: Iterable[str], categories: dict[str, list[str]]) -> list[str]:
    """The column names :func:`one_hot` gives a block with ``columns``."""
    return [new for name in columns
            for new in ([f"{name}={v}" for v in categories[name]] if name in categories else [name])]


@dataclass(frozen=True)
class ParquetColumns:
    """The columns of a Parquet table that a command reads, checked on the table's metadata.

    Made by :func:`parquet_columns` (before any row is read); :meth:`arrays` then reads
    the rows once, on the current Dask client, to count them and refuse missing values.

    Attributes
    ----------
    source : str
        The table (see :func:`open_parquet`).
    features : list of str
        The feature columns, in the model's order.
    target, weight : str or None
        The target column and the column of row weights, if read.
    """

    source: str
    features: list[str]
    target: str | None = None
    weight: str | None = None

    def arrays(self) -> tuple[Any, Any, Any]:
        """The features, target and weights as dask arrays with known row blocks (one per row group).

        One pass over the table (its chosen columns only) counts each row group's rows and
        looks for missing values; the arrays' blocks then read the row groups again when
        computed, so that memory holds a few row groups, never the table.

        Returns
        -------
        X : xarray.DataArray
            float64 features of shape (n, len(features)) over a dask array; its
            ``feature`` coordinate holds the column names (a model's ``feature_names_in_``).
        y : dask.array.Array or None
            The target (its column's dtype), or None without ``target``.
        w : dask.array.Array or None
            The weights as float64, or None without ``weight``.

        Raises
        ------
        ValueError
            A missing value (null or NaN): the message names the column, the rows of its
            row group and the row (counted from 0), and says to fill or drop it.
        """
        import dask
        import dask.array as da
        import xarray as xr

        columns = list(dict.fromkeys([*self.features, *(c for c in (self.target, self.weight) if c is not None)]))
        frame = open_parquet(self.source, columns)
        parts = list(_delayed_partitions(frame))
        counts = dask.compute(*[dask.delayed(_count_rows)(part) for part in parts])
        _refuse_missing_in(counts, self.source)
        kept = [(part, int(rows)) for part, (rows, _) in zip(parts, counts) if rows]
        if not kept:
            raise ValueError(f"{self.source} has no rows; nothing to read")

        def stacked(names: list[str], dtype: Any, vector: bool) -> Any:
            blocks = [da.from_delayed(dask.delayed(_column_values)(part, names, dtype, vector),
                                      shape=(rows,) if vector else (rows, len(names)), dtype=dtype)
                      for part, rows in kept]
            return da.concatenate(blocks, axis=0)

        X = xr.DataArray(stacked(self.features, np.dtype(np.float64), False), dims=("row", "feature"),
                         coords={"feature": np.asarray(self.features, dtype=object)})
        y = None
        if self.target is not None:
            dtype = frame.dtypes[self.target]  # an integer target (class labels) stays integer
            y = stacked([self.target], np.dtype(getattr(dtype, "numpy_dtype", dtype)), True)
        w = None if self.weight is None else stacked([self.weight], np.dtype(np.float64), True)
        return X, y, w


def _delayed_partitions(frame: Any) -> Any:
    # Not optimised: one partition is to stay one row group (see _partitions).
    return frame.to_delayed(optimize_graph=False)


def _count_rows(part: pd.DataFrame) -> tuple[int, tuple[str, int] | None]:
    """A row group's row count and its first missing value (column, row in the group), if any."""
    for name in part.columns:
        missing = part[name].isna().to_numpy()
        if missing.any():
            return len(part), (str(name), int(np.flatnonzero(missing)[0]))
    return len(part), None


def _refuse_missing_in(counts: Sequence[tuple[int, tuple[str, int] | None]], source: str) -> None:
    """Raise for the first row group with a missing value, naming its column, rows and row."""
    first = 0
    for rows, missing in counts:
        if missing is not None:
            raise ValueError(missing_value_message(missing[0], source, first, first + rows - 1, first + missing[1]))
        first += rows


def missing_value_message(column: str, source: str, first: int, last: int, row: int) -> str:
    """The error for a missing value: the column, the rows of its block and its row (counted from 0), the fix."""
    return (f"column {column!r} of {source} has a missing value (null or NaN) in rows {first}-{last} (first at "
            f"row {row}, rows counted from 0); fill or drop the missing values, or leave the column out")


def _column_values(part: pd.DataFrame, names: list[str], dtype: Any, vector: bool) -> np.ndarray:
    values = part[names].to_numpy(dtype=dtype)
    return values[:, 0] if vector else values


def parquet_columns(
    source: str | os.PathLike,
    target: str | None = None,
    features: Sequence[str] | None = None,
    weight: str | None = None,
) -> ParquetColumns:
    """The columns of a Parquet table a fit, a score or a prediction reads, checked on its footers only.

    Parameters
    ----------
    source : str or os.PathLike
        The table (see :func:`open_parquet`).
    target : str or None, default=None
        The target column, or None (features only).
    features : sequence of str or None, default=None
        The feature columns in order; None takes every column but ``target`` and ``weight``.
    weight : str or None, default=None
        A column of row weights, or None.

    Returns
    -------
    ParquetColumns
        Read by its :meth:`ParquetColumns.arrays`.

    Raises
    ------
    KeyError
        A named column the table lacks (the message lists its columns).
    TypeError
        A feature, target or weight column that is not numeric (named; categorical
        features are one-hot encoded by ``daskkrr convert --categorical onehot``).
    ValueError
        No feature column is left.
    """
    frame = open_parquet(source)
    where = os.fspath(source)
    columns = [str(c) for c in frame.columns]
    roles = {role: [name] for role, name in (("target", target), ("weight", weight)) if name is not None}
    chosen = list(features) if features is not None else [c for c in columns if c not in (target, weight)]
    roles["feature"] = chosen
    _check_columns(roles, columns, frame.dtypes, where)
    if not chosen:
        raise ValueError(f"{where} has no feature columns besides the target {target!r}")
    return ParquetColumns(where, chosen, target, weight)


def parquet_training_data(
    source: str | os.PathLike,
    target: str,
    features: Sequence[str] | None = None,
    weight: str | None = None,
) -> tuple[Any, Any, Any]:
    """A Parquet table's features, target and weights as lazy dask objects for ``fit``.

    Parameters
    ----------
    source : str or os.PathLike
        The table (see :func:`open_parquet`).
    target : str
        The target column.
    features : sequence of str or None, default=None
        The feature columns; None takes every column but ``target`` and ``weight``.
    weight : str or None, default=None
        A column of row weights, or None.

    Returns
    -------
    X : dask.dataframe.DataFrame
        The features as float64, their names kept (the model's ``feature_names_in_``).
    y : dask.dataframe.Series
        The target.
    w : dask.dataframe.Series or None
        The weights.

    Raises
    ------
    KeyError, TypeError, ValueError
        As :func:`parquet_columns`.
    """
    chosen = parquet_columns(source, target, features, weight)
    frame = open_parquet(source)
    return (frame[chosen.features].astype("float64"), frame[target],
            None if weight is None else frame[weight])


def _check_columns(roles: dict[str, list[str]], columns: list[str], dtypes: pd.Series, where: str) -> None:
    """Refuse a named column the table lacks, or one that is not numeric; the message names it and the fix."""
    kinds = column_kinds(dtypes)
    for role, names in roles.items():
        missing = [name for name in names if name not in kinds]
        if missing:
            raise KeyError(f"no {role} column {missing[0]!r} in {where}; its columns are {columns}")
        for name in names:
            if kinds[name] == "categorical" and role == "feature":
                raise TypeError(
                    f"feature column {name!r} of {where} is categorical ({dtypes[name]}); a fit takes numbers: "
                    f"convert the table with one-hot encoding (daskkrr convert --categorical onehot, or "
                    f"convert_table(..., categorical='onehot')) and fit on the store, or leave the column out")
            if kinds[name] != "numeric":
                raise TypeError(f"{role} column {name!r} of {where} has dtype {dtypes[name]}, not a number; "
                                f"encode it as numbers or leave it out")
