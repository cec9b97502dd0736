"""Models with their centers and coefficients in a Zarr store (daskkrr.data.model_store).

A model saved with ``store="zarr"`` (or "auto" past ``ZARR_MIN_BYTES``) keeps centers and coef
as row-chunked Zarr arrays in its folder; the loaded model holds them as dask arrays and predict
sums ``k(X, Z_j) C_j`` over the chunks (daskkrr.parallel.center_chunks). The store is read as
hostile: every edit below is refused with a ModelFileError naming the file and the field.

Tolerance of the predictions: the chunked sum adds the ``J`` chunk products in another order than
one matrix product, so each entry differs from the dense product by at most about
``(J + 2) eps |k(x, Z)| |C|`` (a sum of ``J`` partial sums, each within ``eps`` times its absolute
sum, plus the final additions), with float64 arithmetic (the models are fitted on float64 data).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from dask.core import get_dependencies

import daskkrr
from daskkrr import FalkonClassifier, FalkonRegressor
from daskkrr.data import model_store
from daskkrr.models import persistence
from daskkrr.models.persistence import ModelFileError

N, M, D, ROWS = 400, 120, 3, 40  # three chunks of 40 centers
STORE = model_store.STORE_NAME


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of ROWS centers (a few chunks at a test's size)."""
    monkeypatch.setattr(model_store, "CHUNK_BYTES", ROWS * D * 8)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, D))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.normal(size=N)
    return X, y


@pytest.fixture(scope="module")
def fitted(data):
    X, y = data
    return FalkonRegressor(n_centers=M, penalty=1e-4, sigma=1.5, max_iter=20, random_state=0).fit(X, y)


@pytest.fixture
def saved(fitted, tmp_path, small_chunks) -> Path:
    return fitted.save(tmp_path / "model", store="zarr")


def chunk_bound(model, X: np.ndarray) -> np.ndarray:
    """``(J + 2) eps |k(x, Z)| |C|`` per row (see the module docstring)."""
    Xs = model.scaler_.transform(X) if model.scaler_ is not None else X
    Z = np.asarray(model.centers_)
    C = np.abs(np.asarray(model.coef_).reshape(Z.shape[0], -1))
    J = -(-Z.shape[0] // ROWS)
    return (J + 2) * np.finfo(np.float64).eps * (np.abs(model.kernel_(Xs, Z)) @ C)


def assert_same_predictions(got, want, model, X):
    bound = chunk_bound(model, X).reshape(np.shape(want))
    assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= bound)


# --------------------------------------------------------------------------- round trips
def test_zarr_round_trip_predicts_as_the_fitted_model(fitted, saved, data):
    X, _ = data
    assert sorted(os.listdir(saved)) == ["arrays.npz", STORE, "daskkrr-model.json"]
    with np.load(saved / "arrays.npz") as npz:
        assert "centers" not in npz and "coef" not in npz  # only in the Zarr store
    loaded = daskkrr.load(saved)
    assert isinstance(loaded.centers_, da.Array) and isinstance(loaded.coef_, da.Array)
    assert loaded.centers_.chunks[0] == (ROWS,) * (M // ROWS)
    np.testing.assert_array_equal(loaded.centers_.compute(), fitted.centers_)
    np.testing.assert_array_equal(loaded.coef_.compute(), fitted.coef_)
    want = fitted.predict(X)
    assert_same_predictions(loaded.predict(X), want, fitted, X)
    assert_same_predictions(loaded.predict(da.from_array(X, chunks=150)).compute(), want, fitted, X)


def test_a_loaded_zarr_model_saves_again_chunk_by_chunk(saved, fitted, data, tmp_path):
    """Its lazy centers go to a Zarr store again under "auto" (never made one numpy array first)."""
    X, _ = data
    again = daskkrr.load(saved).save(tmp_path / "again")
    assert (again / STORE).is_dir()
    assert_same_predictions(daskkrr.load(again).predict(X), fitted.predict(X), fitted, X)
    npz = daskkrr.load(saved).save(tmp_path / "npz", store="npz")  # and back to one archive on request
    assert not (npz / STORE).exists()
    np.testing.assert_array_equal(daskkrr.load(npz).centers_, fitted.centers_)


def test_auto_takes_zarr_from_the_size_threshold(fitted, tmp_path, monkeypatch):
    size = fitted.centers_.nbytes + fitted.coef_.nbytes
    monkeypatch.setattr(persistence, "ZARR_MIN_BYTES", size + 1)
    assert not (fitted.save(tmp_path / "small") / STORE).exists()
    assert isinstance(daskkrr.load(tmp_path / "small").centers_, np.ndarray)  # today's files, today's arrays
    monkeypatch.setattr(persistence, "ZARR_MIN_BYTES", size)
    assert (fitted.save(tmp_path / "large") / STORE).is_dir()
    with pytest.raises(ValueError, match="store must be one of"):
        fitted.save(tmp_path / "bad", store="hdf5")


def test_classifier_with_several_coefficient_columns(data, tmp_path):
    X, y = data
    labels = np.digitize(y, [-0.5, 0.5])
    model = FalkonClassifier(n_centers=M, penalty=1e-4, sigma=1.5, max_iter=10, random_state=0).fit(X, labels)
    loaded = daskkrr.load(model.save(tmp_path / "clf", store="zarr"))
    assert loaded.coef_.shape == (M, 3) and loaded.coef_.chunks[0] == loaded.centers_.chunks[0]
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    assert_same_predictions(loaded.decision_function(X), model.decision_function(X), model, X)


def test_predict_streams_the_center_chunks_on_the_workers(saved, fitted, data, cluster2):
    """No task of predict's graph takes more than one chunk of the centers (a concatenation or a
    read of the whole array would take them all, an array embedded in the graph none), and the
    graph runs on the workers to the fitted model's predictions."""
    X, _ = data
    loaded = daskkrr.load(saved)
    pred = loaded.predict(da.from_array(X, chunks=100))
    graph = dict(pred.__dask_graph__())
    chunks = set(loaded.centers_.__dask_keys__()[i][0] for i in range(loaded.centers_.numblocks[0]))
    assert len(chunks) == M // ROWS and chunks <= set(graph)
    users = {key: get_dependencies(graph, key) & chunks for key in graph}
    assert max(len(deps) for deps in users.values()) == 1
    assert set().union(*users.values()) == chunks  # every chunk is used, each by its own tasks
    with cluster2.as_current():
        assert_same_predictions(pred.compute(), fitted.predict(X), fitted, X)


# --------------------------------------------------------------------------- hostile stores
def _refused(path: Path, file: Path, field: str, match: str) -> None:
    with pytest.raises(ModelFileError, match=match) as info:
        daskkrr.load(path)
    assert Path(info.value.file) == file, str(info.value)
    assert info.value.field == field, str(info.value)


def _edit_json(path: Path, edit) -> None:
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def test_a_symlinked_chunk_is_refused(saved, tmp_path):
    """A chunk file linking out of the folder (here to a file of the right size) is never read."""
    chunk = saved / STORE / "centers" / "c" / "1" / "0"
    outside = tmp_path / "elsewhere"
    outside.write_bytes(chunk.read_bytes())
    chunk.unlink()
    chunk.symlink_to(outside)
    _refused(saved, chunk, "path", "is a symlink")


def test_a_symlinked_store_is_refused(saved, tmp_path):
    real = tmp_path / "real.zarr"
    shutil.move(saved / STORE, real)
    (saved / STORE).symlink_to(real, target_is_directory=True)
    _refused(saved, saved / STORE, "path", "is a symlink")


def test_a_fifo_chunk_is_refused(saved):
    """A FIFO would block the reader for ever."""
    chunk = saved / STORE / "coef" / "c" / "2"
    chunk.unlink()
    os.mkfifo(chunk)
    _refused(saved, chunk, "path", "special file")


@pytest.mark.parametrize("part", ["", "zarr.json", "centers/zarr.json", "coef/c", "coef"])
def test_a_missing_part_of_the_store_is_refused(saved, part):
    path = saved / STORE / part if part else saved / STORE
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    _refused(saved, path, "file", "is missing|cannot be read")


def test_an_extra_file_in_the_store_is_refused(saved):
    (saved / STORE / "centers" / "c" / "7").write_bytes(b"\0" * 960)
    _refused(saved, saved / STORE / "centers" / "c" / "7", "path", "not part of the Zarr store")


@pytest.mark.parametrize("edit, field, match", [
    (lambda m: m.update(codecs=[{"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "gzip", "configuration": {"level": 1}}]), "centers.codecs", "save"),
    (lambda m: m.update(data_type="int64"), "centers.data_type", "expected one of"),
    (lambda m: m.update(data_type="float16"), "centers.data_type", "expected one of"),
    (lambda m: m.update(shape=[2**40, D]), "centers.shape", "forged"),
    (lambda m: m.update(shape=[M, -3]), "centers.shape", "positive integers"),
    (lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[2**28, D]), "centers.shape", "forged"),
    (lambda m: m.update(attributes={"note": "x"}), "centers.attributes", "save"),
    (lambda m: m.update(fill_value="NaN"), "centers.fill_value", "save"),
    (lambda m: m["chunk_key_encoding"]["configuration"].update(separator="."), "centers.chunk_key_encoding",
     "save"),
])
def test_odd_array_metadata_is_refused(saved, edit, field, match):
    path = saved / STORE / "centers" / "zarr.json"
    _edit_json(path, edit)
    _refused(saved, path, field, match)


def test_chunks_of_other_rows_than_the_centers_are_refused(saved):
    """coef re-chunked by 30 rows (a valid Zarr array) would pair center chunk j with other rows."""
    import zarr

    coef = zarr.open_array(str(saved / STORE / "coef"), mode="r")[:]
    shutil.rmtree(saved / STORE / "coef")
    model_store.write_model_arrays(saved / "tmp", {"coef": coef}, 30)
    shutil.move(saved / "tmp" / STORE / "coef", saved / STORE / "coef")
    shutil.rmtree(saved / "tmp")
    _refused(saved, saved / STORE / "coef" / "zarr.json", "coef.chunk_grid", "same row chunks")


def test_a_missing_or_truncated_chunk_is_refused(saved):
    chunk = saved / STORE / "centers" / "c" / "2" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-8])
    _refused(saved, chunk, "centers", "truncated or forged")
    chunk.unlink()
    _refused(saved, chunk, "centers", "missing")


@pytest.mark.parametrize("name, index", [("centers", (57, 1)), ("coef", (101,))])
def test_nan_in_a_chunk_is_refused(saved, name, index):
    """Found by reading the store chunk by chunk; named by the array's folder and its index."""
    import zarr

    array = zarr.open_array(str(saved / STORE / name), mode="r+")
    array[index] = np.nan
    _refused(saved, saved / STORE / name, name, re.escape(f"NaN or inf value(s), the first at index {index}"))


def test_shapes_are_checked_against_the_rest_of_the_model(saved):
    """A coef of another length, written as save() would, is refused by the model's own shape check."""
    import zarr

    coef = zarr.open_array(str(saved / STORE / "coef"), mode="r")[:]
    shutil.rmtree(saved / STORE)
    centers = np.ones((M, D))
    model_store.write_model_arrays(saved, {"centers": centers, "coef": coef[:-ROWS]}, ROWS)
    _refused(saved, saved / STORE / "coef", "coef", "has shape")


@pytest.mark.parametrize("value", [["centers"], ["coef", "centers"], "centers", None])
def test_the_zarr_arrays_field_is_checked(saved, value):
    path = saved / "daskkrr-model.json"
    _edit_json(path, lambda m: m.update(zarr_arrays=value))
    if value is None:  # the arrays are then looked for in arrays.npz, which lacks them
        _refused(saved, saved / "arrays.npz", "centers", "lacks the array")
    else:
        _refused(saved, path, "zarr_arrays", "save")


def test_an_array_in_both_places_is_refused(saved, fitted):
    import zipfile

    with zipfile.ZipFile(saved / "arrays.npz", "a") as archive:
        with archive.open("coef.npy", "w") as fh:
            np.lib.format.write_array(fh, fitted.coef_)
    _refused(saved, saved / "arrays.npz", "coef", "in arrays.npz and in arrays.zarr")


def test_models_that_keep_one_archive_refuse_zarr(data, tmp_path):
    """The online model's stream state and the unsupervised models' arrays stay in arrays.npz."""
    from daskkrr import NystromKernelPCA, OnlineKernelRidge

    X, y = data
    for model in (OnlineKernelRidge(random_state=0).partial_fit(X[:50], y[:50]),
                  NystromKernelPCA(n_components=2, n_centers=10, random_state=0).fit(X[:50])):
        with pytest.raises(ValueError, match="keeps all its arrays in arrays.npz"):
            model.save(tmp_path / "m", store="zarr")
        assert not (model.save(tmp_path / type(model).__name__) / STORE).exists()


def test_return_std_of_a_zarr_model(data, tmp_path):
    """The posterior (M x M factors, dense-route fits only) stays in arrays.npz; return_std reads the centers
    whole, so mean and std are the fitted model's exactly (the same arithmetic on the same arrays)."""
    X, y = data
    model = FalkonRegressor(n_centers=M, penalty=1e-4, sigma=1.5, max_iter=20, random_state=0,
                            compute_std=True).fit(X, y)
    loaded = daskkrr.load(model.save(tmp_path / "std", store="zarr"))
    assert isinstance(loaded.centers_, da.Array) and loaded.posterior_ is not None
    mean, std = loaded.predict(X[:50], return_std=True)
    want_mean, want_std = model.predict(X[:50], return_std=True)
    np.testing.assert_array_equal(std, want_std)
    np.testing.assert_array_equal(mean, want_mean)
