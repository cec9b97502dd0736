"""Dask DataFrames: fit keeps their column names, predict stays lazy, other columns are refused."""

from __future__ import annotations

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from daskkrr import FalkonClassifier, FalkonRegressor, NystromKernelPCA, OnlineKernelRidge

NAMES = ["age", "income", "rooms"]
ROWS, PARTS = 600, 3  # three partitions of 200 rows


def _refuse_compute(*args, **kwargs):
    raise AssertionError("something was computed where the result should have stayed lazy")


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(ROWS, 3)), columns=NAMES)
    y = pd.Series(np.sin(X["age"].to_numpy()) + 0.5 * X["rooms"].to_numpy(), name="price")
    return X, y, dd.from_pandas(X, npartitions=PARTS), dd.from_pandas(y, npartitions=PARTS)


@pytest.fixture(scope="module")
def fitted(frames):
    _, _, Xd, yd = frames
    with dask.config.set(scheduler="threads"):
        return FalkonRegressor(n_centers=60, random_state=0).fit(Xd, yd)


def test_a_fit_from_a_dask_dataframe_keeps_its_names_and_fits_as_the_same_blocks(fitted, frames):
    X, y, _, _ = frames
    assert isinstance(fitted.feature_names_in_, np.ndarray) and list(fitted.feature_names_in_) == NAMES
    blocks = ROWS // PARTS
    with dask.config.set(scheduler="threads"):
        same = FalkonRegressor(n_centers=60, random_state=0).fit(
            da.from_array(X.to_numpy(), chunks=(blocks, 3)), da.from_array(y.to_numpy(), chunks=blocks))
    # The same centers and row blocks: both fits stop where CG's relative residual is below tol,
    # so their predictions agree within tol * |y| (the standardising means differ by an ulp, and
    # the ill-conditioned coef_ at penalty 1e-6 amplifies that; the predictions do not).
    np.testing.assert_array_equal(fitted.center_indices_, same.center_indices_)
    scale = fitted.tol * np.linalg.norm(y.to_numpy()) / np.sqrt(ROWS)
    np.testing.assert_allclose(fitted.predict(X), same.predict(X.to_numpy()), rtol=0, atol=scale)


def test_predict_on_a_dask_dataframe_stays_lazy_and_matches_pandas(fitted, frames):
    X, y, Xd, _ = frames
    with_std = FalkonRegressor(n_centers=60, random_state=0, compute_std=True).fit(X, y)
    with dask.config.set(scheduler=_refuse_compute):
        lazy = fitted.predict(Xd)
        mean, std = with_std.predict(Xd, return_std=True)
    assert isinstance(lazy, da.Array) and lazy.numblocks == (PARTS,)
    assert isinstance(mean, da.Array) and isinstance(std, da.Array)
    # The same kernel rows times the same coefficients: only the BLAS summation order may differ.
    np.testing.assert_allclose(lazy.compute(scheduler="threads"), fitted.predict(X), rtol=1e-12, atol=1e-12)
    assert np.all(std.compute(scheduler="threads") > 0)


def test_other_columns_are_refused_naming_them(fitted, frames):
    _, _, Xd, _ = frames
    with pytest.raises(ValueError, match="unseen at fit time:\n- salary\n") as info:
        fitted.predict(Xd.rename(columns={"income": "salary"}))
    assert "seen at fit time, yet now missing:\n- income\n" in str(info.value)
    with pytest.raises(ValueError, match="column 0 is 'rooms', was 'age'"):
        fitted.predict(Xd[["rooms", "income", "age"]])
    with pytest.raises(ValueError, match="yet now missing:\n- rooms\n"):
        fitted.predict(Xd[["age", "income"]])


def test_a_model_fitted_without_names_warns_on_a_dask_dataframe(frames):
    X, y, Xd, _ = frames
    plain = FalkonRegressor(n_centers=30, random_state=0).fit(X.to_numpy(), y.to_numpy())
    with pytest.warns(UserWarning, match="X has feature names, but FalkonRegressor was fitted without"):
        plain.predict(Xd)


def test_a_classifier_and_a_transformer_keep_dask_dataframe_names(frames):
    X, y, Xd, _ = frames
    labels = dd.from_pandas(pd.Series((y > 0).astype(int), name="label"), npartitions=PARTS)
    with dask.config.set(scheduler="threads"):
        clf = FalkonClassifier(n_centers=40, random_state=0).fit(Xd, labels)
        pca = NystromKernelPCA(n_components=2, n_centers=40, random_state=0).fit(Xd)
    assert list(clf.feature_names_in_) == NAMES and list(pca.feature_names_in_) == NAMES
    with dask.config.set(scheduler=_refuse_compute):
        assert isinstance(clf.predict(Xd), da.Array) and isinstance(pca.transform(Xd), da.Array)
    with pytest.raises(ValueError, match="unseen at fit time:\n- salary\n"):
        pca.transform(Xd.rename(columns={"income": "salary"}))


def test_a_non_numeric_column_is_refused_before_any_pass(frames):
    X, y, _, _ = frames
    text = dd.from_pandas(X.assign(city="x"), npartitions=PARTS)
    with pytest.raises(TypeError, match="X"):
        FalkonRegressor(n_centers=30).fit(text, y.to_numpy())


def test_the_online_model_keeps_dask_dataframe_names_and_checks_them_on_the_next_batch(frames):
    X, y, _, _ = frames
    half = ROWS // 2
    model = OnlineKernelRidge(batch_size=100).fit(dd.from_pandas(X, npartitions=2), da.from_array(y.to_numpy(), half))
    assert list(model.feature_names_in_) == NAMES
    reordered = dd.from_pandas(X[NAMES[::-1]], npartitions=2)
    with pytest.raises(ValueError, match="same order"):
        model.partial_fit(reordered, da.from_array(y.to_numpy(), half))
    # A refit on unnamed lazy input keeps no names from the earlier fit.
    model.fit(da.from_array(X.to_numpy(), chunks=(half, -1)), da.from_array(y.to_numpy(), half))
    assert not hasattr(model, "feature_names_in_")
