"""predict(X, return_std=True): the posterior of the Gaussian process behind (Nystrom) kernel ridge.

Convention (daskkrr.solvers.variance): prior ``s^2 k``, noise ``s^2 penalty n``, ``s^2`` by
maximum likelihood. With every training point a center the std is scikit-learn's
GaussianProcessRegressor's for that prior; with fewer centers it is the DTC
formula, computed densely here; 95% intervals cover 95% of held-out GP data.
"""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, Matern

from daskkrr import ExactKernelRidge, FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.kernels import make_kernel
from daskkrr.models import load_model
from daskkrr.solvers.variance import PosteriorVariance

PENALTY = 1e-3


def _data(seed: int = 0, n: int = 120, d: int = 2, n_test: int = 50):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.normal(size=n)
    Xt = rng.uniform(-2.5, 2.5, size=(n_test, d))  # inside and beyond the data
    return X, y, Xt


def _all_centers(cls, **params):
    """``cls`` with every training row as a center (exact for ExactKernelRidge), converged tightly."""
    if cls is ExactKernelRidge:
        return cls(**params)
    extra = {"tol": 1e-10, "max_iter": 300} if cls is FalkonRegressor else {}
    return cls(n_centers=10_000, random_state=0, fit_intercept=False, std_method="exact", **extra, **params)


def _likelihood_std(model, Xt, std):
    """The std of the one-amplitude GP at the maximum-likelihood amplitude (the GP's own empirical Bayes
    ``s^2``) instead of the calibrated amplitudes ``return_std`` uses: ``sqrt(s^2 (miss + fit))``. Exact
    KRR has one amplitude (the std scales with ``sqrt(s^2)``); a Nystrom model's miss has its own."""
    post = model.posterior_
    if post.miss_ratio is None:
        return std * np.sqrt(post.likelihood_prior_variance / post.prior_variance)
    Xs = Xt if model.scaler_ is None else model.scaler_.transform(Xt)
    miss, fit = post.variance_parts(model.kernel_(Xs, model.centers_), model.kernel_.diag(Xs))
    return np.sqrt(post.likelihood_prior_variance[0] * np.maximum(miss + fit, 0.0))


def _sklearn_gp(kernel_name: str, sigma, s2: float, alpha: float, X, y):
    base = RBF(sigma, "fixed") if kernel_name == "gaussian" else Matern(sigma, "fixed", nu=1.5)
    return GaussianProcessRegressor(ConstantKernel(s2, "fixed") * base, alpha=alpha, optimizer=None).fit(X, y)


@pytest.mark.parametrize("cls", [ExactKernelRidge, NystromRegressor, FalkonRegressor])
@pytest.mark.parametrize("kernel_name", ["gaussian", "matern"])
def test_every_point_a_center_equals_sklearn_gaussian_process(cls, kernel_name):
    X, y, Xt = _data()
    n = len(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # n_centers clamped to n
        model = _all_centers(cls, kernel=kernel_name, sigma=0.8, penalty=PENALTY, standardize=False,
                             compute_std=True).fit(X, y)
    mean, std = model.predict(Xt, return_std=True)
    s2 = float(model.posterior_.likelihood_prior_variance[0])
    # s^2 is the maximum-likelihood prior variance given the ratio noise / prior = penalty * n.
    K = make_kernel(kernel_name, sigma=0.8)(X, X)
    assert s2 == pytest.approx(y @ np.linalg.solve(K + PENALTY * n * np.eye(n), y) / n, rel=1e-8)
    gp = _sklearn_gp(kernel_name, 0.8, s2, alpha=s2 * PENALTY * n, X=X, y=y)
    gp_mean, gp_std = gp.predict(Xt, return_std=True)
    np.testing.assert_allclose(_likelihood_std(model, Xt, std), gp_std, rtol=1e-6)
    np.testing.assert_allclose(mean, gp_mean, rtol=1e-6, atol=1e-8)
    # The noise variance return_std uses: RSS / (n - tr H), H = K (K + penalty n I)^{-1}, dense here.
    H = K @ np.linalg.inv(K + PENALTY * n * np.eye(n))
    rss = np.sum((y - model.predict(X)) ** 2)
    np.testing.assert_allclose(model.noise_variance_, rss / (n - np.trace(H)), rtol=1e-6)
    np.testing.assert_allclose(model.posterior_.noise_variance, model.noise_variance_)
    np.testing.assert_allclose(model.posterior_.effective_dof, np.trace(H), rtol=1e-6)


def test_standardized_model_is_the_gp_on_centred_targets_and_scaled_features():
    X, y, Xt = _data(1)
    X = X * [3.0, 0.5] + [10.0, -4.0]
    Xt = Xt * [3.0, 0.5] + [10.0, -4.0]
    n = len(X)
    model = ExactKernelRidge(sigma=0.9, penalty=PENALTY, compute_std=True).fit(X, y)
    mean, std = model.predict(Xt, return_std=True)
    Xs, Xts = model.scaler_.transform(X), model.scaler_.transform(Xt)
    s2 = float(model.posterior_.likelihood_prior_variance[0])
    gp = _sklearn_gp("gaussian", 0.9, s2, s2 * PENALTY * n, Xs, y - y.mean())  # normalize_y=False, y centred
    gp_mean, gp_std = gp.predict(Xts, return_std=True)
    np.testing.assert_allclose(_likelihood_std(model, Xt, std), gp_std, rtol=1e-6)
    np.testing.assert_allclose(mean, gp_mean + y.mean(), rtol=1e-6)
    # The std is in the units of y: scaling y by c scales it by c.
    scaled = ExactKernelRidge(sigma=0.9, penalty=PENALTY, compute_std=True).fit(X, 1000 * y)
    np.testing.assert_allclose(scaled.predict(Xt, return_std=True)[1], 1000 * std, rtol=1e-9)


def _dense_dtc_std(kernel, X, y, Z, Xt, penalty, intercept, noise=None):
    """The DTC posterior std with a flat-prior intercept or none, by dense linear algebra (independent
    of the library's factorisation): the posterior of (w, b) in ``y = K_nM w + b + e``, ``w ~ N(0, K_MM^-1)``."""
    n = len(X)
    s = penalty * n  # noise / prior variance
    Knm, Kmm, Ktm = kernel(X, Z), kernel(Z, Z), kernel(Xt, Z)
    F = np.c_[Knm, np.ones(n)] if intercept else Knm
    P = np.zeros((F.shape[1], F.shape[1]))
    P[: len(Z), : len(Z)] = Kmm
    H = F.T @ F + s * P  # s x posterior precision of (w, b) for unit prior variance
    theta = np.linalg.solve(H, F.T @ y)
    s2 = (y @ y - (F.T @ y) @ theta) / (s * n)  # y^T (Q + s I)^{-1} y / n, b profiled out
    if noise is not None:  # the residual noise estimate RSS / (n - tr(hat matrix)) instead
        noise.append(np.sum((y - F @ theta) ** 2) / (n - np.trace(F @ np.linalg.solve(H, F.T))))
    Ft = np.c_[Ktm, np.ones(len(Xt))] if intercept else Ktm
    nystrom_residual = 1.0 - np.einsum("ij,ji->i", Ktm, np.linalg.solve(Kmm, Ktm.T))
    v = nystrom_residual + s * np.einsum("ij,ji->i", Ft, np.linalg.solve(H, Ft.T))
    return Ft @ theta, np.sqrt(s2 * v)


@pytest.mark.parametrize("cls, strategy, sampler", [
    (NystromRegressor, "auto", "uniform"), (FalkonRegressor, "recompute", "uniform"),
    (FalkonRegressor, "gram", "uniform"), (NystromRegressor, "auto", "rls"),  # rls: weighted centers
])
@pytest.mark.parametrize("intercept", [False, True])
def test_fewer_centers_match_the_dense_dtc_formula(cls, strategy, sampler, intercept):
    X, y, Xt = _data(2, n=300)
    extra = {"tol": 1e-10, "max_iter": 300} if cls is FalkonRegressor else {}
    model = cls(n_centers=60, sigma=0.7, penalty=PENALTY, standardize=False, fit_intercept=intercept,
                strategy=strategy, sampler=sampler, compute_std=True, std_method="exact", random_state=0,
                **extra).fit(X, y)
    mean, std = model.predict(Xt, return_std=True)
    ref_noise: list[float] = []
    ref_mean, ref_std = _dense_dtc_std(model.kernel_, X, y, model.centers_, Xt, PENALTY, intercept, ref_noise)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_likelihood_std(model, Xt, std), ref_std, rtol=1e-6)
    # RSS and d_eff from the accumulated Gram matrix (no pass over the data), against the dense hat matrix
    np.testing.assert_allclose(model.noise_variance_, ref_noise, rtol=1e-6)
    # The miss's amplitude (miss_amplitude), densely: a = min((||y_c||^2 / n - noise) / (mean Q_ii - mu' K_MM^-1 mu),
    # s^2), Q the Nystrom kernel; K_MM's condition number (sigma 0.7, 60 centers) costs digits: 1e-6 relative
    Knm, Kmm = model.kernel_(X, model.centers_), model.kernel_(model.centers_, model.centers_)
    mu = Knm.mean(axis=0)
    spanned = np.mean(np.einsum("ij,ji->i", Knm, np.linalg.solve(Kmm, Knm.T)))
    spanned -= mu @ np.linalg.solve(Kmm, mu) if intercept else 0.0
    yc = y - y.mean() if intercept else y
    a = min(max(np.mean(yc**2) - ref_noise[0], 0.0) / spanned, model.posterior_.prior_variance[0])
    np.testing.assert_allclose(model.posterior_.miss_ratio * model.posterior_.prior_variance, a, rtol=1e-6)
    # Far from the data the std is the miss's prior, sqrt(a k(x, x)) (plus the intercept's uncertainty).
    far = model.predict(np.full((1, 2), 50.0), return_std=True)[1][0]
    prior = np.sqrt(a)
    assert far > prior if intercept else far == pytest.approx(prior, rel=1e-12)


def _gp_sample(seed: int, n: int, n_test: int, ell: float, s2: float, noise: float):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, size=(n + n_test, 2))
    K = s2 * make_kernel("gaussian", sigma=ell)(X, X) + 1e-8 * np.eye(n + n_test)
    f = np.linalg.cholesky(K) @ rng.normal(size=n + n_test)
    y = f + noise * rng.normal(size=n + n_test)
    return X[:n], y[:n], X[n:], y[n:], f[n:]


@pytest.mark.parametrize("make", [
    lambda pen: ExactKernelRidge(sigma=0.15, penalty=pen, standardize=False, compute_std=True),
    lambda pen: NystromRegressor(n_centers=100, sigma=0.15, penalty=pen, standardize=False, fit_intercept=False,
                                 compute_std=True, random_state=0),
], ids=["exact", "nystrom"])
def test_95_percent_intervals_cover_95_percent_of_held_out_gp_data(make):
    """Data from the model's own GP (prior variance 2, noise 0.3^2, penalty = their ratio / n)."""
    n, n_test, noise, s2 = 300, 100, 0.3, 2.0
    covered_y, covered_f = [], []
    for seed in range(20):
        X, y, Xt, yt, ft = _gp_sample(seed, n, n_test, 0.15, s2, noise)
        model = make(noise**2 / (s2 * n)).fit(X, y)
        mean, std = model.predict(Xt, return_std=True)
        new_y = np.sqrt(std**2 + model.posterior_.noise_variance[0])  # a new observation adds the noise
        covered_y.append(np.mean(np.abs(yt - mean) <= 1.96 * new_y))
        covered_f.append(np.mean(np.abs(ft - mean) <= 1.96 * std))
    assert 0.93 <= np.mean(covered_y) <= 0.97
    assert 0.93 <= np.mean(covered_f) <= 0.97


def test_intervals_at_the_default_penalty_cover_their_nominal_share_of_held_out_gp_data():
    """The GP data above, fitted at the default penalty (1e-6, 150 times below the data's noise to signal
    ratio): with one amplitude ``s^2 = noise / (penalty n)`` the centers' miss made the intervals far too
    wide (+-1.96 of a new observation held 97.6% of the 2 000 held-out rows, +-1 held 81%, +-1.96 of the
    latent std 98.2% of the true function values); with the miss's own amplitude (a moment estimate, which
    does not depend on the penalty) they hold their nominal share.

    Bands: 20 draws x 100 held-out rows = 2 000 rows; a binomial fraction with p = 0.95 has the SD
    sqrt(p (1 - p) / 2000) = 0.0049, with p = 0.683 (+-1) 0.0104; each band is 4 of them either side
    (rows of one draw share its fit, which widens the spread a little; 4 SD leaves room for that).
    """
    n, n_test, noise, s2, draws = 300, 100, 0.3, 2.0, 20
    in1_y, in2_y, in2_f = [], [], []
    for seed in range(draws):
        X, y, Xt, yt, ft = _gp_sample(seed, n, n_test, 0.15, s2, noise)
        model = NystromRegressor(n_centers=100, sigma=0.15, standardize=False, fit_intercept=False,
                                 compute_std=True, random_state=0).fit(X, y)
        mean, std = model.predict(Xt, return_std=True)
        new_y = np.sqrt(std**2 + model.noise_variance_[0])
        in1_y.append(np.mean(np.abs(yt - mean) <= new_y))
        in2_y.append(np.mean(np.abs(yt - mean) <= 1.96 * new_y))
        in2_f.append(np.mean(np.abs(ft - mean) <= 1.96 * std))
    sd95, sd68 = np.sqrt(0.95 * 0.05 / (draws * n_test)), np.sqrt(0.683 * 0.317 / (draws * n_test))
    assert abs(np.mean(in2_y) - 0.95) <= 4 * sd95, np.mean(in2_y)
    assert abs(np.mean(in1_y) - 0.683) <= 4 * sd68, np.mean(in1_y)
    assert abs(np.mean(in2_f) - 0.95) <= 4 * sd95, np.mean(in2_f)


def test_default_penalty_noise_estimate_and_two_std_coverage_on_data_with_known_noise():
    """A smooth function plus N(0, 0.5^2) noise, FalkonRegressor at its defaults (penalty 1e-6).

    Noise estimate: RSS / sigma^2 is about chi-square with n - d_eff degrees of freedom (the
    fit's bias on this smooth function is far smaller), so sigma_hat^2 / sigma^2 has a
    relative SD of sqrt(2 / (n - d_eff)) < 0.033; each seed is held to 4 of them, the
    mean of the seeds to 4 / sqrt(seeds) of them.

    Coverage of +-2 std for a new observation (nominal p = 0.9545): the fraction over
    seeds x n_test rows has a binomial SD of sqrt(p (1 - p) / 6000) = 0.0027; the
    noise estimate's own error moves each seed's threshold by about 1.6% (half the
    relative SD above), which moves its coverage by 2 phi(2) 2 0.016 = 0.0035, 0.0014
    over the 6 seeds; together 0.003, and the band is 5 of them (the latent std, a
    twentieth of the predictive variance here, adds a little model error too).
    """
    sd_noise, n, n_test, seeds = 0.5, 2000, 1000, 6
    inside, ratios = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(100 + seed)
        X = rng.uniform(-2, 2, size=(n + n_test, 3))
        y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 2 + np.cos(X[:, 2]) + sd_noise * rng.normal(size=n + n_test)
        model = FalkonRegressor(n_centers=200, compute_std=True, random_state=seed).fit(X[:n], y[:n])
        mean, std = model.predict(X[n:], return_std=True)
        ratio = float(model.noise_variance_[0]) / sd_noise**2
        rel_sd = np.sqrt(2 / (n - model.posterior_.effective_dof))
        assert abs(ratio - 1) <= 4 * rel_sd, (seed, ratio)
        ratios.append(ratio)
        new_y = np.sqrt(std**2 + model.noise_variance_[0])
        inside.append(np.mean(np.abs(y[n:] - mean) <= 2 * new_y))
    assert abs(np.mean(ratios) - 1) <= 4 * 0.033 / np.sqrt(seeds)
    assert abs(np.mean(inside) - 0.9545) <= 5 * 0.003


def test_dask_input_gives_lazy_std_equal_to_numpy_and_multi_output_shares_the_shape():
    X, y, Xt = _data(3, n=200)
    Y = np.c_[y, 10 * np.cos(X[:, 0])]
    model = FalkonRegressor(n_centers=40, sigma=0.8, compute_std=True, random_state=0).fit(X, Y)
    mean, std = model.predict(Xt, return_std=True)
    assert mean.shape == std.shape == (len(Xt), 2)
    # One unit variance per row, scaled per target by its prior variance.
    ratio = std[:, 1] / std[:, 0]
    np.testing.assert_allclose(ratio, np.sqrt(model.posterior_.prior_variance[1] / model.posterior_.prior_variance[0]))
    lazy_mean, lazy_std = model.predict(da.from_array(Xt, chunks=17), return_std=True)
    assert isinstance(lazy_mean, da.Array) and isinstance(lazy_std, da.Array)
    # The variance is the prior minus a quadratic form: where they nearly cancel (a point near the
    # centers), another block shape's BLAS rounding moves the std by ~1e-12 of the prior's (seen on
    # an AMD EPYC VM: 4.5e-12 relative on a std 35 times below the largest).
    np.testing.assert_allclose(lazy_std.compute(), std, rtol=1e-10, atol=1e-11 * np.max(std))
    np.testing.assert_allclose(lazy_mean.compute(), mean, rtol=1e-12)
    # predict's mean comes from the engine's matvec, return_std's from a kernel block: round-off apart
    np.testing.assert_allclose(mean, model.predict(Xt), rtol=1e-12, atol=1e-13 * np.max(np.abs(mean)))


def test_saved_model_keeps_its_posterior_and_refit_without_compute_std_drops_it(tmp_path):
    X, y, Xt = _data(4)
    for model in (NystromRegressor(n_centers=30, sigma=[0.5, 2.0], compute_std=True, random_state=0),
                  ExactKernelRidge(compute_std=True)):
        model.fit(X, y)
        loaded = load_model(model.save(tmp_path / type(model).__name__))
        for a, b in zip(loaded.predict(Xt, return_std=True), model.predict(Xt, return_std=True)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(loaded.noise_variance_, model.noise_variance_)
        np.testing.assert_array_equal(loaded.posterior_.likelihood_prior_variance,
                                      model.posterior_.likelihood_prior_variance)
        assert loaded.posterior_.effective_dof == model.posterior_.effective_dof > 0
    model.set_params(compute_std=False).fit(X, y)
    assert model.posterior_ is None and model.noise_variance_ is None
    with pytest.raises(ValueError, match="fitted without compute_std=True"):
        model.predict(Xt, return_std=True)
    loaded = load_model(model.save(tmp_path / "plain"))
    assert loaded.posterior_ is None


def test_an_interpolating_fit_warns_that_its_noise_estimate_is_unreliable():
    X, y, _ = _data(7, n=60)
    # sigma 0.05 on [-2, 2]^2: the kernel matrix is nearly the identity, d_eff close to n = 60
    with pytest.warns(UserWarning, match="nearly interpolates its 60 training rows"):
        model = ExactKernelRidge(sigma=0.05, penalty=1e-8, standardize=False, compute_std=True).fit(X, y)
    assert model.posterior_.effective_dof > 60 - 10
    assert np.all(np.isfinite(model.noise_variance_))


def test_posterior_saved_before_the_calibration_keeps_its_likelihood_amplitude():
    X, y, _ = _data(4)
    post = NystromRegressor(n_centers=30, compute_std=True, random_state=0).fit(X, y).posterior_
    arrays = post.to_arrays()
    assert "miss_ratio" in arrays
    old = {k: v for k, v in arrays.items() if k not in ("likelihood_prior_variance", "miss_ratio")
           and not k.startswith("low_rank_")}
    old["prior_variance"] = arrays["likelihood_prior_variance"]  # what the earlier files held
    old["numbers"] = arrays["numbers"][:2]  # offset and noise ratio, no d_eff
    loaded = PosteriorVariance.from_arrays(old)
    np.testing.assert_array_equal(loaded.prior_variance, post.likelihood_prior_variance)
    np.testing.assert_array_equal(loaded.likelihood_prior_variance, post.likelihood_prior_variance)
    assert np.isnan(loaded.effective_dof)
    # Files written before the miss had its own amplitude keep one amplitude: std = sqrt(s^2 (miss + fit)).
    assert loaded.miss_ratio is None and loaded.low_rank is None
    Z = post.factor.shape[0]
    K, kxx = np.random.default_rng(0).uniform(0, 1, size=(5, Z)), np.ones(5)
    miss, fit = loaded.variance_parts(K, kxx)
    # The same parts, multiplied in another order: a few roundings apart (~4 eps), far below 1e-12.
    np.testing.assert_allclose(loaded.std(K, kxx, exact=True)[:, 0],
                               np.sqrt(loaded.prior_variance[0] * np.maximum(miss + fit, 0.0)), rtol=1e-12)


def test_classifier_decision_function_has_a_std():
    X, y, Xt = _data(5)
    labels = (y > np.median(y)).astype(int)
    model = FalkonClassifier(n_centers=30, compute_std=True, random_state=0).fit(X, labels)
    score, std = model.decision_function(Xt, return_std=True)
    assert score.shape == std.shape == (len(Xt),)
    assert np.all(std > 0)
    np.testing.assert_allclose(score, model.decision_function(Xt))


def test_resumed_fit_has_the_noise_estimate_of_an_uninterrupted_one(tmp_path):
    X, y, _ = _data(6, n=300)
    params = {"n_centers": 40, "sigma": 0.8, "penalty": PENALTY, "compute_std": True, "random_state": 0, "tol": 1e-10}
    checkpoint = tmp_path / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the interrupted fit stops before convergence on purpose
        FalkonRegressor(max_iter=3, **params).fit(X, y, checkpoint=checkpoint, checkpoint_every=1)
        resumed = FalkonRegressor(max_iter=30, **params).fit(X, y, checkpoint=checkpoint, checkpoint_every=1,
                                                             resume=True)
        whole = FalkonRegressor(max_iter=30, **params).fit(X, y)
    # the same CG iterates either way: equal up to the round-off of the posterior's M x M algebra
    np.testing.assert_allclose(resumed.noise_variance_, whole.noise_variance_, rtol=1e-9)
