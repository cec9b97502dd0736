"""The fast predictive variance (``std_method="auto"``/``"fast"``): a rank-``r`` factor in the training rows' metric.

What it promises (daskkrr.solvers.variance, module docstring): the fast variance is never below the exact
Nystrom posterior variance, the mean of the difference over rows drawn like the training rows is
``bound`` (exactly, over the training rows themselves), and ``bound <= FAST_STD_RTOL * mean variance``.
"""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from daskkrr import FalkonRegressor, NystromRegressor
from daskkrr.kernels.engine import engine_for
from daskkrr.models import load_model
from daskkrr.models.persistence import ModelFileError
from daskkrr.pipeline.posterior import _accurate_at_centers
from daskkrr.solvers.variance import FAST_STD_RTOL, fast_rank_cap, low_rank_variance

EPS = np.finfo(np.float64).eps


def _data(seed: int, n: int, d: int = 2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 2 + 0.3 * rng.normal(size=n)
    return X, y


def _unit_variances(model, X):
    """Exact and fast ``v(x)`` (unit prior variance) at the rows ``X``."""
    Xs = model.scaler_.transform(X)
    K = engine_for(model.kernel_).kernel_block(model.kernel_, Xs, model.centers_)
    kxx = model.kernel_.diag(Xs)
    post = model.posterior_
    return post.unit_variance(K, kxx, exact=True), post.unit_variance(K, kxx), kxx


# "fast": at the default penalty the miss's amplitude is below s^2 (rho < 1), and the factor then keeps the
# directions where P exceeds rho whole (its negative part), above the rank cap of "auto" on these sets.
@pytest.mark.parametrize("make", [
    lambda: NystromRegressor(n_centers=200, compute_std=True, random_state=0, std_method="fast"),
    lambda: NystromRegressor(n_centers=200, compute_std=True, random_state=0, fit_intercept=False,
                             std_method="fast"),
    lambda: FalkonRegressor(n_centers=200, compute_std=True, random_state=0, strategy="recompute",
                            std_method="fast"),
    lambda: NystromRegressor(n_centers=8, kernel="polynomial", kernel_params={"degree": 3}, compute_std=True,
                             random_state=0, std_method="fast"),  # k(x, x) varies: its mean comes from a pass
    lambda: NystromRegressor(n_centers=200, compute_std=True, random_state=0, penalty=1e-2),  # rho >= 1: "auto"
], ids=["nystrom", "no-intercept", "falkon", "polynomial", "rho-above-1"])
def test_mean_error_is_the_bound_on_training_rows_and_within_it_on_held_out_rows(make):
    X, y = _data(0, 3000)
    n = 2000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "fast" past the rank cap says so
        model = make().fit(X[:n], y[:n])
    low = model.posterior_.low_rank
    assert low is not None and 0 < low.rank
    assert low.bound <= FAST_STD_RTOL * low.mean_variance
    # Round-off of one variance, k(x, x) - ||c||^2 + ... with ||c||^2 <= k(x, x) and c = T^{-T} D k(x, Z):
    # the triangular solve's forward error is at most about eps cond(T) of c (first order), so
    # eps cond(T) k(x, x) bounds both paths' errors (the fast one's product is no worse: it is checked at
    # the centers at fit time).
    exact, fast, kxx = _unit_variances(model, X[:n])
    noise = EPS * np.linalg.cond(model.posterior_.factor) * np.max(kxx)
    # Over the training rows the identities are exact: E[v] = E[k(x, x)] - tr(QS) - m'Pm + offset and
    # E[v_r - v] = tr((Q - Q_r) S) = sum_{i > r} lambda_i(H) (a Cholesky jitter of S only raises the bound).
    assert np.mean(exact) == pytest.approx(low.mean_variance, rel=1e-6, abs=noise)
    assert np.mean(fast - exact) <= low.bound + noise
    assert np.mean(fast - exact) == pytest.approx(low.bound, abs=noise)
    assert np.all(fast >= exact - noise)  # conservative row by row (Q - Q_r is PSD)
    # Held-out rows from the same distribution: the mean error's expectation is the bound; its sampling
    # SD is sd / sqrt(rows) (CLT), and 4 of them leave a 3e-5 chance of a false failure.
    exact, fast, _ = _unit_variances(model, X[n:])
    err = fast - exact
    assert np.all(err >= -noise)
    assert np.mean(err) <= low.bound + 4 * np.std(err) / np.sqrt(len(err)) + noise
    print(f"rank {low.rank}, bound/mean variance {low.bound / low.mean_variance:.3f}, held-out mean error "
          f"{np.mean(err) / np.mean(exact):.3f} of the mean variance, largest relative error {np.max(err / exact):.3f}")


def test_std_method_exact_keeps_the_exact_path_and_fast_models_can_ask_for_it():
    X, y = _data(1, 1500)
    params = {"n_centers": 100, "compute_std": True, "random_state": 0}
    exact_model = NystromRegressor(std_method="exact", **params).fit(X, y)
    assert exact_model.posterior_.low_rank is None and exact_model.posterior_.fast_variance_bound is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "fast" past the rank cap says so
        fast_model = NystromRegressor(std_method="fast", **params).fit(X, y)
    Xt = _data(2, 300)[0]
    exact_std = exact_model.predict(Xt, return_std=True)[1]
    fast_std = fast_model.predict(Xt, return_std=True)[1]
    # The fast std is never below the exact one (up to the round-off of sqrt(64 eps) of the prior std).
    prior_sd = np.sqrt(fast_model.posterior_.prior_variance[0])
    assert np.all(fast_std >= exact_std - np.sqrt(64 * EPS) * prior_sd) and np.any(fast_std > exact_std)
    fast_model.set_params(std_method="exact")  # the same fit, the exact path: the same arithmetic
    np.testing.assert_array_equal(fast_model.predict(Xt, return_std=True)[1], exact_std)
    # the bound per target, in squared units of y
    np.testing.assert_allclose(exact_model.posterior_.noise_variance, fast_model.posterior_.noise_variance)
    bound = fast_model.posterior_.fast_variance_bound
    assert bound.shape == (1,) and 0 < bound[0] <= FAST_STD_RTOL * fast_model.posterior_.low_rank.mean_variance * (
        fast_model.posterior_.prior_variance[0])


def test_auto_stays_exact_past_the_rank_cap_and_fast_warns_and_keeps_its_bound():
    # 10 features, 300 centers: the kernel's spectrum decays slowly, the rank needed is far above the cap (80)
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, size=(3000, 10))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=3000)
    params = {"n_centers": 300, "compute_std": True, "random_state": 0}
    assert NystromRegressor(**params).fit(X, y).posterior_.low_rank is None
    with pytest.warns(UserWarning, match=r"needs rank \d+ of 300 .* above 80"):
        model = NystromRegressor(std_method="fast", **params).fit(X, y)
    low = model.posterior_.low_rank
    assert fast_rank_cap(10) < low.rank <= 300 and low.bound <= FAST_STD_RTOL * low.mean_variance


def test_save_load_keeps_the_fast_variance_and_refuses_a_factor_of_the_wrong_shape(tmp_path):
    X, y = _data(4, 1500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "fast" past the rank cap says so
        model = NystromRegressor(n_centers=100, compute_std=True, random_state=0, std_method="fast").fit(X, y)
    path = model.save(tmp_path / "fast")
    loaded = load_model(path)
    for name in ("factor", "linear", "negative"):
        np.testing.assert_array_equal(getattr(loaded.posterior_.low_rank, name), getattr(model.posterior_.low_rank,
                                                                                           name))
    assert loaded.posterior_.low_rank.bound == model.posterior_.low_rank.bound
    assert loaded.posterior_.low_rank.miss_ratio == model.posterior_.low_rank.miss_ratio
    Xt = _data(5, 200)[0]
    for a, b in zip(loaded.predict(Xt, return_std=True), model.predict(Xt, return_std=True)):
        np.testing.assert_array_equal(a, b)
    with np.load(path / "arrays.npz") as npz:
        arrays = dict(npz)
    arrays["posterior_low_rank_factor"] = arrays["posterior_low_rank_factor"][:-1]  # one center short
    np.savez(path / "arrays.npz", **arrays)
    with pytest.raises(ModelFileError, match="fast variance's arrays .* do not fit 100 centers"):
        load_model(path)


def test_models_saved_without_the_fast_variance_use_the_exact_one(tmp_path):
    X, y = _data(6, 1500)
    model = NystromRegressor(n_centers=100, compute_std=True, random_state=0).fit(X, y)
    path = model.save(tmp_path / "old")
    with np.load(path / "arrays.npz") as npz:  # what files written before the fast variance hold
        arrays = {k: v for k, v in npz.items() if not k.startswith("posterior_low_rank_")}
    np.savez(path / "arrays.npz", **arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_model(path)
    assert loaded.posterior_.low_rank is None
    Xt = _data(7, 100)[0]
    model.set_params(std_method="exact")
    np.testing.assert_array_equal(loaded.predict(Xt, return_std=True)[1], model.predict(Xt, return_std=True)[1])


def test_a_nearly_singular_kernel_matrix_keeps_the_exact_variance():
    # A cubic polynomial kernel on 2 features spans 10 functions: 100 centers make K_MM of rank 10, and
    # the factor D T^{-1} Y's huge entries cancel in k^T W beyond the variance's size. With one amplitude
    # (rho = 1, models before the miss had its own) the check at the centers refuses that factor; with the
    # calibrated rho < 1 of the default penalty the factor keeps the ill-determined directions whole (its
    # negative part) and passes it.
    X, y = _data(8, 2000)
    model = NystromRegressor(n_centers=100, kernel="polynomial", kernel_params={"degree": 3}, compute_std=True,
                             random_state=0, std_method="exact").fit(X, y)
    ctx = SimpleNamespace(centers=model.centers_, kernel=model.kernel_)
    mean_kxx = float(np.mean(model.kernel_.diag(model.scaler_.transform(X))))
    one_amplitude = dataclasses.replace(model.posterior_, miss_ratio=None)
    low, _ = low_rank_variance(one_amplitude, n=len(X), mean_kxx=mean_kxx)
    assert not _accurate_at_centers(ctx, one_amplitude, low)
    low, _ = low_rank_variance(model.posterior_, n=len(X), mean_kxx=mean_kxx)
    assert low.negative is not None and _accurate_at_centers(ctx, model.posterior_, low)
