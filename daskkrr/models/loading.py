"""Loading saved models: the class comes from a fixed registry, so a model file can never run code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import ClassifierMixin

from daskkrr.data.model_store import open_tile_arrays
from daskkrr.models.model_files import ModelFile
from daskkrr.models.persistence import (
    _ARRAYS,
    _OPTIONAL_ARRAYS,
    _SCALARS,
    POSTERIOR_PREFIX,
    STATE_PREFIX,
    TILED_POSTERIOR,
    ModelFileError,
    ModelFormatError,
)
from daskkrr.models.registry import UNSUPERVISED, classes_by_class_name
from daskkrr.models.unsupervised_persistence import load_unsupervised
from daskkrr.solvers.variance import noise_variance
from daskkrr.utils.jsonable import SAMPLER_CENTERS_ARRAY

UNSUPERVISED_NAMES = {cls.__name__ for cls in UNSUPERVISED.values()}


def _estimator_classes() -> dict[str, type]:
    return classes_by_class_name()


def load_model(path: str | os.PathLike) -> Any:
    """Read a model written by :func:`save_model`. Runs no code from the file.

    The folder is checked as a whole before the estimator is returned (see
    :mod:`daskkrr.models.model_files`): parameters, kernel, scaling, finiteness,
    shapes, class list, sizes and paths.

    Parameters
    ----------
    path : str or os.PathLike
        The model folder, as written by the estimator's ``save``.

    Returns
    -------
    estimator
        The fitted estimator of the class recorded in the folder.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a model directory.
    ModelFileError
        (a :class:`ModelFormatError`) If the files are of another format version, hold
        pickled objects, or are damaged or inconsistent; it names the file and the field.
    """
    path = Path(path)
    classes = _estimator_classes()
    model_file = ModelFile.read(path, classes)
    name = model_file.meta["estimator"]
    try:
        if name in UNSUPERVISED_NAMES:
            return load_unsupervised(classes[name], model_file)
        return _build(classes[name], model_file)
    except ModelFormatError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelFileError(path, "model", f"is not a valid daskkrr model ({type(exc).__name__}: {exc})") from exc


#: Parameters older files lack, with the value their models were fitted with.
_OLD_DEFAULTS = {
    "fit_intercept": False,  # written before the parameter existed: no intercept was fitted
    "multi_class": "ovr",  # logistic models written before the parameter were one-vs-rest
}


def _build(cls: type, mf: ModelFile) -> Any:
    """The estimator described by checked metadata and arrays (no code from the file runs)."""
    mf.check_known_arrays({k.rstrip("_") for k in (*_ARRAYS, *_OPTIONAL_ARRAYS)}
                          | {"classes", "class_weight", SAMPLER_CENTERS_ARRAY}, (POSTERIOR_PREFIX, STATE_PREFIX))
    model = mf.estimator(cls, _OLD_DEFAULTS)
    for key in (*_ARRAYS, *_OPTIONAL_ARRAYS):
        short = key.rstrip("_")
        if short not in mf.arrays and key in _OPTIONAL_ARRAYS:
            value = _OPTIONAL_ARRAYS[key](model)  # the required arrays are set by now
        else:
            value = mf.array(short)
        setattr(model, key, value)
    for key, value in mf.section("fitted").items():
        if key in _SCALARS:
            setattr(model, key, value)
    _check_shapes(model, mf)
    model.posterior_ = _posterior(mf, model)
    model.noise_variance_ = noise_variance(model.posterior_)
    if "class_weight" in mf.arrays:
        model.class_weight_ = mf.arrays["class_weight"]
    restore = getattr(model, "_restore_saved_state", None)
    if restore is not None:
        state = mf.meta.get("state")
        if not isinstance(state, dict):
            raise mf.meta_error("state", f"{cls.__name__} needs its stream 'state' (a JSON object)")
        try:
            restore(state, {k[len(STATE_PREFIX):]: v for k, v in mf.arrays.items() if k.startswith(STATE_PREFIX)})
        except (KeyError, ValueError, TypeError) as exc:
            raise mf.meta_error("state", f"the stream state cannot be restored ({type(exc).__name__}: {exc})") from exc
    if issubclass(cls, ClassifierMixin):
        model.classes_ = _classes(mf, model)
    return model


def _classes(mf: ModelFile, model: Any) -> np.ndarray:
    """A classifier's class list: sorted, distinct, at least two, one coefficient column each (one for two)."""
    if "classes" in mf.arrays:
        classes, error = mf.arrays["classes"], mf.array_error
    elif "classes" in mf.meta:
        raw = mf.meta["classes"]
        if not (isinstance(raw, list) and all(isinstance(c, str) for c in raw)):
            raise mf.meta_error("classes", "must be a list of strings (numeric classes are stored as an array)")
        classes, error = np.asarray(raw), mf.meta_error
    else:
        raise mf.meta_error("classes", "a classifier's file needs its class list (the array or the JSON field)")
    if classes.ndim != 1 or classes.size < 2 or not np.array_equal(np.unique(classes), classes):
        raise error("classes", f"must be at least two distinct labels in sorted order; got {classes.tolist()!r}")
    columns = 1 if classes.size == 2 else classes.size
    coef = model.coef_
    if coef.ndim != 2 or coef.shape[1] != columns:
        raise error("classes", f"{classes.size} classes need {columns} coefficient column(s), but coef has shape "
                               f"{coef.shape}: the class list does not match the coefficients")
    weight = getattr(model, "class_weight_", None)
    if weight is not None:
        mf.check_shape("class_weight", weight, (classes.size,), "one weight per class")
        if (weight < 0).any():
            raise mf.array_error("class_weight", "holds negative weights; class weights are >= 0")
    return classes


def _posterior(mf: ModelFile, model: Any) -> Any:
    """The saved ``posterior_`` (None when the model was fitted without compute_std, or saved before it)."""
    from daskkrr.solvers.variance import PosteriorVariance

    flag = mf.meta.get("posterior")
    if flag not in (None, True, False, TILED_POSTERIOR):
        raise mf.meta_error("posterior", f"is {flag!r}; save() writes true, false or {TILED_POSTERIOR!r}")
    if not flag:
        return None
    tiles = None
    if flag == TILED_POSTERIOR:  # the factors' tiles, checked as hostile before anything reads them
        opened = open_tile_arrays(mf.folder, ("factor", "correction"), ModelFileError)
        tiles = (opened["factor"], opened["correction"])
    parts = {k[len(POSTERIOR_PREFIX):]: v for k, v in mf.arrays.items() if k.startswith(POSTERIOR_PREFIX)}
    required = {"scale", "shift", "prior_variance", "numbers"} | (set() if tiles else {"factor"})
    missing = sorted(required - set(parts))
    if missing:
        raise mf.array_error(POSTERIOR_PREFIX + missing[0], f"the archive lacks the posterior array(s) {missing}")
    try:
        post = PosteriorVariance.from_arrays(parts, tiles)
    except (KeyError, ValueError, TypeError) as exc:
        raise mf.array_error("posterior", f"the posterior arrays do not fit together ({exc})") from exc
    targets = 1 if model.coef_.ndim == 1 else model.coef_.shape[1]
    if post.n_centers != model.centers_.shape[0] or post.prior_variance.shape != (targets,):
        raise mf.array_error(
            "posterior_prior_variance", f"the posterior has {post.n_centers} centers and "
            f"{post.prior_variance.size} targets, the model {model.centers_.shape[0]} and {targets}")
    return post


def _check_shapes(model: Any, mf: ModelFile) -> None:
    """Centers, coefficients, center indices and weights, target means and intercepts must fit together."""
    d = model.n_features_in_ = mf.n_features()
    mf.check_shape("centers", model.centers_, (None, d), "M centers of fitted.n_features_in_ features")
    m = model.centers_.shape[0]
    if model.coef_.ndim == 1:
        mf.check_shape("coef", model.coef_, (m,), "one coefficient per center")
    else:
        mf.check_shape("coef", model.coef_, (m, None), "one row per center")
    targets = 1 if model.coef_.ndim == 1 else model.coef_.shape[1]
    mf.check_shape("center_indices", model.center_indices_, (m,), "one per center")
    mf.check_shape("center_weights", model.center_weights_, (m,), "one per center")
    mf.check_shape("y_mean", model.y_mean_, (targets,), "one per coefficient column")
    mf.check_shape("intercept", model.intercept_, (targets,), "one per coefficient column")
