"""Row weights opened with the training data: ``fit``'s ``sample_weight`` as a dask array.

The weights are chunked like the rows of ``X`` so that every pass reads a
block's weights with its rows (see :mod:`daskkrr.models.weights` for what they
mean and how ``fit`` checks them). numpy weights under a distributed client are
scattered to the workers as numpy rows are, never embedded in the passes' graphs.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from daskkrr.data.chunking import align_rows
from daskkrr.data.inputs import scatter_backend
from daskkrr.data.loading import open_dataset

__all__ = ["open_sample_weight"]


def open_sample_weight(sample_weight: Any, X_in: Any, Xd: da.Array, chunks: int | None) -> da.Array | None:
    """The checked weights as float64 (n,) with the row chunks of ``Xd``, or None.

    ``sample_weight`` is what :func:`daskkrr.models.weights.check_sample_weight`
    returned: None, numpy, dask, or the name of a variable of the store ``X_in``.
    A variable name is opened from the store ``X_in`` (metadata only; its blocks
    are read by the passes, with the rows). Raises ValueError for a length that
    is not the number of rows.
    """
    if sample_weight is None:
        return None
    n = int(Xd.shape[0])
    if isinstance(sample_weight, str):
        _, w = open_dataset(X_in, y=sample_weight, chunks=chunks)
        if w is None:
            raise KeyError(f"no sample_weight array {sample_weight!r} in the training store")
        if w.ndim == 2 and w.shape[1] == 1:
            w = w[:, 0]
    elif isinstance(sample_weight, da.Array):
        w = sample_weight
    elif (backend := scatter_backend(sample_weight)) is not None and np.ndim(sample_weight) == 1 \
            and len(sample_weight) == n:
        # numpy weights under a client: sent to the workers once, block i where X's block i is (the same
        # placement as scatter_rows gives X), so that no pass's graph carries them
        w = backend.scatter_rows(np.asarray(sample_weight), Xd.chunks[0])
    else:
        w = da.from_array(np.asarray(sample_weight), chunks=(Xd.chunks[0],))
    if w.ndim != 1:
        raise ValueError(f"sample_weight must be 1-D, one weight per row of X; got shape {tuple(w.shape)}")
    if int(w.shape[0]) != n:
        raise ValueError(f"sample_weight has {w.shape[0]} weights but X has {n} rows; pass one weight per row")
    if w.dtype.kind not in "biuf":
        raise ValueError(f"sample_weight must be numeric; got dtype {w.dtype}")
    return align_rows(w.astype(np.float64), Xd)
