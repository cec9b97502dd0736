"""Model files of the unsupervised estimators: the format of :mod:`daskkrr.models.persistence`.

The same directory layout (``daskkrr-model.json`` + ``arrays.npz``, no pickle,
written atomically) with the arrays each class lists in ``_saved_arrays``;
:func:`daskkrr.load` dispatches to :func:`load_unsupervised` by the estimator's name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.models.persistence import ARRAYS_FILE, METADATA_FILE, model_metadata, parameter_arrays
from daskkrr.utils.atomic import atomic_directory
from daskkrr.utils.jsonable import SAMPLER_CENTERS_ARRAY, dumps_strict, jsonable_params

if TYPE_CHECKING:
    from daskkrr.models.model_files import ModelFile


def save_unsupervised(model: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a fitted :class:`~daskkrr.models.unsupervised.NystromUnsupervisedBase` to ``path``."""
    model._check_fitted()
    params = jsonable_params(model)
    init = params.get("init")
    if init is not None and not isinstance(init, str):
        params["init"] = "k-means||"  # the initial points were used; the array stays out of the file
    meta = model_metadata(model, params, tuple(model._saved_scalars))
    arrays: dict[str, Any] = {k.rstrip("_"): np.asarray(getattr(model, k)) for k in model._saved_arrays}
    arrays.update(parameter_arrays(model))
    with atomic_directory(path, overwrite=overwrite) as tmp:
        np.savez(tmp / ARRAYS_FILE, **arrays)
        (tmp / METADATA_FILE).write_text(dumps_strict(meta, indent=2, sort_keys=True))
    return Path(path)


def load_unsupervised(cls: Any, mf: ModelFile) -> Any:
    """The estimator of class ``cls`` from a read :class:`ModelFile`, checked as a whole (no code from it runs)."""
    mf.check_known_arrays({k.rstrip("_") for k in cls._saved_arrays} | {SAMPLER_CENTERS_ARRAY})
    model = mf.estimator(cls)
    for key in cls._saved_arrays:
        setattr(model, key, mf.array(key.rstrip("_")))
    for key, value in mf.section("fitted").items():
        if key in cls._saved_scalars:
            setattr(model, key, value)
    d = model.n_features_in_ = mf.n_features()
    mf.check_shape("centers", model.centers_, (None, d), "M centers of fitted.n_features_in_ features")
    m = model.centers_.shape[0]
    mf.check_shape("center_indices", model.center_indices_, (m,), "one per center")
    mf.check_shape("center_weights", model.center_weights_, (m,), "one per center")
    mf.check_shape("basis", model.basis_, (m, None), "one row per center")
    _check_fitted_arrays(mf, model, model.basis_.shape[1])
    return model


def _check_fitted_arrays(mf: ModelFile, model: Any, r: int) -> None:
    """Kernel PCA's projection and spectrum, or k-means' centroids, against the basis' ``r`` columns."""
    m = model.centers_.shape[0]
    if "cluster_centers_" in model._saved_arrays:  # NystromKernelKMeans
        mf.check_shape("cluster_centers", model.cluster_centers_, (model.n_clusters, r),
                       "params.n_clusters centroids of the basis' columns")
        return
    k = mf.scalar("n_components_", int)
    if mf.scalar("rank_", int) != r:
        raise mf.meta_error("fitted.rank_", f"is {model.rank_}; the basis has {r} columns")
    if not 1 <= k <= r:
        raise mf.meta_error("fitted.n_components_", f"is {k}; expected 1 to rank_={r}")
    mf.check_shape("coef", model.coef_, (m, k), "centers x fitted.n_components_")
    for name in ("intercept", "eigenvalues", "explained_variance_ratio"):
        mf.check_shape(name, getattr(model, name + "_"), (k,), "one per component")
