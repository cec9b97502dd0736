"""Open features and targets from Zarr stores, xarray objects or in-memory arrays.

:func:`open_dataset` is the single entry point. Whatever the source, it returns
lazy, row-chunked dask arrays: every block of ``X`` holds all columns and ``y``
is split at the same row boundaries. Opening reads metadata only.
"""

from __future__ import annotations

import difflib
import math
import os
import warnings
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, cast

import dask.array as da
import numpy as np
import xarray as xr
import zarr
from dask.base import is_dask_collection, tokenize
from zarr.abc.store import Store

from daskkrr.data.chunking import FORMAT_VERSION, align_rows, as_row_blocks, numpy_to_dask
from daskkrr.data.sparse import is_sparse_array, sparse_to_dask
from daskkrr.data.validation import CorruptStoreError, check_chunk_rows, check_features, check_target

__all__ = ["open_dataset"]

#: Attributes with which xarray encodes values on disk (CF conventions); arrays that
#: carry any of them are decoded through xarray rather than read raw.
CF_ENCODING_ATTRS = frozenset(
    {"scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned", "dtype", "calendar"}
)

#: The default target name; with an in-memory source it means "no target".
DEFAULT_TARGET = "y"


def open_dataset(
    source: Any,
    x: str = "X",
    y: str | Any | None = DEFAULT_TARGET,
    chunks: int | None = None,
) -> tuple[da.Array, da.Array | None]:
    """Open features ``X`` and target ``y`` as lazy, row-chunked dask arrays.

    Parameters
    ----------
    source : path, zarr Group/Store/Array, xarray Dataset/DataArray, or array
        Where the data live:

        * a path (``str`` / ``os.PathLike``, or an fsspec URL) to a Zarr store
          (format 2 or 3) whose root group holds arrays named ``x`` and ``y``,
          for example one written by :func:`write_zarr` or :func:`convert_table`;
          stores written by ``xarray.Dataset.to_zarr`` are decoded through xarray
          (CF ``scale_factor``/``add_offset``/``_FillValue``);
        * a ``zarr.Group`` or a zarr store object holding such a group;
        * an ``xarray.Dataset`` with variables ``x`` and ``y``;
        * ``X`` itself: a numpy array (or anything ``np.asarray`` accepts), a
          dask array, a ``zarr.Array`` or an ``xarray.DataArray``.
    x : str, default="X"
        Name of the feature array in a store or Dataset. Ignored for array sources.
    y : str, array-like or None, default="y"
        For a store or Dataset, the name of the target array; if no array of that
        name exists and the source holds nothing but ``X``, no target is returned
        (an in-memory target array may be passed instead of a name).
        For an array source, the target itself (numpy, dask, zarr, xarray or any
        array-like); the default name ``"y"`` then means "no target". Pass None to
        open ``X`` alone.
    chunks : int or None, default=None
        Rows per block. None keeps the source's row chunking (numpy sources get
        about 64 MiB per block, at least one row).

    Returns
    -------
    X : dask array of shape (n, d)
        One chunk across the columns; the source's dtype is kept.
    y : dask array of shape (n,) or (n, t), or None
        Chunked like ``X`` along the rows.

    Raises
    ------
    FileNotFoundError
        If a path does not exist or holds no Zarr group or array.
    KeyError
        If the store or Dataset has no array named ``x`` (or ``y``); the message
        lists the names that exist.
    TypeError
        For non-numeric data, or a target name given with an in-memory array.
    ValueError
        For wrong dimensions, empty ``X`` or a row-count mismatch.

    Examples
    --------
    >>> import numpy as np
    >>> X, y = open_dataset(np.ones((10, 3)), y=np.zeros(10), chunks=4)
    >>> X.chunks
    ((4, 4, 2), (3,))
    """
    if chunks is not None:
        chunks = check_chunk_rows(chunks, "chunks")
    if isinstance(source, xr.Dataset):
        X, target = _from_xarray_dataset(source, x, y, "the xarray Dataset")
    elif isinstance(source, (str, os.PathLike)):
        X, target = _from_zarr_path(source, x, y)
    elif isinstance(source, zarr.Group):
        X, target = _from_zarr_group(source, x, y, _describe_group(source))
    elif isinstance(source, Store):
        X, target = _from_zarr_path(source, x, y)
    else:
        X, target = as_array(source, "X"), _array_target(y)
    return _to_row_blocks(X, target, chunks)


# --------------------------------------------------------------------------- sources


def _from_zarr_path(source: str | os.PathLike | Store, x: str, y: Any) -> tuple[Any, Any]:
    """Open a Zarr group (or a lone array, taken as X) at a path, URL or store."""
    where = f"Zarr store {os.fspath(source)}" if not isinstance(source, Store) else str(source)
    if isinstance(source, (str, os.PathLike)) and "://" not in os.fspath(source):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(
                f"no Zarr store at {path}: the path does not exist "
                f"(create one with daskkrr.data.write_zarr or daskkrr.data.convert_table)"
            )
    try:
        node = zarr.open(source, mode="r")
    except zarr.errors.NodeNotFoundError as exc:
        hint = (
            "; tables must be converted first with daskkrr.data.convert_table"
            if not isinstance(source, Store)
            and Path(os.fspath(source)).suffix.lower() in {".csv", ".tsv", ".gz", ".txt"}
            else ""
        )
        raise FileNotFoundError(f"{where} holds no Zarr group or array{hint}") from exc
    except Exception as exc:  # damaged metadata: invalid JSON, missing fields, unknown codecs...
        raise _corrupt(where, exc) from exc
    if isinstance(node, zarr.Array):
        return checked_from_zarr(node, where, "X"), _array_target(y)
    return _from_zarr_group(node, x, y, where)


def _raise_if_damaged(group: zarr.Group, name: str, where: str) -> None:
    """Zarr lists a node with damaged metadata as absent; tell "damaged" from "missing"."""
    try:
        group[name]
    except KeyError as exc:
        if exc.args and exc.args[0] == name:
            return  # really absent
        raise _corrupt(where, exc, f"the metadata of array {name!r} is damaged") from exc
    except Exception as exc:
        raise _corrupt(where, exc, f"the metadata of array {name!r} is damaged") from exc


def _corrupt(
    where: str, exc: BaseException, what: str = "its Zarr metadata is damaged or not Zarr"
) -> CorruptStoreError:
    return CorruptStoreError(
        f"{where} cannot be read: {what} ({type(exc).__name__}: {exc}); "
        f"re-create the store (daskkrr convert / daskkrr generate / daskkrr.data.write_zarr)"
    )


class CheckedZarrArray:
    """Read access to a ``zarr.Array`` whose failures name the store, the array and the rows.

    Dask reads each block with ``array[region]`` in a task, possibly on a worker;
    a damaged chunk (bad compression, truncated file) then raises
    :class:`CorruptStoreError` instead of a codec's bare message.
    """

    def __init__(self, array: zarr.Array, where: str, name: str) -> None:
        self.array = array
        self.where = where
        self.name = name
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = array.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        try:
            # cast: zarr types __getitem__ as any array-like or scalar; a block read is an ndarray
            return cast(np.ndarray, self.array[key])
        except Exception as exc:
            rows = key[0] if isinstance(key, tuple) and key else key
            span = (
                f"rows {rows.start or 0}-{(self.shape[0] if rows.stop is None else rows.stop) - 1}"
                if isinstance(rows, slice) else "a block"
            )
            raise _corrupt(self.where, exc, f"{span} of array {self.name!r} are damaged") from exc

    def __dask_tokenize__(self) -> Any:
        return ("daskkrr.CheckedZarrArray", tokenize(self.array), self.where, self.name)


def checked_from_zarr(array: zarr.Array, where: str, name: str) -> da.Array:
    """``da.from_zarr(array)`` whose block reads raise :class:`CorruptStoreError` on damage."""
    return da.from_array(
        CheckedZarrArray(array, where, name), chunks=array.chunks,
        name="from-zarr-" + tokenize(array), inline_array=False,
    )


def _from_zarr_group(group: zarr.Group, x: str, y: Any, where: str) -> tuple[Any, Any]:
    version = group.attrs.get("daskkrr_format")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise ValueError(
            f"{where} has daskkrr_format {version}, but this version of daskkrr reads "
            f"formats up to {FORMAT_VERSION}; upgrade daskkrr"
        )
    try:
        names = sorted(group.array_keys())
    except Exception as exc:  # an array's metadata is damaged
        raise _corrupt(where, exc) from exc
    # Imported here: a worker unpickling this module's CheckedZarrArray (every dense store's blocks)
    # needs none of the sparse store's code.
    from daskkrr.data.sparse_store import is_sparse_group, open_sparse_group

    if x not in names and is_sparse_group(group.get(x)):  # CSR row blocks (daskkrr convert --sparse)
        X = open_sparse_group(cast(zarr.Group, group[x]), where)
        y_name = _target_name(y, names, names, x, where) if isinstance(y, str) else None
        if not isinstance(y, str):
            return X, _array_target(y)
        return X, None if y_name is None else checked_from_zarr(cast(zarr.Array, group[y_name]), where, y_name)
    if x not in names:
        _raise_if_damaged(group, x, where)
        dataset = _try_open_xarray(group)
        if dataset is not None and x in dataset.variables:
            return _from_xarray_dataset(dataset, x, y, where)
        raise KeyError(_missing_name_message("feature", x, "x", names, where, group))
    y_name = _target_name(y, names, names, x, where) if isinstance(y, str) else None
    try:
        # cast: x and y_name are among group.array_keys(), so these members are arrays, not groups
        selected = [cast(zarr.Array, group[k]) for k in [x] + ([y_name] if y_name is not None else [])]
    except Exception as exc:
        raise _corrupt(where, exc) from exc
    if any(_has_xarray_encoding(arr) for arr in selected):
        dataset = _try_open_xarray(group)
        if dataset is not None:
            return _from_xarray_dataset(dataset, x, y_name if isinstance(y, str) else y, where)
    X = checked_from_zarr(selected[0], where, x)
    if isinstance(y, str):
        return X, (None if y_name is None else checked_from_zarr(selected[1], where, y_name))
    return X, _array_target(y)


def _from_xarray_dataset(ds: xr.Dataset, x: str, y: Any, where: str) -> tuple[Any, Any]:
    names = sorted(str(k) for k in ds.variables)
    if x not in ds.variables:
        raise KeyError(_missing_name_message("feature", x, "x", names, where))
    X = ds[x].data
    if y is None:
        return X, None
    if not isinstance(y, str):
        return X, _array_target(y)
    data_names = sorted(str(k) for k in ds.data_vars)
    y_name = _target_name(y, names, data_names, x, where)
    return X, (None if y_name is None else ds[y_name].data)


def _try_open_xarray(group: zarr.Group) -> xr.Dataset | None:
    """Open ``group`` with xarray (lazily, store chunks), or None if xarray cannot."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return xr.open_zarr(group.store, group=group.path or None, chunks={})
    except Exception:  # not an xarray-readable group (e.g. no dimension names)
        return None


def _has_xarray_encoding(arr: zarr.Array) -> bool:
    """Whether reading ``arr`` raw would differ from xarray's decoded values."""
    attrs = dict(arr.attrs)
    if CF_ENCODING_ATTRS & attrs.keys():
        return True
    units = attrs.get("units")
    if isinstance(units, str) and " since " in units:
        return True
    # xarray reads a Zarr v2 fill_value as _FillValue (masked to NaN).
    if "_ARRAY_DIMENSIONS" in attrs and arr.metadata.zarr_format == 2:
        fill = arr.metadata.fill_value
        if fill is not None and not (isinstance(fill, float) and math.isnan(fill)):
            return True
    return False


# --------------------------------------------------------------------------- targets


def _target_name(
    y: str, names: Sequence[str], data_names: Sequence[str], x: str, where: str
) -> str | None:
    """Resolve a target name: the name, None when the source has no target, or raise.

    ``names`` are all arrays/variables of the source, ``data_names`` those that
    could hold data (an xarray Dataset's coordinates cannot be a missing target).
    """
    if y in names:
        return y
    if not [n for n in data_names if n != x]:
        return None
    raise KeyError(_missing_name_message("target", y, "y", names, where))


def _array_target(y: Any) -> Any:
    """The target that goes with an in-memory X: None, or an array."""
    if y is None:
        return None
    if isinstance(y, str):
        if y == DEFAULT_TARGET:
            return None
        raise TypeError(
            f"y={y!r} is an array name, but the source is an array, not a store or "
            f"Dataset; pass the target itself: open_dataset(X, y=y_array)"
        )
    return as_array(y, "y")


def as_array(a: Any, name: str) -> np.ndarray | da.Array:
    """A numpy or dask array from an array-like; zarr and dask-backed data stay lazy.

    Parameters
    ----------
    a : array-like
        numpy, dask, zarr or xarray array, or anything ``np.asarray`` accepts.
    name : str
        Name used in the error message.
    """
    if isinstance(a, xr.DataArray):
        a = a.data
    if isinstance(a, zarr.Array):
        return checked_from_zarr(a, f"Zarr array {a.path or '/'!r} of {a.store}", name)
    if is_dask_frame(a):
        return frame_rows(a)
    if isinstance(a, (da.Array, np.ndarray)):
        return a
    if is_sparse_array(a):  # scipy CSR/CSC: kept sparse (np.asarray would make an object array)
        return a
    try:
        return np.asarray(a)
    except Exception as exc:
        raise TypeError(
            f"cannot read {name} of type {type(a).__name__} as an array; pass a numpy "
            f"or dask array, an xarray object or a path to a Zarr store"
        ) from exc


def is_dask_frame(a: Any) -> bool:
    """True for a dask DataFrame or Series."""
    return is_dask_collection(a) and hasattr(a, "to_dask_array")


def frame_rows(frame: Any) -> da.Array:
    """A dask DataFrame's (or Series') values as a lazy dask array with known row chunks.

    A DataFrame does not know how many rows each partition holds, and the passes need
    every block's row count: the lengths are counted here, one pass over the partitions
    (``to_dask_array(lengths=True)``); the values themselves stay lazy. Persist the frame
    first if it is expensive to compute, so that this count and the fit read it once.
    """
    with warnings.catch_warnings():
        # A fit's progress annotates its graphs; dask's DataFrames ignore annotations and warn about it.
        # The count is not the fit's work, and the values' tasks are a dask array's, which keep them.
        warnings.filterwarnings("ignore", message="Dask annotations .* detected", category=UserWarning)
        # Optimised first: optimising fuses the small partitions of a Parquet table read in part (a few
        # columns), and the counts must be those of the partitions the array is made of.
        frame = frame.optimize()
        return frame.to_dask_array(lengths=True)


# --------------------------------------------------------------------------- layout


def _to_row_blocks(
    X: Any, y: Any, chunks: int | None
) -> tuple[da.Array, da.Array | None]:
    """Validate (metadata only) and bring X and y into the row-block layout."""
    n, _ = check_features(X, "X")
    if y is not None:
        check_target(y, n, "y", "X")
    if isinstance(X, np.ndarray):
        X = numpy_to_dask(X, chunks)
    elif is_sparse_array(X) and not isinstance(X, da.Array):
        X = sparse_to_dask(X, chunks)
    else:
        X = as_row_blocks(X, chunks)
    if y is None:
        return X, None
    if isinstance(y, np.ndarray):
        y = da.from_array(y, chunks=(X.chunks[0],) + tuple(y.shape[1:]))
    return X, align_rows(y, X)


# --------------------------------------------------------------------------- messages


def _missing_name_message(
    role: str,
    name: Hashable,
    arg: str,
    names: Sequence[str],
    where: str,
    group: zarr.Group | None = None,
) -> str:
    msg = f"no {role} array {name!r} in {where}; it holds arrays {list(names)}"
    if group is not None:
        subgroups = sorted(group.group_keys())
        if subgroups:
            msg += f" and groups {subgroups} (open a group with zarr.open_group(...)[name])"
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5) or [
        n for n in names if n.lower() == str(name).lower()
    ]
    if close:
        msg += f"; did you mean {arg}={close[0]!r}?"
    else:
        msg += f"; pass {arg}=<one of them>"
    if role == "target":
        msg += " (or y=None to open X alone)"
    return msg


def _describe_group(group: zarr.Group) -> str:
    path = group.path or "/"
    return f"Zarr group {path!r} of {group.store}"
