"""``feature_names_in_``: the column names a model was fitted on, and their check at predict.

Names come from the containers that carry them:

* a pandas or dask DataFrame: its columns (as scikit-learn reads them: all strings, or none);
* an xarray DataArray: the string coordinate of its feature (second) dimension;
  an xarray Dataset: that of its feature variable, else its ``feature_names`` attribute;
* a Zarr store (path, store or group): its ``feature_names`` attribute, which
  ``daskkrr convert`` writes from the table's header, or, for a store written by
  xarray, the coordinate of the feature dimension.

numpy, dask and zarr arrays carry no names. The check at predict follows
scikit-learn's ``_check_feature_names``, with the same messages: different
names raise a ValueError listing the unexpected and the missing names, or the
positions whose order changed; names at predict for a model fitted without them
(or the reverse) warn. Dask and zarr arrays cannot carry names, so they are
never warned about: a model fitted on a DataFrame predicts on the same rows
written to a dask array without noise.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from daskkrr.data.inputs import is_in_memory

#: The group attribute of a Zarr store that holds the feature names (written by ``convert``).
STORE_ATTRIBUTE = "feature_names"
#: How many names a message lists before it says "...".
_SHOWN = 5


def feature_names_of(X: Any, n_features: int | None = None, x: str = "X") -> np.ndarray | None:
    """The feature names ``X`` carries (object array of str), or None.

    Parameters
    ----------
    X : anything :func:`daskkrr.open_dataset` takes
        A DataFrame, xarray object, Zarr store or array.
    n_features : int or None
        Expected number of names; names of another length (a store whose
        attribute does not describe its ``X``) are ignored with a warning.
    x : str, default="X"
        The feature array of a store or Dataset.

    Raises
    ------
    TypeError
        If a DataFrame mixes string and non-string column names (as scikit-learn).
    """
    names = _names(X, x)
    if names is None or len(names) == 0:
        return None
    names = np.asarray(list(names), dtype=object)
    kinds = {isinstance(v, str) for v in names}
    if kinds == {True, False}:
        types = sorted({type(v).__qualname__ for v in names})
        raise TypeError(
            "Feature names are only supported if all input features have string names, but your input has "
            f"{types} as feature name / column name types. Convert them all to strings, e.g. "
            "X.columns = X.columns.astype(str), or remove the names"
        )
    if kinds != {True}:
        return None
    if n_features is not None and len(names) != n_features:
        warnings.warn(
            f"X carries {len(names)} feature names but has {n_features} features; the names are ignored",
            UserWarning, stacklevel=3,
        )
        return None
    return names


def fitted_feature_names(estimator: Any, X: Any, n_features: int) -> dict[str, Any]:
    """``{"feature_names_in_": names}`` for a fit on a lazy ``X`` (xarray, Zarr), or ``{}``.

    In-memory input (numpy, pandas) went through scikit-learn's ``validate_data``
    in ``fit``, which set (or removed) ``feature_names_in_`` already. For other
    input the names of an earlier fit are dropped here, since the fitted state is
    only ever added to the estimator: a refit on unnamed data keeps none.
    """
    if is_in_memory(X):
        return {}
    if hasattr(estimator, "feature_names_in_"):
        del estimator.feature_names_in_
    names = feature_names_of(X, n_features)
    return {} if names is None else {"feature_names_in_": names}


def check_feature_names(estimator: Any, X: Any) -> None:
    """Compare the names of ``X`` with ``estimator.feature_names_in_`` (scikit-learn's rules).

    Raises
    ------
    ValueError
        If the names differ: the message names the unexpected and the missing
        names, or, when the same names come in another order, the positions.
    """
    fitted = getattr(estimator, "feature_names_in_", None)
    given = feature_names_of(X)
    cls = type(estimator).__name__
    # In-memory X next meets scikit-learn's validate_data, which warns itself: warn once.
    warn = not is_in_memory(X)
    if fitted is None and given is None:
        return
    if fitted is None:
        if warn:
            warnings.warn(f"X has feature names, but {cls} was fitted without feature names", UserWarning,
                          stacklevel=3)
        return
    if given is None:
        if warn and _can_carry_names(X):
            warnings.warn(f"X does not have valid feature names, but {cls} was fitted with feature names",
                          UserWarning, stacklevel=3)
        return
    if len(fitted) == len(given) and np.all(fitted == given):
        return
    raise ValueError(names_mismatch_message(fitted, given))


def names_mismatch_message(fitted: np.ndarray, given: np.ndarray) -> str:
    """scikit-learn's message for different feature names, with the moved positions added."""
    message = "The feature names should match those that were passed during fit.\n"
    unexpected = sorted(set(given) - set(fitted))
    missing = sorted(set(fitted) - set(given))
    if unexpected:
        message += "Feature names unseen at fit time:\n" + _listed(unexpected)
    if missing:
        message += "Feature names seen at fit time, yet now missing:\n" + _listed(missing)
    if not unexpected and not missing:
        message += "Feature names must be in the same order as they were in fit.\n"
        moved = [f"column {i} is {g!r}, was {f!r} at fit" for i, (f, g) in enumerate(zip(fitted, given))
                 if f != g]
        message += _listed(moved)
        message += "Select the columns in fit's order: X[model.feature_names_in_]\n"
    return message


def _listed(names: list[Any]) -> str:
    shown = "".join(f"- {name}\n" for name in names[:_SHOWN])
    return shown + ("- ...\n" if len(names) > _SHOWN else "")


# --------------------------------------------------------------------------- containers
def _names(X: Any, x: str) -> Any:
    """Raw names of any container, unchecked (None when it has none)."""
    module = type(X).__module__.split(".", 1)[0]
    if module in ("pandas", "dask") and hasattr(X, "columns"):  # a pandas or dask DataFrame
        return list(X.columns)
    if module == "xarray":
        return _xarray_names(X, x)
    if isinstance(X, (str, os.PathLike)) or module == "zarr":
        return _store_names(X, x)
    return None


def _xarray_names(X: Any, x: str) -> Any:
    import xarray as xr

    if isinstance(X, xr.Dataset):
        if x in X.variables:
            names = _xarray_names(X[x], x)
            if names is not None:
                return names
        return X.attrs.get(STORE_ATTRIBUTE)
    if isinstance(X, xr.DataArray) and X.ndim == 2:
        dim = X.dims[1]
        if dim in X.coords:
            values = np.asarray(X.coords[dim].values)
            if values.dtype.kind in "UO":
                return values.tolist()
    return None


def _store_names(X: Any, x: str) -> Any:
    """The names kept by a Zarr store: its attribute, or an xarray feature coordinate."""
    import zarr

    from daskkrr.data.loading import _try_open_xarray

    if isinstance(X, zarr.Array):
        return None
    try:
        group = X if isinstance(X, zarr.Group) else zarr.open_group(X, mode="r")
    except Exception:  # not a group: open_dataset reports what is wrong with the path
        return None
    names = group.attrs.get(STORE_ATTRIBUTE)
    if names is not None:
        return names
    try:
        node = group[x]
    except Exception:
        return None
    # Dimension names: an attribute in Zarr format 2 (xarray's convention), metadata in format 3.
    dims: Any = dict(node.attrs).get("_ARRAY_DIMENSIONS") or getattr(node.metadata, "dimension_names", None)
    if not dims or len(dims) != 2 or dims[1] not in group.array_keys():
        return None
    dataset = _try_open_xarray(group)
    return None if dataset is None else _xarray_names(dataset, x)


def _can_carry_names(X: Any) -> bool:
    """Containers that could have carried names (dask and zarr arrays cannot; dask DataFrames can)."""
    module = type(X).__module__.split(".", 1)[0]
    if module == "dask":
        return hasattr(X, "columns")
    return not (module == "zarr" and type(X).__name__ == "Array")


__all__ = ["STORE_ATTRIBUTE", "check_feature_names", "feature_names_of", "fitted_feature_names",
           "names_mismatch_message"]
