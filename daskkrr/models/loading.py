"""Loading saved models: the class comes from a fixed registry, so a model file can never run code."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

import daskkrr
from daskkrr.models.persistence import (
    _ARRAYS,
    _OPTIONAL_ARRAYS,
    _SCALARS,
    ARRAYS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    METADATA_FILE,
    POSTERIOR_PREFIX,
    STATE_PREFIX,
    ModelFormatError,
)
from daskkrr.models.registry import UNSUPERVISED, classes_by_class_name
from daskkrr.models.unsupervised_persistence import load_unsupervised
from daskkrr.solvers.variance import noise_variance

UNSUPERVISED_NAMES = {cls.__name__ for cls in UNSUPERVISED.values()}


def _estimator_classes() -> dict[str, type]:
    return classes_by_class_name()


def load_model(path: str | os.PathLike) -> Any:
    """Read a model written by :func:`save_model`. Runs no code from the file.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a model directory.
    ModelFormatError
        If the files are of another format version, hold pickled objects, or are
        damaged or inconsistent.
    """
    path = Path(path)
    meta_path = path / METADATA_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not a daskkrr model directory (no {METADATA_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{meta_path} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ModelFormatError(f"{meta_path} is not a daskkrr model file")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelFormatError(
            f"{path} has model format version {version!r}; this daskkrr ({daskkrr.__version__}) reads "
            f"version {FORMAT_VERSION}. Re-fit the model or load it with the daskkrr version that wrote it "
            f"({meta.get('library_version', 'unknown')})"
        )
    classes = _estimator_classes()
    name = meta.get("estimator")
    if not isinstance(name, str) or name not in classes:
        raise ModelFormatError(f"{path}: unknown estimator {name!r}; expected one of {sorted(classes)}")
    try:
        with np.load(path / ARRAYS_FILE, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except ValueError as exc:  # object arrays need pickle: refused
        raise ModelFormatError(
            f"{path / ARRAYS_FILE} holds pickled objects or is damaged ({exc}); refusing to load it. "
            "daskkrr never writes pickles: save the model again from a fitted estimator"
        ) from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelFormatError(f"{path / ARRAYS_FILE} cannot be read: {exc}") from exc
    try:
        if name in UNSUPERVISED_NAMES:
            model = load_unsupervised(classes[name], meta, arrays, path)
        else:
            model = _build(classes[name], meta, arrays, path)
    except ModelFormatError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelFormatError(
            f"{path} is not a valid daskkrr model ({type(exc).__name__}: {exc}); the file is damaged "
            "or was edited: save the model again from a fitted estimator"
        ) from exc
    return model


def _build(cls: type, meta: dict[str, Any], arrays: dict[str, np.ndarray], path: Path) -> Any:
    """The estimator described by checked metadata and arrays (no code from the file runs)."""
    from daskkrr.data import Standardizer
    from daskkrr.kernels import kernel_from_dict

    params = meta.get("params", {})
    if not isinstance(params, dict):
        raise ModelFormatError(f"{path / METADATA_FILE}: 'params' must be a JSON object")
    accepted = set(cls().get_params())
    # Models saved while ``client`` was a parameter may carry it (null): where a fit runs
    # is Dask's context now, not the model's.
    params = {k: v for k, v in params.items() if k != "client"}
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ModelFormatError(
            f"{path / METADATA_FILE}: unknown parameter(s) {unknown} for {cls.__name__}; "
            "the file was written by another daskkrr version or edited"
        )
    if "fit_intercept" in accepted and "fit_intercept" not in params:
        params["fit_intercept"] = False  # written before the parameter existed: no intercept was fitted
    if "multi_class" in accepted and "multi_class" not in params:
        params["multi_class"] = "ovr"  # logistic models written before the parameter were one-vs-rest
    model = cls(**params)
    model.kernel_ = kernel_from_dict(meta["kernel"])
    model.scaler_ = None if meta.get("scaler") is None else Standardizer.from_dict(meta["scaler"])
    for key in (*_ARRAYS, *_OPTIONAL_ARRAYS):
        short = key.rstrip("_")
        value = arrays.get(short)
        if value is None:
            if key not in _OPTIONAL_ARRAYS:
                raise ModelFormatError(f"{path / ARRAYS_FILE} lacks the array {short!r}")
            value = _OPTIONAL_ARRAYS[key](model)  # the required arrays are set by now
        elif value.dtype.kind not in "biuf":
            raise ModelFormatError(f"{path / ARRAYS_FILE}: array {short!r} has dtype {value.dtype}, not numeric")
        setattr(model, key, value)
    fitted = meta.get("fitted", {})
    for key, value in fitted.items():
        if key in _SCALARS:
            setattr(model, key, value)
    _check_shapes(model, path)
    model.posterior_ = _posterior(meta, arrays, model, path)
    model.noise_variance_ = noise_variance(model.posterior_)
    names = meta.get("feature_names")  # absent in models fitted without names (and older files)
    if names is not None:
        if not (isinstance(names, list) and len(names) == model.n_features_in_
                and all(isinstance(n, str) for n in names)):
            raise ModelFormatError(
                f"{path / METADATA_FILE}: 'feature_names' must be a list of {model.n_features_in_} strings"
            )
        model.feature_names_in_ = np.asarray(names, dtype=object)
    model.sampler_info_ = meta.get("sampler_info", {})
    if "class_weight" in arrays:
        model.class_weight_ = arrays["class_weight"]
    restore = getattr(model, "_restore_saved_state", None)
    if restore is not None:
        if not isinstance(meta.get("state"), dict):
            raise ModelFormatError(f"{path / METADATA_FILE}: {cls.__name__} needs its stream 'state'")
        restore(meta["state"], {k[len(STATE_PREFIX):]: v for k, v in arrays.items() if k.startswith(STATE_PREFIX)})
    if "classes" in arrays:
        model.classes_ = arrays["classes"]
    elif "classes" in meta:
        model.classes_ = np.asarray(meta["classes"])
    return model


def _posterior(meta: dict[str, Any], arrays: dict[str, np.ndarray], model: Any, path: Path) -> Any:
    """The saved ``posterior_`` (None when the model was fitted without compute_std, or saved before it)."""
    from daskkrr.solvers.variance import PosteriorVariance

    if not meta.get("posterior"):
        return None
    parts = {k[len(POSTERIOR_PREFIX):]: v for k, v in arrays.items() if k.startswith(POSTERIOR_PREFIX)}
    missing = sorted({"factor", "scale", "shift", "prior_variance", "numbers"} - set(parts))
    if missing:
        raise ModelFormatError(f"{path / ARRAYS_FILE} lacks the posterior array(s) {missing}")
    post = PosteriorVariance.from_arrays(parts)
    targets = 1 if model.coef_.ndim == 1 else model.coef_.shape[1]
    if post.n_centers != model.centers_.shape[0] or post.prior_variance.shape != (targets,):
        raise ModelFormatError(
            f"{path} is inconsistent: the posterior has {post.n_centers} centers and "
            f"{post.prior_variance.size} targets, the model {model.centers_.shape[0]} and {targets}"
        )
    return post


def _check_shapes(model: Any, path: Path) -> None:
    """Centers, coefficients, scaling and target means must fit together."""
    d = getattr(model, "n_features_in_", None)
    if not isinstance(d, int) or d < 1:
        raise ModelFormatError(f"{path / METADATA_FILE}: 'fitted.n_features_in_' is missing or invalid ({d!r})")
    Z, coef = model.centers_, model.coef_
    problems = []
    if Z.ndim != 2 or Z.shape[1] != d:
        problems.append(f"centers have shape {Z.shape}, expected (M, {d})")
    elif coef.ndim not in (1, 2) or coef.shape[0] != Z.shape[0]:
        problems.append(f"coef has shape {coef.shape}, expected ({Z.shape[0]},) or ({Z.shape[0]}, t)")
    elif model.y_mean_.shape != (1 if coef.ndim == 1 else coef.shape[1],):
        problems.append(f"y_mean has shape {model.y_mean_.shape} for coef of shape {coef.shape}")
    elif model.intercept_.shape != model.y_mean_.shape:
        problems.append(f"intercept has shape {model.intercept_.shape}, y_mean {model.y_mean_.shape}")
    scales = getattr(model.kernel_, "sigma", None)
    if isinstance(scales, tuple) and len(scales) != d:
        problems.append(f"the kernel has {len(scales)} length scales (sigma), expected {d}")
    if model.scaler_ is not None and model.scaler_.n_features_in_ != d:
        problems.append(f"the scaler has {model.scaler_.n_features_in_} features, expected {d}")
    if problems:
        raise ModelFormatError(f"{path} is inconsistent: {'; '.join(problems)}; save the model again")

