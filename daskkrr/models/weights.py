"""Per-row weights of a fit: ``sample_weight`` and the classifiers' ``class_weight``.

Every estimator minimises the weighted objective

    sum_i w_i (y_i - f(x_i))^2 + penalty * W * ||f||^2,      W = sum_i w_i,

so a row of integer weight ``k`` counts exactly as ``k`` copies of the row (the
penalty is scaled by the sum of the weights, as it is scaled by ``n`` without
them). The weights reach the pipeline as a 1-D dask array chunked like the rows
of ``X`` (``FitContext.sample_weight``): they are read block by block with the
rows and never gathered on the client.

This module turns what users pass into that array:

- :func:`check_sample_weight`: in ``fit``, before any work: in-memory weights are
  checked at once (length, NaN, inf, negative, all zero); lazy ones (dask, a
  variable of a Zarr store) by their shape here and by the statistics pass for
  their values, which refuses them before anything is written (checkpoint, model);
- :func:`daskkrr.data.sample_weight.open_sample_weight`: in the statistics
  stage, the weights as a dask array aligned with the opened ``X``;
- :func:`class_weights` and :func:`class_row_weights`: ``class_weight=None |
  "balanced" | dict`` as scikit-learn defines it, multiplied into the row weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dask.array as da
import numpy as np

from daskkrr.data.inputs import is_in_memory, is_store

__all__ = [
    "check_class_weight",
    "check_sample_weight",
    "check_weight_values",
    "refuse_weighted_std",
    "class_row_weights",
    "class_weights",
]


def check_sample_weight(sample_weight: Any, X: Any) -> Any:
    """Check ``sample_weight`` against the training input ``X``, before any work.

    Parameters
    ----------
    sample_weight : None, array-like of shape (n,), dask array or str
        Row weights. A string names a variable of the Zarr store (or xarray
        Dataset) that ``X`` is.
    X : any training input of ``fit``

    Returns
    -------
    None (no weights, or all ones in memory), a float64 numpy array, a dask
    array or the variable name.

    Raises
    ------
    ValueError
        In-memory weights of the wrong length or shape, with NaN, inf or negative
        values (the message names the first row), or all zero; lazy weights of
        the wrong shape; a variable name with in-memory ``X``. The values of lazy
        weights are checked by the statistics pass, before anything is written.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, str):
        if not is_store(X):
            raise ValueError(
                f"sample_weight={sample_weight!r} names a variable of a Zarr store, but X is not a store; "
                "pass the weights themselves (an array of one weight per row)"
            )
        return sample_weight
    n = (int(X.shape[0]) if hasattr(X, "shape") else len(X)) if is_in_memory(X) else None  # sparse X has no len
    if not is_in_memory(sample_weight):
        w = sample_weight if isinstance(sample_weight, da.Array) else da.asarray(sample_weight)
        _check_shape(tuple(w.shape), n)
        return w
    try:
        values = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sample_weight must hold numbers (one weight per row): {exc}") from None
    _check_shape(values.shape, n)
    return check_weight_values(values)


def refuse_weighted_std(estimator: Any, sample_weight: Any) -> None:
    """ValueError for ``compute_std=True`` with row weights (``sample_weight`` or ``class_weight``).

    The predictive variance of a weighted fit (a noise variance ``sigma^2 / w_i`` per
    row) is not implemented; refused before any work rather than computed as if unweighted.
    """
    weighted = sample_weight is not None or getattr(estimator, "class_weight", None) is not None
    if weighted and getattr(estimator, "compute_std", False):
        raise ValueError(
            "compute_std=True is not supported with sample_weight or class_weight (the predictive "
            "variance of a weighted fit is not implemented); fit without weights for predict(return_std=True)"
        )


def _check_shape(shape: tuple[int, ...], n: int | None) -> None:
    if len(shape) != 1:
        raise ValueError(f"sample_weight must be 1-D, one weight per row of X; got shape {shape}")
    if n is not None and shape[0] != n:
        raise ValueError(f"sample_weight has {shape[0]} weights but X has {n} rows; pass one weight per row")


def check_weight_values(w: np.ndarray) -> np.ndarray | None:
    """Refuse NaN, inf, negative and all-zero weights, naming the first bad row; None when all are one."""
    w = np.ascontiguousarray(w, dtype=np.float64)
    for bad, what in ((~np.isfinite(w), "NaN or inf"), (w < 0, "a negative weight")):
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(
                f"sample_weight has {what} ({w[row]!r}) at row {row}; weights must be finite and >= 0"
            )
    if not np.any(w):
        raise ValueError(
            "sample_weight has only zero weights: no row counts in the fit; give at least one row a weight > 0"
        )
    return None if np.all(w == 1) else w


# --------------------------------------------------------------------------- class weights
def check_class_weight(class_weight: Any) -> None:
    """Refuse a ``class_weight`` that is not None, "balanced" or a dict of finite weights >= 0."""
    if class_weight is None or (isinstance(class_weight, str) and class_weight == "balanced"):
        return
    if not isinstance(class_weight, Mapping):
        raise ValueError(f'class_weight must be None, "balanced" or a dict {{class: weight}}; got {class_weight!r}')
    for label, weight in class_weight.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)) or not (
            np.isfinite(weight) and weight >= 0
        ):
            raise ValueError(f"class_weight[{label!r}] must be a finite number >= 0; got {weight!r}")


def class_weights(class_weight: Any, classes: np.ndarray, counts: np.ndarray | None = None,
                  labels: np.ndarray | None = None) -> np.ndarray:
    """The weight of each class, as scikit-learn's ``compute_class_weight`` defines it.

    Parameters
    ----------
    class_weight : None, "balanced" or dict
        None: all ones. "balanced": ``sum(counts) / (n_classes * counts)``, i.e.
        ``n_samples / (n_classes * np.bincount(y))``, with the counts weighted by
        the sample weights when there are some (scikit-learn >= 1.6 does the
        same). A dict maps class labels to weights; classes it omits weigh 1.
    classes : ndarray of shape (n_classes,)
        The sorted classes (as the fit encodes them).
    counts : ndarray of shape (n_classes,), optional
        Rows (or sums of sample weights) of each class; needed for "balanced".
    labels : ndarray of shape (n_classes,), optional
        The user's labels of ``classes`` (when text labels were encoded as
        integers), to look the dict keys up.
    """
    k = len(classes)
    if class_weight is None:
        return np.ones(k)
    if isinstance(class_weight, str) and class_weight == "balanced":
        if counts is None:
            raise ValueError('class_weight="balanced" needs the class counts')
        counts = np.asarray(counts, dtype=np.float64)
        with np.errstate(divide="ignore"):
            out = counts.sum() / (k * counts)
        # A class whose rows all weigh zero: its weight multiplies only zeros.
        return np.where(counts > 0, out, 1.0)
    check_class_weight(class_weight)
    names = [_plain(name) for name in (classes if labels is None else labels)]
    # Keys match a label, or its text (a dict read back from JSON has text keys).
    by_text = {str(name): i for i, name in enumerate(names)}
    out = np.ones(k)
    unknown = []
    for key, value in class_weight.items():
        i = names.index(_plain(key)) if _plain(key) in names else by_text.get(str(_plain(key)))
        if i is None:
            unknown.append(key)
        else:
            out[i] = float(value)
    if unknown:
        raise ValueError(f"class_weight names classes {unknown} that are not in y; the classes are {names}")
    return out


def _plain(label: Any) -> Any:
    """A label as a plain Python value (numpy scalars compare and hash as Python ones)."""
    return label.item() if isinstance(label, np.generic) else label


def _codes(yb: np.ndarray, classes: np.ndarray) -> np.ndarray:
    return np.searchsorted(classes, np.asarray(yb).reshape(-1))


def _times_class_weight(yb: np.ndarray, classes: np.ndarray, weights: np.ndarray,
                        wb: np.ndarray | None = None) -> np.ndarray:
    out = weights[_codes(yb, classes)]
    return out if wb is None else out * np.asarray(wb, dtype=np.float64).reshape(-1)


def class_row_weights(class_weight: Any, y: da.Array, classes: np.ndarray, sample_weight: da.Array | None,
                      labels: np.ndarray | None = None) -> tuple[da.Array | None, np.ndarray | None]:
    """Row weights ``sample_weight * class_weight[y]`` (lazy) and the class weights.

    ``y`` holds one label per row (dask, 1-D, labels among ``classes``);
    ``sample_weight`` is None or a dask array with the row chunks of ``y``.
    "balanced" costs one pass over ``y`` (and the weights) for the class counts.
    Returns ``(sample_weight, None)`` unchanged when ``class_weight`` is None.
    """
    if class_weight is None:
        return sample_weight, None
    y = y.reshape(-1) if y.ndim == 2 else y
    counts = None
    if isinstance(class_weight, str) and class_weight == "balanced":
        codes = da.map_blocks(_codes, y, classes, dtype=np.int64)
        counts = np.asarray(da.bincount(codes, weights=sample_weight, minlength=len(classes)).compute())
    weights = class_weights(class_weight, classes, counts, labels)
    if sample_weight is None:
        rows = da.map_blocks(_times_class_weight, y, classes, weights, dtype=np.float64)
    else:
        rows = da.map_blocks(_times_class_weight, y, classes, weights, sample_weight, dtype=np.float64)
    return rows, weights
