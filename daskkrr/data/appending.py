"""Growing a Zarr store by appending rows (the stream an online model consumes)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import zarr


def append_rows(path: str | os.PathLike, X: Any, y: Any) -> int:
    """Append rows to the ``X`` and ``y`` arrays of a store written by :func:`daskkrr.write_zarr`.

    ``y`` is written first and ``X`` last, so a reader that opens the store in
    between sees the old row count of ``X``; the two are not one atomic change.

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    X : array of shape (b, d)
        New rows (same columns as the store's ``X``).
    y : array of shape (b,) or (b, t)
        Their targets.

    Returns
    -------
    int
        Rows in the store afterwards.
    """
    group = zarr.open_group(str(path), mode="r+")
    Xs, ys = group["X"], group["y"]
    if not (isinstance(Xs, zarr.Array) and isinstance(ys, zarr.Array)):
        raise ValueError(f"{path} must hold arrays X and y (written by daskkrr.write_zarr)")
    X = np.asarray(X, dtype=Xs.dtype)
    y = np.asarray(y, dtype=ys.dtype)
    if X.ndim != 2 or X.shape[1] != Xs.shape[1]:
        raise ValueError(f"X has shape {X.shape}; the store's X has {Xs.shape[1]} columns")
    if y.shape[:1] != X.shape[:1] or y.shape[1:] != ys.shape[1:]:
        raise ValueError(f"y has shape {y.shape}; expected ({X.shape[0]},{''.join(f' {s},' for s in ys.shape[1:])})")
    n = Xs.shape[0]
    ys.resize((n + len(y), *ys.shape[1:]))
    ys[n:] = y
    Xs.resize((n + len(X), Xs.shape[1]))
    Xs[n:] = X
    return n + len(X)


__all__ = ["append_rows"]
