"""Turning what users pass to ``fit``/``predict`` into validated dask arrays."""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from daskkrr.data.loading import open_dataset


def is_in_memory(X: Any) -> bool:
    """True for numpy arrays, lists, pandas objects, scipy sparse matrices and other
    array-likes that are already in memory (the estimators check them as scikit-learn does)."""
    if isinstance(X, (np.ndarray, list, tuple)) or sp.issparse(X):
        return True
    lazy = isinstance(X, da.Array) or _module_of(X) in ("xarray", "zarr")
    return hasattr(X, "__array__") and not lazy


def _module_of(X: Any) -> str:
    return type(X).__module__.split(".", 1)[0]


def is_store(X: Any) -> bool:
    """True for a path to (or an open) Zarr store / xarray Dataset."""
    if isinstance(X, (str, os.PathLike)):
        return True
    return _module_of(X) == "zarr" or type(X).__name__ == "Dataset"


def load_training_data(X: Any, y: Any, chunks: int | None) -> tuple[da.Array, da.Array]:
    """Open ``(X, y)`` from anything :func:`daskkrr.data.open_dataset` takes."""
    if is_store(X):
        Xd, yd = open_dataset(X, y="y" if y is None else y, chunks=chunks)
    else:
        if y is None:
            raise ValueError("y is required when X is an array; pass fit(X, y)")
        Xd, yd = open_dataset(X, y=y, chunks=chunks)
    if yd is None:
        raise ValueError("the training data has no target y")
    return Xd, yd


def load_features(X: Any, chunks: int | None = None) -> da.Array:
    """Open features only (for predict)."""
    Xd, _ = open_dataset(X, y=None, chunks=chunks)
    return Xd
