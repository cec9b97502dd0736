"""Metrics on row-chunked dask arrays, and the choice of the best model (the splits: :mod:`daskkrr.data.splits`).

Nothing of size n reaches the client: metrics are reduced blockwise to a handful of sums,
computed through the executor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from daskkrr.parallel import Executor
from daskkrr.workflow.spec import HIGHER_IS_BETTER

if TYPE_CHECKING:
    import dask.array as da


def compute_metrics(y_true: da.Array, y_pred: da.Array, names: list[str]) -> dict[str, float]:
    """The named metrics (rmse, mae, r2, accuracy), from blockwise sums computed in one go."""
    yt = y_true.reshape(-1) if y_true.ndim == 2 and y_true.shape[1] == 1 else y_true
    yp = y_pred.reshape(-1) if y_pred.ndim == 2 and y_pred.shape[1] == 1 else y_pred
    if yp.shape != yt.shape:
        raise ValueError(f"predictions have shape {yp.shape} but targets {yt.shape}")
    n = int(yt.shape[0])
    out: dict[str, float] = {"n": n}
    if "accuracy" in names:
        (correct,) = Executor().compute((yp == yt).sum())
        out["accuracy"] = float(correct) / n
        return out
    t = yt.astype(np.float64)
    err = yp.astype(np.float64) - t
    sse, sae, st, st2 = Executor().compute((err**2).sum(), abs(err).sum(), t.sum(), (t**2).sum())
    sst = max(float(st2) - float(st) ** 2 / n, 0.0)
    if "rmse" in names:
        out["rmse"] = float(np.sqrt(sse / n))
    if "mae" in names:
        out["mae"] = float(sae / n)
    if "r2" in names:
        out["r2"] = float(1 - sse / sst) if sst > 0 else float("nan")
    out["rmse_of_mean"] = float(np.sqrt(sst / n))
    return out


def better(metric: str, a: float, b: float) -> bool:
    """Whether score ``a`` beats ``b`` on ``metric`` (NaN never wins)."""
    if np.isnan(a):
        return False
    if np.isnan(b):
        return True
    return a > b if metric in HIGHER_IS_BETTER else a < b


def summarize_folds(fold_metrics: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the folds, plus ``<metric>_std``."""
    keys = [k for k in fold_metrics[0] if k != "n"]
    out: dict[str, float] = {"folds": len(fold_metrics), "n": int(sum(m["n"] for m in fold_metrics))}
    for k in keys:
        vals = np.array([m[k] for m in fold_metrics], dtype=float)
        out[k] = float(np.mean(vals))
        out[f"{k}_std"] = float(np.std(vals))
    return out
