"""BKB and BatchBKB against exact GP-UCB (written here) on a discretised Branin function."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from daskkrr.bandits import (
    BKB,
    BatchBKB,
    HallucinatedVariance,
    NystromPosterior,
    bayesian_width,
    confidence_width,
    dimension_width,
    evidence_penalty,
    nystrom_embedding,
)
from daskkrr.kernels import make_kernel
from daskkrr.utils.threads import blas_threads

# Branin on [0, 1]^2 (rescaled from [-5, 10] x [0, 15]), maximised, rewards standardised.
SIGMA, PENALTY, NOISE, XI, F_BOUND, QBAR = 0.3, 0.01, 0.1, 0.05, 0.5, 2.0


def branin_arms(n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    g = np.linspace(0.0, 1.0, n)
    X = np.array([(a, b) for a in g for b in g])
    x1, x2 = -5 + 15 * X[:, 0], 15 * X[:, 1]
    f = (x2 - 5.1 / (4 * np.pi**2) * x1**2 + 5 / np.pi * x1 - 6) ** 2 + 10 * (1 - 1 / (8 * np.pi)) * np.cos(x1) + 10
    r = -f
    return X, (r - r.mean()) / r.std()


class ExactGPUCB:
    """GP-UCB with the exact posterior, in BKB's units (prior k / lambda, unit noise).

    The Cholesky factor ``L`` of ``K_t + lambda I`` and ``V = L^{-1} K_{t,A}`` grow by
    one row per step, so a step costs ``O(t A)``.
    """

    def __init__(self, arms: np.ndarray, rng: np.random.Generator):
        self.arms, self.rng = arms, rng
        self.k = make_kernel("gaussian", sigma=SIGMA)
        self.L = np.zeros((0, 0))
        self.V = np.zeros((0, len(arms)))
        self.alpha = np.zeros(0)  # L^{-1} y
        self.pulled: list[int] = []
        self.mean = np.zeros(len(arms))
        self.variance = np.ones(len(arms)) / PENALTY
        self.beta = self._beta()

    def _beta(self) -> float:
        return confidence_width(variance_sum=float(self.variance[self.pulled].sum()), t=len(self.pulled),
                                kappa2=1.0, penalty=PENALTY, noise_bound=XI, norm_bound=F_BOUND, delta=0.5,
                                epsilon=0.0)

    def ask(self) -> int:
        u = self.mean + self.beta * np.sqrt(self.variance)
        best = np.flatnonzero(u == u.max())
        return int(self.rng.choice(best))

    def tell(self, i: int, reward: float) -> None:
        k_new = self.k(self.arms, self.arms[i : i + 1])[:, 0]
        l_row = np.linalg.solve(self.L, k_new[self.pulled]) if self.pulled else np.zeros(0)
        l_diag = math.sqrt(k_new[i] + PENALTY - l_row @ l_row)
        n = len(self.pulled)
        L = np.zeros((n + 1, n + 1))
        L[:n, :n], L[n, :n], L[n, n] = self.L, l_row, l_diag
        v_new = (k_new - l_row @ self.V) / l_diag
        a_new = (reward - l_row @ self.alpha) / l_diag
        self.L, self.V = L, np.vstack([self.V, v_new])
        self.alpha = np.append(self.alpha, a_new)
        self.pulled.append(i)
        self.mean = self.mean + v_new * a_new
        self.variance = np.maximum(self.variance - v_new**2 / PENALTY, 0.0)
        self.beta = self._beta()


def _run(make, arms, f, T, seed, batch=False):
    rng = np.random.default_rng(seed)
    bandit = make(arms, rng)
    regret: list[float] = []
    while len(regret) < T:
        chosen = bandit.ask() if batch else [bandit.ask()]
        rewards = [f[i] + NOISE * rng.normal() for i in chosen]
        if batch:
            bandit.tell_many(chosen, rewards)
        else:
            bandit.tell(chosen[0], rewards[0])
        regret += [f.max() - f[i] for i in chosen]
    return np.cumsum(regret[:T]), bandit


def _params(rng, kw):
    return {"sigma": SIGMA, "penalty": PENALTY, "qbar": QBAR, "noise_bound": XI, "norm_bound": F_BOUND,
            "epsilon": 0.0, "random_state": rng, **kw}


def _bkb(arms, rng, **kw):
    return BKB(arms, **_params(rng, kw))


def _batch(arms, rng, **kw):
    return BatchBKB(arms, **_params(rng, kw))


def _exponent(R: np.ndarray) -> float:
    """Slope of log R_t against log t over the last three quarters."""
    t = np.arange(1, len(R) + 1)
    start = len(R) // 4
    return float(np.polyfit(np.log(t[start:]), np.log(R[start:]), 1)[0])


@pytest.fixture(scope="module")
def regrets():
    arms, f = branin_arms(30)
    T, seeds, B = 300, range(3), 5
    out: dict[str, list] = {"gp": [], "bkb": [], "batch": [], "size": [], "rounds": [], "bkb_defaults": [],
                            "batch_defaults": []}
    with blas_threads(1):
        for seed in seeds:
            out["gp"].append(_run(ExactGPUCB, arms, f, T, seed)[0])
            R, bandit = _run(_bkb, arms, f, T, seed)
            out["bkb"].append(R)
            out["size"].append(bandit.dictionary_size_[-1])
            R, bandit = _run(lambda a, r: _batch(a, r, batch_size=B), arms, f, T, seed, batch=True)
            out["batch"].append(R)
            out["rounds"].append(bandit.n_rounds_)
            # only the length scale given: noise, scale and width from the defaults
            out["bkb_defaults"].append(_run(lambda a, r: BKB(a, sigma=SIGMA, random_state=r), arms, f, T, seed)[0])
            out["batch_defaults"].append(_run(lambda a, r: BatchBKB(a, sigma=SIGMA, random_state=r), arms, f, T,
                                              seed, batch=True)[0])
    return {k: np.array(v) for k, v in out.items()} | {"T": T, "B": B}


def test_bkb_regret_is_within_a_small_constant_of_exact_gp_ucb(regrets):
    gp, bkb = regrets["gp"].mean(0), regrets["bkb"].mean(0)
    assert bkb[-1] <= 2.0 * gp[-1]


@pytest.mark.parametrize("method", ["bkb_defaults", "batch_defaults"])
def test_defaults_are_within_2x_of_gp_ucb_with_a_tuned_width(regrets, method):
    """Issue 40: with the noise and scale estimated and the default width, BKB and BatchBKB (adaptive
    batches) reach a regret within 2x of exact GP-UCB whose xi and F were tuned for this problem. With
    the paper's width on the estimated constants, BKB was at 2.46x on the benchmark's Branin."""
    assert regrets[method].mean(0)[-1] <= 2.0 * regrets["gp"].mean(0)[-1]
    assert _exponent(regrets[method].mean(0)) < 0.8  # learning, not exploring at a constant rate


def test_bkb_regret_is_sublinear(regrets):
    bkb = regrets["bkb"].mean(0)
    assert _exponent(bkb) < 0.8
    T = regrets["T"]
    # Average regret falls: the second half's per-step regret is well below the first's.
    assert bkb[-1] - bkb[T // 2] < 0.7 * bkb[T // 2]


def test_dictionary_stays_far_below_t(regrets):
    assert np.max(regrets["size"]) <= regrets["T"] / 3


def test_batch_bkb_reaches_the_regret_in_t_over_b_rounds(regrets):
    assert np.all(regrets["rounds"] == regrets["T"] // regrets["B"])
    assert regrets["batch"].mean(0)[-1] <= 2.0 * regrets["gp"].mean(0)[-1]
    assert _exponent(regrets["batch"].mean(0)) < 0.8


def test_with_every_point_kept_bkb_is_the_exact_gp():
    arms, f = branin_arms(12)
    rng = np.random.default_rng(1)
    exact = ExactGPUCB(arms, np.random.default_rng(1))
    bandit = _bkb(arms, rng, qbar=1e15)
    for _ in range(40):
        i = bandit.ask()
        r = f[i] + NOISE * rng.normal()
        bandit.tell(i, r)
        exact.tell(i, r)
        assert set(bandit.dictionary_) == set(exact.pulled)
    np.testing.assert_allclose(bandit.mean_, exact.mean, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(bandit.variance_, exact.variance, rtol=1e-6, atol=1e-8)
    # In the units of a GP with prior k and noise variance lambda: lambda * sigma~^2.
    K = exact.k(arms[exact.pulled], arms[exact.pulled]) + PENALTY * np.eye(len(exact.pulled))
    Ka = exact.k(arms, arms[exact.pulled])
    gp_var = 1.0 - np.einsum("ij,ji->i", Ka, np.linalg.solve(K, Ka.T))
    np.testing.assert_allclose(PENALTY * bandit.variance_, gp_var, rtol=1e-6, atol=1e-9)
    assert bandit.beta_ == pytest.approx(exact.beta)


def test_hallucinated_batch_variance_equals_the_posterior_with_the_batch_observed():
    rng = np.random.default_rng(0)
    arms = rng.uniform(size=(40, 2))
    k = make_kernel("gaussian", sigma=0.3)
    counts = np.zeros(40, dtype=np.int64)
    counts[[1, 5, 7]] = [2, 1, 1]
    sums = rng.normal(size=40) * counts
    start = NystromPosterior(nystrom_embedding(k, arms, np.array([1, 5])), k.diag(arms), counts, sums, 0.1)
    hallucinated = HallucinatedVariance(start, k, arms, counts)
    batch = [3, 7, 3, 20]  # 7 pulled but outside the dictionary, 3 twice
    for j in batch:
        hallucinated.add(j)
    after = counts.copy()
    np.add.at(after, batch, 1)
    full = NystromPosterior(nystrom_embedding(k, arms, np.array([1, 5, 3, 7, 20])), k.diag(arms), after, sums, 0.1)
    np.testing.assert_allclose(hallucinated.variance, full.variance, rtol=1e-9, atol=1e-12)


def test_adaptive_batches_stop_on_the_variance_ratio():
    arms, f = branin_arms(20)
    rng = np.random.default_rng(0)
    bandit = _batch(arms, rng, ratio_threshold=3.0)
    for _ in range(40):
        batch = bandit.ask()
        frozen = bandit.variance_[batch]
        # BBKB's rule: the batch grows while 1 + sum of the frozen variances of the previous arms <= C~.
        assert 1.0 + frozen[:-1].sum() <= 3.0
        assert len(batch) == bandit.n_arms or 1.0 + frozen.sum() > 3.0
        bandit.tell_many(batch, [f[i] for i in batch])
    assert max(bandit.batch_sizes_) > 1  # once variances fall, batches grow
    assert bandit.t_ == sum(bandit.batch_sizes_)


def test_ard_sigma_vector_equals_scaled_arms():
    rng = np.random.default_rng(0)
    arms = rng.uniform(size=(30, 2))
    scale = np.array([0.2, 0.5])
    a = BKB(arms, sigma=scale, penalty=0.1, random_state=0)
    b = BKB(arms / scale, sigma=1.0, penalty=0.1, random_state=0)
    for _ in range(10):
        i, j = a.ask(), b.ask()
        assert i == j
        a.tell(i, float(arms[i].sum()))
        b.tell(j, float(arms[j].sum()))
    np.testing.assert_allclose(a.mean_, b.mean_)
    with pytest.raises(ValueError, match="length 2"):
        BKB(arms, sigma=[1.0, 2.0, 3.0])


@pytest.mark.parametrize("arms", [np.zeros((0, 2)), []])
def test_empty_arm_set_is_refused(arms):
    with pytest.raises(ValueError, match="arm set is empty"):
        BKB(arms)


def test_tell_needs_an_asked_arm_and_a_finite_reward():
    bandit = BKB(np.linspace(0, 1, 5)[:, None], sigma=0.5, random_state=0)
    with pytest.raises(ValueError, match="was not asked"):
        bandit.tell(0, 1.0)
    i = bandit.ask()
    with pytest.raises(ValueError, match="finite"):
        bandit.tell(i, float("nan"))
    with pytest.raises(IndexError, match="out of range"):
        bandit.tell(7, 1.0)
    bandit.tell(i, 1.0)
    with pytest.raises(ValueError, match="already told"):
        bandit.tell(i, 1.0)
    assert bandit.t_ == 1


def test_batch_needs_its_rewards_before_the_next_batch():
    bandit = BatchBKB(np.linspace(0, 1, 5)[:, None], sigma=0.5, batch_size=2, random_state=0)
    batch = bandit.ask()
    bandit.tell(batch[0], 0.0)
    with pytest.raises(ValueError, match="without a reward"):
        bandit.ask()
    bandit.exclude(batch[1])  # a failed evaluation: dropped, never asked again
    assert bandit.n_rounds_ == 1 and batch[1] not in bandit.ask(3)


def test_a_first_batch_that_fails_entirely_leaves_the_prior():
    """Every arm of the first batch excluded before any reward: the round ends with an empty
    dictionary (the prior), and the next batch is asked among the other arms."""
    bandit = BatchBKB(np.linspace(0, 1, 6)[:, None], sigma=0.5, batch_size=2, random_state=0)
    first = bandit.ask()
    for i in first:
        bandit.exclude(i)
    assert bandit.n_rounds_ == 1 and bandit.t_ == 0
    assert bandit.dictionary_.size == 0 and bandit.dictionary_size_[-1] == 0
    np.testing.assert_allclose(bandit.mean_, 0.0)
    second = bandit.ask()
    assert not set(first) & set(second)
    bandit.tell_many(second, [1.0, 0.5])
    assert bandit.t_ == 2 and bandit.dictionary_.size >= 1


def test_asking_with_every_arm_excluded_is_refused():
    bandit = BKB(np.eye(2), sigma=0.5, random_state=0)
    bandit.exclude(0)
    bandit.exclude(1)
    assert bandit.n_arms_left == 0
    with pytest.raises(ValueError, match="every arm is excluded"):
        bandit.ask()


@pytest.mark.parametrize("bad", [{"penalty": 0.0}, {"delta": 1.0}, {"qbar": -1}, {"epsilon": 1.0},
                                 {"noise_bound": float("nan")}, {"width": "union"}, {"noise_estimate": "mle"}])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        BKB(np.eye(3), **bad)


def test_added_arms_get_the_exact_posterior_and_keep_the_rewards():
    arms, f = branin_arms(12)
    first, later = arms[::2], arms[1::2]
    rng = np.random.default_rng(3)
    bandit = _bkb(first, rng, qbar=1e15)  # every pulled arm kept: the exact GP
    exact = ExactGPUCB(arms, np.random.default_rng(3))
    for _ in range(15):
        i = bandit.ask()
        r = f[::2][i] + NOISE * rng.normal()
        bandit.tell(i, r)
        exact.tell(2 * i, r)  # the same arm in the full set
    added = bandit.add_arms(later)
    np.testing.assert_array_equal(added, np.arange(len(first), len(arms)))
    assert bandit.n_arms == len(arms) and bandit.counts_[added].sum() == 0
    order = np.concatenate([np.arange(0, len(arms), 2), np.arange(1, len(arms), 2)])
    np.testing.assert_allclose(bandit.mean_, exact.mean[order], rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(bandit.variance_, exact.variance[order], rtol=1e-6, atol=1e-8)
    i = bandit.ask()  # the larger set is usable at once
    bandit.tell(i, 0.0)


def test_arms_are_added_only_between_steps_and_with_the_same_width():
    rng = np.random.default_rng(0)
    arms = rng.uniform(size=(20, 2))
    bandit = BatchBKB(arms, sigma=0.3, penalty=0.01, batch_size=3, random_state=0)
    batch = bandit.ask()
    with pytest.raises(ValueError, match="no reward is pending"):
        bandit.add_arms(rng.uniform(size=(4, 2)))
    bandit.tell_many(batch, [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="3 coordinates"):
        bandit.add_arms(rng.uniform(size=(4, 3)))
    bandit.add_arms(rng.uniform(size=(4, 2)))
    assert len(bandit.ask()) == 3 and bandit.n_arms == 24


# --------------------------------------------------------------------------- defaults that learn
def _unit_branin(n: int) -> tuple[np.ndarray, np.ndarray]:
    arms, f = branin_arms(n)
    return arms, (f - f.min()) / (f.max() - f.min())  # rewards in [0, 1], as a user's would be


def _mean_regret(bandit, f, T, noise, rng, scale=1.0, shift=0.0):
    regret, asked = [], []
    with blas_threads(1):
        for _ in range(T):
            i = bandit.ask()
            bandit.tell(i, scale * float(f[i] + noise * rng.normal()) + shift)
            regret.append(f.max() - f[i])
            asked.append(i)
    return float(np.mean(regret)), asked


def test_defaults_learn_on_rewards_of_unit_scale_where_the_papers_width_does_not():
    """Issue 40: rewards in [0, 1] with noise 0.01. Random search's mean regret is exactly mean(max f - f);
    with the paper's xi = 1 BKB does no better (0.24 against 0.18 here). With the defaults (noise and scale
    estimated) the mean regret over 150 steps must be below 0.6x random search's and half the paper
    width's on each of 3 seeds (0.06 to 0.09x and 0.05 to 0.07x on these seeds with the evidence, 0.06 to
    0.10x random search's with the residual estimate: the thresholds separate learning from exploring, not
    one run's figure), and the noise estimate within 2x of the true 0.01 (the evidence's xi^2 has relative
    spread about sqrt(2 / (t - d_eff)) < 15% here, and lambda's grid steps by 10^(1/4); 0.0087 to 0.010 on
    these seeds)."""
    arms, f = _unit_branin(30)
    random_search = float(np.mean(f.max() - f))
    for seed in range(3):
        bandit = BKB(arms, sigma=SIGMA, random_state=seed)
        learned, _ = _mean_regret(bandit, f, 150, 0.01, np.random.default_rng(seed))
        paper, _ = _mean_regret(BKB(arms, sigma=SIGMA, penalty=1.0, noise_bound=1.0, norm_bound=1.0,
                                    random_state=seed), f, 150, 0.01, np.random.default_rng(seed))
        assert learned < 0.6 * random_search and learned < 0.5 * paper
        assert 0.005 < bandit.noise_bound_ < 0.02
        assert bandit.penalty_ == pytest.approx(bandit.noise_bound_**2 / bandit.norm_bound_**2)


def test_estimated_width_does_not_depend_on_the_rewards_units():
    """The evidence's prior mean m, xi, lambda = xi^2 / s^2 and F = s make the UCB of rewards a r + b equal
    to a u + b (m and s move with the rewards, lambda does not): the same arms are asked, up to round-off
    in near-ties (none here)."""
    arms, f = _unit_branin(12)
    _, base = _mean_regret(BKB(arms, sigma=SIGMA, random_state=1), f, 40, 0.05, np.random.default_rng(1))
    _, moved = _mean_regret(BKB(arms, sigma=SIGMA, random_state=1), f, 40, 0.05, np.random.default_rng(1),
                            scale=1000.0, shift=-7.0)
    assert moved == base
    _, fixed = _mean_regret(BKB(arms, sigma=SIGMA, noise_bound=1.0, random_state=1), f, 40, 0.05,
                            np.random.default_rng(1), scale=1000.0, shift=-7.0)
    assert fixed != base  # the paper's fixed width is not scale-free: the check above can fail


def test_a_fixed_noise_bound_keeps_the_papers_width():
    bandit = BKB(np.eye(3), noise_bound=1.0, random_state=0)
    i = bandit.ask()
    bandit.tell(i, 5.0)
    assert (bandit.penalty_, bandit.noise_bound_, bandit.norm_bound_, bandit.reward_offset_) == (1.0, 1.0, 1.0, 0.0)
    assert bandit.beta_ == confidence_width(
        variance_sum=float(bandit.variance_ @ bandit.counts_), t=1, kappa2=1.0, penalty=1.0, noise_bound=1.0,
        norm_bound=1.0, delta=bandit.delta, epsilon=bandit.epsilon)


def _tell_ten_steps(bandit, f, rng):
    for _ in range(10):
        chosen = bandit.ask() if isinstance(bandit, BatchBKB) else [bandit.ask()]
        bandit.tell_many(chosen, [float(f[i] + 0.01 * rng.normal()) for i in chosen])


def test_estimated_noise_gets_the_dimension_width_by_default():
    """With noise_bound="auto" the default width is xi sqrt(0.2 d log(2t)) (Kandasamy et al. 2015), for the
    next step t + 1, whatever the number of arms and epsilon; BatchBKB widens it by sqrt(ratio_threshold)."""
    arms, f = _unit_branin(8)
    rng = np.random.default_rng(0)
    for bandit, factor in ((BKB(arms, sigma=SIGMA, random_state=0), 1.0),
                           (BatchBKB(arms, sigma=SIGMA, batch_size=2, ratio_threshold=3.0, random_state=0),
                            math.sqrt(3.0))):
        _tell_ten_steps(bandit, f, rng)
        deviations = math.sqrt(0.2 * 2 * math.log(2 * (bandit.t_ + 1)))  # d = 2 coordinates
        # rel=1e-12: the same few products and a sqrt in another order, a few roundings (~1e-15) apart
        assert bandit.beta_ == pytest.approx(factor * bandit.noise_bound_ * deviations, rel=1e-12)
        assert dimension_width(n_features=2, t=bandit.t_ + 1) == pytest.approx(deviations, rel=1e-12)
    # one reward: no spread to estimate the noise from, so the width is not zero (it was: xi = 0)
    bandit = BKB(arms, sigma=SIGMA, random_state=0)
    bandit.tell(bandit.ask(), 0.3)
    assert bandit.noise_bound_ == 1.0 and bandit.beta_ > 0.0


def test_estimated_noise_gets_the_bayesian_width_with_width_arms():
    """With width="arms" the width is xi sqrt(alpha beta_t) (Srinivas et al. 2010, Theorem 1, finite
    arm set), for the next step t + 1; BatchBKB widens it by sqrt(ratio_threshold)."""
    arms, f = _unit_branin(8)
    rng = np.random.default_rng(0)
    for bandit, factor in ((BKB(arms, sigma=SIGMA, width="arms", random_state=0), 1.0),
                           (BatchBKB(arms, sigma=SIGMA, batch_size=2, ratio_threshold=3.0, width="arms",
                                     random_state=0), math.sqrt(3.0))):
        _tell_ten_steps(bandit, f, rng)
        alpha = (1 + 0.5) / (1 - 0.5)  # the default epsilon 0.5
        beta_t = 2 * math.log(len(arms) * (bandit.t_ + 1) ** 2 * math.pi**2 / (6 * 0.5))  # default delta 0.5
        assert bandit.beta_ == pytest.approx(factor * bandit.noise_bound_ * math.sqrt(alpha * beta_t), rel=1e-12)
        assert bayesian_width(n_arms=len(arms), t=bandit.t_ + 1, delta=0.5, epsilon=0.5) == pytest.approx(
            math.sqrt(alpha * beta_t), rel=1e-12)
    with pytest.raises(ValueError, match="noise_bound must be a finite real number or 'auto'"):
        BKB(np.eye(3), noise_bound="estimate")


def _hartmann6(n_arms: int) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's Hartmann-6 (n random arms of [0, 1]^6 and the optimum, rewards standardised)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    return importlib.import_module("workflows.benchmarks.bkb_regret").hartmann6(n_arms)


@pytest.mark.parametrize("cls", [BKB, BatchBKB])
def test_defaults_learn_in_six_dimensions(cls):
    """Issue 40: on Hartmann-6 (200 arms + the optimum, noise 0.1 on standardised rewards, 150 steps) the
    union bound over arms (width="arms", 7 to 10 standard deviations) explored at random-search level (mean
    regret 0.94 to 0.97 of random search's over 5 seeds with BKB, 0.97 with BatchBKB); the dimension width
    with the noise from the residuals and the running mean as prior mean (noise_estimate="residuals", the
    default before) 0.41 to 0.50 with BKB, 0.63 to 0.65 with BatchBKB on seeds 0-5: about 100 distinct arms
    tried. With the evidence's noise, scale and prior mean (the default) the median over seeds 0-4 is 0.14
    with BKB and 0.23 with BatchBKB; a seed that stays near a poor local optimum scores 0.5 to 0.76 (one
    such seed of five for each). Threshold on the median of 5 seeds, 0.35 of random search's: below every
    seed of the former default (0.41 and more), above the new medians by 0.12 or more, and met while two
    seeds of five get stuck (round-off in near-ties may change a path on another machine, not the level).
    A bandit exploring at random is within sd(f) / sqrt(150) = 0.08 (1.2% of random search's 7.0) of it."""
    arms, f = _hartmann6(200)
    random_search = float(np.mean(f.max() - f))
    relative = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        bandit = cls(arms, sigma=0.4, random_state=seed)
        regret: list[float] = []
        with blas_threads(1):
            while len(regret) < 150:
                chosen = bandit.ask() if cls is BatchBKB else [bandit.ask()]
                bandit.tell_many(chosen, [float(f[i] + 0.1 * rng.normal()) for i in chosen])
                regret += [float(f.max() - f[i]) for i in chosen]
        relative.append(np.mean(regret[:150]) / random_search)
    assert np.median(relative) < 0.35, relative


def _dense_evidence(K, y, lam):
    """The GP's constant mean, signal variance and profile evidence at one penalty, from the t x t matrix."""
    A = K + lam * np.eye(len(y))
    one = np.ones(len(y))
    m = one @ np.linalg.solve(A, y) / (one @ np.linalg.solve(A, one))
    r = y - m
    s2 = r @ np.linalg.solve(A, r) / len(y)
    return m, s2, -0.5 * len(y) * np.log(s2) - 0.5 * np.linalg.slogdet(A)[1]


def test_evidence_estimate_equals_the_dense_gaussian_process_evidence():
    """evidence_penalty works per arm in the r-dimensional Nystrom space; the same quantities from the
    t x t kernel matrix of every pull (repeated arms as repeated rows). Tolerance 1e-8: both are
    backward stable, so they differ by cond(A) * eps with cond(A) <= (t kappa^2 + lambda) / lambda
    = 4e3 at the chosen lambda (>= 0.01 here: noise 0.3 on a signal of scale 2), i.e. ~1e-12."""
    rng = np.random.default_rng(3)
    arms = rng.uniform(size=(40, 2))
    kernel = make_kernel("gaussian", sigma=0.3)
    counts = rng.integers(0, 3, size=40)
    Z = nystrom_embedding(kernel, arms, np.flatnonzero(counts))
    pulls = np.repeat(np.arange(40), counts)
    f = 2.0 * np.sin(4 * arms[:, 0]) + arms[:, 1]
    y = 5.0 + f[pulls] + 0.3 * rng.normal(size=pulls.size)
    sums, squares = np.bincount(pulls, y, 40), np.bincount(pulls, y * y, 40)
    penalty, signal, mean = evidence_penalty(Z, counts, sums, squares)
    K = kernel(arms[pulls], arms[pulls])
    grid = np.logspace(-6, 1, 29)
    dense = [_dense_evidence(K, y, lam) for lam in grid]
    best = int(np.argmax([d[2] for d in dense]))
    assert penalty == pytest.approx(grid[best], rel=1e-12) and penalty >= 0.01
    assert (mean, signal) == pytest.approx(dense[best][:2], rel=1e-8)
    # the noise xi^2 = lambda s^2 is within the grid's step (10^(1/4)) and sampling error of the true 0.09
    assert 0.09 / 2 < penalty * signal < 0.09 * 2
    # all rewards equal (one reward): no scale to estimate
    one = np.zeros(40)
    one[7] = 1
    assert evidence_penalty(Z, one.astype(int), 2.5 * one, 6.25 * one)[1:] == (0.0, 2.5)
