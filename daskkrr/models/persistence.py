"""Model files: numpy arrays in an ``.npz`` plus JSON metadata, never pickle.

A model is a directory::

    MODEL/
      daskkrr-model.json   format name and version, estimator, parameters, kernel,
                           feature scaling, fitted scalars, feature names, library version
      arrays.npz           centers, coefficients, center indices/weights, ...
                           (and posterior_* for return_std with compute_std=True)
      arrays.zarr/         large models only: centers and coefficients as a Zarr group
                           chunked by rows (then not in arrays.npz; see below)
      posterior.zarr/      a posterior fitted on the tiled preconditioner route only: its
                           triangular factors T and R as tiles ("posterior": "tiled" in the JSON;
                           :mod:`daskkrr.data.model_store`)

Loading reads the arrays with ``allow_pickle=False`` and builds the estimator from
a fixed registry of classes, so a model file can never run code. The directory is
written under a temporary name and renamed into place at the end: an error leaves
nothing at the destination.

Where the centers and coefficients go (``save(..., store=...)``): "auto" puts them in the
Zarr store when together they take :data:`ZARR_MIN_BYTES` or more, or when they are lazy
already (a model loaded from such a store, saved again: copied chunk by chunk). The size
decides, not the preconditioner's route: the route is chosen by the ``M x M`` factors, which no
model file holds (``O(M^2)``), while the file's centers are ``M x d`` (8 MB at M = 50 000 and
d = 20, 250 MB at M = 40 000 and d = 784). Below the threshold every process may hold them,
and one ``.npz`` read is the fastest load; above it the loaded model keeps them as dask arrays
read one chunk per task by ``predict`` (:mod:`daskkrr.parallel.center_chunks`), so no process
holds them whole. The model folder must then stay where it is, visible to the workers (a
local cluster or a shared file system), for as long as the loaded model predicts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import daskkrr
from daskkrr.data.inputs import is_in_memory
from daskkrr.data.model_store import chunk_rows, write_model_arrays, write_tile_arrays
from daskkrr.utils.atomic import atomic_directory
from daskkrr.utils.jsonable import SAMPLER_CENTERS_ARRAY, dumps_strict, jsonable_params
from daskkrr.utils.safe_files import FileFieldError

FORMAT_NAME = "daskkrr-model"
FORMAT_VERSION = 1
METADATA_FILE = "daskkrr-model.json"
ARRAYS_FILE = "arrays.npz"

#: Centers and coefficients taking this many bytes or more are saved in the Zarr store by "auto".
ZARR_MIN_BYTES = 64 * 2**20
#: The ``store`` choices of :func:`save_model`.
STORE_CHOICES = ("auto", "npz", "zarr")
#: The arrays that may be kept in the Zarr store (the model file's ``zarr_arrays`` lists them).
ZARR_ARRAYS = ("centers", "coef")

_ARRAYS = ("centers_", "coef_", "center_indices_", "center_weights_", "residuals_", "y_mean_")
#: Arrays added after format version 1 was fixed; a file without them gets the default.
_OPTIONAL_ARRAYS = {"intercept_": lambda model: np.asarray(model.y_mean_, dtype=np.float64)}
#: Arrays of a model's stream state (``_saved_state``) are stored under this prefix.
STATE_PREFIX = "state_"
#: Prefix of the arrays of ``posterior_`` (:class:`daskkrr.solvers.variance.PosteriorVariance`).
POSTERIOR_PREFIX = "posterior_"
#: The JSON's ``posterior`` for a posterior whose factors are tiles in ``posterior.zarr`` (else true or false).
TILED_POSTERIOR = "tiled"
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


def check_store(store: str, model: Any, zarr_possible: bool = True) -> None:
    """ValueError unless ``store`` is one of :data:`STORE_CHOICES` (and not "zarr" where ``model`` cannot)."""
    if store not in STORE_CHOICES:
        raise ValueError(f"store must be one of {STORE_CHOICES}; got {store!r}")
    if store == "zarr" and not zarr_possible:
        raise ValueError(f"{type(model).__name__} keeps all its arrays in arrays.npz (its centers and coefficients "
                         "are not the ones a Zarr store holds); pass store='auto' or 'npz'")


def _in_zarr(model: Any, store: str) -> bool:
    """Whether the centers and coefficients go to the Zarr store (see the module docstring)."""
    online = getattr(model, "_saved_state", None) is not None  # online models: their stream state is one .npz
    check_store(store, model, not online)
    values = [getattr(model, k + "_") for k in ZARR_ARRAYS]
    if online or store != "auto":
        return store == "zarr"
    return not all(is_in_memory(v) for v in values) or sum(int(v.nbytes) for v in values) >= ZARR_MIN_BYTES


def model_metadata(model: Any, params: dict[str, Any], scalars: tuple[str, ...]) -> dict[str, Any]:
    """The JSON metadata every model file starts with: format, estimator, ``params``, kernel, scaling,
    the fitted ``scalars`` the model has, the sampler's record and the feature names (if any)."""
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": daskkrr.__version__,
        "estimator": type(model).__name__,
        "params": params,
        "kernel": model.kernel_.to_dict(),
        "scaler": None if model.scaler_ is None else model.scaler_.to_dict(),
        "fitted": {k: getattr(model, k) for k in scalars if hasattr(model, k)},
        "sampler_info": getattr(model, "sampler_info_", {}),
    }
    if getattr(model, "feature_names_in_", None) is not None:
        meta["feature_names"] = [str(name) for name in model.feature_names_in_]  # text travels in JSON
    return meta


def save_model(model: Any, path: str | os.PathLike, *, overwrite: bool = False, store: str = "auto") -> Path:
    """Write a fitted estimator to the directory ``path``; return the path.

    Parameters
    ----------
    model : estimator
        A fitted daskkrr estimator.
    path : str or os.PathLike
        The model folder to write.
    overwrite : bool, default=False
        Replace an existing folder.
    store : {"auto", "npz", "zarr"}, default="auto"
        Where the centers and coefficients go (see the module docstring).

    Returns
    -------
    Path
        ``path``.
    """
    model._check_fitted()
    zarr_arrays = _in_zarr(model, store)
    meta = model_metadata(model, jsonable_params(model), _SCALARS)
    # Any: numpy's savez stub lets a str-keyed dict collide with its allow_pickle flag.
    large = {k: getattr(model, k + "_") for k in ZARR_ARRAYS} if zarr_arrays else {}
    if large:
        meta["zarr_arrays"] = list(ZARR_ARRAYS)
    arrays: dict[str, Any] = {k.rstrip("_"): np.asarray(getattr(model, k)) for k in (*_ARRAYS, *_OPTIONAL_ARRAYS)
                              if hasattr(model, k) and k.rstrip("_") not in large}
    arrays.update(parameter_arrays(model))
    if hasattr(model, "class_weight_"):  # classifiers: the weight of each class in the fit
        arrays["class_weight"] = np.asarray(model.class_weight_, dtype=np.float64)
    posterior = getattr(model, "posterior_", None)
    # what predict(X, return_std=True) needs; "tiled": its factors are tiles in posterior.zarr
    meta["posterior"] = TILED_POSTERIOR if posterior is not None and posterior.tiled else posterior is not None
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
        if posterior is not None and posterior.tiled:
            write_tile_arrays(tmp, {"factor": posterior.factor, "correction": posterior.correction})
        if large:
            centers = large["centers"]
            write_model_arrays(tmp, large, chunk_rows(centers.shape[0], centers.shape[1] * centers.dtype.itemsize))
        (tmp / METADATA_FILE).write_text(dumps_strict(meta, indent=2, sort_keys=True))
    return Path(path)
