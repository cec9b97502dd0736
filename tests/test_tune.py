"""BKBSearchCV and ``daskkrr tune``: better than the defaults within the budget, sklearn search attributes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.kernel_ridge import KernelRidge
from sklearn.model_selection import GridSearchCV, ShuffleSplit

from daskkrr import ExactKernelRidge, FalkonRegressor
from daskkrr.cli import main
from daskkrr.tune import BKBSearchCV


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # A wiggly target: the defaults (sigma = sqrt(d), penalty = 1e-6) smooth it out.
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 3))
    y = np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.05 * rng.normal(size=n)
    return X, y


@pytest.fixture(scope="module")
def search():
    X, y = _data(300, 0)
    return BKBSearchCV(ExactKernelRidge(), budget_fits=12, batch_size=4, random_state=0).fit(X, y)


def test_tuning_beats_the_defaults_within_the_budget(search):
    X, y = _data(300, 0)
    Xt, yt = _data(500, 1)
    default = ExactKernelRidge().fit(X, y).score(Xt, yt)
    tuned = search.score(Xt, yt)
    assert tuned > default + 0.1, (tuned, default)
    assert tuned > 0.8
    assert search.n_fits_ <= 12 and search.stop_reason_ == "budget_fits"
    assert len(search.cv_results_["params"]) == search.n_fits_  # one holdout split: a fit per candidate


def test_search_exposes_the_sklearn_search_attributes(search):
    holdout = ShuffleSplit(n_splits=1, test_size=0.25, random_state=0)  # what cv=0.25 means
    grid = GridSearchCV(ExactKernelRidge(), {"sigma": [1.0], "penalty": [1e-3]}, cv=holdout).fit(*_data(60, 0))
    expected = {k for k in grid.cv_results_ if "train" not in k and "score_time" not in k}
    assert expected <= set(search.cv_results_)
    res = search.cv_results_
    best = search.best_index_
    assert res["rank_test_score"][best] == 1
    assert search.best_score_ == res["mean_test_score"][best] == np.nanmax(res["mean_test_score"])
    assert search.best_params_ == res["params"][best]
    assert search.best_estimator_.get_params()["sigma"] == search.best_params_["sigma"]
    assert hasattr(search.best_estimator_, "coef_")
    assert isinstance(search.history_, pd.DataFrame) and len(search.history_) == len(res["params"])
    assert list(search.history_["round"]) == sorted(search.history_["round"])
    np.testing.assert_array_equal(search.predict(_data(5, 2)[0]), search.best_estimator_.predict(_data(5, 2)[0]))


def test_time_budget_stops_after_the_batch_running():
    X, y = _data(120, 0)
    s = BKBSearchCV(ExactKernelRidge(), budget_fits=None, budget_seconds=1e-3, batch_size=2, cv=3,
                    random_state=0).fit(X, y)
    assert s.stop_reason_ == "budget_seconds"
    assert s.n_fits_ == 2 * 3  # one batch of 2 candidates x 3 folds
    assert s.cv_results_["split2_test_score"].shape == (2,)


@pytest.mark.parametrize("bad, match", [
    ({"budget_fits": 0}, "budget_fits must be"),
    ({"budget_fits": -3}, "budget_fits must be"),
    ({"budget_seconds": 0.0}, "budget_seconds must be"),
    ({"param_space": {"n_centers": (500, 900)}}, "no valid point"),
    ({"param_space": {"sigma": (2.0, 1.0)}}, "low must be <= high"),
    ({"param_space": {"sigma": (0.0, 1.0)}}, "must be > 0"),
    ({"param_space": {"gamma": (1.0, 2.0)}}, "cannot tune"),
    ({"param_space": {"sigma": ([0.1, 0.2], [1.0, 2.0])}, "ard": True}, "length 3"),
    ({"cv": 1.5}, "holdout fraction"),
])
def test_bad_searches_are_refused(bad, match):
    from daskkrr import NystromRegressor

    X, y = _data(60, 0)
    with pytest.raises(ValueError, match=match):
        BKBSearchCV(NystromRegressor(n_centers=20), **bad).fit(X, y)


def _accepts_vector_sigma() -> bool:
    try:
        ExactKernelRidge(sigma=np.ones(3))._validate_params()
    except (ValueError, TypeError):
        return False
    return True


def test_ard_tuning_passes_one_sigma_per_feature():
    X, y = _data(150, 0)
    if not _accepts_vector_sigma():
        with pytest.raises(ValueError, match="no valid point"):
            BKBSearchCV(ExactKernelRidge(), ard=True, budget_fits=2).fit(X, y)
        pytest.skip("the estimators do not accept a per-feature sigma yet (issue 16, item 3): "
                    "only the refusal was checked")
    s = BKBSearchCV(ExactKernelRidge(), ard=True, budget_fits=6, batch_size=3, random_state=0).fit(X, y)
    assert np.shape(s.best_params_["sigma"]) == (3,)


def test_cli_tune_on_a_two_worker_cluster(tmp_path, cluster2, capsys):
    X, y = _data(200, 0)
    table = tmp_path / "train.csv"
    pd.DataFrame(np.column_stack([X, y]), columns=["a", "b", "c", "target"]).to_csv(table, index=False)
    out, history = tmp_path / "model", tmp_path / "history.json"
    argv = ["tune", "--data", str(table), "--target", "target", "--out", str(out), "--history", str(history),
            "--estimator", "exact", "--budget-fits", "2", "--round-size", "2", "--search-seed", "0",
            "--scheduler", cluster2.scheduler.address, "-q"]
    assert main(argv) == 0
    assert "2 fits" in capsys.readouterr().out
    rows = json.loads(history.read_text())
    assert len(rows) == 2 and {"param_sigma", "mean_test_score", "round"} <= set(rows[0])
    from daskkrr import load

    assert load(out).score(X, y) > 0.5
    assert main(argv) == 1  # outputs exist: refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err


class _Picky(RegressorMixin, BaseEstimator):
    """scikit-learn KernelRidge that refuses wide kernels: a stand-in for fits that fail."""

    def __init__(self, sigma: float = 1.0, penalty: float = 1e-3):
        self.sigma = sigma
        self.penalty = penalty

    def fit(self, X, y):
        if self.sigma > 2.0:
            raise ValueError("sigma too wide")
        self.model_ = KernelRidge(alpha=self.penalty, kernel="rbf", gamma=0.5 / self.sigma**2).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


def test_failed_candidates_are_excluded_and_reported():
    X, y = _data(120, 0)
    s = BKBSearchCV(_Picky(), {"sigma": (0.1, 20.0), "penalty": (1e-4, 1e-1)}, budget_fits=12, batch_size=4,
                    random_state=0).fit(X, y)
    failed = s.history_[s.history_["error"].notna()]
    assert len(failed) > 0 and failed["error"].str.contains("sigma too wide").all()
    assert np.isnan(s.cv_results_["mean_test_score"][failed.index]).all()
    assert s.best_params_["sigma"] <= 2.0
    assert not set(failed["arm"]) & set(s.bandit_.pending)
    assert all(s.bandit_._excluded[i] for i in failed["arm"])


def test_a_space_with_nothing_to_refine_still_searches():
    """Only n_centers tuned: the refinement has no range to move (its compass is empty)."""
    X, y = _data(120, 0)
    s = BKBSearchCV(FalkonRegressor(), {"n_centers": (10, 60)}, budget_fits=10, random_state=0).fit(X, y)
    assert 10 <= s.best_params_["n_centers"] <= 60 and s.n_fits_ <= 10
    assert not s.refined_  # no fits held back for a refinement that cannot move


def test_a_search_whose_every_fit_fails_says_why():
    X, y = _data(60, 0)
    with pytest.raises(ValueError, match="every evaluated candidate failed: ValueError: sigma too wide"):
        BKBSearchCV(_Picky(), {"sigma": (4.0, 20.0), "penalty": (1e-4, 1e-1)}, budget_fits=6, batch_size=2,
                    random_state=0).fit(X, y)


def test_the_box_grows_past_the_face_the_best_candidate_is_on():
    from daskkrr.tune.space import GROW_MAX, GROW_POINTS, GROW_STEP, BoxGrowth, parse_space

    ranges = parse_space({"sigma": (1.0, 10.0), "penalty": (1e-4, 1e-2), "n_centers": (10, 50)}, 3, ard=False)
    growth = BoxGrowth(ranges, max_centers=100)
    best = np.array([0.5, 0.02, 0.99])  # penalty near its low face, n_centers at its high one
    assert growth.faces_near(best) == [(1, 0)]  # n_centers never grows
    sigma = ranges[0].values(best[None, :1])[0, 0]
    for k in range(GROW_MAX):
        new = growth.grow(best)
        pen = np.array([p["penalty"] for p in new.params])
        top = 1e-4 * 100.0 ** (-GROW_STEP * k)  # the face before this growth
        low = 1e-4 * 100.0 ** (-GROW_STEP * (k + 1))
        assert len(pen) == GROW_POINTS and pen.min() == pytest.approx(low) and pen.max() < top
        np.testing.assert_allclose(np.diff(np.log(pen)), -np.log(100.0) * GROW_STEP / GROW_POINTS)  # a line
        # The other coordinates are the best candidate's.
        assert all(p["sigma"] == pytest.approx(sigma) and p["n_centers"] == 49 for p in new.params)
        assert growth.grown[-1][:2] == ("penalty", "low") and growth.grown[-1][2] == pytest.approx(low)
        best = new.arms[np.argmin(pen)]
    assert growth.faces_near(best) == [] and len(growth.grow(best).params) == 0  # grown GROW_MAX times


def test_search_follows_an_optimum_outside_the_box_only_when_allowed():
    X, y = _data(300, 0)  # 0.05 noise: the best penalty is far below 1e-2
    space = {"sigma": (0.3, 3.0), "penalty": (1e-2, 1.0)}
    grown = BKBSearchCV(ExactKernelRidge(), space, budget_fits=16, batch_size=4, random_state=0).fit(X, y)
    fixed = BKBSearchCV(ExactKernelRidge(), space, budget_fits=16, batch_size=4, grow_space=False,
                        random_state=0).fit(X, y)
    assert any(face[1:3] == ("penalty", "low") for face in grown.space_growth_)
    assert grown.best_params_["penalty"] < 1e-2 <= fixed.best_params_["penalty"]
    assert fixed.space_growth_ == [] and len(fixed.candidates_) < len(grown.candidates_)
    assert grown.best_score_ > fixed.best_score_


def test_local_refinement_finds_the_peak_of_a_quadratic():
    from daskkrr.tune.space import REFINE_STEP, LocalRefinement, parse_space

    ranges = parse_space({"sigma": (1.0, 16.0), "penalty": (1e-8, 1e-2), "n_centers": (10, 50)}, 3, ard=False)

    def score(u):
        return -((u[0] - 0.45) ** 2) - 0.1 * (u[1] - 0.6) ** 2

    def step(local, arms, reach=4.0):
        return local.step(arms, np.array([score(u) for u in arms]), reach)

    local = LocalRefinement(ranges, np.array([0.5, 0.5, 0.3]), np.zeros(3), np.ones(3))
    pattern = local.pattern()
    unit = np.array([[-1, 0, 0], [1, 0, 0], [0, -1, 0], [0, 1, 0]]) * REFINE_STEP
    np.testing.assert_allclose(pattern, local.center + unit)  # a compass; n_centers stays
    seen = np.vstack([local.center, pattern])
    np.testing.assert_allclose(step(local, seen), [0.45, 0.6, 0.3])  # exact on a quadratic
    # Candidates with another n_centers, or past the weight's cut-off (8.4 steps), are not in the model.
    far = np.array([[0.45, 0.6, 0.9], [0.0, 0.0, 0.3]])
    np.testing.assert_allclose(local.step(np.vstack([seen, far]), np.r_[[score(u) for u in seen], 5.0, 5.0]),
                               [0.45, 0.6, 0.3])
    # The peak is sought within the reach; at a face the down move is cut short and the
    # model uses the shortened offset.
    local = LocalRefinement(ranges, np.array([0.5, 0.03, 0.3]), np.zeros(3), np.ones(3))
    pattern = local.pattern()
    assert pattern[2, 1] == 0.0
    best = step(local, np.vstack([local.center, pattern]))
    assert best[0] == pytest.approx(0.45)
    assert best[1] == pytest.approx(0.03 + 4 * REFINE_STEP)  # the peak is far above: at most 4 steps
    assert step(local, np.vstack([local.center, pattern]), reach=1.0)[1] == pytest.approx(0.03 + REFINE_STEP)
    # A direction with candidates at fewer than three offsets along it stays at the centre.
    best = step(local, np.vstack([local.center, pattern[1:]]))
    assert best[0] == pytest.approx(0.5) and best[1] == pytest.approx(0.03 + 4 * REFINE_STEP)
    # With three offsets on one side the model extrapolates, within the reach.
    one_sided = np.vstack([local.center, local.center + [REFINE_STEP, 0, 0], local.center + [2 * REFINE_STEP, 0, 0],
                           pattern[2:]])
    assert step(local, one_sided)[0] == pytest.approx(0.45)
    # Too few candidates for a model: none.
    assert step(local, local.center[None, :]) is None


def test_refinement_moves_reach_as_far_as_the_box_may_grow():
    from daskkrr.tune.space import GROW_MAX, GROW_STEP, BoxGrowth, LocalRefinement, parse_space

    ranges = parse_space({"sigma": (1.0, 16.0), "penalty": (1e-8, 1e-2), "n_centers": (10, 50)}, 3, ard=False)
    growth = BoxGrowth(ranges)
    low, high = growth.outer_bounds()
    np.testing.assert_allclose(low, [-GROW_STEP * GROW_MAX, -GROW_STEP * GROW_MAX, 0.0])  # n_centers never grows
    np.testing.assert_allclose(high, [1 + GROW_STEP * GROW_MAX, 1 + GROW_STEP * GROW_MAX, 1.0])
    local = LocalRefinement(ranges, np.array([0.5, 0.0, 0.3]), low, high)
    assert local.pattern()[2, 1] < growth.low[1]  # the compass steps past the present face


def test_a_refinement_step_is_a_new_candidate():
    from daskkrr.tune.space import REFINE_GAP, LocalRefinement, parse_space

    ranges = parse_space({"sigma": (1.0, 16.0), "penalty": (1e-8, 1e-2)}, 3, ard=False)
    local = LocalRefinement(ranges, np.array([0.5, 0.5]), np.zeros(2), np.ones(2))
    seen = np.vstack([local.center, local.pattern()])
    scores = -np.sum((seen - 0.5) ** 2, axis=1)  # the peak is the centre, already evaluated
    for reach in (1.0, 4.0):
        arm = local.step(seen, scores, reach)
        x, taken = local.offsets(arm)[0], local.offsets(seen)
        assert np.min(np.linalg.norm(taken - x, axis=1)) >= REFINE_GAP - 1e-9
        assert np.max(np.abs(x)) <= reach + 1e-9
        assert np.linalg.norm(x) == pytest.approx(REFINE_GAP)  # as near the peak as allowed
    # Every arm of a tiny region is near an evaluated one: no step.
    assert local.step(seen, scores, reach=0.25) is None


def test_local_refinement_follows_a_diagonal_ridge():
    from daskkrr.tune.space import REFINE_STEP, LocalRefinement, parse_space

    ranges = parse_space({"sigma": (1.0, 16.0), "penalty": (1e-8, 1e-2)}, 3, ard=False)
    h = REFINE_STEP

    def score(u):  # a ridge along sigma + penalty = 1, peaked at (0.6, 0.4)
        a, b = u[0] - 0.6, u[1] - 0.4
        return -10 * (a + b) ** 2 - 0.5 * (a - b) ** 2

    local = LocalRefinement(ranges, np.array([0.5, 0.5]), np.zeros(2), np.ones(2))
    seen = np.vstack([local.center, local.pattern(), local.center + [-h, h]])  # one candidate off the axes
    best = local.step(seen, np.array([score(u) for u in seen]))
    np.testing.assert_allclose(best, [0.6, 0.4], atol=1e-9)  # the cross term is fitted
    compass_only = local.step(seen[:5], np.array([score(u) for u in seen[:5]]))
    assert score(compass_only) < score(best) - 0.01  # one parabola per direction misses the ridge


def test_local_refinement_moves_an_ard_sigma_as_a_whole():
    from daskkrr.tune.space import REFINE_STEP, LocalRefinement, parse_space

    ranges = parse_space({"sigma": (1.0, 16.0), "penalty": (1e-8, 1e-2)}, 3, ard=True)
    center = np.array([0.2, 0.5, 0.7, 0.4])
    pattern = LocalRefinement(ranges, center, np.zeros(4), np.ones(4)).pattern()
    assert pattern.shape == (4, 4)
    np.testing.assert_allclose(pattern[1, :3] - center[:3], REFINE_STEP)
    np.testing.assert_allclose(pattern[1, 3], center[3])


class _NarrowPeak(RegressorMixin, BaseEstimator):
    """Scores exp(-(log(sigma / 1.3) / 0.12)^2) whatever the data: a peak the bandit's smooth model misses."""

    def __init__(self, sigma: float = 1.0, penalty: float = 1e-3):
        self.sigma = sigma
        self.penalty = penalty

    def fit(self, X, y):
        self.fitted_ = True
        return self

    def score(self, X, y, sample_weight=None):
        return float(np.exp(-((np.log(self.sigma / 1.3) / 0.12) ** 2)) - 1e-3 * np.log10(self.penalty) ** 2 / 64)

    def predict(self, X):
        return np.zeros(len(X))


def test_refinement_rounds_close_in_on_a_narrow_peak():
    X, y = _data(40, 0)
    space = {"sigma": (0.1, 10.0), "penalty": (1e-8, 1e-2)}
    gains = []
    for seed in range(8):
        kw = dict(budget_fits=15, batch_size=4, random_state=seed)  # 8 bandit fits, the compass, 3 steps
        refined = BKBSearchCV(_NarrowPeak(), space, **kw).fit(X, y)
        plain = BKBSearchCV(_NarrowPeak(), space, refine=False, **kw).fit(X, y)
        assert refined.refined_ and not plain.refined_
        assert refined.n_fits_ <= 15 and plain.n_fits_ <= 15
        sizes = refined.history_.groupby("round").size().tolist()
        assert sizes == [4, 4, 4, 1, 1, 1], sizes  # the bandit's rounds, the compass, the trust-region steps
        assert len(refined.candidates_) > refined.bandit_.n_arms  # refinement candidates are not arms
        assert refined.best_score_ >= refined.history_.query("round <= 2")["mean_test_score"].max()
        gains.append(refined.best_score_ - plain.best_score_)
    assert np.mean(gains) > 0.05 and np.mean(np.array(gains) >= 0) >= 0.75, gains


@pytest.mark.parametrize(("budget", "cv", "bandit", "steps"), [(10, 0.25, 5, 1), (19, 0.25, 10, 5), (40, 0.25, 31, 5),
                                                             (38, 2, 20, 5), (20, 2, 12, 1)])
def test_the_refinement_keeps_half_of_the_budget_for_the_bandit(budget, cv, bandit, steps):
    X, y = _data(40, 0)
    s = BKBSearchCV(_NarrowPeak(), {"sigma": (0.1, 10.0), "penalty": (1e-8, 1e-2)}, budget_fits=budget, cv=cv,
                    batch_size=3, random_state=0).fit(X, y)
    rows = s.history_
    compass_round = rows["round"].max() - steps
    assert s.refined_ and s.n_fits_ <= budget
    rounds = rows["round"]
    assert (rounds < compass_round).sum() * s.n_splits_ <= bandit
    assert (rounds == compass_round).sum() == 4
    assert rows[rounds > compass_round].groupby("round").size().tolist() == [1] * steps


def test_no_refinement_when_the_budget_is_small():
    X, y = _data(60, 0)
    s = BKBSearchCV(ExactKernelRidge(), budget_fits=8, batch_size=4, random_state=0).fit(X, y)
    assert not s.refined_ and s.n_fits_ == 8 and len(s.candidates_) == s.bandit_.n_arms
