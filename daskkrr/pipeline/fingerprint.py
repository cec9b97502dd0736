"""What identifies a fit, so that a checkpoint is resumed only by the same fit."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from daskkrr.pipeline.context import FitContext
from daskkrr.utils.jsonable import dumps_strict, jsonable_params

#: Parameters that may change between the interrupted fit and its continuation.
FREE_PARAMS = frozenset({"client", "verbose", "max_iter", "tol", "compute_std"})


def block_digest(*blocks: np.ndarray) -> str:
    """SHA-256 of the shapes, dtypes and bytes of some numpy blocks."""
    h = hashlib.sha256()
    for block in blocks:
        a = np.ascontiguousarray(block)
        h.update(f"{a.shape}{a.dtype.str}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def fit_fingerprint(ctx: FitContext) -> dict[str, Any]:
    """The estimator and its parameters (:data:`FREE_PARAMS` excepted), the scaled data's
    shape, dtype and row chunking, a SHA-256 of its first row block (computed where the
    block lives; only the digest comes back) and the feature and target statistics;
    with row weights, their sum and a SHA-256 of their first block.

    Returns
    -------
    dict
        JSON-ready.
    """
    model = ctx.params
    params = {k: v for k, v in jsonable_params(model).items() if k not in FREE_PARAMS}
    (first,) = ctx.executor.passes(ctx.X, ctx.Y).map(block_digest, name="digest", with_y=True, blocks=[0])
    chunks = [int(c) for c in ctx.X.chunks[0]]
    classes = getattr(model, "classes_", None)
    fingerprint = {
        "estimator": type(model).__name__,
        "params": params,
        "n_rows": int(ctx.X.shape[0]),
        "n_features": int(ctx.X.shape[1]),
        "n_targets": int(ctx.Y.shape[1]),
        "dtype": str(ctx.X.dtype),
        "row_blocks": len(chunks),
        "row_chunks_sha256": hashlib.sha256(json.dumps(chunks).encode()).hexdigest(),
        "first_block_sha256": first,
        "scaler": None if ctx.scaler is None else ctx.scaler.to_dict(),
        "y_mean": np.asarray(ctx.y_mean if ctx.y_mean is not None else []),
        "classes": None if classes is None else np.asarray(classes),
    }
    if ctx.sample_weight is not None:  # the weighted statistics are in "scaler"; these catch other weights
        (digest,) = ctx.executor.passes(ctx.sample_weight[:, None]).map(
            block_digest, name="digest", blocks=[0])
        fingerprint["sample_weight"] = {"sum": float(ctx.weight_sum), "first_block_sha256": digest}
    return json.loads(dumps_strict(fingerprint))  # plain values, as read back from a checkpoint
