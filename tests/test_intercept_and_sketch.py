"""The unpenalised intercept and the row-sketch preconditioner.

- With ``fit_intercept=True`` the Nystrom model is scikit-learn's
  ``Nystroem + Ridge(fit_intercept=True)`` on the same centers: predictions agree
  to round-off.
- The sketch preconditioner with the centers as its rows is FALKON's own; with a
  few times ``M`` sampled rows CG needs far fewer iterations and reaches the same
  solution.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dask.array as da
import numpy as np
import pytest
from scipy.linalg import solve_triangular

from daskkrr import FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.kernels import GaussianKernel
from daskkrr.models.loading import load_model
from daskkrr.models.persistence import save_model
from daskkrr.parallel.preconditioner_cost import sketch_candidates
from daskkrr.solvers import FalkonPreconditioner
from daskkrr.solvers.intercept import centered_gram_matvec
from daskkrr.solvers.sketch import KernelRowSketch, sketch_indices


@pytest.fixture(scope="module")
def offset_data():
    """A target with a large mean level, which a penalised Gaussian model shrinks."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(4000, 5))
    y = 10.0 + np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=4000)
    return X, y


def _sklearn_same_centers(X, y, model, sigma, penalty):
    """scikit-learn's Nystroem + Ridge on the daskkrr model's own centers."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge

    mu, sd = X.mean(axis=0), X.std(axis=0)
    Xs = (X - mu) / sd
    features = Nystroem(kernel="rbf", gamma=1 / (2 * sigma**2), n_components=model.centers_.shape[0])
    features.fit(Xs[model.center_indices_])  # as many rows as components: all of them are used
    ridge = Ridge(alpha=penalty * X.shape[0], fit_intercept=True, solver="cholesky")
    ridge.fit(features.transform(Xs), y)
    return lambda Xt: ridge.predict(features.transform((Xt - mu) / sd))


@pytest.mark.parametrize("estimator", ["nystrom", "falkon"])
def test_intercept_equals_sklearn_nystroem_ridge_on_the_same_centers(offset_data, estimator):
    X, y = offset_data
    sigma, penalty = 2.0, 1e-6
    common = dict(sigma=sigma, penalty=penalty, n_centers=300, random_state=0)
    if estimator == "nystrom":
        model = NystromRegressor(**common).fit(X, y)
    else:
        model = FalkonRegressor(**common, max_iter=100, tol=1e-10).fit(X, y)
    reference = _sklearn_same_centers(X, y, model, sigma, penalty)
    Xt = np.random.default_rng(9).normal(size=(500, 5))
    expected = reference(Xt)
    got = model.predict(Xt)
    assert np.max(np.abs(got - expected)) <= 1e-6 * np.max(np.abs(expected)), np.max(np.abs(got - expected))
    # without the intercept the penalty shrinks the mean level: a different model
    plain = NystromRegressor(**common, fit_intercept=False).fit(X, y)
    assert np.max(np.abs(plain.predict(Xt) - expected)) > 1e-4
    np.testing.assert_allclose(plain.intercept_, plain.y_mean_)


def test_intercept_is_the_mean_residual(offset_data):
    X, y = offset_data
    model = NystromRegressor(sigma=2.0, penalty=1e-5, n_centers=200, random_state=1).fit(X, y)
    fitted = model.predict(X)
    # the unpenalised constant makes the residuals average to zero on the training rows
    assert abs(np.mean(y - fitted)) < 1e-8 * np.abs(y).max()
    plain = NystromRegressor(sigma=2.0, penalty=1e-5, n_centers=200, random_state=1, fit_intercept=False).fit(X, y)
    assert abs(np.mean(y - plain.predict(X))) > 1e3 * abs(np.mean(y - fitted))


def test_intercept_without_standardisation_and_multi_target(offset_data):
    X, y = offset_data
    Y = np.column_stack([y, -3 * y + 1])
    model = NystromRegressor(sigma=2.0, penalty=1e-6, n_centers=250, standardize=False, random_state=2).fit(X, Y)
    assert model.intercept_.shape == (2,)
    pred = model.predict(X)
    np.testing.assert_allclose(pred.mean(axis=0), Y.mean(axis=0), rtol=1e-8)
    falkon = FalkonRegressor(sigma=2.0, penalty=1e-6, n_centers=250, standardize=False, random_state=2,
                             max_iter=100, tol=1e-10).fit(X, Y)
    np.testing.assert_allclose(falkon.predict(X[:200]), model.predict(X[:200]), rtol=1e-6, atol=1e-6)


def test_classifier_fits_an_intercept():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 3))
    y = (X[:, 0] + 0.3 * X[:, 1] > 1.0).astype(int)  # unbalanced: mean target far from 0
    model = FalkonClassifier(n_centers=200, penalty=1e-6, random_state=0, max_iter=50).fit(X, y)
    assert model.intercept_.shape == (1,)
    assert model.score(X, y) > 0.97


def test_centered_gram_matvec_is_the_centred_product():
    rng = np.random.default_rng(0)
    K = rng.uniform(size=(50, 7))
    mu = K.mean(axis=0)
    Kc = K - mu
    apply = centered_gram_matvec(lambda u: K.T @ (K @ u), mu, 50)
    for u in (rng.normal(size=7), rng.normal(size=(7, 3))):
        np.testing.assert_allclose(apply(u), Kc.T @ (Kc @ u), rtol=1e-10, atol=1e-12)


def test_model_saved_before_the_intercept_loads_without_one(tmp_path, offset_data):
    X, y = offset_data
    model = NystromRegressor(sigma=2.0, penalty=1e-6, n_centers=100, random_state=0, fit_intercept=False).fit(X, y)
    path = tmp_path / "model"
    save_model(model, path)
    # Rewrite it as an older daskkrr wrote it: no intercept array, no fit_intercept parameter.
    import json

    arrays = dict(np.load(path / "arrays.npz"))
    del arrays["intercept"]
    np.savez(path / "arrays.npz", **arrays)
    meta = json.loads((path / "daskkrr-model.json").read_text())
    del meta["params"]["fit_intercept"]
    (path / "daskkrr-model.json").write_text(json.dumps(meta))
    old = load_model(path)
    assert old.fit_intercept is False
    np.testing.assert_allclose(old.intercept_, model.y_mean_)
    np.testing.assert_allclose(old.predict(X[:50]), model.predict(X[:50]), rtol=1e-12)


def test_intercept_round_trips(tmp_path, offset_data):
    X, y = offset_data
    model = FalkonRegressor(sigma=2.0, n_centers=100, random_state=0, max_iter=30).fit(X, y)
    save_model(model, tmp_path / "m")
    back = load_model(tmp_path / "m")
    np.testing.assert_array_equal(back.intercept_, model.intercept_)
    np.testing.assert_array_equal(back.predict(X[:20]), model.predict(X[:20]))


# ----------------------------------------------------------------------------- the sketch
def _problem(n=6000, M=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    kernel = GaussianKernel(sigma=2.5)
    Z = X[rng.choice(n, M, replace=False)]
    return X, Z, kernel


def test_sketch_of_the_centers_is_falkons_preconditioner():
    """FALKON's rows are the centers': a sketch of the same rows changes nothing."""
    X, Z, kernel = _problem()
    Kmm = kernel(Z, Z)
    falkon = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-5, n=len(X))
    sketched = FalkonPreconditioner.from_kernel_matrix(
        Kmm, penalty=1e-5, n=len(X), sketch=[Kmm[:100], Kmm[100:]])
    np.testing.assert_allclose(sketched.A, falkon.A, rtol=1e-9, atol=1e-11)
    np.testing.assert_array_equal(sketched.T, falkon.T)


@pytest.mark.parametrize("center", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_sketch_factor_is_the_sampled_gram(center, weighted):
    X, Z, kernel = _problem()
    M = Z.shape[0]
    weights = np.random.default_rng(1).uniform(0.5, 2.0, size=M) if weighted else None
    Ks = kernel(X[:1500], Z)
    P = FalkonPreconditioner.from_kernel_matrix(kernel(Z, Z), penalty=1e-4, n=len(X), weights=weights,
                                                sketch=(Ks[i:i + 256] for i in range(0, 1500, 256)),
                                                center_sketch=center)
    W = solve_triangular(P.T, (P.d[:, None] * Ks.T), trans="T", lower=False).T
    W = np.vstack([P.T.T, W])  # FALKON's rows (the centers') and the sketch's
    if center:
        W = W - W.mean(axis=0)
    expected = W.T @ W / (M + 1500) + 1e-4 * np.eye(M)
    np.testing.assert_allclose(P.A.T @ P.A, expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match=r"sketch blocks must have shape \(rows, 300\)"):
        FalkonPreconditioner.from_kernel_matrix(kernel(Z, Z), penalty=1e-4, n=len(X), sketch=[Ks[:, :10]])
    empty = FalkonPreconditioner.from_kernel_matrix(kernel(Z, Z), penalty=1e-4, n=len(X), sketch=[])
    np.testing.assert_allclose(empty.A, FalkonPreconditioner.from_kernel_matrix(kernel(Z, Z), penalty=1e-4,
                                                                                n=len(X)).A, rtol=1e-12)


def test_sketch_cuts_cg_iterations_and_keeps_the_solution():
    rng = np.random.default_rng(4)
    n = 20_000
    X = rng.uniform(-1, 1, size=(n, 5))
    y = np.sin(3 * X[:, 0]) * X[:, 1] + X[:, 2] ** 2 + 0.1 * rng.normal(size=n)
    common = dict(sigma=1.0, penalty=1e-7, n_centers=400, random_state=3, chunks=5000, max_iter=200, tol=1e-6)
    direct = NystromRegressor(sigma=1.0, penalty=1e-7, n_centers=400, random_state=3, chunks=5000).fit(X, y)
    falkon = FalkonRegressor(**common, preconditioner_rows=None).fit(X, y)
    sketched = FalkonRegressor(**common, preconditioner_rows=1600).fit(X, y)  # 4 M rows
    assert sketched.preconditioner_rows_ == 1600
    assert falkon.preconditioner_rows_ == 0
    assert sketched.converged_
    assert sketched.n_iter_ <= 0.6 * falkon.n_iter_, (sketched.n_iter_, falkon.n_iter_)
    Xt = rng.uniform(-1, 1, size=(500, 5))
    expected = direct.predict(Xt)
    assert np.max(np.abs(sketched.predict(Xt) - expected)) <= 1e-4 * np.max(np.abs(expected))


def test_sketch_rows_choice_and_seed():
    assert sketch_candidates(1_000_000, 1000) == (0, 2000, 4000, 8000, 16_000)  # none, then 2-16 M
    assert sketch_candidates(10_000, 1000) == (0, 2000, 4000, 8000, 10_000)  # never more than n
    assert sketch_candidates(1000, 500) == (0, 1000)
    Z = np.arange(12.0).reshape(4, 3)
    a, b = sketch_indices(1000, 100, Z), sketch_indices(1000, 100, Z)
    np.testing.assert_array_equal(a, b)  # a resumed fit (same centers) draws the same rows
    assert len(np.unique(a)) == 100 and np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < 1000
    assert not np.array_equal(a, sketch_indices(1000, 100, Z + 1))
    np.testing.assert_array_equal(sketch_indices(50, 50, Z), np.arange(50))
    with pytest.raises(ValueError, match="0 < rows <= n"):
        sketch_indices(10, 11, Z)


def test_kernel_row_sketch_blocks_are_the_kernel_rows():
    X, Z, kernel = _problem(n=2500, M=40)
    sketch = KernelRowSketch(kernel, X, Z)
    blocks = list(sketch)
    assert sketch.rows == 2500 and all(b.dtype == np.float64 for b in blocks) and len(blocks) == 3  # 1024 rows each
    np.testing.assert_allclose(np.vstack(blocks), kernel(X, Z), rtol=1e-12, atol=1e-14)


def test_preconditioner_rows_parameter_is_validated(offset_data):
    X, y = offset_data
    for bad, err in [("many", TypeError), (0, ValueError), (-5, ValueError), (2.5, TypeError)]:
        with pytest.raises(err, match="preconditioner_rows"):
            FalkonRegressor(preconditioner_rows=bad).fit(X, y)
    with pytest.raises(TypeError, match="fit_intercept must be an instance of 'bool'"):
        FalkonRegressor(fit_intercept="yes").fit(X, y)
    model = FalkonRegressor(n_centers=50, preconditioner_rows=10**9, max_iter=5).fit(X, y)
    assert model.preconditioner_rows_ == len(X)  # capped at n


def test_sketch_is_the_same_on_a_cluster_and_chunking_free(offset_data, cluster2):
    X, y = offset_data
    common = dict(sigma=2.0, penalty=1e-4, n_centers=200, random_state=0, max_iter=100, tol=1e-10,
                  preconditioner_rows=800)  # "auto" weighs the cluster's cores: it may choose differently
    local = FalkonRegressor(**common).fit(da.from_array(X, chunks=1000), y)
    with cluster2.as_current():
        remote = FalkonRegressor(**common).fit(da.from_array(X, chunks=700), y)
    assert remote.preconditioner_rows_ == local.preconditioner_rows_ == 800
    assert local.converged_ and remote.converged_
    assert np.linalg.norm(remote.coef_ - local.coef_) <= 1e-8 * np.linalg.norm(local.coef_)


def test_the_sketch_rows_do_not_depend_on_the_last_bits_of_the_centers():
    # Standardisation rounds differently with the chunking, the input route (Zarr, Parquet) and the CPU; the
    # sketch's seed comes from the centers' row indices, or from their values rounded to float32, not their bits.
    Z = np.random.default_rng(0).normal(size=(50, 3))
    Z_ulp = np.nextafter(Z, np.inf)
    rows = np.arange(0, 500, 10)
    np.testing.assert_array_equal(sketch_indices(1000, 100, Z, rows), sketch_indices(1000, 100, Z_ulp, rows))
    assert not np.array_equal(sketch_indices(1000, 100, Z, rows), sketch_indices(1000, 100, Z, rows + 1))
    given = np.full(50, -1)  # centers given by the user are no training rows (sampling.fixed.NOT_A_ROW)
    np.testing.assert_array_equal(sketch_indices(1000, 100, Z, given), sketch_indices(1000, 100, Z_ulp))
    assert not np.array_equal(sketch_indices(1000, 100, Z), sketch_indices(1000, 100, Z + 1e-3))


def test_a_sketched_fit_does_not_depend_on_the_chunking_beyond_round_off(offset_data):
    # Before the sketch was seeded by the centers' row indices, the 1-ulp differences of the standardised
    # centers between two chunkings drew two different sketches: the models then differed by the CG tolerance
    # (1e-2 of max|y| at tol 1e-3), not by round-off. With one preconditioner both CGs take the same steps up
    # to round-off: 10 iterations amplify a relative perturbation of ~1e-16 by at most kappa ** 10 with kappa
    # ~ 10 for FALKON's preconditioned system, far below 1e-6.
    X, y = offset_data
    common = dict(sigma=2.0, penalty=1e-6, n_centers=200, random_state=0, max_iter=10, tol=1e-3,
                  preconditioner_rows=800)
    a = FalkonRegressor(**common).fit(da.from_array(X, chunks=1000), y)
    b = FalkonRegressor(**common).fit(da.from_array(X, chunks=700), y)
    np.testing.assert_array_equal(a.center_indices_, b.center_indices_)
    assert a.n_iter_ == b.n_iter_
    assert np.abs(a.predict(X) - b.predict(X)).max() <= 1e-6 * np.abs(y).max()


@pytest.mark.slow  # a fit in a new Python process: 7 s
def test_threaded_fit_does_not_import_distributed():
    """Dask imports distributed on every compute unless a scheduler is named as a function."""
    code = textwrap.dedent("""
        import sys
        import numpy as np, dask.array as da
        from daskkrr import FalkonRegressor
        X = np.random.default_rng(0).normal(size=(20000, 5)).astype(np.float32)
        FalkonRegressor(n_centers=100, max_iter=3, dtype="float32").fit(da.from_array(X, chunks=4000), X[:, 0])
        print("distributed" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_config_keys_for_the_intercept_and_the_sketch(tmp_path):
    from daskkrr.config import ConfigError, build_estimator, read_config

    path = tmp_path / "model.toml"
    path.write_text('[model]\nestimator = "falkon"\nfit_intercept = false\npreconditioner_rows = "none"\n')
    model = build_estimator(read_config(path))
    assert model.fit_intercept is False and model.preconditioner_rows is None
    path.write_text('[model]\npreconditioner_rows = 5000\n')
    assert build_estimator(read_config(path)).preconditioner_rows == 5000
    path.write_text('[model]\npreconditioner_rows = "lots"\n')
    with pytest.raises(ConfigError, match='preconditioner_rows must be int, "auto" or "none"; got \'lots\''):
        read_config(path)
    path.write_text('[model]\nfit_intercept = "yes"\n')
    with pytest.raises(ConfigError, match="fit_intercept must be bool"):
        read_config(path)


def test_sketch_gram_is_symmetric_in_both_triangles():
    """The jitter retry of its Cholesky rebuilds the upper triangle from the lower one."""
    from daskkrr.solvers.falkon import sketch_gram

    X, Z, kernel = _problem(n=1500, M=300)
    T = np.linalg.cholesky(kernel(Z, Z) + 1e-8 * np.eye(300)).T
    inner, _ = sketch_gram(T, np.ones(300), [kernel(X[:700], Z), kernel(X[700:], Z)], center=True)
    np.testing.assert_array_equal(inner, inner.T)
