"""The penalty path: one Gram pass, every penalty's Nystrom solution, and the tuner that
profiles the penalty out of its search with it (issue 16)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import r2_score

from daskkrr import ExactKernelRidge, FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.kernels import GaussianKernel
from daskkrr.pipeline.penalty_path import fit_penalty_path, path_unsupported
from daskkrr.solvers import FalkonPreconditioner
from daskkrr.solvers.exact import exact_krr_path, exact_krr_solve
from daskkrr.tune import BKBSearchCV
from daskkrr.tune.search import PATH_PER_DECADE

PENALTIES = [1e-9, 1e-7, 1e-5, 1e-3, 1e-1]


def _data(n: int = 600, seed: int = 0, d: int = 4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * rng.normal(size=n) + 5.0  # an offset: the intercept matters
    return X, y


# --------------------------------------------------------------------------- the solver
@pytest.mark.parametrize("jitter", [None, 1e-6])  # the second keeps the jitter's part (exact_penalty)
@pytest.mark.parametrize("weights", [False, True])
def test_the_path_equals_a_direct_solve_at_each_penalty(jitter, weights):
    rng = np.random.default_rng(1)
    X, Z = rng.normal(size=(400, 3)), rng.normal(size=(40, 3))
    k = GaussianKernel(sigma=1.5)
    K, y = k(X, Z), rng.normal(size=400)
    w = rng.uniform(0.5, 2.0, 40) if weights else None
    gram, b = K.T @ K, K.T @ y
    pre = FalkonPreconditioner.from_kernel_matrix(k(Z, Z), penalty=1e-3, n=400, weights=w, relative_jitter=jitter)
    assert pre.exact_penalty == (jitter is not None)
    path = pre.direct_solve_path(gram, b, PENALTIES)
    assert path.shape == (40, len(PENALTIES))
    for j, lam in enumerate(PENALTIES):
        one = FalkonPreconditioner.from_kernel_matrix(k(Z, Z), penalty=lam, n=400, weights=w,
                                                      relative_jitter=jitter).direct_solve(gram.copy(), b)
        assert np.allclose(path[:, j], one, rtol=1e-7, atol=1e-9 * np.abs(one).max()), lam


def test_the_path_refuses_what_it_cannot_solve():
    k = GaussianKernel(sigma=1.0)
    Z = np.random.default_rng(0).normal(size=(10, 2))
    pre = FalkonPreconditioner.from_kernel_matrix(k(Z, Z), penalty=1e-3, n=100)
    with pytest.raises(ValueError, match="positive"):
        pre.direct_solve_path(np.eye(10), np.ones(10), [1e-3, 0.0])
    with pytest.raises(ValueError, match="one right-hand side"):
        pre.direct_solve_path(np.eye(10), np.ones((10, 2)), [1e-3])


# --------------------------------------------------------------------------- the fit
@pytest.mark.parametrize("estimator", [
    NystromRegressor(n_centers=60, sigma=1.5, random_state=0),
    FalkonRegressor(n_centers=60, sigma=1.5, random_state=0),
    NystromRegressor(n_centers=60, sigma=1.5, random_state=0, dtype="float32", fit_intercept=False),
    # centers that do not depend on the penalty either: RPCholesky's pivots (the kernel alone) and given ones
    NystromRegressor(n_centers=60, sigma=1.5, random_state=0, sampler="rpcholesky"),
    FalkonRegressor(sigma=1.5, sampler=np.random.default_rng(7).normal(size=(60, 4))),
], ids=["nystrom", "falkon", "nystrom-float32", "rpcholesky", "fixed-centers"])
def test_a_path_fit_predicts_as_a_fit_at_each_penalty(estimator):
    X, y = _data()
    Xt = _data(100, seed=1)[0]
    path = fit_penalty_path(estimator, X, y, PENALTIES)
    P = path.predict(Xt)
    assert P.shape == (100, len(PENALTIES)) and path.coef_.shape == (60, len(PENALTIES))
    np.testing.assert_array_equal(path.penalties_, PENALTIES)
    common = {k: v for k, v in estimator.get_params().items() if k in NystromRegressor().get_params()}
    common["dtype"] = "float64"  # a path is computed in float64 whatever the estimator's dtype
    for j, lam in enumerate(PENALTIES):
        ref = NystromRegressor(**common).set_params(penalty=lam).fit(X, y).predict(Xt)
        assert np.abs(P[:, j] - ref).max() <= 1e-8 * np.abs(ref).max(), lam


@pytest.mark.slow  # M = 2048 fits: 18 s; the exactness of the path: test_the_path_equals_a_direct_solve_at_each_penalty
def test_a_float32_estimators_path_is_the_float64_nystrom_solution():
    """At M >= 2048 a float32 fit factors in float32 with a jitter floor that keeps part of the
    penalty; a float32 Gram pass then amplified by T^{-1} made a path off by 100x at penalty
    1e-6. The path runs in float64 and equals the float64 direct solve."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((6000, 5)).astype(np.float32).astype(np.float64)
    y = np.sin(X[:, :3].sum(axis=1)) + 0.1 * rng.standard_normal(6000)
    Xt = rng.standard_normal((200, 5))
    lams = [1e-6, 1e-3]
    path = fit_penalty_path(NystromRegressor(n_centers=2048, sigma=20.0, random_state=0, dtype="float32"), X, y, lams)
    for j, lam in enumerate(lams):
        ref = NystromRegressor(n_centers=2048, sigma=20.0, random_state=0, penalty=lam).fit(X, y).predict(Xt)
        assert np.abs(path.predict(Xt)[:, j] - ref).max() <= 1e-6 * np.abs(ref).max(), lam


def test_a_path_is_refused_where_the_centers_or_the_model_depend_on_the_penalty():
    X, y = _data(200)
    assert path_unsupported(FalkonRegressor()) is None
    assert "sampler" in path_unsupported(FalkonRegressor(sampler="squeak"))
    assert "sampler" in path_unsupported(FalkonRegressor(sampler="bless"))
    assert "compute_std" in path_unsupported(NystromRegressor(compute_std=True))
    assert path_unsupported(ExactKernelRidge()) is None  # its direct solve (see the exact-path tests)
    assert "not a squared-loss kernel ridge regressor" in path_unsupported(FalkonClassifier())
    with pytest.raises(ValueError, match="direct solve: its centers depend on the penalty"):
        fit_penalty_path(FalkonRegressor(n_centers=20, sampler="squeak"), X, y, PENALTIES)
    with pytest.raises(ValueError, match="one target"):
        fit_penalty_path(FalkonRegressor(n_centers=20), X, np.column_stack([y, y]), PENALTIES)
    for bad in ([], [1e-3, -1.0], [np.nan]):
        with pytest.raises(ValueError, match="penalties must be"):
            fit_penalty_path(FalkonRegressor(n_centers=20), X, y, bad)


# --------------------------------------------------------------------------- exact KRR's path
@pytest.mark.parametrize("weights", [False, True])
def test_the_exact_path_equals_the_factored_solve_at_each_penalty(weights):
    X, y = _data(300)
    K = GaussianKernel(sigma=1.5)(X, X)
    w = np.random.default_rng(2).uniform(0.0, 3.0, len(y)) if weights else None
    if weights:
        w[:10] = 0.0  # zero weights are allowed: their rows get no coefficient
    C = exact_krr_path(K, y, np.array(PENALTIES), sample_weight=w)
    assert C.shape == (300, len(PENALTIES))
    for j, lam in enumerate(PENALTIES):
        ref = exact_krr_solve(K, y, lam, sample_weight=w)[0]
        # the same system; its condition number (about 1 / lam) bounds the agreement of two solvers
        assert np.linalg.norm(C[:, j] - ref) <= max(1e-10, 1e-15 / lam) * np.linalg.norm(ref), lam
        assert np.abs(K @ C[:, j] - K @ ref).max() <= 1e-6 * np.abs(y).max(), lam  # the fitted values
    if weights:
        assert not C[:10].any()
    for bad in ([], [0.0], [np.inf]):
        with pytest.raises(ValueError, match="penalties must be"):
            exact_krr_path(K, y, np.array(bad, dtype=float))
    with pytest.raises(ValueError, match="one target"):
        exact_krr_path(K, np.column_stack([y, y]), np.array(PENALTIES))


def test_an_exact_path_fit_predicts_as_exact_fits_and_refuses_pcg():
    X, y = _data(400)
    Xt = _data(80, seed=1)[0]
    path = fit_penalty_path(ExactKernelRidge(sigma=1.5), X, y, PENALTIES)
    assert path.solver_ == "direct" and path.coef_.shape == (400, len(PENALTIES))
    P = path.predict(Xt)
    for j, lam in enumerate(PENALTIES):
        ref = ExactKernelRidge(sigma=1.5, penalty=lam, solver="direct").fit(X, y).predict(Xt)
        assert np.abs(P[:, j] - ref).max() <= 1e-6 * np.abs(ref).max(), lam
    assert "solver='pcg'" in path_unsupported(ExactKernelRidge(solver="pcg"))
    assert "compute_std" in path_unsupported(ExactKernelRidge(compute_std=True))
    assert "takes PCG" in path_unsupported(ExactKernelRidge(max_samples=100), n_rows=400, n_features=4)
    assert path_unsupported(ExactKernelRidge(max_samples=1000), n_rows=400, n_features=4) is None
    with pytest.raises(ValueError, match="ExactKernelRidge's direct solve: solver='pcg'"):
        fit_penalty_path(ExactKernelRidge(solver="pcg"), X, y, PENALTIES)


def test_a_search_of_exact_krr_profiles_the_penalty_when_asked():
    """Its path (an n x n eigendecomposition) costs several direct fits: "auto" leaves it, True takes it."""
    X, y = _data(300)
    auto = _search(ExactKernelRidge(), X, y, budget_fits=4)
    assert auto.penalty_path_ is None and all("penalty" in c for c in auto.candidates_)
    s = _search(ExactKernelRidge(), X, y, budget_fits=4, profile_penalty=True)
    assert s.penalty_path_ is not None and all(set(c) == {"sigma"} for c in s.candidates_)
    train, val = next(s._splitter().split(X, y))
    model = fit_penalty_path(ExactKernelRidge(sigma=s.best_params_["sigma"]), X[train], y[train], s.penalty_path_)
    assert s.best_score_ == pytest.approx(max(r2_score(y[val], c) for c in model.predict(X[val]).T), rel=1e-9)
    # a split too large for the direct solve has no path
    with pytest.raises(ValueError, match="cannot profile the penalty: solver='auto' takes PCG"):
        _search(ExactKernelRidge(max_samples=100), X, y, budget_fits=4, profile_penalty=True)


# --------------------------------------------------------------------------- the search
def _search(estimator, X, y, **kw):
    space = kw.pop("space", {"sigma": (0.3, 8.0), "penalty": (1e-8, 1e-2)})
    return BKBSearchCV(estimator, space, budget_fits=kw.pop("budget_fits", 8), batch_size=2, random_state=0,
                       **kw).fit(X, y)


def test_the_search_profiles_the_penalty_out_and_scores_the_best_of_each_path():
    X, y = _data()
    s = _search(FalkonRegressor(n_centers=60, random_state=0), X, y)
    path = s.penalty_path_
    # the path spans the range as far as the box may grow (half its log-width past each face)
    assert path[0] == pytest.approx(10**-11) and path[-1] == pytest.approx(10**1)
    assert len(path) == 12 * PATH_PER_DECADE + 1
    assert all(set(c) == {"sigma"} for c in s.candidates_)  # the candidates move sigma only
    assert s.bandit_.arms.shape[1] == 1
    assert all(any(np.isclose(p, path, rtol=1e-12)) for p in s.cv_results_["param_penalty"])
    # a candidate's score is its path's best: no penalty on the path validates better
    train, val = next(s._splitter().split(X, y))
    best = s.best_params_
    model = fit_penalty_path(FalkonRegressor(n_centers=60, random_state=0, sigma=best["sigma"]), X[train], y[train],
                             path)
    scores = [r2_score(y[val], col) for col in model.predict(X[val]).T]
    assert s.best_score_ == pytest.approx(max(scores), rel=1e-12)
    assert best["penalty"] == pytest.approx(path[int(np.argmax(scores))])
    assert s.best_estimator_.penalty == best["penalty"]


def test_a_profiled_search_beats_the_same_budget_on_both_coordinates():
    """On a wiggly target with a narrow (sigma, penalty) optimum, the path finds a better
    validation score than a search of the same fits over both."""
    X, y = _data(800)
    kw = dict(budget_fits=10)
    profiled = _search(FalkonRegressor(n_centers=80, random_state=0), X, y, **kw)
    plain = _search(FalkonRegressor(n_centers=80, random_state=0), X, y, profile_penalty=False, **kw)
    assert plain.penalty_path_ is None and profiled.n_fits_ <= 10 and plain.n_fits_ <= 10
    assert profiled.best_score_ > plain.best_score_


def test_folds_share_one_penalty_per_candidate():
    X, y = _data(400)
    s = _search(FalkonRegressor(n_centers=40, random_state=0), X, y, cv=3, budget_fits=6)
    rows = s.cv_results_
    assert s.n_splits_ == 3 and s.n_fits_ <= 6
    means = np.mean([rows[f"split{k}_test_score"] for k in range(3)], axis=0)
    np.testing.assert_allclose(rows["mean_test_score"], means)


def test_a_space_of_the_penalty_alone_is_one_path():
    X, y = _data(300)
    s = _search(FalkonRegressor(n_centers=40, random_state=0, sigma=2.0), X, y, space={"penalty": (1e-8, 1e-2)})
    assert s.n_fits_ == 1 and len(s.cv_results_["params"]) == 1
    assert set(s.best_params_) == {"penalty"}


def test_profile_penalty_true_says_why_it_cannot_and_auto_falls_back():
    X, y = _data(200)
    with pytest.raises(ValueError, match="cannot profile the penalty: .*sampler='squeak'"):
        _search(FalkonRegressor(n_centers=20, sampler="squeak"), X, y, profile_penalty=True)
    with pytest.raises(ValueError, match="no 'penalty' range"):
        _search(FalkonRegressor(n_centers=20), X, y, space={"sigma": (0.5, 4.0)}, profile_penalty=True)
    with pytest.raises(ValueError, match="profile_penalty must be"):
        _search(FalkonRegressor(n_centers=20), X, y, profile_penalty="yes")
    s = _search(FalkonRegressor(n_centers=20, sampler="squeak"), X, y, budget_fits=4)  # "auto" falls back
    assert s.penalty_path_ is None and all("penalty" in c for c in s.candidates_)


@pytest.mark.slow  # a CLI search of several path fits: 11 s
def test_cli_tune_profiles_the_penalty_on_a_two_worker_cluster(tmp_path, cluster2, capsys):
    """The paths run as tasks on the workers; ``--no-penalty-path`` searches both coordinates."""
    import json

    import pandas as pd

    from daskkrr.cli import main

    X, y = _data(300)
    table = tmp_path / "train.csv"
    pd.DataFrame(np.column_stack([X, y]), columns=["a", "b", "c", "d", "target"]).to_csv(table, index=False)
    seen = {}
    for flag in ([], ["--no-penalty-path"]):
        out, history = tmp_path / f"model{len(flag)}", tmp_path / f"history{len(flag)}.json"
        argv = ["tune", "--data", str(table), "--target", "target", "--out", str(out), "--history", str(history),
                "--estimator", "falkon", "--n-centers", "30", "--budget-fits", "4", "--round-size", "2",
                "--search-seed", "0", "--scheduler", cluster2.scheduler.address, "-q", *flag]
        assert main(argv) == 0
        assert "4 fits" in capsys.readouterr().out
        seen[bool(flag)] = json.loads(history.read_text())
    path = 10.0 ** np.arange(-11.5, 2.5 + 1e-9, 1 / PATH_PER_DECADE)  # the default range, grown both ways
    assert all(np.isclose(r["param_penalty"], path, rtol=1e-9).any() for r in seen[False])
    assert not all(np.isclose(r["param_penalty"], path, rtol=1e-9).any() for r in seen[True])
