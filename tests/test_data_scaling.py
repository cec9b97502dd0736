"""Standardizer: one-pass statistics, finiteness checks, transforms, serialisation."""

from __future__ import annotations

import json
import threading

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from daskkrr.data import Standardizer
from daskkrr.data.scaling import Moments, merge_moments


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(loc=[0.0, 5.0, -3.0, 100.0], scale=[1.0, 0.1, 7.0, 30.0], size=(1037, 4))
    y = rng.normal(size=1037) + 2.5
    return X, y


# Single-row blocks on both sides of a large one: merges of 1 with 1 row and of 1 with 997 rows (all
# 1037 rows in blocks of one were 1037 tasks, 2.3 s, for the same two merges).
@pytest.mark.parametrize("chunks", [1037, 100, (7, 4), (250, 1), ((1,) * 20 + (997,) + (1,) * 20, 4)])
def test_matches_numpy(data, chunks):
    X, y = data
    s = Standardizer().fit(da.from_array(X, chunks=chunks), da.from_array(y, chunks=50))
    np.testing.assert_allclose(s.mean_, X.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s.scale_, X.std(axis=0), rtol=1e-12, atol=1e-12)
    assert s.n_samples_ == 1037 and s.n_features_in_ == 4
    assert isinstance(s.y_mean_, float)
    assert s.y_mean_ == pytest.approx(y.mean(), rel=1e-12)


def test_large_offset_is_stable():
    rng = np.random.default_rng(1)
    X = 1e8 + rng.normal(size=(5000, 2))
    s = Standardizer().fit(da.from_array(X, chunks=333))
    np.testing.assert_allclose(s.scale_, X.std(axis=0), rtol=1e-7)


def test_numpy_and_integer_input(data):
    X, _ = data
    Xi = np.round(X * 10).astype(np.int64)
    s = Standardizer().fit(Xi)
    np.testing.assert_allclose(s.mean_, Xi.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(s.scale_, Xi.std(axis=0), rtol=1e-12)
    out = s.transform(Xi)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, (Xi - Xi.mean(0)) / Xi.std(0), atol=1e-12)


def test_two_dimensional_target_mean(data):
    X, y = data
    Y = np.column_stack([y, -2 * y])
    s = Standardizer().fit(da.from_array(X, chunks=300), da.from_array(Y, chunks=(111, 1)))
    np.testing.assert_allclose(s.y_mean_, Y.mean(axis=0), rtol=1e-12)
    assert s.y_mean_.shape == (2,)
    assert Standardizer().fit(X).y_mean_ is None


def test_constant_columns_get_unit_scale():
    X = np.column_stack([np.full(1000, 0.1), np.zeros(1000), np.full(1000, 3e7), np.arange(1000.0)])
    s = Standardizer().fit(da.from_array(X, chunks=77))
    np.testing.assert_array_equal(s.scale_[:3], [1.0, 1.0, 1.0])
    assert s.scale_[3] == pytest.approx(np.arange(1000.0).std(), rel=1e-12)
    Z = s.transform(X)
    assert np.all(np.isfinite(Z))
    np.testing.assert_allclose(Z[:, :3], 0.0, atol=1e-9)


def test_single_row():
    s = Standardizer().fit(np.array([[1.0, 2.0]]))
    np.testing.assert_array_equal(s.scale_, [1.0, 1.0])
    np.testing.assert_array_equal(s.transform(np.array([[1.0, 2.0]])), [[0.0, 0.0]])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_name_the_rows(bad):
    X = np.ones((3500, 3))
    X[2017, 1] = bad
    X[3100, 0] = bad
    with pytest.raises(
        ValueError,
        match=r"^X has NaN or inf in rows 2000-2999 \(block 2, first at row 2017\); "
        r"clean or impute them before fitting$",
    ):
        Standardizer().fit(da.from_array(X, chunks=(1000, 1)))


def test_non_finite_in_last_partial_block():
    X = np.ones((3500, 3))
    X[3499, 2] = np.nan
    with pytest.raises(ValueError, match=r"rows 3000-3499 \(block 3, first at row 3499\)"):
        Standardizer().fit(da.from_array(X, chunks=1000))


def test_non_finite_target_is_reported(data):
    X, y = data
    y = y.copy()
    y[555] = np.nan
    message = r"^y has NaN or inf in rows 500-599 \(block 5, first at row 555\)"
    with pytest.raises(ValueError, match=message):
        Standardizer().fit(da.from_array(X, chunks=100), y)


def test_fit_is_a_single_pass_over_the_blocks(data, monkeypatch):
    X, y = data
    loads = []
    lock = threading.Lock()

    def load(block, block_info=None):
        with lock:
            loads.append(block_info[0]["chunk-location"][0])
        return block

    Xd = da.from_array(X, chunks=(100, 4)).map_blocks(load, dtype=X.dtype)
    yd = da.from_array(y, chunks=100)
    computes = []
    compute = dask.compute

    def counting_compute(*args, **kwargs):
        computes.append(1)
        return compute(*args, **kwargs)

    monkeypatch.setattr(dask, "compute", counting_compute)
    Standardizer().fit(Xd, yd)
    assert len(computes) == 1
    assert sorted(loads) == list(range(11))  # each block read exactly once


def test_moments_merge_matches_direct(data):
    X, _ = data
    a, b = Moments.of(X[:300]), Moments.of(X[300:])
    merged = merge_moments(a, b)
    direct = Moments.of(X)
    assert merged.count == direct.count
    np.testing.assert_allclose(merged.mean, direct.mean, rtol=1e-13)
    np.testing.assert_allclose(merged.m2, direct.m2, rtol=1e-12)
    empty = Moments(0, np.zeros(4), np.zeros(4))
    assert merge_moments(empty, a) is a and merge_moments(a, empty) is a


def test_transform_is_lazy_and_inverts(data):
    X, _ = data
    Xd = da.from_array(X, chunks=(200, 4))
    s = Standardizer().fit(Xd)
    Z = s.transform(Xd)
    assert isinstance(Z, da.Array) and Z.chunks == Xd.chunks
    Zc = Z.compute()
    np.testing.assert_allclose(Zc.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Zc.std(axis=0), 1.0, rtol=1e-12)
    back = s.inverse_transform(Z)
    assert isinstance(back, da.Array)
    np.testing.assert_allclose(back.compute(), X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s.inverse_transform(s.transform(X)), X, rtol=1e-12, atol=1e-12)


def test_float32_is_preserved(data):
    X, _ = data
    X32 = X.astype(np.float32)
    s = Standardizer().fit(X32)
    assert s.mean_.dtype == np.float64
    assert s.transform(X32).dtype == np.float32
    assert s.transform(da.from_array(X32)).dtype == np.float32


@pytest.mark.parametrize(("with_mean", "with_std"), [(False, True), (True, False), (False, False)])
def test_with_mean_with_std(data, with_mean, with_std):
    X, _ = data
    s = Standardizer(with_mean=with_mean, with_std=with_std).fit(X)
    assert (s.mean_ is None) == (not with_mean)
    assert (s.scale_ is None) == (not with_std)
    expected = (X - (X.mean(0) if with_mean else 0)) / (X.std(0) if with_std else 1)
    np.testing.assert_allclose(s.transform(X), expected, rtol=1e-12, atol=1e-12)


def test_feature_count_mismatch(data):
    X, _ = data
    s = Standardizer().fit(X)
    message = "X has 3 features but this Standardizer was fitted with 4$"
    with pytest.raises(ValueError, match=message):
        s.transform(X[:, :3])


def test_not_fitted():
    with pytest.raises(NotFittedError, match="call fit"):
        Standardizer().transform(np.ones((2, 2)))
    with pytest.raises(NotFittedError):
        Standardizer().to_dict()


def test_fit_validates_inputs(data):
    X, y = data
    with pytest.raises(ValueError, match="y has 10 rows but X has 1037"):
        Standardizer().fit(X, y[:10])
    with pytest.raises(TypeError, match="X has dtype object"):
        Standardizer().fit(np.array([["a"]], dtype=object))


def test_dict_round_trip_is_json_ready(data):
    X, y = data
    s = Standardizer().fit(X, np.column_stack([y, y]))
    state = json.loads(json.dumps(s.to_dict()))
    assert state["n_samples"] == 1037 and state["n_features"] == 4
    assert all(isinstance(v, float) for v in state["mean"] + state["scale"] + state["y_mean"])
    t = Standardizer.from_dict(state)
    np.testing.assert_array_equal(t.mean_, s.mean_)
    np.testing.assert_array_equal(t.scale_, s.scale_)
    np.testing.assert_array_equal(t.y_mean_, s.y_mean_)
    np.testing.assert_array_equal(t.transform(X), s.transform(X))
    partial = Standardizer(with_mean=False).fit(X, y).to_dict()
    assert partial["mean"] is None and isinstance(partial["y_mean"], float)
    assert Standardizer.from_dict(json.loads(json.dumps(partial))).mean_ is None


def test_from_dict_rejects_bad_state(data):
    X, _ = data
    state = Standardizer().fit(X).to_dict()
    with pytest.raises(KeyError, match=r"missing keys \['scale'\]"):
        Standardizer.from_dict({k: v for k, v in state.items() if k != "scale"})
    with pytest.raises(ValueError, match=r"mean has shape \(3,\), expected \(4,\)"):
        Standardizer.from_dict({**state, "mean": state["mean"][:3]})


def test_sklearn_protocol():
    s = Standardizer(with_mean=False)
    assert s.get_params() == {"with_mean": False, "with_std": True}
    assert clone(s).get_params() == s.get_params()
    out = s.fit_transform(np.array([[1.0], [3.0]]))
    np.testing.assert_allclose(out, [[1.0], [3.0]])
