"""What identifies a fit, so that a checkpoint is resumed only by the same fit."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from daskkrr.pipeline.context import FitContext
from daskkrr.utils.jsonable import dumps_strict, jsonable_params

#: Parameters that may change between the interrupted fit and its continuation.
FREE_PARAMS = frozenset({"client", "verbose", "max_iter", "tol", "compute_std"})


def fit_fingerprint(ctx: FitContext) -> dict[str, Any]:
    """The estimator and its parameters (:data:`FREE_PARAMS` excepted), the data's shape, dtype
    and row chunking, the classes, and the content of every row block: the ``(X, y, weights)``
    digests of the statistics pass (``ctx.block_digests``, in block order).

    Nothing in it is a float summed by a reduction whose shape depends on the cluster, so the
    same data give the same fingerprint in any process on any cluster; a change anywhere in the
    data changes the digest of the block that holds it.

    Returns
    -------
    dict
        JSON-ready.
    """
    model = ctx.params
    params = {k: v for k, v in jsonable_params(model).items() if k not in FREE_PARAMS}
    if ctx.block_digests is None:
        raise RuntimeError("the statistics pass kept no block digests; fit the Standardizer with digest_blocks=True")
    classes = getattr(model, "classes_", None)
    fingerprint = {
        "estimator": type(model).__name__,
        "params": params,
        "n_rows": int(ctx.X.shape[0]),
        "n_features": int(ctx.X.shape[1]),
        "n_targets": int(ctx.Y.shape[1]),
        "dtype": str(ctx.X.dtype),
        "row_chunks": [int(c) for c in ctx.X.chunks[0]],
        "blocks": [list(d) for d in ctx.block_digests],
        "classes": None if classes is None else np.asarray(classes),
    }
    return json.loads(dumps_strict(fingerprint))  # plain values, as read back from a checkpoint

