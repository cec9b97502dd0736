"""Model files of the unsupervised estimators: the format of :mod:`daskkrr.models.persistence`.

The same directory layout (``daskkrr-model.json`` + ``arrays.npz``, no pickle,
written atomically) with the arrays each class lists in ``_saved_arrays``;
:func:`daskkrr.load` dispatches to :func:`load_unsupervised` by the estimator's name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import daskkrr
from daskkrr.models.persistence import ARRAYS_FILE, FORMAT_NAME, FORMAT_VERSION, METADATA_FILE, ModelFormatError
from daskkrr.utils.atomic import atomic_directory
from daskkrr.utils.jsonable import dumps_strict, jsonable_params


def save_unsupervised(model: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a fitted :class:`~daskkrr.models.unsupervised.NystromUnsupervisedBase` to ``path``."""
    model._check_fitted()
    params = jsonable_params(model)
    init = params.get("init")
    if init is not None and not isinstance(init, str):
        params["init"] = "k-means||"  # the initial points were used; the array stays out of the file
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": daskkrr.__version__,
        "estimator": type(model).__name__,
        "params": params,
        "kernel": model.kernel_.to_dict(),
        "scaler": None if model.scaler_ is None else model.scaler_.to_dict(),
        "fitted": {k: getattr(model, k) for k in model._saved_scalars if hasattr(model, k)},
        "sampler_info": getattr(model, "sampler_info_", {}),
    }
    if getattr(model, "feature_names_in_", None) is not None:
        meta["feature_names"] = [str(name) for name in model.feature_names_in_]
    arrays: dict[str, Any] = {k.rstrip("_"): np.asarray(getattr(model, k)) for k in model._saved_arrays}
    with atomic_directory(path, overwrite=overwrite) as tmp:
        np.savez(tmp / ARRAYS_FILE, **arrays)
        (tmp / METADATA_FILE).write_text(dumps_strict(meta, indent=2, sort_keys=True))
    return Path(path)


def load_unsupervised(cls: Any, meta: dict[str, Any], arrays: dict[str, np.ndarray], path: Path) -> Any:
    """The estimator of class ``cls`` from checked metadata and arrays (no code from the file runs)."""
    from daskkrr.data import Standardizer
    from daskkrr.kernels import kernel_from_dict

    params = meta.get("params", {})
    if not isinstance(params, dict):
        raise ModelFormatError(f"{path / METADATA_FILE}: 'params' must be a JSON object")
    unknown = sorted(set(params) - set(cls().get_params()))
    if unknown:
        raise ModelFormatError(f"{path / METADATA_FILE}: unknown parameter(s) {unknown} for {cls.__name__}")
    model = cls(**params)
    model.kernel_ = kernel_from_dict(meta["kernel"])
    model.scaler_ = None if meta.get("scaler") is None else Standardizer.from_dict(meta["scaler"])
    for key in cls._saved_arrays:
        value = arrays.get(key.rstrip("_"))
        if value is None:
            raise ModelFormatError(f"{path / ARRAYS_FILE} lacks the array {key.rstrip('_')!r}")
        if value.dtype.kind not in "biuf":
            raise ModelFormatError(f"{path / ARRAYS_FILE}: array {key.rstrip('_')!r} is not numeric")
        setattr(model, key, value)
    for key, value in meta.get("fitted", {}).items():
        if key in cls._saved_scalars:
            setattr(model, key, value)
    d = getattr(model, "n_features_in_", None)
    Z, P = model.centers_, model.basis_
    if not isinstance(d, int) or Z.ndim != 2 or Z.shape[1] != d or P.ndim != 2 or P.shape[0] != Z.shape[0]:
        raise ModelFormatError(f"{path} is inconsistent: centers {Z.shape}, basis {P.shape}, n_features {d!r}")
    names = meta.get("feature_names")
    if names is not None:
        if not (isinstance(names, list) and len(names) == d and all(isinstance(n, str) for n in names)):
            raise ModelFormatError(f"{path / METADATA_FILE}: 'feature_names' must be a list of {d} strings")
        model.feature_names_in_ = np.asarray(names, dtype=object)
    model.sampler_info_ = meta.get("sampler_info", {})
    return model
