"""BKBSearchCV: hyperparameter search by batched Gaussian-process bandit (BBKB).

The candidates (``n_candidates`` points of a log-uniform space) are the arms of a
:class:`~daskkrr.bandits.BatchBKB`; each round asks it for a batch, fits every
candidate of the batch on every split in parallel (one Dask task per fit on the
current cluster), and tells it the mean validation score. The search stops when
the budget of fits or of seconds is spent; a last round searches locally around
the best candidate (``refine``); then the best candidate is refitted on all the data.

For a squared-loss Nystrom regressor with uniform centers the penalty is profiled
out (``profile_penalty``): a candidate is the other parameters, and its evaluation
scores the whole path of penalties from one Gram pass
(:func:`daskkrr.pipeline.penalty_path.fit_penalty_path`), keeping the best.
"""

from __future__ import annotations

import math
import time
from numbers import Integral, Real
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, MetaEstimatorMixin, RegressorMixin, clone
from sklearn.metrics import check_scoring
from sklearn.model_selection import KFold, ShuffleSplit, check_cv
from sklearn.utils.validation import check_is_fitted

from daskkrr.bandits import BatchBKB
from daskkrr.parallel.tasks import TaskRunner, task_slots
from daskkrr.pipeline.penalty_path import fit_penalty_path, path_unsupported
from daskkrr.tune.space import (
    GROW_MAX,
    GROW_STEP,
    REFINE_STEPS,
    TRUST_MAX,
    TRUST_MIN,
    TRUST_START,
    BoxGrowth,
    CandidateSet,
    LocalRefinement,
    Range,
    candidates_at,
    default_space,
    draw_candidates,
    moving_ranges,
    parse_space,
)

#: The bandit's settings for scores such as R^2 and accuracy (at most 1, noise of a few
#: hundredths between splits), over arms in the unit cube of the log-parameters. The
#: paper's width over-explores a budget of a few dozen fits: beta~ is scaled by 0.2
#: (ExactKernelRidge, 800 training rows, 2 seeds, test R^2 after 20 fits: 197_cpu_act
#: 0.926 against 0.846 unscaled and 0.913 for a 20-point grid; 564_fried 0.929 against
#: 0.919 unscaled and 0.931 for the grid). The arm kernel's length is 0.5 of the cube:
#: with 0.25 the search was close to random over 20 fits and lost to the grid on
#: 537_houses and 564_fried; with 0.5 it matched or beat the grid's test R^2 on 8 of 9
#: (set, seed) pairs of 537_houses, 197_cpu_act and 564_fried (4000 training rows,
#: ``workflows/benchmarks/tune_arm_length.py``).
DEFAULT_BANDIT = {"sigma": 0.5, "penalty": 1e-3, "qbar": 4.0, "noise_bound": 0.03, "norm_bound": 1.0,
                  "epsilon": 0.0, "delta": 0.5, "beta_scale": 0.2}

#: The box grows only from this round on: BKB's first batch, asked with no reward yet,
#: goes to the most uncertain candidates (the box's edges), so the best of it being on
#: a face says little about where the optimum is.
GROW_AFTER_ROUNDS = 2

#: Scores below this are told to the bandit as this (a diverged fit's R^2 of -1e6 would
#: otherwise flatten the bandit's picture of every other candidate).
REWARD_FLOOR = -1.0

#: Penalties per decade of a profiled penalty path (``profile_penalty``): steps of 1.78x,
#: finer than the refinement's compass step over the default 7 decades (0.58 of a decade).
PATH_PER_DECADE = 4


def _evaluate(shared: tuple[Any, Any, Any], job: tuple[Any, dict[str, Any], np.ndarray, np.ndarray]) -> float:
    """Fit one candidate on one split and score it (runs as a Dask task)."""
    X, y, scorer = shared
    estimator, params, train, test = job
    model = clone(estimator).set_params(**params)
    model.fit(X[train], y[train])
    return float(scorer(model, X[test], y[test]))


def _evaluate_path(shared: tuple[Any, Any, Any, np.ndarray],
                   job: tuple[Any, dict[str, Any], np.ndarray, np.ndarray]) -> np.ndarray:
    """Fit one candidate on one split at every penalty of the path; the score of each (a Dask task)."""
    X, y, scorer, penalties = shared
    estimator, params, train, test = job
    model = fit_penalty_path(clone(estimator).set_params(**params), X[train], y[train], penalties)
    predictions = np.asarray(model.predict(X[test])).reshape(len(test), len(penalties))
    return np.array([float(scorer(_Predicted(predictions[:, j]), X[test], y[test])) for j in range(len(penalties))])


class _Predicted(RegressorMixin, BaseEstimator):
    """A regressor whose ``predict`` returns fixed predictions: one column of a path, scored by any scorer."""

    def __init__(self, predictions: np.ndarray) -> None:
        self.predictions = predictions

    def fit(self, X: Any, y: Any = None) -> _Predicted:  # pragma: no cover - never fitted
        return self

    def predict(self, X: Any) -> np.ndarray:
        return self.predictions


class BKBSearchCV(MetaEstimatorMixin, BaseEstimator):
    """Search an estimator's hyperparameters with batched BKB on the Dask cluster.

    Parameters
    ----------
    estimator : estimator
        A daskkrr (or any scikit-learn) estimator; its parameters not in the space keep their values.
    param_space : dict or None, default=None
        Log-uniform ranges ``{"sigma": (lo, hi), "penalty": (lo, hi), "n_centers": (lo, hi)}``
        (any subset). None: ``sigma`` from ``sqrt(d)/10`` to ``10 sqrt(d)`` and ``penalty``
        from 1e-8 to 1e-1 (the estimators standardise features by default).
    n_candidates : int, default=256
        Candidates drawn (scrambled Sobol) in the log-space: the bandit's arm set.
    budget_fits : int or None, default=40
        Model fits at most (a candidate costs one fit per split); None: no limit.
    budget_seconds : float or None, default=None
        No new batch starts after this many seconds (the batch running then finishes;
        the first batch always runs).
    batch_size : int or None, default=None
        Candidates per round; None: the cluster's task slots divided by the splits
        (at least 2; 4 without a cluster).
    cv : float, int or CV splitter, default=0.25
        A float in (0, 1): one holdout split with that validation fraction; an int
        ``K >= 2``: K shuffled folds; or a scikit-learn splitter.
    scoring : str, callable or None, default=None
        scikit-learn scoring; None: the estimator's ``score`` (R^2 for regressors).
    ard : bool, default=False
        Tune one ``sigma`` per feature, passed to the estimator as a vector of
        length d (the estimator must accept it).
    grow_space : bool, default=True
        From the second round on, when the best candidate so far lies near a face of
        the box (within 0.1 of a range's log-width), extend that range past the face
        by a quarter of its log-width (twice per face at most) and add 4 candidates on
        the line from the best one across the new slab: the optimum of a box whose
        best point is on its edge may well be outside it (the smallest penalty on
        large data, for instance). ``n_centers`` never grows. False: the search
        stays in ``param_space``.
    refine : bool, default=True
        Spend the last rounds of ``budget_fits`` on a local search around the best
        candidate: first a compass, the best candidate moved by a twelfth of each
        range's log-width (:data:`~daskkrr.tune.space.REFINE_STEP`), down and up, one
        range at a time (``n_centers`` stays; a per-feature sigma moves as a whole): 4
        candidates for ``sigma`` and ``penalty``; then up to 5 trust-region steps
        (:data:`~daskkrr.tune.space.REFINE_STEPS`), each one candidate at the peak of a
        quadratic model of the scores around the best candidate so far, within 4 steps
        of it, the region doubling (to 8) after a step that found a better candidate
        and halving (to 1) after one that did not. The bandit's smooth model finds the
        region of the best score; this finds its peak, which can be narrow in
        ``sigma`` and lie on a diagonal ridge of (``sigma``, ``penalty``). The bandit
        keeps at least half of the budget: with ``budget_fits = 19`` (one split) it is
        10 bandit fits, the compass's 4 and 5 steps for ``sigma`` and ``penalty``
        (12, 2 and 5 with the penalty profiled out, ``sigma`` alone moving); with 10,
        5 bandit fits, the compass and 1 step; under 10, no refinement. With ``grow_space`` the moves
        may pass the box's present faces, as far as it may grow. Not after
        ``budget_seconds`` ran out; the steps stop early when no model can be fitted
        or no new candidate is left in the region.
    profile_penalty : bool or "auto", default="auto"
        Profile the penalty out of the search: the bandit, the box's growth and the
        refinement move the other parameters, and each candidate's evaluation fits
        the whole penalty path, :data:`PATH_PER_DECADE` penalties a decade over the
        ``penalty`` range (extended as far as ``grow_space`` may grow it), from one
        Gram pass and one ``M x M`` eigendecomposition
        (:func:`~daskkrr.pipeline.penalty_path.fit_penalty_path`); the candidate's
        score is the best mean validation score along the path, and its ``penalty``
        the one that gave it. Such an evaluation costs about one fit and counts as
        one. The path is the exact Nystrom solution at each penalty, which a
        ``FalkonRegressor`` refit approaches to its ``tol``. "auto": whenever the
        space has a ``penalty`` range and the estimator is a ``FalkonRegressor`` or
        ``NystromRegressor`` with uniform centers (a leverage-score sampler's centers
        depend on the penalty) and without ``compute_std``; True: the same, with an
        error where it cannot, and also an ``ExactKernelRidge`` that would solve
        directly, whose path is one ``n x n`` eigendecomposition per evaluation
        (:func:`~daskkrr.solvers.exact.exact_krr_path`: 3 to 6 direct fits' time at
        n = 2000 to 5000, more above, still counted as one fit); False: the penalty
        is one more coordinate of the candidates.
    refit : bool, default=True
        Refit the best candidate on all the data (``best_estimator_``).
    bandit_params : dict or None, default=None
        Overrides of :data:`DEFAULT_BANDIT` given to :class:`~daskkrr.bandits.BatchBKB`.
    random_state : int or None, default=None
        Seeds the candidates, the splits and the bandit.

    Attributes
    ----------
    best_params_ : dict
    best_score_ : float
        Mean validation score of the best candidate.
    best_index_ : int
        Its row in ``cv_results_``.
    best_estimator_ : estimator
        The best candidate refitted on all the data (with ``refit=True``).
    cv_results_ : dict of arrays
        As GridSearchCV's: ``params``, ``param_<name>``, ``split<k>_test_score``,
        ``mean_test_score``, ``std_test_score``, ``rank_test_score``,
        ``mean_fit_time``, ``std_fit_time``, plus ``round`` (the batch) and ``arm``
        (the candidate's index); one row per evaluated candidate, in order.
    history_ : pandas.DataFrame
        The same rows as a table, with the elapsed seconds at each round's end and
        the error of failed candidates.
    n_fits_ : int
        Model fits made.
    stop_reason_ : str
        "budget_fits", "budget_seconds", "candidates" (all evaluated) or "converged"
        (a round asked only candidates already evaluated).
    n_splits_ : int
    bandit_ : BatchBKB or None
        None when the penalty, profiled out, was the only parameter tuned (one path).
    candidates_ : list of dict
        Every candidate of the arm set (with those added when the box grew).
    refined_ : bool
        Whether the last rounds were the local refinement (see ``refine``); their
        candidates are in ``candidates_`` but are not the bandit's arms.
    space_growth_ : list of tuple
        ``(round, parameter, "low" or "high", new bound)`` for each growth of the box.
    penalty_path_ : ndarray or None
        The penalties each evaluation scored when the penalty was profiled out (see
        ``profile_penalty``); None otherwise.

    Notes
    -----
    The bandit's reward is the mean validation score, floored at -1 (:data:`REWARD_FLOOR`)
    for the estimator's own score (R^2, accuracy), so that one diverged fit does not
    distort the model of the others. The bandit's defaults (:data:`DEFAULT_BANDIT`)
    suit scores of that scale; for a ``scoring`` on another scale (an error in the
    target's units), scale ``bandit_params``' ``noise_bound`` and ``norm_bound`` with it. A candidate
    whose fit fails is excluded from the arm set and reported with its error; a
    candidate asked again is told its recorded score without a new fit.
    """

    def __init__(
        self,
        estimator: Any,
        param_space: dict[str, Any] | None = None,
        *,
        n_candidates: int = 256,
        budget_fits: int | None = 40,
        budget_seconds: float | None = None,
        batch_size: int | None = None,
        cv: Any = 0.25,
        scoring: Any = None,
        ard: bool = False,
        grow_space: bool = True,
        refine: bool = True,
        profile_penalty: bool | str = "auto",
        refit: bool = True,
        bandit_params: dict[str, Any] | None = None,
        random_state: Any = None,
    ):
        self.estimator = estimator
        self.param_space = param_space
        self.n_candidates = n_candidates
        self.budget_fits = budget_fits
        self.budget_seconds = budget_seconds
        self.batch_size = batch_size
        self.cv = cv
        self.scoring = scoring
        self.ard = ard
        self.grow_space = grow_space
        self.refine = refine
        self.profile_penalty = profile_penalty
        self.refit = refit
        self.bandit_params = bandit_params
        self.random_state = random_state

    # ------------------------------------------------------------------ checks
    def _check_budget(self) -> None:
        for name in ("budget_fits", "budget_seconds"):
            value = getattr(self, name)
            if value is None:
                continue
            integral = name == "budget_fits"
            kind = Integral if integral else Real
            good = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value) and float(value) > 0
            if not good:
                raise ValueError(f"{name} must be {'an integer' if integral else 'a number of seconds'} > 0 "
                                 f"or None; got {value!r}")
        for name in ("n_candidates", "batch_size"):
            value = getattr(self, name)
            if value is None and name == "batch_size":
                continue
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")

    def _splitter(self) -> Any:
        cv = self.cv
        if isinstance(cv, Real) and not isinstance(cv, (bool, Integral)):
            if not 0 < float(cv) < 1:
                raise ValueError(f"cv as a holdout fraction must be in (0, 1); got {cv!r}")
            return ShuffleSplit(n_splits=1, test_size=float(cv), random_state=self.random_state)
        if isinstance(cv, Integral) and not isinstance(cv, bool):
            if cv < 2:
                raise ValueError(f"cv as a number of folds must be >= 2; got {cv!r}")
            return KFold(n_splits=int(cv), shuffle=True, random_state=self.random_state)
        return check_cv(cv)

    def _candidates(self, n_features: int, n_train: int,
                    y: np.ndarray) -> tuple[CandidateSet, BoxGrowth, np.ndarray | None]:
        """The candidate set, the box's growth and the penalty path (None: not profiled)."""
        space = default_space(n_features) if self.param_space is None else dict(self.param_space)
        ranges = parse_space(space, n_features, ard=bool(self.ard))
        if self.ard and not any(r.name == "sigma" for r in ranges):
            raise ValueError("ard=True tunes sigma per feature: give the space a 'sigma' range")
        ranges, penalties = self._penalty_path(ranges, y, n_train, n_features)
        found = draw_candidates(ranges, self.n_candidates, self.random_state, max_centers=n_train)
        accepted, first_error = self._accepted(found)
        if not accepted.params:
            raise ValueError(f"the tuning space has no valid point for {type(self.estimator).__name__}: "
                             f"{first_error}")
        growth = BoxGrowth(ranges, max_centers=n_train)
        return accepted, growth, penalties

    def _penalty_path(self, ranges: list[Range], y: np.ndarray, n_train: int,
                      n_features: int) -> tuple[list[Range], np.ndarray | None]:
        """The ranges the candidates move, and the penalties of the path when the penalty is
        profiled out (see ``profile_penalty``)."""
        choice = self.profile_penalty
        if not (isinstance(choice, bool) or choice == "auto"):
            raise ValueError(f"profile_penalty must be True, False or 'auto'; got {choice!r}")
        if choice is False:
            return ranges, None
        penalty = next((r for r in ranges if r.name == "penalty"), None)
        if penalty is None:
            why: str | None = "the space has no 'penalty' range"
        elif np.ndim(y) != 1:
            why = f"a penalty path fits one target; y has shape {np.shape(y)}"
        else:
            why = path_unsupported(self.estimator, n_rows=n_train, n_features=n_features)
        from daskkrr.models.regressors import ExactKernelRidge

        if why is None and choice == "auto" and isinstance(self.estimator, ExactKernelRidge):
            # its path is an n x n eigendecomposition: 3x (n = 2000) to 6x (n = 5000) a direct fit, and
            # growing with n, where a Nystrom path costs about one fit; counted as one, it would skew
            # budget_fits, so only profile_penalty=True takes it
            return ranges, None
        if why is not None or penalty is None:  # (penalty is None implies why: for the type checker)
            if choice is True:
                raise ValueError(f"profile_penalty=True cannot profile the penalty: {why}; use "
                                 "profile_penalty=False or 'auto'")
            return ranges, None
        lo, hi = float(np.log10(penalty.low[0])), float(np.log10(penalty.high[0]))
        if self.grow_space:  # as far as the box may grow past each face
            reach = GROW_STEP * GROW_MAX * (hi - lo)
            lo, hi = lo - reach, hi + reach
        count = max(1, int(math.ceil((hi - lo) * PATH_PER_DECADE)) + 1)
        return [r for r in ranges if r.name != "penalty"], np.logspace(lo, hi, count)

    def _accepted(self, found: CandidateSet) -> tuple[CandidateSet, Exception | None]:
        """The candidates the estimator accepts (e.g. not a vector sigma it cannot take), and the first refusal."""
        keep, first_error = [], None
        for i, params in enumerate(found.params):
            try:
                model = clone(self.estimator).set_params(**params)
                if hasattr(model, "_parameter_constraints"):  # scikit-learn style parameter checks
                    model._validate_params()
            except (ValueError, TypeError) as exc:
                first_error = first_error or exc
                continue
            keep.append(i)
        return CandidateSet(arms=found.arms[keep], params=[found.params[i] for i in keep]), first_error

    # --------------------------------------------------------------------- fit
    def fit(self, X: Any, y: Any = None) -> BKBSearchCV:
        """Run the search on in-memory data (numpy, pandas; dask arrays are computed)."""
        self._check_budget()
        X, y = _in_memory(X, y)
        splitter = self._splitter()
        splits = list(splitter.split(X, y))
        self.n_splits_ = len(splits)
        n_train = min(len(train) for train, _ in splits)
        cands, growth, penalties = self._candidates(X.shape[1], n_train, y)
        self.candidates_ = cands.params
        self.penalty_path_ = penalties
        scorer = check_scoring(self.estimator, scoring=self.scoring)
        runner = (TaskRunner(_evaluate, (X, y, scorer)) if penalties is None
                  else TaskRunner(_evaluate_path, (X, y, scorer, penalties)))
        batch = self.batch_size or (max(2, task_slots() // self.n_splits_) if runner.is_distributed else 4)
        # With the penalty profiled out and nothing else tuned, one path is the whole search.
        bandit = None if cands.arms.shape[1] == 0 else BatchBKB(
            cands.arms, batch_size=batch, random_state=self.random_state,
            **{**DEFAULT_BANDIT, **(self.bandit_params or {})})
        self.bandit_ = bandit
        search = _Progress(splits, floor=REWARD_FLOOR if self.scoring is None else -math.inf, penalties=penalties)
        reserve, n_steps = self._refinement_fits(growth)
        bandit_budget = None if self.budget_fits is None else self.budget_fits - reserve
        grown: list[tuple[int, str, str, float]] = []
        stop = "candidates"
        try:
            if bandit is None:
                search.run_round(runner, self.estimator, cands, [0])
            else:
                stop = self._bandit_rounds(search, runner, cands, growth, bandit, batch, bandit_budget, grown)
            self.refined_ = bool(reserve) and stop != "budget_seconds" and bool(search.scores)
            if self.refined_:
                self._refine(search, runner, cands, growth, n_steps)
        finally:
            runner.close()
        self.n_fits_ = search.n_fits
        self.stop_reason_ = stop
        self.space_growth_ = grown
        if not search.scores:
            errors = "; ".join(sorted({r["error"] for r in search.rows if r["error"]}))
            raise ValueError(f"every evaluated candidate failed: {errors or 'no candidate was evaluated'}")
        self._set_results(search.rows)
        if self.refit:
            self.best_estimator_ = clone(self.estimator).set_params(**self.best_params_).fit(X, y)
        return self

    def _bandit_rounds(self, search: _Progress, runner: TaskRunner, cands: CandidateSet, growth: BoxGrowth,
                       bandit: BatchBKB, batch: int, bandit_budget: int | None,
                       grown: list[tuple[int, str, str, float]]) -> str:
        """The bandit's rounds until a budget, the candidates or the bandit run out; the reason it stopped."""
        while True:
            if bandit_budget is not None and search.n_fits + self.n_splits_ > bandit_budget:
                return "budget_fits"
            if self.budget_seconds is not None and search.rounds and search.elapsed >= self.budget_seconds:
                return "budget_seconds"
            if bandit.n_arms_left == 0 or len(search.scores) >= len(cands.params):
                return "candidates"
            size = batch
            if bandit_budget is not None:
                size = max(1, min(size, (bandit_budget - search.n_fits) // self.n_splits_))
            asked = bandit.ask(size)
            new = list(dict.fromkeys(i for i in asked if i not in search.scores))
            if not new:  # only candidates already evaluated: the bandit has settled
                bandit.tell_many(asked, [search.reward(i) for i in asked])
                return "converged"
            search.run_round(runner, self.estimator, cands, new)
            told = [i for i in asked if i in search.scores]
            if told:
                bandit.tell_many(told, [search.reward(i) for i in told])
            for i in set(asked) - set(search.scores):
                bandit.exclude(i)  # its fit failed: never asked again
            if self.grow_space and search.scores and search.rounds >= GROW_AFTER_ROUNDS:
                new_faces = self._grow(growth, cands, bandit, search.best)
                grown += [(search.rounds, *face) for face in new_faces]

    def _refinement_fits(self, growth: BoxGrowth) -> tuple[int, int]:
        """The fits kept out of the bandit's budget for the refinement, and its trust-region
        steps: the compass and ``min(REFINE_STEPS, units // 2 - compass)`` steps, where
        ``units`` is ``budget_fits`` in candidates, so that the bandit keeps at least half
        of the budget; none without at least one step (a small budget is all bandit) or
        without a range to move."""
        if not self.refine or self.budget_fits is None:
            return 0, 0
        compass = 2 * len(moving_ranges(growth.ranges))  # a move down and up along each
        if not compass:  # nothing to move (only n_centers tuned): every fit goes to the bandit
            return 0, 0
        n_steps = min(REFINE_STEPS, self.budget_fits // self.n_splits_ // 2 - compass)
        return ((compass + n_steps) * self.n_splits_, n_steps) if n_steps >= 1 else (0, 0)

    def _refine(self, search: _Progress, runner: TaskRunner, cands: CandidateSet, growth: BoxGrowth,
                n_steps: int) -> None:
        """The last rounds: the compass around the best candidate, then ``n_steps``
        trust-region steps of one candidate each, at the peak of a quadratic model of the
        scores around the best candidate so far (:class:`~daskkrr.tune.space.LocalRefinement`).
        The region doubles after a step that found a better candidate and halves after
        one that did not.

        Their candidates join ``candidates_`` but not the bandit's arms: no bandit round follows.
        """
        # Moves may go past the box's present faces, as far as it may grow: a step past a
        # face is a growth there (clipped to the present box, 1201_BNG_breastTumor lost
        # 0.0012 test R^2 on seed 6 of the PMLB benchmark, 0.00013 on average).
        low, high = growth.outer_bounds() if self.grow_space else (np.zeros_like(growth.low),
                                                                   np.ones_like(growth.high))
        local = LocalRefinement(growth.ranges, cands.arms[search.best], low, high)
        compass = self._add_candidates(cands, growth, local.pattern())
        search.run_round(runner, self.estimator, cands, [i for i in dict.fromkeys(compass)
                                                        if i is not None and i not in search.scores])
        reach = TRUST_START
        for _ in range(n_steps):
            if self.budget_seconds is not None and search.elapsed >= self.budget_seconds:
                break
            best = search.best
            done = list(search.scores)
            local = LocalRefinement(growth.ranges, cands.arms[best], low, high)
            arm = local.step(cands.arms[done], np.array([search.scores[i] for i in done]), reach)
            index = None if arm is None else self._add_candidates(cands, growth, arm[None, :])[0]
            if index is None or index in search.scores:  # no model, or no new candidate in the region
                break
            search.run_round(runner, self.estimator, cands, [index])
            better = index in search.scores and search.scores[index] > search.scores[best]
            reach = min(TRUST_MAX, 2 * reach) if better else max(TRUST_MIN, reach / 2)

    def _add_candidates(self, cands: CandidateSet, growth: BoxGrowth, unit: np.ndarray) -> list[int | None]:
        """The candidate index of each arm in ``unit`` (appended when new; None when invalid)."""
        indices: list[int | None] = []
        for arm in unit:
            found, _ = self._accepted(candidates_at(growth.ranges, arm[None, :], growth.max_centers))
            if not found.params:
                indices.append(None)
                continue
            same = np.flatnonzero(np.all(np.isclose(cands.arms, found.arms[0], rtol=0, atol=1e-9), axis=1))
            if same.size:
                indices.append(int(same[0]))
                continue
            cands.arms = np.concatenate([cands.arms, found.arms])
            cands.params.append(found.params[0])
            indices.append(len(cands.params) - 1)
        return indices

    def _grow(self, growth: BoxGrowth, cands: CandidateSet, bandit: BatchBKB,
              best: int) -> list[tuple[str, str, float]]:
        """Grow the box past the faces the best candidate is near (new candidates become
        arms); returns the faces grown."""
        done = len(growth.grown)
        added, _ = self._accepted(growth.grow(cands.arms[best]))
        if added.params:
            bandit.add_arms(added.arms)
            cands.arms = np.concatenate([cands.arms, added.arms])
            cands.params.extend(added.params)
        return growth.grown[done:]

    def _set_results(self, rows: list[dict[str, Any]]) -> None:
        n = len(rows)
        split = np.array([r["split_scores"] for r in rows], dtype=float).reshape(n, self.n_splits_)
        times = np.array([r["fit_times"] if not r["error"] else [np.nan] * self.n_splits_ for r in rows],
                         dtype=float).reshape(n, self.n_splits_)
        failed = np.array([r["error"] is not None for r in rows])
        mean = np.where(failed, np.nan, split.mean(axis=1) if n else np.zeros(0))
        std = np.where(failed, np.nan, split.std(axis=1) if n else np.zeros(0))
        order = np.argsort(np.where(np.isnan(mean), np.inf, -mean), kind="stable")  # failed rows last
        rank = np.empty(n, dtype=np.int32)
        rank[order] = np.arange(1, n + 1)
        results: dict[str, Any] = {"params": [r["params"] for r in rows]}
        for name in sorted({k for r in rows for k in r["params"]}):
            col = np.ma.MaskedArray(np.empty(n, dtype=object), mask=False)
            for j, r in enumerate(rows):
                col[j] = r["params"][name]
            results[f"param_{name}"] = col
        for k in range(self.n_splits_):
            results[f"split{k}_test_score"] = split[:, k]
        results.update({
            "mean_test_score": mean, "std_test_score": std, "rank_test_score": rank,
            "mean_fit_time": np.where(failed, np.nan, np.nan_to_num(times).mean(axis=1) if n else np.zeros(0)),
            "std_fit_time": np.where(failed, np.nan, np.nan_to_num(times).std(axis=1) if n else np.zeros(0)),
            "round": np.array([r["round"] for r in rows]), "arm": np.array([r["arm"] for r in rows]),
        })
        self.cv_results_ = results
        self.best_index_ = int(order[0])
        self.best_params_ = dict(rows[self.best_index_]["params"])
        self.best_score_ = float(mean[self.best_index_])
        table = {k: (list(v) if isinstance(v, np.ma.MaskedArray) else v) for k, v in results.items()
                 if k != "params"}
        table["elapsed"] = [r["elapsed"] for r in rows]
        table["error"] = [r["error"] for r in rows]
        self.history_ = pd.DataFrame(table)

    # ---------------------------------------------------------- the best model
    def predict(self, X: Any) -> Any:
        """``best_estimator_.predict(X)``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)

    def score(self, X: Any, y: Any) -> float:
        """``best_estimator_.score(X, y)`` (or the search's scoring)."""
        check_is_fitted(self, "best_estimator_")
        return float(check_scoring(self.best_estimator_, scoring=self.scoring)(self.best_estimator_, X, y))



class _Progress:
    """The search's record: the rows of ``cv_results_``, each candidate's mean score, the fits and rounds."""

    def __init__(self, splits: list[tuple[np.ndarray, np.ndarray]], floor: float,
                 penalties: np.ndarray | None = None) -> None:
        self.splits = splits
        self.floor = floor
        self.penalties = penalties
        self.rows: list[dict[str, Any]] = []
        self.scores: dict[int, float] = {}
        self.n_fits = 0
        self.rounds = 0
        self._t0 = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    @property
    def best(self) -> int:
        """The candidate with the best mean score so far."""
        return max(self.scores, key=self.scores.__getitem__)

    def reward(self, index: int) -> float:
        """The score told to the bandit (floored: see :data:`REWARD_FLOOR`)."""
        return max(self.scores[index], self.floor)

    def run_round(self, runner: TaskRunner, estimator: Any, cands: CandidateSet, indices: list[int]) -> None:
        """Fit and score candidates ``indices`` on every split, in parallel; record them as one round."""
        if not indices:
            return
        n_splits = len(self.splits)
        self.rounds += 1
        jobs = [(estimator, cands.params[i], train, test) for i in indices for train, test in self.splits]
        outcomes = runner.run(jobs)
        self.n_fits += len(jobs)
        elapsed = self.elapsed
        for k, i in enumerate(indices):
            mine = outcomes[k * n_splits : (k + 1) * n_splits]
            error = next((o.error for o in mine if not o.ok), None)
            params = cands.params[i]
            if self.penalties is not None and error is None:  # a path: its best penalty over the splits
                path = np.mean([o.value for o in mine], axis=0)
                j = int(np.nanargmax(path)) if np.isfinite(path).any() else 0
                params = {**params, "penalty": float(self.penalties[j])}
                split_scores = [float(o.value[j]) for o in mine]
            else:
                split_scores = [o.value if o.ok else np.nan for o in mine]
            self.rows.append({"round": self.rounds, "arm": i, "params": params, "elapsed": elapsed,
                              "error": None if error is None else f"{type(error).__name__}: {error}",
                              "fit_times": [o.seconds for o in mine], "split_scores": split_scores})
            if error is None:
                self.scores[i] = float(np.mean(split_scores))

def _in_memory(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """The training data as numpy arrays (a store or dask arrays are read into memory)."""
    from daskkrr.data.inputs import is_in_memory, load_training_data

    if not is_in_memory(X) or (y is not None and not is_in_memory(y)):
        Xd, yd = load_training_data(X, y, None)
        X, y = Xd.compute(), yd.compute()
    if y is None:
        raise ValueError("y is required when X is an array; pass fit(X, y)")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X must be 2-D with one row per target; got X {X.shape}, y {y.shape}")
    return X, y
