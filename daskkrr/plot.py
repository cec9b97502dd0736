"""Figures of a fit with matplotlib (``pip install "daskkrr[plot]"``).

>>> from daskkrr import plot                          # doctest: +SKIP
>>> plot.cg_convergence(model)                        # residual by CG iteration
>>> plot.dictionary_growth(model)                     # SQUEAK dictionary size vs rows seen
>>> plot.predicted_vs_true(y_test, model.predict(X_test))

Each function draws on ``ax`` (or a new figure's axes) and returns the axes.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError('daskkrr.plot needs matplotlib: pip install "daskkrr[plot]"') from None
    _, ax = plt.subplots(figsize=(5, 3.6))
    return ax


def _residuals(source: Any) -> np.ndarray:
    """Residual table (iterations x targets) from a fitted model, a progress record or an array."""
    if hasattr(source, "residuals_"):
        return np.atleast_2d(np.asarray(source.residuals_, dtype=float).T).T
    cg = getattr(source, "cg", None)
    if cg is None and isinstance(source, dict):
        cg = source.get("cg")
    if cg is not None:
        pts = np.asarray(cg, dtype=float).reshape(-1, 2)
        return pts[:, 1:2]
    arr = np.asarray(source, dtype=float)
    return arr[:, None] if arr.ndim == 1 else arr


def cg_convergence(source: Any, ax: Any = None, *, label: str | None = None) -> Any:
    """Relative residual of the preconditioned system by CG iteration (log scale).

    Parameters
    ----------
    source : fitted estimator, FitProgress, dict or array
        A FALKON model (``residuals_``), a progress record (``cg``) or the residuals.
    ax : matplotlib Axes, optional
    label : str, optional
        Legend label (one target); several targets are labelled by index.
    """
    res = _residuals(source)
    if res.size == 0:
        raise ValueError("no CG residuals to plot: the model was solved directly (n_iter_ = 0) "
                         "or CG has not started")
    ax = _axes(ax)
    its = np.arange(res.shape[0])
    for j in range(res.shape[1]):
        name = label if res.shape[1] == 1 else f"target {j}"
        ax.semilogy(its, np.where(res[:, j] > 0, res[:, j], np.nan), marker="o", ms=3, label=name)
    ax.set_xlabel("CG iteration")
    ax.set_ylabel("relative residual")
    ax.set_title("CG convergence")
    if res.shape[1] > 1 or label:
        ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return ax


def _history(source: Any) -> list[tuple[int, int]]:
    if hasattr(source, "sampler_info_"):
        history = (source.sampler_info_ or {}).get("history") or []
    elif hasattr(source, "info") and isinstance(source.info, dict):
        history = source.info.get("history") or []
    elif hasattr(source, "dictionary") and isinstance(source.dictionary, list):
        return [(int(r), int(m)) for r, m in source.dictionary]
    elif isinstance(source, dict):
        history = source.get("history") or [tuple(p) for p in source.get("dictionary", [])]
    else:
        history = list(source)
    out = []
    for h in history:
        if isinstance(h, dict):
            size = h["dictionary_size"] if "dictionary_size" in h else h.get("unique", 0)
            out.append((int(h["rows_seen"]), int(size)))
        else:
            out.append((int(h[0]), int(h[1])))
    return out


def dictionary_growth(source: Any, ax: Any = None, *, unique: bool = False) -> Any:
    """SQUEAK dictionary size against the rows seen.

    Parameters
    ----------
    source : fitted estimator, CenterDictionary, FitProgress, dict or list
        Anything holding a SQUEAK history (``sampler_info_["history"]``,
        ``CenterDictionary.info["history"]``, a progress record's ``dictionary``).
    unique : bool
        Plot the number of distinct centers instead of the size with copies
        (SQUEAK histories only).
    """
    if unique and hasattr(source, "sampler_info_"):
        history = [(int(h["rows_seen"]), int(h["unique"])) for h in source.sampler_info_.get("history", [])]
    else:
        history = _history(source)
    if not history:
        raise ValueError(
            "no dictionary history to plot: only streaming samplers (SQUEAK, DISQUEAK) record one; "
            "fit with sampler='squeak'"
        )
    ax = _axes(ax)
    rows, size = zip(*history)
    ax.plot(rows, size, marker="o", ms=3, color="tab:red")
    ax.set_xlabel("rows seen")
    ax.set_ylabel("distinct centers" if unique else "dictionary size")
    ax.set_title("SQUEAK dictionary growth")
    ax.grid(True, alpha=0.3)
    return ax


def _sample(a: Any, max_points: int) -> np.ndarray:
    """At most ``max_points`` evenly spaced entries, computed if lazy (never all n rows of a dask array)."""
    n = int(a.shape[0])
    step = max(1, -(-n // max_points))
    part = a[::step]
    if hasattr(part, "compute"):
        part = part.compute()
    return np.asarray(part, dtype=float).reshape(part.shape[0], -1)[:, 0]


def predicted_vs_true(y_true: Any, y_pred: Any, ax: Any = None, *, max_points: int = 5000) -> Any:
    """Scatter of predictions against targets with the diagonal; at most ``max_points`` points.

    Both may be numpy or dask arrays of the same length (dask arrays are thinned
    before anything is computed).
    """
    if int(y_true.shape[0]) != int(y_pred.shape[0]):
        raise ValueError(f"y_true has {y_true.shape[0]} rows but y_pred has {y_pred.shape[0]}")
    t = _sample(y_true, max_points)
    p = _sample(y_pred, max_points)
    ax = _axes(ax)
    ax.scatter(t, p, s=4, alpha=0.4)
    lo, hi = float(np.nanmin([t.min(), p.min()])), float(np.nanmax([t.max(), p.max()]))
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    rmse = float(np.sqrt(np.mean((p - t) ** 2)))
    ax.set_xlabel("true")
    ax.set_ylabel("predicted")
    ax.set_title(f"predicted vs true (RMSE {rmse:.3g} on {t.size} points)")
    return ax


__all__ = ["cg_convergence", "dictionary_growth", "predicted_vs_true"]
