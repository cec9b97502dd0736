"""Model files: numpy arrays in an ``.npz`` plus JSON metadata, never pickle.

A model is a directory::

    MODEL/
      daskkrr-model.json   format name and version, estimator, parameters, kernel,
                           feature scaling, fitted scalars, feature names, library version
      arrays.npz           centers, coefficients, center indices/weights, ...
                           (and posterior_* for return_std with compute_std=True)

Loading reads the arrays with ``allow_pickle=False`` and builds the estimator from
a fixed registry of classes, so a model file can never run code. The directory is
written under a temporary name and renamed into place at the end: an error leaves
nothing at the destination.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import daskkrr
from daskkrr.utils.atomic import atomic_directory
from daskkrr.utils.jsonable import SAMPLER_CENTERS_ARRAY, dumps_strict, jsonable_params
from daskkrr.utils.safe_files import FileFieldError

FORMAT_NAME = "daskkrr-model"
FORMAT_VERSION = 1
METADATA_FILE = "daskkrr-model.json"
ARRAYS_FILE = "arrays.npz"

_ARRAYS = ("centers_", "coef_", "center_indices_", "center_weights_", "residuals_", "y_mean_")
#: Arrays added after format version 1 was fixed; a file without them gets the default.
_OPTIONAL_ARRAYS = {"intercept_": lambda model: np.asarray(model.y_mean_, dtype=np.float64)}
#: Arrays of a model's stream state (``_saved_state``) are stored under this prefix.
STATE_PREFIX = "state_"
#: Prefix of the arrays of ``posterior_`` (:class:`daskkrr.solvers.variance.PosteriorVariance`).
POSTERIOR_PREFIX = "posterior_"
_SCALARS = ("n_features_in_", "n_iter_", "converged_", "jitter_", "n_data_passes_", "fit_time_",
            # ExactKernelRidge: the solver chosen and, for PCG, its preconditioner (JSON scalars and lists)
            "solver_", "n_features_", "preconditioner_penalty_", "kernel_tiles_", "adaptive_trace_",
            # Nystrom fits: the strategy and the preconditioner's sketch chosen, with the expected costs
            "strategy_", "preconditioner_rows_", "preconditioner_dtype_", "preconditioner_costs_",
            "preconditioner_route_")


class ModelFormatError(ValueError):
    """The path does not hold a daskkrr model this version can read."""


class ModelFileError(ModelFormatError, FileFieldError):
    """A model file refused at load; ``file`` and ``field`` (e.g. ``params.penalty``, ``coef``) say where."""

    fix = "the file is damaged or was edited: save the model again from a fitted estimator"


def parameter_arrays(model: Any) -> dict[str, np.ndarray]:
    """Parameters that are arrays (centers passed as ``sampler=``), by their name in the file's arrays."""
    sampler = model.get_params(deep=False).get("sampler")
    return {SAMPLER_CENTERS_ARRAY: np.asarray(sampler)} if isinstance(sampler, np.ndarray) else {}


def save_model(model: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a fitted estimator to the directory ``path``; return the path."""
    model._check_fitted()
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": daskkrr.__version__,
        "estimator": type(model).__name__,
        "params": jsonable_params(model),
        "kernel": model.kernel_.to_dict(),
        "scaler": None if model.scaler_ is None else model.scaler_.to_dict(),
        "fitted": {k: getattr(model, k) for k in _SCALARS if hasattr(model, k)},
        "sampler_info": getattr(model, "sampler_info_", {}),
    }
    if getattr(model, "feature_names_in_", None) is not None:
        meta["feature_names"] = [str(name) for name in model.feature_names_in_]  # text travels in JSON
    # Any: numpy's savez stub lets a str-keyed dict collide with its allow_pickle flag.
    arrays: dict[str, Any] = {k.rstrip("_"): np.asarray(getattr(model, k)) for k in (*_ARRAYS, *_OPTIONAL_ARRAYS)
              if hasattr(model, k)}
    arrays.update(parameter_arrays(model))
    if hasattr(model, "class_weight_"):  # classifiers: the weight of each class in the fit
        arrays["class_weight"] = np.asarray(model.class_weight_, dtype=np.float64)
    posterior = getattr(model, "posterior_", None)
    meta["posterior"] = posterior is not None  # what predict(X, return_std=True) needs
    if posterior is not None:
        arrays.update({POSTERIOR_PREFIX + k: v for k, v in posterior.to_arrays().items()})
    if hasattr(model, "classes_"):
        classes = np.asarray(model.classes_)
        if classes.dtype.kind not in "biuf":
            meta["classes"] = classes.tolist()  # strings travel in JSON
        else:
            arrays["classes"] = classes
    saved_state = getattr(model, "_saved_state", None)
    if saved_state is not None:  # a model that goes on learning (online): its stream state too
        meta["state"], state_arrays = saved_state()
        arrays.update({STATE_PREFIX + name: np.asarray(value) for name, value in state_arrays.items()})
    with atomic_directory(path, overwrite=overwrite) as tmp:
        np.savez(tmp / ARRAYS_FILE, **arrays)
        (tmp / METADATA_FILE).write_text(dumps_strict(meta, indent=2, sort_keys=True))
    return Path(path)
