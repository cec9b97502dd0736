"""A model folder read and checked as a whole before an estimator is built from it.

Shared by the supervised loader (:mod:`daskkrr.models.loading`) and the
unsupervised one (:mod:`daskkrr.models.unsupervised_persistence`). What a file
holds is checked against itself: the parameters through the estimator's own
``_parameter_constraints``, the kernel against the kernel those parameters give,
the feature scaling (finite, positive scales), every float array finite, and
the arrays' shapes against each other and the recorded number of features. Each
refusal is a :class:`~daskkrr.models.persistence.ModelFileError` naming the file
and the field.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils._param_validation import InvalidParameterError

import daskkrr
from daskkrr.data.model_store import STORE_NAME, first_non_finite, open_model_arrays
from daskkrr.models.persistence import (
    ARRAYS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    METADATA_FILE,
    ZARR_ARRAYS,
    ModelFileError,
)
from daskkrr.sampling.fixed import NOT_A_ROW
from daskkrr.utils.jsonable import SAMPLER_CENTERS_ARRAY
from daskkrr.utils.safe_files import contained_file, read_json_object, read_npz

#: Top-level fields of ``daskkrr-model.json``; any other is refused (format version 1 has exactly these).
KNOWN_FIELDS = frozenset({"format", "format_version", "library_version", "estimator", "params", "kernel", "scaler",
                          "fitted", "sampler_info", "feature_names", "posterior", "classes", "state",
                          "zarr_arrays"})
#: Arrays of real numbers: save writes them as float32 or float64 (an integer, bool or float16 array is an edit).
FLOAT_ARRAYS = frozenset({"centers", "coef", "center_weights", "residuals", "y_mean", "intercept", "class_weight",
                          "basis", "eigenvalues", "explained_variance_ratio", "cluster_centers"})
#: Row numbers of the centers in the training data (``NOT_A_ROW``, -1, for centers the user gave).
INDEX_ARRAYS = frozenset({"center_indices"})
#: Fitted scalars of a fixed type: the JSON type(s) accepted (bools are not numbers here); all are >= 0.
FITTED_SCALARS: dict[str, tuple[type, ...]] = {
    "n_iter_": (int,), "n_data_passes_": (int,), "converged_": (bool,), "jitter_": (int, float),
    "fit_time_": (int, float), "inertia_": (int, float)}


@dataclasses.dataclass
class ModelFile:
    """The metadata and arrays of one model folder, read with bounds (see :mod:`daskkrr.utils.safe_files`)."""

    folder: Path
    meta: dict[str, Any]
    #: numpy arrays from ``arrays.npz``; lazy (dask) ones from the Zarr store (:mod:`daskkrr.data.model_store`).
    arrays: dict[str, Any]
    #: The file (a Zarr array's folder) of each array not in ``arrays.npz``, named by its errors.
    sources: dict[str, Path] = dataclasses.field(default_factory=dict)

    @property
    def meta_path(self) -> Path:
        return self.folder / METADATA_FILE

    @property
    def arrays_path(self) -> Path:
        return self.folder / ARRAYS_FILE

    @classmethod
    def read(cls, folder: Path, estimators: dict[str, type]) -> ModelFile:
        """Read ``folder``: its JSON (format, version, known fields, a registered estimator) and its arrays."""
        meta_path = contained_file(folder, METADATA_FILE, ModelFileError)
        if not meta_path.is_file():
            raise FileNotFoundError(f"{folder} is not a daskkrr model directory (no {METADATA_FILE})")
        meta = read_json_object(meta_path, ModelFileError)
        if meta.get("format") != FORMAT_NAME:
            raise ModelFileError(meta_path, "format", f"is {meta.get('format')!r}, not {FORMAT_NAME!r}: this is "
                                 "not a daskkrr model file", fix="pass the folder daskkrr's save() wrote")
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelFileError(
                meta_path, "format_version",
                f"model format version {version!r}; this daskkrr ({daskkrr.__version__}) reads version "
                f"{FORMAT_VERSION}",
                fix="re-fit the model or load it with the daskkrr version that wrote it "
                    f"({meta.get('library_version', 'unknown')})")
        unknown = sorted(set(meta) - KNOWN_FIELDS)
        if unknown:
            raise ModelFileError(meta_path, unknown[0], f"unknown field(s) {unknown}; a version-{FORMAT_VERSION} "
                                 f"model file has only {sorted(KNOWN_FIELDS)}")
        name = meta.get("estimator")
        if not isinstance(name, str) or name not in estimators:
            raise ModelFileError(meta_path, "estimator", f"unknown estimator {name!r}; expected one of "
                                 f"{sorted(estimators)}")
        arrays = read_npz(contained_file(folder, ARRAYS_FILE, ModelFileError), ModelFileError)
        if not isinstance(meta.get("library_version", ""), str):
            raise ModelFileError(meta_path, "library_version", f"is {meta['library_version']!r}; expected the "
                                 "version string save() writes")
        model_file = cls(folder, meta, arrays)
        model_file.add_zarr_arrays()
        for key, value in model_file.arrays.items():
            model_file.check_dtype(key, value)
            model_file.check_finite(key, value)
        model_file.check_centers()
        model_file.check_fitted_scalars()
        return model_file

    def add_zarr_arrays(self) -> None:
        """The arrays of the model's Zarr store (``zarr_arrays`` lists them), checked and opened lazily."""
        names = self.meta.get("zarr_arrays")
        if names is None:
            return
        if names != list(ZARR_ARRAYS):
            raise self.meta_error("zarr_arrays", f"is {names!r}; save() writes {list(ZARR_ARRAYS)} (the arrays "
                                                 f"kept in {STORE_NAME})")
        both = sorted(set(names) & set(self.arrays))
        if both:
            raise self.array_error(both[0], f"is in {ARRAYS_FILE} and in {STORE_NAME}; save() writes it once")
        self.arrays.update(open_model_arrays(self.folder, tuple(names), ModelFileError))
        self.sources.update({name: self.folder / STORE_NAME / name for name in names})

    # ------------------------------------------------------------------ errors
    def meta_error(self, field: str, problem: str) -> ModelFileError:
        return ModelFileError(self.meta_path, field, problem)

    def array_error(self, field: str, problem: str) -> ModelFileError:
        return ModelFileError(self.sources.get(field, self.arrays_path), field, problem)

    def check_finite(self, name: str, value: Any) -> None:
        """Refuse NaN or inf in a float array (a model holding them predicts NaN), naming the first; a lazy
        array is read one chunk at a time."""
        if value.dtype.kind != "f":
            return
        found = _first_non_finite(value) if isinstance(value, np.ndarray) else first_non_finite(value)
        if found is None:
            return
        raise self.array_error(name, f"holds {found[0]} NaN or inf value(s), the first at index {found[1]}; "
                                     "a model holding them predicts NaN")

    def check_dtype(self, name: str, value: np.ndarray) -> None:
        """Real-valued arrays must be float32 or float64 and row numbers integers, as save writes them."""
        floats = value.dtype.kind == "f" and value.dtype.itemsize in (4, 8)
        if (name in FLOAT_ARRAYS and not floats) or (value.dtype.kind == "f" and not floats):
            raise self.array_error(name, f"has dtype {value.dtype}; expected float32 or float64 (the precision "
                                         "the model was fitted in)")
        if name in INDEX_ARRAYS:
            if value.dtype.kind not in "iu":
                raise self.array_error(name, f"has dtype {value.dtype}; expected integers (row numbers)")
            if value.size and value.min() < NOT_A_ROW:
                raise self.array_error(name, f"holds {value.min()}; row numbers are >= 0 ({NOT_A_ROW} for a "
                                             "center the user gave)")

    def check_centers(self) -> None:
        """Center weights are positive, as every sampler makes them (:class:`~daskkrr.sampling.CenterDictionary`)."""
        weights = self.arrays.get("center_weights")
        if weights is not None and weights.size and not (weights > 0).all():
            first = int(np.flatnonzero(~(weights > 0))[0])
            raise self.array_error("center_weights", f"is {float(weights.reshape(-1)[first])!r} for center {first}; "
                                                     "center weights are > 0")

    def check_known_arrays(self, names: set[str], prefixes: tuple[str, ...] = ()) -> None:
        """Refuse an archive member save() does not write (as unknown JSON fields are refused, not ignored)."""
        unknown = sorted(k for k in self.arrays if k not in names and not k.startswith(prefixes))
        if unknown:
            raise self.array_error(unknown[0], f"unknown array(s) {unknown}; a version-{FORMAT_VERSION} model file "
                                               f"of this estimator has only {sorted(names)}"
                                               + (f" and arrays named {' or '.join(p + '*' for p in prefixes)}"
                                                  if prefixes else ""))

    def check_fitted_scalars(self) -> None:
        """``fitted.n_iter_``, ``converged_`` & co.: of their JSON type, finite and >= 0."""
        for key, value in self.section("fitted").items():
            kinds = FITTED_SCALARS.get(key)
            if kinds is None:
                continue
            if bool in kinds:
                valid = isinstance(value, bool)
            else:  # a JSON integer may exceed a float's range: compare, do not convert
                number: Any = value  # an int or float once the isinstance below holds
                valid = (isinstance(value, kinds) and not isinstance(value, bool) and number >= 0
                         and (isinstance(number, int) or math.isfinite(number)))
            if not valid:
                expected = "true or false" if bool in kinds else f"a finite number >= 0 ({kinds[0].__name__})"
                raise self.meta_error(f"fitted.{key}", f"is {value!r}; expected {expected}")

    def check_shape(self, name: str, value: np.ndarray, expected: tuple[int | None, ...], why: str) -> None:
        """``value.shape`` must be ``expected`` (None: any length); ``why`` says where the lengths come from."""
        if value.ndim != len(expected) or any(e is not None and s != e for s, e in zip(value.shape, expected)):
            shown = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ("," if len(expected) == 1
                                                                                      else "") + ")"
            raise self.array_error(name, f"has shape {value.shape}, expected {shown} ({why})")

    # ------------------------------------------------------------------ fields
    def section(self, key: str) -> dict[str, Any]:
        """A JSON object field (``{}`` when absent)."""
        value = self.meta.get(key, {})
        if not isinstance(value, dict):
            raise self.meta_error(key, f"must be a JSON object; it is a JSON {type(value).__name__}")
        return value

    def array(self, name: str) -> np.ndarray:
        """A required array."""
        if name not in self.arrays:
            raise self.array_error(name, f"the archive lacks the array {name!r}")
        return self.arrays[name]

    def n_features(self) -> int:
        """``fitted.n_features_in_``: a positive int, the length every per-feature field is checked against."""
        d = self.section("fitted").get("n_features_in_")
        if type(d) is not int or d < 1:
            raise self.meta_error("fitted.n_features_in_", f"is missing or invalid ({d!r}); expected a positive "
                                  "integer, the number of features the model was fitted on")
        return d

    def scalar(self, key: str, kind: type) -> Any:
        """``fitted.KEY`` of type ``kind`` (bools are not ints)."""
        value = self.section("fitted").get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.meta_error(f"fitted.{key}", f"is {value!r}; expected {kind.__name__}")
        return value

    def estimator(self, cls: type, defaults: dict[str, Any] | None = None) -> Any:
        """An unfitted ``cls`` from ``params`` checked by its own validation, with the kernel and scaling set.

        ``defaults`` fill parameters older files lack (they must be accepted parameters of ``cls``).
        """
        params = {k: v for k, v in self.section("params").items() if k != "client"}  # was a parameter once
        accepted = set(cls().get_params())
        unknown = sorted(set(params) - accepted)
        if unknown:
            raise self.meta_error(f"params.{unknown[0]}", f"unknown parameter(s) {unknown} for {cls.__name__}; "
                                  "the file was written by another daskkrr version or edited")
        for key, value in (defaults or {}).items():
            if key in accepted:
                params.setdefault(key, value)
        sampler = params.get("sampler")
        if isinstance(sampler, dict):  # centers of the user's own, kept in the arrays
            if sampler != {"array": SAMPLER_CENTERS_ARRAY}:
                raise self.meta_error("params.sampler", f"is {sampler!r}; a dict there can only be "
                                      f"{{'array': {SAMPLER_CENTERS_ARRAY!r}}}")
            params["sampler"] = self.array(SAMPLER_CENTERS_ARRAY)
        model = cls(**params)
        try:
            model._validate_params()
        except (InvalidParameterError, ValueError, TypeError) as exc:
            name = getattr(exc, "parameter", None) or _named_parameter(str(exc), params)
            raise self.meta_error(f"params.{name}" if name else "params", str(exc)) from exc
        d = self.n_features()
        model.kernel_ = self.kernel(model, d)
        model.scaler_ = self.scaler(d)
        names = self.feature_names(d)
        if names is not None:
            model.feature_names_in_ = names
        sampler_info = self.meta.get("sampler_info", {})
        if not isinstance(sampler_info, dict):
            raise self.meta_error("sampler_info", "must be a JSON object")
        model.sampler_info_ = sampler_info
        return model

    def kernel(self, model: Any, d: int) -> Any:
        """The saved kernel, refused unless it is the kernel the saved parameters give for ``d`` features."""
        from daskkrr.kernels import kernel_from_dict

        spec = self.meta.get("kernel")
        if not isinstance(spec, dict):
            raise self.meta_error("kernel", f"must be a JSON object such as {{\"name\": \"gaussian\", \"sigma\": "
                                  f"1.0}}; got {spec!r}")
        for key, value in spec.items():
            numbers = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
                raise self.meta_error(f"kernel.{key}", f"is {value!r}; kernel parameters must be finite")
        try:
            saved = kernel_from_dict(spec)
        except (ValueError, TypeError) as exc:
            raise self.meta_error("kernel", str(exc)) from exc
        # A model whose kernel depends on more than its parameters (the online model's length scales are in
        # its first call's feature units) says which kernel its file must hold.
        expected_kernel = getattr(model, "_expected_saved_kernel", None)
        try:
            expected = model._make_kernel(d) if expected_kernel is None else expected_kernel(d, self.meta)
        except (ValueError, TypeError) as exc:
            field = getattr(exc, "field", None) or f"params.{getattr(exc, 'parameter', None) or 'kernel'}"
            raise self.meta_error(field, str(exc)) from exc
        if saved.to_dict() != expected.to_dict():
            raise self.meta_error(
                "kernel", f"{saved.to_dict()} contradicts the saved parameters (kernel={model.kernel!r}, "
                          f"sigma={model.sigma!r}, kernel_params={model.kernel_params!r}), which give "
                          f"{expected.to_dict()} for {d} features")
        return saved

    def scaler(self, d: int) -> Any:
        """The saved feature scaling (None without one): ``d`` features, finite means, finite positive scales."""
        from daskkrr.data import Standardizer

        state = self.meta.get("scaler")
        if state is None:
            return None
        if not isinstance(state, dict):
            raise self.meta_error("scaler", "must be a JSON object or null")
        try:
            scaler = Standardizer.from_dict(state)
        except (KeyError, ValueError, TypeError) as exc:
            raise self.meta_error("scaler", str(exc)) from exc
        if scaler.n_features_in_ != d:
            raise self.meta_error("scaler.n_features", f"is {scaler.n_features_in_}; the model has {d} features")
        for key, values in (("mean", scaler.mean_), ("scale", scaler.scale_)):
            if values is not None and not np.isfinite(values).all():
                raise self.meta_error(f"scaler.{key}", "holds NaN or inf; every feature's value must be finite")
        if scaler.scale_ is not None and (scaler.scale_ <= 0).any():
            first = int(np.flatnonzero(scaler.scale_ <= 0)[0])
            raise self.meta_error("scaler.scale", f"is {scaler.scale_[first]!r} for feature {first}; every "
                                  "feature's scale must be > 0 (scaling divides by it)")
        return scaler

    def feature_names(self, d: int) -> np.ndarray | None:
        """``feature_names`` (absent in models fitted without names): ``d`` strings."""
        names = self.meta.get("feature_names")
        if names is None:
            return None
        if not (isinstance(names, list) and len(names) == d and all(isinstance(n, str) for n in names)):
            got = f"a list of {len(names)}" if isinstance(names, list) else f"a JSON {type(names).__name__}"
            raise self.meta_error("feature_names", f"must be a list of {d} strings (one per feature); got {got}")
        return np.asarray(names, dtype=object)


def _first_non_finite(value: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """``(count, index of the first)`` of the NaN/inf values of an in-memory array; None if all are finite."""
    if np.isfinite(value).all():
        return None
    bad = np.flatnonzero(~np.isfinite(value.reshape(-1)))
    return bad.size, tuple(int(i) for i in np.unravel_index(int(bad[0]), value.shape))


def _named_parameter(message: str, params: dict[str, Any]) -> str | None:
    """The parameter a scikit-learn message names (``The 'x' parameter of ...``), if any."""
    for name in params:
        if f"'{name}'" in message or message.startswith(f"{name} "):
            return name
    return None
