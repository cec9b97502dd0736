"""Cheap shape and dtype checks for features and targets.

Every check here looks only at metadata (shape, dtype, chunk sizes); none of them
reads the data, so they are safe to call on arrays far larger than memory.
Value checks (NaN/inf) happen in the single statistics pass of
:class:`daskkrr.data.Standardizer`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

#: numpy dtype kinds accepted as features or targets: bool, signed/unsigned int, float.
NUMERIC_KINDS = "biuf"


class CorruptStoreError(ValueError):
    """A Zarr store exists but its metadata or chunks cannot be read.

    Raised when opening (damaged ``zarr.json``/``.zarray``) or, lazily, by the task
    that reads a damaged chunk; the message names the store, the array and the rows.
    """


def check_numeric_dtype(dtype: Any, name: str) -> np.dtype:
    """Return ``dtype`` as a numpy dtype, or raise TypeError if it is not bool/int/float.

    Parameters
    ----------
    dtype : dtype-like
        The dtype to check.
    name : str
        Name of the array in the error message (``"X"``, ``"y"``).

    Raises
    ------
    TypeError
        For object, string, bytes, complex, datetime and other non-real dtypes.
    """
    dtype = np.dtype(dtype)
    if dtype.kind in NUMERIC_KINDS:
        return dtype
    if dtype.kind in "OSUT":
        fix = (
            "encode categorical/text columns as numbers and convert, "
            f"e.g. {name}.astype('float64')"
        )
    elif dtype.kind == "c":
        fix = f"split real and imaginary parts into separate columns, e.g. np.real({name})"
    else:
        fix = f"convert it to a real number type first, e.g. {name}.astype('float64')"
    raise TypeError(f"{name} has dtype {dtype}; expected bool, integer or float: {fix}")


def check_known_shape(shape: tuple[float, ...], name: str) -> tuple[int, ...]:
    """Return ``shape`` as ints, or raise ValueError if a dimension is unknown (NaN).

    Dask arrays built from dataframes or boolean masks may have unknown chunk sizes.
    """
    if any(isinstance(s, float) and math.isnan(s) for s in shape):
        raise ValueError(
            f"{name} has unknown chunk sizes (shape {shape}); "
            f"call {name}.compute_chunk_sizes() before passing it"
        )
    return tuple(int(s) for s in shape)


def check_features(X: Any, name: str = "X") -> tuple[int, int]:
    """Check that ``X`` is a numeric 2-D array with at least one row and one column.

    Parameters
    ----------
    X : array with ``shape``, ``ndim`` and ``dtype`` (numpy, dask, zarr, xarray)
        The feature matrix.
    name : str, default="X"
        Name used in error messages.

    Returns
    -------
    (n_rows, n_columns) : tuple of int

    Raises
    ------
    ValueError
        If ``X`` is not 2-D, is empty, or has unknown chunk sizes.
    TypeError
        If ``X`` is not bool, integer or float.
    """
    check_feature_columns(X, name)
    n, d = check_known_shape(tuple(X.shape), name)
    if n < 1 or d < 1:
        raise ValueError(
            f"{name} has shape {(n, d)}; at least 1 row and 1 column are required"
        )
    return n, d


def check_feature_columns(X: Any, name: str = "X") -> int:
    """Check that ``X`` is a numeric 2-D array with at least one column; return the column count.

    The row count may be unknown (a dask DataFrame's values): a blockwise pass such as
    predict or a transform needs none, where a fit does (:func:`check_features`).

    Raises
    ------
    ValueError
        If ``X`` is not 2-D or has no column.
    TypeError
        If ``X`` is not bool, integer or float.
    """
    if X.ndim != 2:
        hint = (
            f"reshape a single feature with {name}.reshape(-1, 1)"
            if X.ndim == 1
            else "pass a (n_samples, n_features) matrix"
        )
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features); got {X.ndim}-D with shape "
            f"{tuple(X.shape)}: {hint}"
        )
    check_numeric_dtype(X.dtype, name)
    d = X.shape[1]
    if d < 1:
        # the same words as check_features: one documented error whatever the path that found it
        raise ValueError(f"{name} has shape {tuple(X.shape)}; at least 1 row and 1 column are required")
    return int(d)


def check_target(y: Any, n_rows: int, name: str = "y", x_name: str = "X") -> None:
    """Check that ``y`` is a numeric 1-D or 2-D array with ``n_rows`` rows.

    Parameters
    ----------
    y : array with ``shape``, ``ndim`` and ``dtype``
        The target, ``(n,)`` or ``(n, t)``.
    n_rows : int
        Number of rows of the feature matrix.
    name, x_name : str
        Names used in error messages.

    Raises
    ------
    ValueError
        Wrong number of dimensions, rows or zero target columns.
    TypeError
        Non-numeric dtype.
    """
    if y.ndim not in (1, 2):
        raise ValueError(
            f"{name} must be 1-D (n_samples,) or 2-D (n_samples, n_targets); "
            f"got {y.ndim}-D with shape {tuple(y.shape)}"
        )
    shape = check_known_shape(tuple(y.shape), name)
    check_numeric_dtype(y.dtype, name)
    if shape[0] != n_rows:
        raise ValueError(f"{name} has {shape[0]} rows but {x_name} has {n_rows}")
    if y.ndim == 2 and shape[1] < 1:
        raise ValueError(f"{name} has shape {shape}; a 2-D target needs at least 1 column")


def check_chunk_rows(value: Any, name: str = "chunk_rows") -> int:
    """Return ``value`` as a positive int, or raise.

    Raises
    ------
    TypeError
        If ``value`` is not an integer (bools are rejected too).
    ValueError
        If ``value`` < 1.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a positive integer (rows per block); got {value!r} "
            f"of type {type(value).__name__}"
        )
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (rows per block); got {value}")
    return int(value)
