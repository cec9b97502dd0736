"""Estimators on in-memory and dask input: exactness, scikit-learn protocol, persistence."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.kernel_ridge import KernelRidge
from sklearn.model_selection import GridSearchCV

import daskkrr
from daskkrr import ExactKernelRidge, FalkonClassifier, FalkonRegressor, NystromRegressor


def test_all_points_as_centers_equals_exact_krr():
    rng = np.random.default_rng(0)
    n, sigma, lam = 500, 1.5, 1e-4
    X = rng.normal(size=(n, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    Xt = rng.normal(size=(300, 4))
    ref = KernelRidge(alpha=lam * n, kernel="rbf", gamma=1 / (2 * sigma**2)).fit(X, y)
    model = FalkonRegressor(sigma=sigma, penalty=lam, n_centers=n, max_iter=50, tol=1e-9,
                            standardize=False, random_state=0, fit_intercept=False).fit(X, y)
    assert model.converged_
    expected = ref.predict(Xt)
    assert np.linalg.norm(model.predict(Xt) - expected) <= 1e-6 * np.linalg.norm(expected)
    # every training point is a center: the fitted coefficients are KernelRidge's dual ones
    order = np.argsort(model.center_indices_)
    np.testing.assert_array_equal(model.center_indices_[order], np.arange(n))
    exact = ExactKernelRidge(sigma=sigma, penalty=lam, standardize=False).fit(X, y)
    np.testing.assert_allclose(exact.coef_, ref.dual_coef_, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kernel,params", [("laplacian", {}), ("matern", {"nu": 2.5}),
                                           ("polynomial", {"degree": 2, "gamma": 0.2})])
def test_other_kernels_match_sklearn_exact(kernel, params):
    from sklearn.metrics import pairwise

    rng = np.random.default_rng(1)
    n, lam = 300, 1e-3
    X = rng.normal(size=(n, 3))
    y = np.cos(X[:, 0]) + X[:, 1]
    sigma = None if kernel == "polynomial" else 2.0
    model = FalkonRegressor(kernel=kernel, sigma=sigma, kernel_params=params, penalty=lam, n_centers=n,
                            max_iter=100, tol=1e-10, standardize=False, random_state=0,
                            fit_intercept=False).fit(X, y)
    exact = ExactKernelRidge(kernel=kernel, sigma=sigma, kernel_params=params, penalty=lam,
                             standardize=False).fit(X, y)
    Xt = rng.normal(size=(50, 3))
    np.testing.assert_allclose(model.predict(Xt), exact.predict(Xt), rtol=1e-5, atol=1e-5)
    if kernel == "polynomial":
        K = pairwise.polynomial_kernel(X, X, degree=2, gamma=0.2, coef0=1.0)
        ref = KernelRidge(alpha=lam * n, kernel="precomputed").fit(K, y)
        Kt = pairwise.polynomial_kernel(Xt, X, degree=2, gamma=0.2, coef0=1.0)
        np.testing.assert_allclose(exact.predict(Xt), ref.predict(Kt), rtol=1e-8, atol=1e-8)


def test_falkon_matches_direct_nystrom_at_20000():
    rng = np.random.default_rng(3)
    n = 20_000
    X = rng.uniform(-1, 1, size=(n, 5))
    y = np.sin(3 * X[:, 0]) * X[:, 1] + X[:, 2] ** 2 + 0.1 * rng.normal(size=n)
    common = dict(sigma=0.5, penalty=1e-5, n_centers=500, random_state=7, chunks=4000)
    direct = NystromRegressor(**common).fit(X, y)
    falkon = FalkonRegressor(**common, max_iter=30, tol=1e-10).fit(X, y)
    np.testing.assert_array_equal(falkon.center_indices_, direct.center_indices_)
    rel = np.linalg.norm(falkon.coef_ - direct.coef_) / np.linalg.norm(direct.coef_)
    assert rel <= 1e-5, rel
    assert falkon.n_iter_ <= 30
    res = falkon.residuals_[:, 0]
    assert res[-1] < 1e-5 * res[0]
    # the residual falls (CG's residual need not fall at every single step)
    assert np.all(np.diff(np.minimum.accumulate(res)[::5]) < 0)


def test_sklearn_protocol_clone_and_gridsearch(regression_data):
    X, y = regression_data
    est = FalkonRegressor(n_centers=100, penalty=1e-4, random_state=0)
    assert clone(est).get_params() == est.get_params()
    est.set_params(penalty=1e-3)
    assert est.penalty == 1e-3 and not hasattr(est, "coef_")
    grid = GridSearchCV(FalkonRegressor(n_centers=100, random_state=0), {"penalty": [1e-2, 1e-6]}, cv=3)
    grid.fit(X, y)
    assert grid.best_params_ == {"penalty": 1e-6}
    assert grid.best_score_ > 0.9


def test_predict_numpy_and_dask(regression_data):
    X, y = regression_data
    model = FalkonRegressor(n_centers=150, penalty=1e-5, random_state=0).fit(X, y)
    p_np = model.predict(X)
    assert isinstance(p_np, np.ndarray) and p_np.shape == (1200,)
    p_da = model.predict(da.from_array(X, chunks=250))
    assert isinstance(p_da, da.Array) and p_da.chunks[0] == (250, 250, 250, 250, 200)
    np.testing.assert_allclose(p_da.compute(), p_np, rtol=1e-12, atol=1e-12)
    assert model.score(X, y) > 0.95
    assert model.score(da.from_array(X, chunks=300), da.from_array(y, chunks=300)) == pytest.approx(
        model.score(X, y), rel=1e-10)


def test_multi_target_regression(regression_data):
    X, y = regression_data
    Y = np.column_stack([y, -2 * y + 1])
    model = FalkonRegressor(n_centers=100, penalty=1e-3, random_state=0, tol=1e-9, max_iter=40).fit(X, Y)
    assert model.converged_ and model.coef_.shape == (100, 2)
    P = model.predict(X)
    np.testing.assert_allclose(P[:, 1], -2 * P[:, 0] + 1, atol=1e-5)


def test_classifier_binary_and_multiclass():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(900, 2))
    radius = np.hypot(X[:, 0], X[:, 1])
    y3 = np.digitize(radius, [0.8, 1.5])  # rings: not linearly separable
    clf = FalkonClassifier(n_centers=200, penalty=1e-5, random_state=0).fit(X, y3)
    assert list(clf.classes_) == [0, 1, 2] and clf.coef_.shape == (200, 3)
    assert clf.score(X, y3) > 0.9
    assert clf.decision_function(X).shape == (900, 3)
    labels = np.where(radius > 1.0, "out", "in")
    clf2 = FalkonClassifier(n_centers=200, penalty=1e-5, random_state=0).fit(X, labels)
    assert clf2.score(X, labels) > 0.9
    d = clf2.decision_function(X)
    assert d.shape == (900,)
    np.testing.assert_array_equal(clf2.predict(X), np.where(d > 0, "out", "in"))
    lazy = clf2.predict(da.from_array(X, chunks=300))
    np.testing.assert_array_equal(lazy.compute(), clf2.predict(X))


def test_save_load_round_trip(tmp_path, regression_data):
    X, y = regression_data
    model = FalkonRegressor(kernel="matern", kernel_params={"nu": 1.5}, n_centers=80, random_state=0).fit(X, y)
    path = model.save(tmp_path / "model")
    again = daskkrr.load(path)
    assert type(again) is FalkonRegressor and again.kernel_ == model.kernel_
    np.testing.assert_array_equal(again.predict(X), model.predict(X))
    with pytest.raises(FileExistsError, match="overwrite"):
        model.save(path)
    model.save(path, overwrite=True)
    clf = FalkonClassifier(n_centers=50, random_state=0).fit(X, np.where(y > 0, "a", "b"))
    clf.save(tmp_path / "clf")
    again = daskkrr.load(tmp_path / "clf")
    np.testing.assert_array_equal(again.predict(X), clf.predict(X))


def test_random_state_reproducible_and_chunk_independent(regression_data):
    X, y = regression_data
    # A converged solve: round-off differences from the summation order stay round-off.
    params = dict(n_centers=100, penalty=1e-3, tol=1e-11, max_iter=60, random_state=5)
    a = FalkonRegressor(chunks=200, **params).fit(X, y)
    b = FalkonRegressor(chunks=1200, **params).fit(X, y)
    assert a.converged_ and b.converged_
    np.testing.assert_array_equal(a.center_indices_, b.center_indices_)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-8, atol=1e-10)


def test_parameter_errors(regression_data):
    X, y = regression_data
    with pytest.raises(ValueError, match=r"penalty must be a float in the range \(0.0, inf\); got 0"):
        FalkonRegressor(penalty=0).fit(X, y)
    with pytest.warns(UserWarning, match="n_centers=5000 is larger than the number of training rows"):
        assert FalkonRegressor(n_centers=5000, max_iter=2).fit(X, y).n_centers_ == len(X)
    with pytest.raises(ValueError, match="unknown kernel"):
        FalkonRegressor(kernel="nope", n_centers=10).fit(X, y)
    with pytest.raises(ValueError, match="sampler must be one of 'bless', 'disqueak', 'rls', 'rpcholesky', 'squeak', "
                       "'uniform'"):
        FalkonRegressor(sampler="nope", n_centers=10).fit(X, y)
    with pytest.raises(TypeError, match=r"n_centers must be an int in the range \[1, inf\); got 10.5"):
        FalkonRegressor(n_centers=10.5).fit(X, y)
    model = FalkonRegressor(n_centers=10, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but FalkonRegressor is expecting 4 features"):
        model.predict(X[:, :3])
    with pytest.raises(NotFittedError, match="not fitted"):
        FalkonRegressor().predict(X)
