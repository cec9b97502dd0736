"""Per-feature length scales (ARD): ``sigma`` a vector of length d for the stationary kernels.

A stationary kernel with length scales ``s`` is the isotropic one (sigma = 1) on ``X / s``;
so is every estimator, engine and sampler with such a kernel.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel

from daskkrr import ExactKernelRidge, FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.config import build_estimator, read_config
from daskkrr.kernels import engine_for, kernel_from_dict, make_kernel
from daskkrr.models import load_model
from daskkrr.models.kernel_model import ParameterError

SCALES = np.array([0.5, 2.0, 4.0])
STATIONARY = [("gaussian", {}), ("laplacian", {}), ("matern", {"nu": 0.5}), ("matern", {"nu": 1.5}),
              ("matern", {"nu": 2.5})]


def _data(seed: int = 0, n: int = 300):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * [1.0, 3.0, 5.0]
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.normal(size=n)
    return X, y


@pytest.mark.parametrize("name, params", STATIONARY)
def test_kernel_with_length_scales_is_the_isotropic_kernel_on_scaled_inputs(name, params):
    X, _ = _data()
    Z = X[:40]
    ard = make_kernel(name, sigma=SCALES, **params)
    iso = make_kernel(name, sigma=1.0, **params)
    assert ard.sigma == tuple(SCALES) and ard.is_ard and not iso.is_ard
    np.testing.assert_allclose(ard(X, Z), iso(X / SCALES, Z / SCALES), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(ard.diag(X), np.ones(len(X)))
    rng = np.random.default_rng(1)
    U, V = rng.normal(size=(40, 2)), rng.normal(size=(len(X), 2))
    ref = iso(X / SCALES, Z / SCALES)
    for engine in ("numpy", "fused"):
        e = engine_for(ard, engine)
        for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
            Xd, Zd = X.astype(dtype), Z.astype(dtype)
            scale = np.abs(ref.T @ ref).max()
            np.testing.assert_allclose(e.matvec(ard, Xd, Zd, U), ref @ U, rtol=tol, atol=tol)
            np.testing.assert_allclose(e.gram_matvec(ard, Xd, Zd, U), ref.T @ (ref @ U), rtol=tol, atol=tol * scale)
            np.testing.assert_allclose(e.t_matvec(ard, Xd, Zd, V), ref.T @ V, rtol=tol, atol=tol * scale)
            np.testing.assert_allclose(e.kernel_block(ard, Xd, Zd), ref, rtol=tol, atol=tol)
            np.testing.assert_allclose(e.gram_and_rhs(ard, Xd, V, Zd), np.c_[ref.T @ ref, ref.T @ V], rtol=tol,
                                       atol=tol * scale)
    # JSON round trip, equality and hashing (the kernel is a frozen dataclass).
    back = kernel_from_dict(ard.to_dict())
    assert back == ard and hash(back) == hash(ard)
    # Equal length scales are the scalar kernel.
    np.testing.assert_allclose(make_kernel(name, sigma=[2.0] * 3, **params)(X, Z),
                               make_kernel(name, sigma=2.0, **params)(X, Z), rtol=1e-12)


def test_kernel_refuses_bad_length_scales():
    X, _ = _data()
    with pytest.raises(ValueError, match="must be > 0"):
        make_kernel("gaussian", sigma=[1.0, -1.0, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        make_kernel("laplacian", sigma=[[1.0, 2.0]])
    with pytest.raises(ValueError, match="finite"):
        make_kernel("matern", sigma=[1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="has 2 length scales .* vector of length d=3"):
        make_kernel("gaussian", sigma=[1.0, 2.0])(X, X)
    with pytest.raises(ValueError, match="does not take parameter"):
        make_kernel("polynomial", sigma=[1.0, 2.0])


def _fit_pair(make, X, y):
    """The ARD model on X and the isotropic one on X / SCALES (raw features: no standardisation)."""
    ard = make(sigma=SCALES).fit(X, y)
    iso = make(sigma=1.0).fit(X / SCALES, y)
    return ard, iso


ESTIMATORS = {
    "falkon": lambda **p: FalkonRegressor(n_centers=50, standardize=False, random_state=0, tol=1e-10, max_iter=200,
                                          **p),
    "nystrom": lambda **p: NystromRegressor(n_centers=50, standardize=False, random_state=0, **p),
    "exact": lambda **p: ExactKernelRidge(standardize=False, **p),
    "classifier": lambda **p: FalkonClassifier(n_centers=50, standardize=False, random_state=0, tol=1e-10,
                                               max_iter=200, **p),
}


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_every_estimator_with_ard_is_the_isotropic_one_on_scaled_columns(estimator):
    X, y = _data()
    if estimator == "classifier":
        y = (y > 0).astype(int)
    ard, iso = _fit_pair(lambda **p: ESTIMATORS[estimator](penalty=1e-3, **p), X, y)
    assert ard.kernel_.sigma == tuple(SCALES)
    np.testing.assert_allclose(ard.centers_, iso.centers_ * SCALES, rtol=1e-12)
    out = "decision_function" if estimator == "classifier" else "predict"
    np.testing.assert_allclose(getattr(ard, out)(X), getattr(iso, out)(X / SCALES), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("name, params", STATIONARY[1:])
def test_every_stationary_kernel_through_the_direct_solve(name, params):
    X, y = _data(1)
    make = ESTIMATORS["nystrom"]
    ard, iso = _fit_pair(lambda **p: make(kernel=name, kernel_params=params or None, penalty=1e-3, **p), X, y)
    np.testing.assert_allclose(ard.predict(X), iso.predict(X / SCALES), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("sampler", ["rls", "bless", "squeak", "disqueak"])
def test_leverage_score_samplers_choose_the_same_centers(sampler):
    X, y = _data(2, n=400)
    ard, iso = _fit_pair(lambda **p: NystromRegressor(n_centers=30, sampler=sampler, standardize=False, penalty=1e-3,
                                                      random_state=0, **p), X, y)
    np.testing.assert_array_equal(ard.center_indices_, iso.center_indices_)
    np.testing.assert_allclose(ard.center_weights_, iso.center_weights_, rtol=1e-9)
    np.testing.assert_allclose(ard.predict(X), iso.predict(X / SCALES), rtol=1e-7, atol=1e-8)


def test_equal_length_scales_equal_the_scalar_sigma():
    X, y = _data(3)
    vector = FalkonRegressor(n_centers=40, sigma=[1.5] * 3, random_state=0, tol=1e-10, max_iter=200).fit(X, y)
    scalar = FalkonRegressor(n_centers=40, sigma=1.5, random_state=0, tol=1e-10, max_iter=200).fit(X, y)
    np.testing.assert_allclose(vector.predict(X), scalar.predict(X), rtol=1e-7, atol=1e-9)


def test_ard_exact_gp_std_equals_sklearn_anisotropic_rbf():
    X, y = _data(4, n=120)
    n, pen = len(X), 1e-3
    model = ExactKernelRidge(sigma=SCALES, penalty=pen, standardize=False, compute_std=True).fit(X, y)
    s2 = float(model.posterior_.prior_variance[0])
    gp = GaussianProcessRegressor(ConstantKernel(s2, "fixed") * RBF(SCALES, "fixed"), alpha=s2 * pen * n,
                                  optimizer=None).fit(X, y)
    Xt = _data(5, n=40)[0]
    np.testing.assert_allclose(model.predict(Xt, return_std=True)[1], gp.predict(Xt, return_std=True)[1], rtol=1e-6)


def test_save_load_set_params_and_clone_keep_the_vector(tmp_path):
    X, y = _data(6)
    model = NystromRegressor(n_centers=30, random_state=0)
    model.set_params(sigma=np.array([1.0, 2.0, 3.0]))  # as a tuner sets it
    copy = clone(model)
    np.testing.assert_array_equal(copy.sigma, [1.0, 2.0, 3.0])
    model.fit(X, y)
    loaded = load_model(model.save(tmp_path / "m"))
    assert loaded.kernel_ == model.kernel_ and loaded.kernel_.sigma == (1.0, 2.0, 3.0)
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    np.testing.assert_array_equal(loaded.get_params()["sigma"], [1.0, 2.0, 3.0])


def test_wrong_length_and_dot_product_kernels_are_refused_before_any_pass():
    X, y = _data(7)
    for model in (FalkonRegressor(sigma=[1.0, 2.0]), ExactKernelRidge(sigma=[1.0, 2.0, 3.0, 4.0])):
        with pytest.raises(ParameterError, match=r"sigma has \d length scales but X has d=3 features"):
            model.fit(X, y)
    with pytest.raises(ValueError, match="kernel 'polynomial' takes no sigma .per-feature"):
        FalkonRegressor(kernel="polynomial", sigma=[1.0, 2.0, 3.0]).fit(X, y)
    for bad in ([1.0, 0.0, 2.0], [[1.0, 2.0, 3.0]], [], {"a": 1}):
        with pytest.raises(ParameterError, match="sigma must be"):
            NystromRegressor(sigma=bad).fit(X, y)


def test_toml_list_and_comma_flag_set_a_vector_sigma(tmp_path):
    from daskkrr.cli import _parser

    path = tmp_path / "m.toml"
    path.write_text('[model]\nestimator = "nystrom"\nsigma = [1, 2.5, 3]\n')
    config = read_config(path)
    assert config["sigma"] == [1, 2.5, 3]
    assert build_estimator(config).sigma == [1, 2.5, 3]
    args = _parser().parse_args(["fit", "--data", "d", "--out", "o", "--sigma", "1,2.5,3"])
    assert args.sigma == [1.0, 2.5, 3.0]
    assert _parser().parse_args(["fit", "--data", "d", "--out", "o", "--sigma", "2"]).sigma == 2
    path.write_text('[model]\nsigma = [1, "x"]\n')
    with pytest.raises(Exception, match="sigma must be"):
        read_config(path)


def test_isotropic_kernel_keeps_its_scalar():
    k = make_kernel("gaussian", sigma=2.0)
    assert k.sigma == 2.0 and dataclasses.asdict(k) == {"sigma": 2.0}
