"""RPCholesky centers (the paper's trace-error claim, the sequential law, chunking) and centers of one's own."""

from __future__ import annotations

import itertools
import math

import dask
import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonRegressor, NystromRegressor
from daskkrr.config import ConfigError, check_model_config
from daskkrr.kernels import make_kernel
from daskkrr.models.loading import load_model
from daskkrr.sampling import FixedCenters, RPCholeskySampler, UniformSampler, make_sampler
from daskkrr.sampling.rpcholesky import accept_candidates, draw_proportional


@pytest.fixture(scope="module")
def clusters():
    """Clusters of very unequal sizes: the kernel spectrum decays, and uniform sampling misses small clusters."""
    rng = np.random.default_rng(1)
    sizes = [200, 40, 20, 10, 10, 5, 5, 5, 5]
    X = np.concatenate([rng.normal(size=(s, 2)) * 0.3 + rng.normal(size=2) * 4 for s in sizes])
    return X, make_kernel("gaussian", sigma=0.5)


def trace_error(X: np.ndarray, kernel, Z: np.ndarray) -> float:
    """``tr(K - K_nZ K_ZZ^+ K_Zn)``, the trace-norm error of the Nystrom approximation on centers ``Z``."""
    Knz = kernel(X, Z)
    proj = np.linalg.lstsq(kernel(Z, Z), Knz.T, rcond=1e-12)[0]
    return float(np.trace(kernel(X, X)) - np.einsum("ij,ji->", Knz, proj))


def test_expected_trace_error_within_the_papers_bound_and_below_uniform(clusters):
    """Chen, Epperly, Tropp and Webber (2023), Theorem 3.1: with k >= r/eps + r log(1/(eps eta)) pivots,
    E tr(K - K_hat) <= (1 + eps) tr(K - [[K]]_r). The mean over 20 seeds is checked against the bound
    itself (no extra tolerance: the bound holds with room here, the sample mean's spread is ~2% of it)."""
    X, kernel = clusters
    eig = np.sort(np.linalg.eigvalsh(kernel(X, X)))[::-1]
    r, eps = 5, 0.25
    best = float(eig[r:].sum())
    eta = best / float(eig.sum())
    k = math.ceil(r / eps + r * math.log(1 / (eps * eta)))
    with dask.config.set(scheduler="sync"):
        rpc = [trace_error(X, kernel, RPCholeskySampler().select(X, kernel, n_centers=k, random_state=s).centers)
               for s in range(20)]
        uni = [trace_error(X, kernel, UniformSampler().select(X, kernel, n_centers=k, penalty=1.0,
                                                              random_state=s).centers) for s in range(20)]
    assert np.mean(rpc) <= (1 + eps) * best
    # Better than uniform in expectation on a decaying spectrum (the paper's experiments): the gap must
    # exceed 3 standard errors of the difference of the two means, so it is not one lucky set of seeds.
    se = math.sqrt(np.var(rpc, ddof=1) / 20 + np.var(uni, ddof=1) / 20)
    assert np.mean(uni) - np.mean(rpc) > 3 * se


def test_rejection_rounds_draw_the_sequential_pivots():
    """A round's candidates are drawn from the stale diagonal and accepted with probability r/d; the pair
    of pivots must have the law of two steps of sequential RPCholesky: P(i then j) = d_i/tr(d) * r_j/tr(r)
    with r the residual after pivot i. Each of the 20 ordered pairs is checked to 5 binomial standard
    deviations (a miss has probability < 1e-5 per pair)."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(5, 3))
    K = A @ A.T + 0.1 * np.eye(5)
    d = np.diag(K).copy()
    exact = {}
    for i, j in itertools.permutations(range(5), 2):
        res = K - np.outer(K[:, i], K[:, i]) / K[i, i]
        exact[(i, j)] = d[i] / d.sum() * res[j, j] / np.trace(res)
    counts = dict.fromkeys(exact, 0)
    trials = 10_000
    draws = np.random.default_rng(1)
    for _ in range(trials):
        pivots: list[int] = []
        while len(pivots) < 2:  # as select() does: a round that accepts too few is followed by another
            res = K.copy()
            for i in pivots:
                res -= np.outer(res[:, i], res[:, i]) / res[i, i]
            stale = np.maximum(np.diag(res), 0.0)
            cand = draw_proportional(stale, 3, draws)
            chosen = accept_candidates(res[np.ix_(cand, cand)].copy(), stale[cand], draws.random(3),
                                       2 - len(pivots), 1e-12)
            pivots += [int(c) for c in cand[chosen]]
        counts[(pivots[0], pivots[1])] += 1
    total = trials
    for pair, p in exact.items():
        assert abs(counts[pair] / total - p) <= 5 * math.sqrt(p * (1 - p) / total), pair


def test_same_centers_for_any_chunking(clusters):
    X, kernel = clusters
    with dask.config.set(scheduler="sync"):
        a = RPCholeskySampler().select(da.from_array(X, chunks=(X.shape[0], 2)), kernel, n_centers=40,
                                       random_state=7)
        b = RPCholeskySampler(max_candidates=16).select(da.from_array(X, chunks=(37, 2)), kernel, n_centers=40,
                                                         random_state=7)
        c = RPCholeskySampler().select(da.from_array(X, chunks=(37, 2)), kernel, n_centers=40, random_state=7)
    np.testing.assert_array_equal(a.indices, c.indices)
    assert a.size == b.size == 40 and len(b.info["rounds"]) > len(a.info["rounds"])
    assert np.unique(a.indices).size == 40 and a.info["passes"] == len(a.info["rounds"]) - 1


def test_stops_at_the_numerical_rank():
    X = np.repeat(np.arange(4.0)[:, None], 25, axis=0)  # 4 distinct rows: the kernel matrix has rank 4
    with dask.config.set(scheduler="sync"):
        D = RPCholeskySampler().select(X, make_kernel("gaussian", sigma=1.0), n_centers=10, random_state=0)
    assert D.size == 4 and D.info["stopped"] == "rank"
    assert sorted(np.unique(X[D.indices, 0])) == [0.0, 1.0, 2.0, 3.0]


# --------------------------------------------------------------------------- centers of one's own
def test_fixed_centers_give_the_model_of_the_same_rows_drawn_by_a_sampler(regression_data):
    """Uniform centers passed back as an array (in X's units) give the same model to round-off: the
    centers are scaled as X was, and the direct solve sees the same M x M system."""
    X, y = regression_data
    drawn = NystromRegressor(n_centers=30, random_state=3).fit(X, y)
    rows = X[drawn.center_indices_]
    given = NystromRegressor(sampler=rows, random_state=3).fit(X, y)
    # the same (x - mean) / scale of the same rows, through the scaler instead of the blocks: a few ulps
    np.testing.assert_allclose(given.centers_, drawn.centers_, rtol=0, atol=1e-12)
    # the same solve to round-off: the M x M system's conditioning at this penalty times eps (1e-9)
    np.testing.assert_allclose(given.predict(X), drawn.predict(X), rtol=0, atol=1e-9 * np.abs(y).max())
    assert np.all(given.center_indices_ == -1) and given.sampler_info_["sampler"] == "fixed"


@pytest.mark.parametrize(("centers", "message"), [
    (np.zeros(3), "2-D array"),
    (np.zeros((4, 2)), "have 2 features but X has 4"),
    (np.array([[0.0, 1.0, np.nan, 0]]), "row 0, column 2"),
    (np.zeros((0, 4)), "no rows"),
    (np.array([["a"] * 4]), "must be numbers"),
])
def test_bad_centers_are_refused_with_the_problem_named(regression_data, centers, message):
    X, y = regression_data
    assert X.shape[1] == 4
    with pytest.raises(ValueError, match=message):
        FalkonRegressor(sampler=centers, max_iter=2).fit(X, y)


def test_fixed_centers_saved_and_loaded(regression_data, tmp_path):
    X, y = regression_data
    Z = X[:20] + 0.5
    model = FalkonRegressor(sampler=Z, random_state=0).fit(X, y)
    model.save(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    np.testing.assert_array_equal(loaded.sampler, Z)
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    refit = loaded.fit(X, y)  # the loaded parameters refit the same model
    # the same data, centers and solve; only the statistics' reduction order may differ (eps times the
    # conditioning of the small M x M system, far below 1e-10)
    np.testing.assert_allclose(refit.predict(X), model.predict(X), rtol=0, atol=1e-10 * np.abs(y).max())


def test_a_config_file_names_a_sampler_and_explains_arrays():
    assert check_model_config({"sampler": "rpcholesky"})["sampler"] == "rpcholesky"
    with pytest.raises(ConfigError, match=r"from Python only: FalkonRegressor\(sampler=np.load"):
        check_model_config({"sampler": "centers.npy"})
    assert isinstance(make_sampler(np.ones((2, 2))), FixedCenters)


def test_given_centers_do_not_warn_about_n_centers_on_small_data():
    """n_centers (default 1000) is not used with an array of centers: no warning that it exceeds the rows."""
    import warnings

    X, y = np.random.default_rng(3).normal(size=(200, 3)), np.random.default_rng(4).normal(size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model = FalkonRegressor(sampler=X[:40].copy(), max_iter=30).fit(X, y)
    assert model.centers_.shape == (40, 3)
    with pytest.warns(UserWarning, match="n_centers=1000 is larger than the number of training rows"):
        FalkonRegressor(max_iter=5).fit(X, y)  # the warning itself is still given where n_centers is used
