"""``feature_names_in_``: from DataFrames, xarray and converted Zarr stores; checked at predict; saved."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from daskkrr import FalkonClassifier, FalkonRegressor, load
from daskkrr.data import convert_table
from daskkrr.data.feature_names import feature_names_of
from daskkrr.models.persistence import METADATA_FILE

NAMES = ["age", "income", "rooms"]


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(400, 3)), columns=NAMES)
    y = np.sin(X["age"].to_numpy()) + 0.5 * X["rooms"].to_numpy()
    return X, y


@pytest.fixture(scope="module")
def fitted(frame):
    X, y = frame
    return FalkonRegressor(n_centers=60, random_state=0).fit(X, y)


def test_a_dataframe_gives_names_and_reordered_columns_raise(fitted, frame):
    X, y = frame
    assert isinstance(fitted.feature_names_in_, np.ndarray) and fitted.feature_names_in_.dtype == object
    assert list(fitted.feature_names_in_) == NAMES
    with pytest.raises(ValueError, match="same order as they were in fit") as info:
        fitted.predict(X[["rooms", "income", "age"]])
    assert "column 0 is 'rooms', was 'age'" in str(info.value)
    with pytest.raises(ValueError, match="unseen at fit time:\n- salary\n") as info:
        fitted.predict(X.rename(columns={"income": "salary"}))
    assert "seen at fit time, yet now missing:\n- income\n" in str(info.value)
    with pytest.raises(ValueError, match="yet now missing:\n- rooms\n"):
        fitted.score(X[["age", "income"]], y)
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        unnamed = fitted.predict(X.to_numpy())
    np.testing.assert_allclose(fitted.predict(X), unnamed, rtol=1e-12)


def test_names_and_no_names_warn_as_scikit_learn_does(fitted, frame):
    X, _ = frame
    with pytest.warns(UserWarning, match="X does not have valid feature names, but FalkonRegressor was fitted"):
        fitted.predict(X.to_numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted.predict(da.from_array(X.to_numpy(), chunks=100)).compute()  # dask arrays carry no names
    plain = FalkonRegressor(n_centers=60).fit(X.to_numpy(), frame[1])
    assert not hasattr(plain, "feature_names_in_")
    with pytest.warns(UserWarning, match="X has feature names, but FalkonRegressor was fitted without"):
        plain.predict(X)


def test_a_refit_without_names_forgets_them(frame):
    X, y = frame
    model = FalkonRegressor(n_centers=60).fit(X, y)
    model.fit(X.to_numpy(), y)
    assert not hasattr(model, "feature_names_in_")


def test_the_classifier_checks_names_in_decision_function_and_score(frame):
    X, y = frame
    labels = (y > 0).astype(int)
    model = FalkonClassifier(n_centers=60, random_state=0).fit(X, labels)
    assert list(model.feature_names_in_) == NAMES
    for method in (model.decision_function, model.predict, lambda Z: model.score(Z, labels)):
        with pytest.raises(ValueError, match="same order"):
            method(X[NAMES[::-1]])


def test_a_saved_model_keeps_its_names_and_checks_them_after_loading(fitted, frame, tmp_path):
    X, _ = frame
    fitted.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / METADATA_FILE).read_text())["feature_names"] == NAMES
    loaded = load(tmp_path / "m")
    assert list(loaded.feature_names_in_) == NAMES and loaded.feature_names_in_.dtype == object
    np.testing.assert_allclose(loaded.predict(X), fitted.predict(X))
    with pytest.raises(ValueError, match="same order as they were in fit"):
        loaded.predict(X[["income", "age", "rooms"]])


def test_a_model_saved_without_names_still_loads(frame, tmp_path):
    X, y = frame
    FalkonRegressor(n_centers=60).fit(X.to_numpy(), y).save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / METADATA_FILE).read_text())
    assert "feature_names" not in meta  # as in files written before names were kept
    assert not hasattr(load(tmp_path / "m"), "feature_names_in_")
    meta["feature_names"] = ["a"]  # damaged: one name for three features
    (tmp_path / "m" / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="feature_names: must be a list of 3 strings"):
        load(tmp_path / "m")


def test_a_converted_store_gives_the_header_names(frame, tmp_path):
    X, y = frame
    table = tmp_path / "t.csv"
    X.assign(price=y).to_csv(table, index=False)
    store = tmp_path / "t.zarr"
    convert_table(table, store, target="price", chunk_rows=150)
    assert list(feature_names_of(store)) == NAMES
    model = FalkonRegressor(n_centers=60, random_state=0).fit(str(store))
    assert list(model.feature_names_in_) == NAMES
    assert model.predict(store).shape == (400,)
    assert model.score(str(store), "y") > 0.9
    with pytest.raises(ValueError, match="same order as they were in fit"):
        model.predict(X[["rooms", "age", "income"]])


def test_xarray_datasets_and_arrays_give_the_feature_coordinate(frame):
    X, y = frame
    data = xr.DataArray(X.to_numpy(), dims=("row", "feature"), coords={"feature": NAMES})
    ds = xr.Dataset({"X": data, "y": ("row", y)})
    model = FalkonRegressor(n_centers=60, random_state=0).fit(ds)
    assert list(model.feature_names_in_) == NAMES
    model.predict(data)  # same names: no error
    with pytest.raises(ValueError, match="same order"):
        model.predict(data.isel(feature=[2, 0, 1]))
    attrs_only = xr.Dataset({"X": (("row", "f"), X.to_numpy()), "y": ("row", y)}, attrs={"feature_names": NAMES})
    assert list(feature_names_of(attrs_only)) == NAMES
    unnamed = xr.Dataset({"X": (("row", "f"), X.to_numpy()), "y": ("row", y)})
    assert feature_names_of(unnamed) is None


def test_a_store_written_by_xarray_gives_the_feature_coordinate(frame, tmp_path):
    X, y = frame
    data = xr.DataArray(X.to_numpy(), dims=("row", "feature"), coords={"feature": NAMES})
    xr.Dataset({"X": data, "y": ("row", y)}).to_zarr(tmp_path / "x.zarr")
    assert list(feature_names_of(str(tmp_path / "x.zarr"))) == NAMES
    model = FalkonRegressor(n_centers=60, random_state=0).fit(str(tmp_path / "x.zarr"))
    assert list(model.feature_names_in_) == NAMES


def test_mixed_column_types_are_refused_and_integer_columns_carry_no_names(frame):
    X, _ = frame
    assert feature_names_of(pd.DataFrame(X.to_numpy())) is None
    with pytest.raises(TypeError, match="string names"):
        feature_names_of(pd.DataFrame(X.to_numpy(), columns=["a", 1, "c"]))


def test_the_fit_path_imports_first_in_a_fresh_process():
    """A Dask worker unpickles a pipeline function before anything else of daskkrr: the names
    module (used by the statistics stage) must not pull the models package into that import.
    Each entry point is imported first in a process of its own, the two side by side (each is
    mostly its imports: one per core). ``import daskkrr.pipeline.fingerprint`` runs the package's
    ``__init__`` first, then the submodule: the import of ``daskkrr.pipeline`` first, followed by
    fingerprint's (a third process for ``daskkrr.pipeline`` alone would repeat its first part)."""
    modules = ["daskkrr.pipeline.fingerprint", "daskkrr.data.feature_names"]
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for m in modules}
    failed = {}
    for module, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failed[module] = err[-2000:]
    assert not failed, failed
