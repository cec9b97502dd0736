"""Numerical robustness on awkward real and synthetic data: duplicated rows (kddcup is 70%
duplicates), constant columns (201_pol), extreme sigma, a penalty near zero. The fits end
without NaN; a Cholesky that needs more jitter says so (JitterWarning); a problem that is
singular for all practical purposes raises an error that says what to change."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import ConvergenceWarning

from daskkrr import ExactKernelRidge, FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.solvers import JitterWarning, cholesky_jitter
from daskkrr.solvers.falkon import FLOAT32_RELATIVE_JITTER, FLOAT64_JITTER_TIMES_PENALTY, jitter_floor

from .conftest import shared_file


def _finite(model, X) -> None:
    assert np.all(np.isfinite(model.coef_)), "NaN/inf coefficients"
    assert np.all(np.isfinite(model.centers_))
    pred = model.decision_function(X) if hasattr(model, "decision_function") else model.predict(X)
    assert np.all(np.isfinite(pred)), "NaN/inf predictions"


@pytest.fixture(scope="module")
def kddcup():
    """12 000 random rows of kddcup (about 60% of them duplicates of another row)."""
    frame = pd.read_csv(shared_file("kddcup.tsv.gz"), sep="\t")
    rng = np.random.default_rng(0)
    sub = frame.iloc[np.sort(rng.choice(len(frame), 12_000, replace=False))]
    X = sub.drop(columns="target").to_numpy(np.float64)
    return X, sub["target"].to_numpy()


@pytest.fixture(scope="module")
def pol():
    frame = pd.read_csv(shared_file("201_pol.tsv.gz"), sep="\t")
    return frame.drop(columns="target").to_numpy(np.float64), frame["target"].to_numpy(np.float64)


def test_kddcup_duplicated_rows(kddcup):
    X, y = kddcup
    assert pd.DataFrame(X).duplicated().mean() > 0.5
    train, test = slice(0, 9000), slice(9000, None)
    clf = FalkonClassifier(n_centers=300, penalty=1e-6, max_iter=15, random_state=0).fit(X[train], y[train])
    assert len(np.unique(clf.centers_, axis=0)) < 0.6 * len(clf.centers_)  # many centers are duplicates
    _finite(clf, X[test])
    majority = np.bincount(y[test]).max() / len(y[test])
    accuracy = clf.score(X[test], y[test])
    assert accuracy > majority + 0.15, (accuracy, majority)
    # the direct solve of the same problem copes with the duplicated centers too (round-off
    # below the penalty is clipped, with a warning) and agrees with FALKON's predictions
    classes = np.unique(y[train])
    Y = np.where(y[train, None] == classes[None, :], 1.0, -1.0)
    with pytest.warns(JitterWarning):
        direct = NystromRegressor(n_centers=300, penalty=1e-6, random_state=0).fit(X[train], Y)
    _finite(direct, X[test])
    agree = np.mean(classes[direct.predict(X[test]).argmax(axis=1)] == clf.predict(X[test]))
    assert agree > 0.97, agree


def test_constant_columns_of_201_pol(pol):
    X, y = pol
    constant = np.flatnonzero(X.std(axis=0) == 0)
    assert len(constant) >= 19
    model = FalkonRegressor(n_centers=500, penalty=1e-6, max_iter=20, random_state=0).fit(X[:10_000], y[:10_000])
    np.testing.assert_array_equal(model.scaler_.scale_[constant], 1.0)  # no division by zero
    _finite(model, X[10_000:])
    assert model.score(X[10_000:], y[10_000:]) > 0.8
    raw = FalkonRegressor(n_centers=300, sigma=50.0, penalty=1e-6, max_iter=20, standardize=False,
                          random_state=0).fit(X[:10_000], y[:10_000])
    _finite(raw, X[10_000:])


@pytest.mark.parametrize("sigma", [1e-3, 1e4])
def test_extreme_sigma(pol, sigma):
    X, y = pol
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JitterWarning)  # allowed, not required
        model = FalkonRegressor(n_centers=300, sigma=sigma, penalty=1e-6, max_iter=10, random_state=0).fit(
            X[:6000], y[:6000])
    _finite(model, X[6000:8000])
    if sigma < 1:  # every point is far from every other: the kernel matrix is the identity
        np.testing.assert_allclose(model.predict(X[6000:6100]), model.intercept_[0], atol=1e-8)


def test_penalty_near_zero(pol):
    X, y = pol
    model = FalkonRegressor(n_centers=300, penalty=1e-14, max_iter=15, random_state=0).fit(X[:6000], y[:6000])
    _finite(model, X[6000:8000])  # barely regularised, so it overfits, but without NaN or inf
    assert np.all(np.isfinite(model.residuals_))
    direct = NystromRegressor(n_centers=300, penalty=1e-14, random_state=0).fit(X[:6000], y[:6000])
    _finite(direct, X[6000:8000])


def test_exact_krr_on_duplicated_rows():
    rng = np.random.default_rng(0)
    X = np.repeat(rng.normal(size=(100, 3)), 5, axis=0)  # every row five times
    y = np.sin(X[:, 0])
    model = ExactKernelRidge(sigma=1.0, penalty=1e-10).fit(X, y)
    _finite(model, X)
    assert model.score(X, y) > 0.999


def test_raw_features_far_from_the_origin_keep_their_distances():
    """Unstandardised features around 1e4 .. 1e12: the kernels shift both point sets by the
    centers' mean before the GEMM expansion, so K_MM needs no extra jitter and the fit is the
    one on the unshifted data. (Jitter escalation and the singular-problem error are tested on
    cholesky_jitter itself.)"""
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(2000, 3))
    y = np.sin(Z[:, 0])
    params = dict(n_centers=200, sigma=1.0, penalty=1e-6, standardize=False, random_state=0)
    plain = FalkonRegressor(**params).fit(Z, y)
    for offset in (1e4, 1e8, 1e12):
        with warnings.catch_warnings():
            warnings.simplefilter("error", JitterWarning)
            shifted = FalkonRegressor(**params).fit(Z + offset, y)
        assert shifted.jitter_ == pytest.approx(plain.jitter_)
        assert shifted.score(Z + offset, y) == pytest.approx(plain.score(Z, y), abs=1e-5)
    # standardisation (the default) makes the same data harmless too
    standardized = FalkonRegressor(**{**params, "standardize": True}).fit(Z + 1e8, y)
    assert standardized.score(Z + 1e8, y) == pytest.approx(
        FalkonRegressor(**{**params, "standardize": True}).fit(Z, y).score(Z, y), abs=1e-4)


def test_a_wide_kernel_with_a_tiny_penalty_still_converges_in_float64():
    """float64 products amplified by T^{-1} A^{-1} (both grow as the penalty falls) made CG stop
    after 4 iterations at relative residual 0.87 here, a model far from the Nystrom solution
    (1201_BNG_breastTumor's features, sigma = 2-8 sqrt(d), penalty <= 1e-9, showed it first).
    The float64 jitter floor grows as the penalty falls (jitter_floor) and bounds that growth."""
    rng = np.random.default_rng(0)
    n = 10000  # one continuous feature and eight with 2-18 values, like the PMLB set
    X = np.column_stack([rng.normal(50, 10, n)] + [rng.integers(0, k, n) for k in (3, 18, 2, 3, 2, 5, 2, 2)])
    y = 0.3 * X[:, 2] + 2 * X[:, 4] - 0.05 * X[:, 0] + np.sin(X[:, 0] / 5) + 3 * rng.standard_normal(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # 50 iterations do not reach tol=1e-4
        model = FalkonRegressor(n_centers=1000, sigma=16.0, penalty=1e-11, random_state=0).fit(X, y)
    assert model.n_iter_ >= 20 and model.residuals_[-1].max() < 0.02, (model.n_iter_, model.residuals_[-1])
    assert model.jitter_ >= jitter_floor(np.float64, 1e-11) * 1000 * 0.99  # K_MM's diagonal is 1


def test_the_float64_jitter_floor_grows_as_the_penalty_falls():
    eps = np.finfo(np.float64).eps
    assert jitter_floor(np.float64, 1e-2) == eps  # round-off where the penalty is large
    assert jitter_floor(np.float64, 1e-9) == pytest.approx(FLOAT64_JITTER_TIMES_PENALTY / 1e-9)
    assert jitter_floor(np.float64, 1e-11) == pytest.approx(100 * jitter_floor(np.float64, 1e-9))
    assert jitter_floor(np.float32, 1e-11) == FLOAT32_RELATIVE_JITTER
    with pytest.raises(ValueError, match="penalty must be > 0"):
        jitter_floor(np.float64, 0.0)


def test_degenerate_kernel_is_a_clear_error():
    X = np.ones((300, 3))  # constant features: standardised to zeros
    with pytest.raises(np.linalg.LinAlgError, match="non-positive mean diagonal .*use another kernel"):
        FalkonRegressor(kernel="linear", n_centers=20).fit(X, np.arange(300.0))
    # the Gaussian kernel on identical points is the constant model: the mean
    model = FalkonRegressor(n_centers=20).fit(X, np.arange(300.0))
    np.testing.assert_allclose(model.predict(X[:3]), 149.5)


def test_cholesky_jitter_unit():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(50, 50)))
    S = (Q * np.r_[np.ones(45), np.full(5, -1e-9)]) @ Q.T  # slightly indefinite
    with pytest.warns(JitterWarning, match=r"needed jitter"):
        T, jitter = cholesky_jitter(S, what="test matrix")
    assert 1e-9 < jitter <= 1e-2 and np.all(np.isfinite(T))
    np.testing.assert_allclose(T.T @ T, S + jitter * np.eye(50), atol=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="test matrix .* the problem is singular"):
        cholesky_jitter(np.diag([1.0, 1.0, -0.5]), what="test matrix")  # needs jitter > 1% of the diagonal
    with pytest.raises(np.linalg.LinAlgError, match="NaN or inf"):
        cholesky_jitter(np.full((2, 2), np.nan))
