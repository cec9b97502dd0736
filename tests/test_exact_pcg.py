"""Exact kernel ridge regression by random-feature preconditioned CG (Avron, Clarkson and Woodruff).

The claims checked: PCG solves the exact system (equal to scikit-learn's KernelRidge),
random features are unbiased with error ~ 1/sqrt(s), the Woodbury preconditioner is the
inverse of ``Z Z^T + lambda_p I``, the preconditioner cuts the iterations of plain CG,
the fit is the same on a cluster from Zarr and out of core, it resumes from a checkpoint,
and bad input is refused before anything is written.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
from sklearn.gaussian_process.kernels import Matern
from sklearn.kernel_ridge import KernelRidge

from daskkrr import ExactKernelRidge
from daskkrr.data import write_zarr
from daskkrr.kernels import Kernel, make_kernel
from daskkrr.kernels.random_features import NystromFeatures, random_features
from daskkrr.parallel.resources import Resources
from daskkrr.parallel.tiles import plan_tiles, tile_bytes
from daskkrr.solvers.pcg import NumpyOps, WoodburyFactor, pcg, ritz_bounds

N, D = 2000, 4
EXACT = dict(solver="pcg", tol=1e-12, n_features=400, standardize=False, random_state=0, chunks=1000)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * rng.normal(size=N)
    return X, y


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


SIGMA = 2.0
CASES = {
    "gaussian": (dict(kernel="gaussian", sigma=SIGMA), dict(kernel="rbf", gamma=0.5 / SIGMA**2)),
    "laplacian": (dict(kernel="laplacian", sigma=SIGMA * D), dict(kernel="laplacian", gamma=1 / (SIGMA * D))),
    "matern": (dict(kernel="matern", sigma=SIGMA, kernel_params={"nu": 1.5}),
               dict(kernel=Matern(length_scale=SIGMA, nu=1.5))),
    "polynomial": (dict(kernel="polynomial", kernel_params={"degree": 2, "gamma": 0.2, "coef0": 1.0}),
                   dict(kernel="poly", degree=2, gamma=0.2, coef0=1.0)),
}


#: Laplacian and Matern take about 90 PCG iterations each (the Gaussian 52, the polynomial 8) for no more
#: of the solver: the default run keeps the Gaussian case (PCG = KernelRidge through the distributed
#: products) and the polynomial one (a non-stationary kernel, TensorSketch features); the two kernels
#: equal scikit-learn's in test_kernels.py (test_laplacian_matches_sklearn, test_matern_closed_form) and
#: FALKON with them equals ExactKernelRidge in test_models.py (test_other_kernels_match_sklearn_exact).
KERNEL_CASES = [pytest.param(name, marks=pytest.mark.slow) if name in ("laplacian", "matern") else name
                for name in CASES]


@pytest.mark.parametrize("name", KERNEL_CASES)
def test_pcg_equals_sklearn_kernel_ridge(data, name):
    X, y = data[0][:1000], data[1][:1000]  # two row chunks of 500: the distributed products
    ours, theirs = CASES[name]
    penalty = 1e-4
    model = ExactKernelRidge(penalty=penalty, **ours, **{**EXACT, "chunks": 500}).fit(X, y)
    reference = KernelRidge(alpha=penalty * len(X), **theirs).fit(X, y)
    assert model.solver_ == "pcg" and model.converged_ and model.n_features_ == 400
    assert _rel(model.coef_, reference.dual_coef_) <= 1e-8
    Xt = np.random.default_rng(1).normal(size=(50, D))
    assert _rel(model.predict(Xt) - model.intercept_, reference.predict(Xt)) <= 1e-8


def test_preconditioner_cuts_iterations_of_plain_cg_and_lambda_p_10_lambda_helps(data):
    """Table 4 (>= 5x fewer iterations than plain CG) and Table 2 (lambda_p = 10 lambda beats lambda),
    on the solver with dense numpy products (the distributed products are tested above)."""
    X, y = data[0][:1000], data[1][:1000]
    kernel = make_kernel("gaussian", sigma=SIGMA)
    K = kernel(X, X)
    lam = 1e-6 * len(X)
    A = lambda v: K @ v + lam * v  # noqa: E731
    b = y[:, None]
    Z = random_features(kernel, 500, D, seed=0)(X)
    iterations = {"plain": pcg(A, b, NumpyOps(), tol=1e-5, max_iter=2000).n_iter}
    for factor in (1.0, 10.0):
        M = WoodburyFactor.from_gram(Z.T @ Z, factor * lam)
        result = pcg(A, b, NumpyOps(), preconditioner=lambda r, M=M: M.apply(Z, r), tol=1e-5, max_iter=2000)
        assert result.converged
        iterations[factor] = result.n_iter
    assert iterations[10.0] * 5 <= iterations["plain"], iterations
    assert iterations[10.0] < iterations[1.0], iterations


def test_adaptive_s_doubles_and_reports_the_probe(data):
    X, y = data[0][:1200], data[1][:1200]
    model = ExactKernelRidge(kernel="gaussian", sigma=SIGMA, penalty=1e-6, solver="pcg", tol=1e-6,
                             standardize=False, random_state=0).fit(X, y)
    trace = model.adaptive_trace_
    assert trace[0]["n_features"] == 256 and model.n_features_ == trace[-1]["n_features"]
    kappas = [t["kappa"] for t in trace]
    assert all(k2 < k1 for k1, k2 in zip(kappas, kappas[1:]))  # more features, a better preconditioner
    # The probe's Ritz values predict the iterations PCG then needed (the paper's bound; the Ritz
    # values lie inside the spectrum, so the estimate is a little optimistic).
    assert model.converged_ and model.n_iter_ <= 1.5 * trace[-1]["predicted_iterations"]


@pytest.mark.parametrize("kernel", [
    make_kernel("gaussian", sigma=1.5), make_kernel("laplacian", sigma=3.0),
    make_kernel("matern", sigma=1.5, nu=1.5), make_kernel("matern", sigma=1.5, nu=0.5),
    make_kernel("polynomial", degree=2, gamma=0.1, coef0=1.0),
    make_kernel("gaussian", sigma=(1.0, 2.0, 0.5, 1.5, 1.0, 3.0)),  # ARD: one length scale per feature
])
def test_random_features_are_unbiased_with_error_one_over_sqrt_s(kernel):
    X = np.random.default_rng(3).normal(size=(30, 6)) * 0.7
    K = kernel(X, X)

    def error(s, seeds):
        return np.mean([np.linalg.norm((Z := random_features(kernel, s, 6, seed)(X)) @ Z.T - K) for seed in seeds])

    mean = np.mean([(Z := random_features(kernel, 500, 6, seed)(X)) @ Z.T for seed in range(40)], axis=0)
    assert np.linalg.norm(mean - K) / np.linalg.norm(K) < 0.03  # E[Z Z^T] = K
    ratio = error(250, range(8)) / error(4000, range(8))  # 16 times the features: 1/4 the error
    # TensorSketch of a degree-2 kernel on 7 coordinates (49 monomials) becomes exact faster.
    assert 2.5 < ratio and (ratio < 6.5 or kernel.name == "polynomial"), ratio


def test_features_of_a_row_depend_only_on_seed_and_row():
    kernel = make_kernel("polynomial", degree=3, gamma=0.5, coef0=1.0)
    X = np.random.default_rng(4).normal(size=(20, 5))
    fmap = random_features(kernel, 64, 5, seed=9, srht_features=32)
    np.testing.assert_array_equal(fmap(X)[7:12], fmap(X[7:12]))
    np.testing.assert_array_equal(fmap(X), random_features(kernel, 64, 5, seed=9, srht_features=32)(X))


def test_srht_level_stays_unbiased():
    kernel = make_kernel("gaussian", sigma=1.0)
    X = np.random.default_rng(5).normal(size=(15, 3))
    mean = np.mean([(Z := random_features(kernel, 300, 3, seed, srht_features=200)(X)) @ Z.T
                    for seed in range(60)], axis=0)
    assert np.linalg.norm(mean - kernel(X, X)) / np.linalg.norm(kernel(X, X)) < 0.05


def test_woodbury_preconditioner_equals_dense_inverse():
    rng = np.random.default_rng(6)
    Z = rng.normal(size=(80, 12))
    R = rng.normal(size=(80, 3))
    factor = WoodburyFactor.from_gram(Z.T @ Z, 0.3)
    dense = np.linalg.solve(Z @ Z.T + 0.3 * np.eye(80), R)
    np.testing.assert_allclose(factor.apply(Z, R), dense, rtol=1e-10, atol=1e-12)


def test_numpy_pcg_and_ritz_values_match_the_spectrum():
    rng = np.random.default_rng(7)
    Q, _ = np.linalg.qr(rng.normal(size=(60, 60)))
    ev = np.geomspace(0.1, 10.0, 60)
    A = (Q * ev) @ Q.T
    b = rng.normal(size=(60, 2))
    result = pcg(lambda v: A @ v, b, NumpyOps(), tol=1e-10, max_iter=500)
    assert result.converged
    np.testing.assert_allclose(A @ result.x, b, rtol=0, atol=1e-8)
    lo, hi = ritz_bounds(result.alphas, result.betas)
    assert lo == pytest.approx(0.1, rel=1e-3) and hi == pytest.approx(10.0, rel=1e-3)
    lo8, hi8 = ritz_bounds(result.alphas[:8], result.betas[:8])  # a few steps: inside, near the ends
    assert 0.1 <= lo8 < 0.5 and 5.0 < hi8 <= 10.0


def test_nystrom_preconditioner_and_features(data):
    X, y = data
    kernel = make_kernel("gaussian", sigma=SIGMA)
    fmap = NystromFeatures.from_centers(kernel, X[:50])
    Z = fmap(X[:50])
    np.testing.assert_allclose(Z @ Z.T, kernel(X[:50], X[:50]), atol=1e-8)
    X, y = X[:1000], y[:1000]
    model = ExactKernelRidge(kernel="gaussian", sigma=SIGMA, penalty=1e-3, preconditioner="nystrom",
                             **{**EXACT, "chunks": 500}).fit(X, y)
    reference = KernelRidge(alpha=1e-3 * len(X), kernel="rbf", gamma=0.5 / SIGMA**2).fit(X, y)
    assert _rel(model.coef_, reference.dual_coef_) <= 1e-8


def test_cost_model_recomputes_tiles_that_do_not_fit():
    small = Resources(slots=2, cores=2, memory_bytes=10 * 2**20, n_workers=2, thread_budget=1)
    large = dataclasses.replace(small, memory_bytes=64 * 2**30)
    assert not plan_tiles(20_000, 10, resources=small).keep
    plan = plan_tiles(60_000, 784, resources=large, tile_dtype="float32")
    assert plan.keep and plan.tile_bytes == tile_bytes(60_000, plan.tile_rows, 4)
    assert abs(plan.tile_bytes - 60_000**2 * 4 / 2) / (60_000**2 * 2) < 0.05  # the upper triangle
    assert "n=60000" in plan.describe(60_000, 50) and "GB" in plan.describe(60_000, 50)


def test_out_of_core_fit_recomputes_tiles_under_a_small_memory_limit(data, monkeypatch):
    import daskkrr.parallel.resources as resources

    X, y = data[0][:800], data[1][:800]  # 2 x 2 tiles of 400 rows, recomputed at each of the 21 iterations
    monkeypatch.setattr(resources, "_available_memory", lambda: 2 * 2**20)  # 2 MiB: no kept tiles
    # penalty 1e-2: the route, not the conditioning, is checked here (1e-3 took 35 iterations to the same 1e-12)
    model = ExactKernelRidge(kernel="gaussian", sigma=SIGMA, penalty=1e-2, **{**EXACT, "chunks": 400}).fit(X, y)
    assert model.kernel_tiles_ == "recompute"
    reference = KernelRidge(alpha=1e-2 * len(X), kernel="rbf", gamma=0.5 / SIGMA**2).fit(X, y)
    assert _rel(model.coef_, reference.dual_coef_) <= 1e-8


def test_cluster_fit_from_zarr_equals_numpy(data, cluster2, tmp_path):
    X, y = data[0][:1000], data[1][:1000]
    path = write_zarr(X, y, tmp_path / "train.zarr", chunk_rows=300)
    # The same arithmetic in the same order on both: equal to round-off at any tol (1e-4: 10 iterations,
    # each a round trip to the workers, where 1e-8 took 15).
    params = dict(kernel="gaussian", sigma=SIGMA, penalty=1e-2, **{**EXACT, "chunks": 500, "tol": 1e-4})
    with cluster2.as_current():
        on_cluster = ExactKernelRidge(**params).fit(path)
    in_memory = ExactKernelRidge(**params).fit(X, y)
    assert on_cluster.converged_ and in_memory.converged_
    assert _rel(on_cluster.coef_, in_memory.coef_) <= 1e-8


def test_checkpoint_resume_continues_the_pcg(data, tmp_path):
    X, y = data[0][:1000], data[1][:1000]
    # penalty 1e-3: about 30 iterations, so the checkpoint after 4 leaves most of the solve to the resumed fit
    params = dict(kernel="gaussian", sigma=SIGMA, penalty=1e-3, solver="pcg", tol=1e-10, n_features=300,
                  random_state=0, standardize=False)
    whole = ExactKernelRidge(**params).fit(X, y)
    with pytest.warns(Warning, match="max_iter=4"):
        ExactKernelRidge(**params, max_iter=4).fit(X, y, checkpoint=tmp_path / "ck", checkpoint_every=2)
    resumed = ExactKernelRidge(**params).fit(X, y, checkpoint=tmp_path / "ck", resume=True)
    assert resumed.converged_ and resumed.n_iter_ == whole.n_iter_
    assert _rel(resumed.coef_, whole.coef_) <= 1e-10


@dataclasses.dataclass(frozen=True)
class _CustomKernel(Kernel):
    name: ClassVar[str] = "custom"

    def _block(self, A, B):
        return np.exp(-np.abs(A @ B.T))

    def _diag(self, A):
        return np.ones(A.shape[0])


@pytest.mark.parametrize("params, message", [
    (dict(n_features=0), "n_features"),
    (dict(kernel=_CustomKernel()), "no random feature map"),
    (dict(preconditioner_penalty=0.0), "preconditioner_penalty"),
    (dict(preconditioner_penalty=-1.0), "preconditioner_penalty"),
    (dict(srht_features=500, n_features=400), "srht_features"),
    (dict(solver="direct", max_samples=1000), "max_samples=1000"),
])
def test_bad_input_is_refused_and_nothing_is_written(data, tmp_path, params, message):
    X, y = data
    target = tmp_path / "ck"
    with pytest.raises(ValueError, match=message):
        ExactKernelRidge(**{"solver": "pcg", **params}).fit(X, y, checkpoint=target)
    assert not target.exists()


def test_auto_picks_direct_for_small_n_and_pcg_beyond(data, monkeypatch):
    import daskkrr.pipeline.exact_pcg as exact_pcg

    X, y = data
    assert ExactKernelRidge(penalty=1e-4).fit(X[:300], y[:300]).solver_ == "direct"
    monkeypatch.setattr(exact_pcg, "AUTO_DIRECT_MAX", 200)
    model = ExactKernelRidge(penalty=1e-4, n_features=100, random_state=0).fit(X[:300], y[:300])
    assert model.solver_ == "pcg" and model.converged_


def test_sample_weights_equal_duplicated_rows(data):
    """Integer weights == duplicated rows (the symmetric form ``W^1/2 K W^1/2``), zero weights allowed."""
    X, y = data[0][:400], data[1][:400]
    w = np.random.default_rng(8).integers(0, 4, size=400).astype(float)
    params = dict(kernel="gaussian", sigma=SIGMA, penalty=1e-4, solver="pcg", tol=1e-12, n_features=100,
                  random_state=0)
    model = ExactKernelRidge(**params).fit(X, y, sample_weight=w)
    rows = np.repeat(np.arange(400), w.astype(int))
    dup = ExactKernelRidge(**params).fit(X[rows], y[rows])
    Xt = np.random.default_rng(9).normal(size=(30, D))
    assert _rel(model.predict(Xt), dup.predict(Xt)) <= 1e-7
    assert np.all(model.coef_[w == 0] == 0)
    direct = ExactKernelRidge(**{**params, "solver": "direct"}).fit(X, y, sample_weight=w)
    assert _rel(model.predict(Xt), direct.predict(Xt)) <= 1e-8


def test_pcg_model_saves_and_loads(data, tmp_path):
    import daskkrr

    X, y = data[0][:300], data[1][:300]
    model = ExactKernelRidge(solver="pcg", penalty=1e-3, n_features=64, random_state=0).fit(X, y)
    loaded = daskkrr.load(model.save(tmp_path / "m"))
    assert loaded.get_params() == model.get_params()
    np.testing.assert_allclose(loaded.predict(X[:20]), model.predict(X[:20]), rtol=1e-12)
