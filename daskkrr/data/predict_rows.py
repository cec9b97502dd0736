"""The row blocks of ``predict``: each block's rows checked, then the kernel products with the centers.

What the workers run for a fitted model's ``predict`` (and ``predict(..., return_std=True)``): kept
apart from the estimators (:mod:`daskkrr.models.kernel_model`), whose module imports scikit-learn,
so that a worker unpickling these functions imports numpy, the kernels and the solvers' variance
code only. The checks name a bad row by its place in ``X`` (``block_info``'s row offset).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskkrr.data.extremes import ExtremeValueError, feature_limit
from daskkrr.data.sparse import column_absmax, first_non_finite_row, is_sparse_array
from daskkrr.kernels import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.kernels.sparse import cast_rows
from daskkrr.solvers.variance import predict_with_std

__all__ = ["check_extreme_rows", "check_finite_rows", "checked_rows", "predict_block", "predict_std_block"]


def checked_rows(Xb: np.ndarray, block_info: dict | None = None) -> np.ndarray:
    """``Xb`` after the NaN/inf and overflow checks, which name its rows by their place in ``X``."""
    start = block_info[0]["array-location"][0][0] if block_info and 0 in block_info else 0
    check_finite_rows(Xb, start)
    check_extreme_rows(Xb, start, Xb.dtype)
    return Xb


def predict_block(
    Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray, y_mean: np.ndarray,
    block_info: dict | None = None,
) -> np.ndarray:
    checked_rows(Xb, block_info)
    return engine_for(kernel).matvec(kernel, Xb, Z, coef) + y_mean


def predict_std_block(
    Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray, intercept: np.ndarray, post: Any,
    exact: bool, block_info: dict | None = None,
) -> np.ndarray:
    checked_rows(Xb, block_info)
    return predict_with_std(Xb, kernel, Z, coef, intercept, post, exact=exact)


def check_extreme_rows(Xs: Any, start: int, dtype: Any) -> None:
    """Refuse (scaled) features whose squared distances would overflow ``dtype`` (the limit the fit
    applies, :func:`daskkrr.data.extremes.feature_limit`), naming the column and the first row."""
    sparse = is_sparse_array(Xs)
    Xs = cast_rows(Xs, np.float64) if sparse else np.asarray(Xs)
    if Xs.dtype.kind not in "fiu" or 0 in Xs.shape:
        return
    limit = feature_limit(dtype, Xs.shape[1])
    absmax = column_absmax(Xs) if sparse else np.abs(Xs).max(axis=0).astype(np.float64)
    if not (absmax > limit).any():  # compared in float64 (limit > float32's max)
        return
    if sparse:  # stored entries in row order: the first beyond the limit
        k = int(np.argmax(np.abs(Xs.data) > limit))
        row, col = int(np.searchsorted(Xs.indptr, k, side="right") - 1), int(Xs.indices[k])
    else:
        row, col = (int(v) for v in np.argwhere(np.abs(Xs.astype(np.float64)) > limit)[0])
    raise ExtremeValueError(
        f"X column {col} has |x| = {abs(float(Xs[row, col])):.3g} at row {start + row} (after the model's scaling), "
        f"beyond {limit:.3g}: its squared distances to the centers overflow {np.dtype(dtype)}; such a point is "
        "far outside the training data: clip or rescale that column as it was in fit"
    )


def check_finite_rows(Xb: np.ndarray, start: int) -> None:
    """Refuse NaN/inf features (their predictions would be NaN), naming the first bad row."""
    if is_sparse_array(Xb):
        if first_non_finite_row(Xb) is None:
            return
        csr = cast_rows(Xb, Xb.dtype)
        bad = np.unique(np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))[~np.isfinite(csr.data)])
    elif Xb.dtype.kind not in "fc" or np.isfinite(Xb).all():
        return
    else:
        bad = np.flatnonzero(~np.isfinite(Xb).reshape(len(Xb), -1).all(axis=1))
    raise ValueError(
        f"X has NaN or inf in {bad.size} row(s) of rows {start}-{start + Xb.shape[0] - 1}, the first at "
        f"row {start + int(bad[0])}; their predictions would be NaN: clean or impute them before predicting"
    )
