"""BKB: GP-UCB on a Nystrom dictionary resampled by posterior variance at every step.

Calandriello, Carratino, Lazaric, Valko and Rosasco, "Gaussian Process Optimization
with Adaptive Sketching: Scalable and No Regret", COLT 2019.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

from daskkrr.bandits.posterior import NystromPosterior, nystrom_embedding
from daskkrr.kernels import Kernel, make_kernel
from daskkrr.utils.threads import blas_threads


def confidence_width(
    *,
    variance_sum: float,
    t: int,
    kappa2: float,
    penalty: float,
    noise_bound: float,
    norm_bound: float,
    delta: float,
    epsilon: float,
    ratio: float = 1.0,
) -> float:
    """BKB's ``beta~_t`` (Theorem 1 of the COLT 2019 paper)::

        beta~_t = 2 xi sqrt(ratio * alpha * log(kappa^2 t) * sum_s sigma~_t^2(x_s) + log(1/delta))
                  + (1 + 1 / sqrt(1 - eps)) sqrt(lambda) F

    with ``alpha = (1 + eps) / (1 - eps)``, ``xi`` the noise's sub-Gaussian bound
    (``noise_bound``), ``F`` the bound on ``f``'s RKHS norm (``norm_bound``),
    ``kappa^2 = max k(x, x)`` and ``sum_s sigma~_t^2(x_s)`` the current variances
    summed over the ``t`` pulls (an estimate of ``log det(I + K_t / lambda)``).
    ``ratio`` is BBKB's batch factor ``C~`` (1 for BKB); ``log(kappa^2 t)`` is taken
    as 0 while ``kappa^2 t < 1``.

    Parameters
    ----------
    variance_sum : float
        ``sum_s sigma~_t^2(x_s)`` over the ``t`` pulls.
    t : int
        Rewards told so far.
    kappa2 : float
        ``max k(x, x)`` over the arms.
    penalty : float
        ``lambda``.
    noise_bound, norm_bound : float
        ``xi`` and ``F``.
    delta : float
        The bound holds with probability ``1 - delta``.
    epsilon : float
        The Nystrom accuracy ``eps`` in [0, 1).
    ratio : float, default=1.0
        BBKB's ``C~``.

    Returns
    -------
    float
        ``beta~_t``.
    """
    alpha = (1.0 + epsilon) / (1.0 - epsilon)
    logdet = ratio * alpha * max(math.log(kappa2 * t), 0.0) * variance_sum if t > 0 else 0.0
    return (2.0 * noise_bound * math.sqrt(logdet + math.log(1.0 / delta))
            + (1.0 + 1.0 / math.sqrt(1.0 - epsilon)) * math.sqrt(penalty) * norm_bound)


def bayesian_width(*, n_arms: int, t: int, delta: float, epsilon: float) -> float:
    """The width of GP-UCB's bound for a reward drawn from the GP prior, over a finite arm set.

    Srinivas, Krause, Kakade and Seeger (ICML 2010), Theorem 1: with
    ``beta_t = 2 log(|A| t^2 pi^2 / (6 delta))``, ``|f(x) - mu_{t-1}(x)| <= sqrt(beta_t)
    sigma_{t-1}(x)`` for every arm and step with probability ``1 - delta``, where
    ``sigma`` is the posterior standard deviation in the rewards' units. Nystrom's
    variance is within a factor ``alpha = (1 + eps) / (1 - eps)`` of the exact one
    (BKB's Lemma: ``sigma^2 / alpha <= sigma~^2 <= alpha sigma^2``), so the width on
    ``sigma~`` is ``sqrt(alpha beta_t)``.

    Parameters
    ----------
    n_arms : int
        ``|A|``.
    t : int
        The step the bound is for (1 for the first ask: ``t - 1`` rewards told).
    delta : float
        The bound holds with probability ``1 - delta``.
    epsilon : float
        The Nystrom accuracy ``eps`` in [0, 1).

    Returns
    -------
    float
        ``sqrt(alpha beta_t)``, in posterior standard deviations.
    """
    alpha = (1.0 + epsilon) / (1.0 - epsilon)
    beta_t = 2.0 * math.log(max(n_arms, 1) * max(t, 1) ** 2 * math.pi**2 / (6.0 * delta))
    return math.sqrt(alpha * beta_t)


def dimension_width(*, n_features: int, t: int, constant: float = 0.2) -> float:
    """A width that grows with the arms' dimension and the step, not with the number of arms.

    ``sqrt(c d log(2 t))`` posterior standard deviations with ``c = 0.2``: the default
    of Kandasamy, Schneider and Poczos (ICML 2015, "High dimensional Bayesian
    optimisation and bandits via additive models") for GP-UCB. It keeps the
    ``d log t`` order of Srinivas et al.'s (2010) Theorem 2, the width for a
    ``d``-dimensional box, where Theorem 1's ``log |A|`` (the union bound over a finite
    arm set, :func:`bayesian_width`) counts every arm as independent: arms that
    discretise a box are not, and on Hartmann-6 (1001 arms) that count made the width
    7 to 11 standard deviations and BKB explore for the whole run (issue 40).

    Parameters
    ----------
    n_features : int
        ``d``, the arms' number of coordinates.
    t : int
        The step the width is for (1 for the first ask).
    constant : float, default=0.2
        ``c``.

    Returns
    -------
    float
        ``sqrt(c d log(2 t))``, in posterior standard deviations.
    """
    return math.sqrt(constant * max(n_features, 1) * math.log(2.0 * max(t, 1)))


#: The value of a parameter estimated online.
AUTO = "auto"
#: The confidence widths for estimated noise: ``width=`` names them.
WIDTHS = ("dimension", "arms")
#: What "auto" means before any reward, and for penalty/norm_bound in the paper's setting (its defaults).
PAPER_DEFAULT = 1.0
#: The estimated noise variance is kept at least this fraction of the rewards' variance (so lambda >= 1e-6).
MIN_NOISE_RATIO = 1e-6
#: How "auto" estimates the noise: ``noise_estimate=`` names them.
NOISE_ESTIMATES = ("evidence", "residuals")
#: The penalties ``lambda = xi^2 / s^2`` the evidence is maximised over: 4 a decade from MIN_NOISE_RATIO to 10.
EVIDENCE_GRID = np.logspace(math.log10(MIN_NOISE_RATIO), 1.0, 29)


def evidence_penalty(Z: np.ndarray, counts: np.ndarray, sums: np.ndarray, squares: np.ndarray,
                     grid: np.ndarray = EVIDENCE_GRID) -> tuple[float, float, float]:
    """The penalty, signal variance and prior mean that maximise the Gaussian-process evidence of the rewards.

    The rewards ``y`` are modelled as ``y = m 1 + Z w + noise`` with ``w ~ N(0, s^2 I)`` and
    noise ``N(0, xi^2 I)``: the GP with constant prior mean ``m`` and prior covariance
    ``s^2 k`` on the Nystrom-projected kernel ``Z Z^T``. For ``lambda = xi^2 / s^2`` and
    ``A = Z Z^T + lambda I`` the evidence is maximised in ``m`` by the generalised least-squares
    mean ``m(lambda) = 1^T A^{-1} y / 1^T A^{-1} 1`` (correlated pulls, such as many pulls
    near one optimum, count together as little more than one) and in ``s^2`` by
    ``s^2(lambda) = r^T A^{-1} r / t``, ``r = y - m 1``; that leaves the profile
    ``-t/2 log s^2(lambda) - 1/2 log det A``, evaluated on ``grid`` from one
    eigendecomposition ``U diag(h) U^T`` of ``H = sum_s z(x_s) z(x_s)^T``:
    ``u^T A^{-1} v = (u^T v - (Z^T u)^T U diag(1 / (h + lambda)) U^T (Z^T v)) / lambda`` and
    ``log det A = t log lambda + sum_k log(1 + h_k / lambda)``. Observations enter per arm
    (pull count, sum and sum of squares of the rewards), so the cost is ``O(A r^2 + r^3)``
    whatever the number of pulls.

    Parameters
    ----------
    Z : ndarray of shape (A, r)
        Nystrom embedding of the arms (:func:`~daskkrr.bandits.nystrom_embedding`).
    counts, sums, squares : ndarray of shape (A,)
        Pulls of each arm, the sum of its rewards and the sum of their squares.
    grid : ndarray
        The penalties to compare.

    Returns
    -------
    penalty : float
        The ``lambda`` of ``grid`` with the largest evidence (the largest one among ties).
    signal : float
        ``s^2(lambda)`` at that penalty (0 when the rewards are all equal).
    mean : float
        ``m(lambda)`` at that penalty.
    """
    pulled = np.flatnonzero(counts)
    c = counts[pulled].astype(np.float64)
    t = float(c.sum())
    total, total_squares = float(sums[pulled].sum()), float(squares[pulled].sum())
    lam = np.asarray(grid, dtype=np.float64)
    if total_squares - total**2 / t <= 1e-12 * total_squares:  # the rewards are all equal (one reward): no scale
        return float(lam[-1]), 0.0, total / t
    Zp = Z[pulled]
    h, U = np.linalg.eigh(Zp.T @ (c[:, None] * Zp))
    h = np.maximum(h, 0.0)
    zy, z1 = U.T @ (Zp.T @ sums[pulled]), U.T @ (Zp.T @ c)
    inv = 1.0 / (h[None, :] + lam[:, None])  # one row per penalty
    # lambda u^T A^{-1} v for (u, v) = (1, 1), (1, y), (y, y)
    one_one = t - inv @ (z1 * z1)
    one_y = total - inv @ (z1 * zy)
    y_y = total_squares - inv @ (zy * zy)
    mean = one_y / np.maximum(one_one, np.finfo(float).tiny)
    # r^T A^{-1} r >= 0; round-off can push it below when the fit interpolates.
    quad = np.maximum(y_y - 2.0 * mean * one_y + mean**2 * one_one, 0.0) / lam
    signal = np.maximum(quad / t, np.finfo(float).tiny)
    logdet = t * np.log(lam) + np.sum(np.log1p(h[None, :] / lam[:, None]), axis=1)
    profile = -0.5 * t * np.log(signal) - 0.5 * logdet
    # Ties (a flat profile, from few rewards) go to the largest penalty, the smoothest fit. The tolerance is
    # absolute, as the profile moves by -t log(a) for rewards a y + b: the same penalty whatever their units.
    best = int(np.flatnonzero(profile >= profile.max() - 1e-9 * t)[-1])
    return float(lam[best]), float(signal[best]), float(mean[best])


def _auto_or_real(name: str, value: Any, **bounds: Any) -> float | str:
    """``"auto"`` or a real number checked by :func:`_check_real`."""
    if isinstance(value, str):
        if value != AUTO:
            raise ValueError(f"{name} must be a finite real number or {AUTO!r}; got {value!r}")
        return value
    return _check_real(name, value, **bounds)


def _check_real(name: str, value: Any, *, low: float, high: float = math.inf, closed_low: bool = False,
                closed_high: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number; got {value!r}")
    value = float(value)
    above = value >= low if closed_low else value > low
    below = value <= high if closed_high else value < high
    if not (above and below):
        lo, hi = ("[" if closed_low else "("), ("]" if closed_high else ")")
        raise ValueError(f"{name} must be in {lo}{low}, {high}{hi}; got {value!r}")
    return value


def check_arms(arms: Any) -> np.ndarray:
    """The arm set as a finite float64 array (A, d); ValueError for an empty or bad one."""
    a = np.asarray(arms, dtype=np.float64) if not isinstance(arms, np.ndarray) else arms.astype(np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"arms must be a 2-D array (A arms, d features); got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError("the arm set is empty: BKB needs at least one arm to choose from")
    if a.shape[1] == 0:
        raise ValueError("the arms have no features (shape (A, 0))")
    if not np.all(np.isfinite(a)):
        raise ValueError("the arms contain NaN or infinite values")
    return np.ascontiguousarray(a)


def scaled_kernel(kernel: str | Kernel, sigma: Any, d: int) -> tuple[Kernel, np.ndarray | None]:
    """The kernel and, for a per-feature ``sigma`` (ARD), the factors that scale each feature.

    A vector ``sigma`` of length ``d`` is applied by dividing feature ``j`` by
    ``sigma[j]`` and using the kernel with ``sigma = 1``: the same kernel values for
    every stationary kernel.
    """
    if isinstance(kernel, Kernel):
        if sigma is not None:
            raise ValueError("pass sigma inside the Kernel object, or pass the kernel by name")
        return kernel, None
    if sigma is None:
        return make_kernel(kernel), None
    s = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    if s.ndim != 1 or s.size not in (1, d):
        raise ValueError(f"sigma must be a scalar or a vector of length {d} (one per feature); "
                         f"got shape {np.shape(sigma)}")
    if not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError(f"sigma must be > 0 and finite; got {sigma!r}")
    if s.size == 1:
        return make_kernel(kernel, sigma=float(s[0])), None
    return make_kernel(kernel, sigma=1.0), 1.0 / s


class BKB:
    """Budgeted kernelized bandit (BKB): GP-UCB with an adaptive Nystrom dictionary.

    At each step the arm with the largest upper confidence bound
    ``u~(x) = f~(x) + beta~_t sigma~(x)`` is asked; once its reward is told, every
    pulled arm enters the new dictionary ``S_t`` independently with probability
    ``min(qbar sigma~^2(x), 1)`` (for an arm pulled ``c`` times, the chance that at
    least one of its ``c`` copies is drawn, ``1 - (1 - p)^c``), and the posterior
    of every arm is recomputed on ``S_t``: ``O(A m^2)`` for ``m = |S_t|``, against
    ``O(A t^2)`` for exact GP-UCB. Mean and variance follow the conventions of
    :mod:`daskkrr.bandits.posterior`: ``sigma~^2`` is the posterior variance of the
    GP with prior covariance ``k / lambda`` and unit noise.

    Parameters
    ----------
    arms : array-like of shape (A, d)
        The finite set of candidate points.
    kernel : str or Kernel, default="gaussian"
        A :func:`daskkrr.kernels.make_kernel` name, or a kernel object.
    sigma : float, array-like of shape (d,) or None, default=1.0
        Length scale of a stationary kernel; a vector gives one per feature (ARD).
        None for kernels without one (``linear``, ``polynomial``).
    penalty : float or "auto", default="auto"
        ``lambda``: the regularisation, i.e. the noise variance relative to the prior.
        "auto": ``noise_bound_^2 / s^2`` with the estimates below when
        ``noise_bound="auto"``, else 1.0 (the paper's setting).
    qbar : float, default=4.0
        Oversampling of the dictionary: larger keeps more arms (more accurate and
        slower). The paper's guarantee needs ``qbar >= 6 alpha log(4 T / delta) / eps^2``;
        a few units work in practice.
    delta : float, default=0.5
        Confidence: the bounds hold with probability ``1 - delta``.
    noise_bound : float or "auto", default="auto"
        ``xi``, the sub-Gaussian bound of the reward noise. "auto" estimates it and
        the rewards' scale online (empirical Bayes, see Notes); a number gives the
        paper's width with that bound (``noise_bound=1.0, penalty=1.0, norm_bound=1.0``
        is the paper's default).
    norm_bound : float or "auto", default="auto"
        ``F``, a bound on the RKHS norm of the reward function. "auto": the
        estimated reward amplitude ``s`` when ``noise_bound="auto"`` (a function drawn
        from the prior ``GP(0, s^2 k)`` has RKHS-norm scale ``s``), else 1.0.
    epsilon : float, default=0.5
        ``eps`` in [0, 1), the accuracy of the Nystrom approximation that ``beta~``
        allows for (``alpha = (1 + eps) / (1 - eps)``); 0 gives exact GP-UCB's width.
        Used by the paper's width and ``width="arms"``, not by the default dimension width.
    beta_scale : float, default=1.0
        Factor on ``beta~_t``: 1 is the paper's width; the theoretical widths
        over-explore, and GP-UCB's practice shrinks them (Srinivas et al. 2010
        divide by 5 in their experiments).
    width : {"dimension", "arms"}, default="dimension"
        The width with ``noise_bound="auto"`` (see Notes): "dimension",
        ``sqrt(0.2 d log(2t))`` standard deviations (:func:`dimension_width`);
        "arms", Srinivas et al.'s finite-arm-set width ``sqrt(alpha beta_t)``, which
        grows with ``log A`` (:func:`bayesian_width`). Unused when ``noise_bound`` is a number.
    noise_estimate : {"evidence", "residuals"}, default="evidence"
        How ``noise_bound="auto"`` estimates the noise, scale and prior mean (see Notes):
        "evidence", the Gaussian-process evidence maximised over ``lambda``
        (:func:`evidence_penalty`); "residuals", the running mean and the residuals of the
        current posterior mean (the default before issue 40's third round).
    random_state : int, numpy Generator or None, default=None
        Seeds the dictionary draws and the breaking of ties between arms.

    Notes
    -----
    With ``noise_bound="auto"`` and ``noise_estimate="evidence"`` (the default) the
    rewards are modelled, after each update, as a GP with a constant prior mean ``m``,
    prior covariance ``s^2 k`` (on the new dictionary's Nystrom kernel) and noise
    variance ``xi^2``, and ``m``, ``s^2`` and ``lambda = xi^2 / s^2`` are those of largest
    evidence (type-II maximum likelihood; ``lambda`` over 4 values a decade in
    ``[1e-6, 10]``, ``m`` and ``s^2`` in closed form: :func:`evidence_penalty`). ``m`` is
    the generalised least-squares mean, in which correlated pulls count together: the
    running mean of the pulls, once they concentrate near a good arm, puts the prior
    mean of the arms never pulled near that arm's reward, and UCB then keeps pulling
    them (on Hartmann-6 about 100 distinct arms in 300 pulls, against 20 to 70).
    With ``noise_estimate="residuals"`` the rewards are centred by their running mean,
    ``s^2`` is their variance so far and the noise variance is ``RSS / (t - d_eff)``,
    the residual sum of squares of the current posterior mean over its residual
    degrees of freedom (``d_eff`` the trace of its hat matrix), or ``s^2`` while
    ``t - d_eff < 1``, kept in ``[1e-6 s^2, s^2]``. That estimate is taken at the
    previous ``lambda`` and feeds itself: a large ``lambda`` smooths the mean, whose
    large residuals keep ``lambda`` large (``xi`` was 0.5 to 1 times the rewards'
    spread for the first 25 steps on Hartmann-6; by the evidence, about 0.10 from the
    20th step on against the true 0.1). Either way ``lambda = xi^2 / s^2`` and ``F = s`` where those are "auto".

    The estimated model is a GP: prior ``s^2 k``, noise variance ``xi^2``; the posterior
    standard deviation in the rewards' units is ``xi sigma~``, and ``beta~_t`` is ``xi``
    times a number of standard deviations. By default (``width="dimension"``) that
    number is ``sqrt(0.2 d log(2t))`` (:func:`dimension_width`, Kandasamy et al. 2015:
    the ``d log t`` order of Srinivas et al.'s Theorem 2 for a ``d``-dimensional domain);
    with ``width="arms"`` it is the Bayesian width for a finite arm set,
    ``sqrt(alpha beta_t)`` with Srinivas et al.'s (2010, Theorem 1)
    ``beta_t = 2 log(A t^2 pi^2 / (6 delta))`` (:func:`bayesian_width`; ``alpha`` covers
    Nystrom's variance error). BatchBKB multiplies either by ``sqrt(ratio_threshold)``.
    The union bound over ``A`` arms asked 7 to 11 standard deviations on Hartmann-6
    (1001 arms, t <= 300) and BKB explored for the whole run at 19x the regret of a tuned
    GP-UCB; the dimension width asks 0.9 to 2.8 there and 0.5 to 1.7 on Branin (issue 40,
    ``docs/guide/tuning.rst``). ``epsilon`` does not enter the dimension width: its
    constant 0.2 was set by experiment, not by a bound that a worst-case factor
    ``sqrt(alpha)`` would keep valid (with it the regret on Hartmann-6 was 2.2x larger).
    Both are in place of Theorem 1 of the BKB paper,
    whose ``2 xi sqrt(alpha log(t) sum_s sigma~^2 + log(1/delta))`` is for a worst-case
    function of RKHS norm ``F`` and grows with the effective dimension: with the
    estimated constants it asked for about 40 posterior standard deviations on Branin
    at t = 100 (GP-UCB with the benchmark's tuned width: about 12; the finite-arm width:
    10.5; the dimension width: 1.5), and
    its regret was 2.46x that GP-UCB's (issue 40). Either way the width is in the
    rewards' units whatever their scale. A reward of scale 1 with noise 0.01 gets
    ``xi`` near 0.01, where the fixed ``xi = 1`` made BKB explore like random search.
    A number for ``noise_bound`` keeps the paper's width (:func:`confidence_width`).

    Attributes
    ----------
    t_ : int
        Rewards told so far.
    penalty_, noise_bound_, norm_bound_ : float
        The ``lambda``, ``xi`` and ``F`` in use (estimated with "auto").
    reward_offset_ : float
        The prior mean subtracted from the rewards (with ``noise_bound="auto"`` the
        evidence's constant mean, or the running mean with ``noise_estimate="residuals"``;
        else 0).
    dictionary_ : ndarray of int
        Arm indices in the current dictionary ``S_t``.
    dictionary_size_ : list of int
        ``|S_t|`` after each update (one entry per update).
    beta_ : float
        The current ``beta~_t`` (:func:`dimension_width` or :func:`bayesian_width`, as
        ``width`` says, times ``noise_bound_`` with ``noise_bound="auto"``, else
        :func:`confidence_width`; times ``beta_scale``).
    mean_, variance_ : ndarray of shape (A,)
        Posterior mean ``f~_t`` and variance ``sigma~_t^2`` of every arm.
    counts_, reward_sums_ : ndarray of shape (A,)
        Pulls of each arm and the sum of its rewards.

    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr.bandits import BKB
    >>> arms = np.linspace(0, 1, 50)[:, None]
    >>> bandit = BKB(arms, sigma=0.2, penalty=0.01, noise_bound=0.1, random_state=0)
    >>> for _ in range(30):
    ...     i = bandit.ask()
    ...     bandit.tell(i, -(arms[i, 0] - 0.3) ** 2)
    >>> bool(abs(arms[int(np.argmax(bandit.mean_)), 0] - 0.3) < 0.05)
    True
    """

    def __init__(
        self,
        arms: Any,
        *,
        kernel: str | Kernel = "gaussian",
        sigma: Any = 1.0,
        penalty: float | str = AUTO,
        qbar: float = 4.0,
        delta: float = 0.5,
        noise_bound: float | str = AUTO,
        norm_bound: float | str = AUTO,
        epsilon: float = 0.5,
        beta_scale: float = 1.0,
        width: str = "dimension",
        noise_estimate: str = "evidence",
        random_state: Any = None,
    ):
        self.arms = check_arms(arms)
        self.penalty = _auto_or_real("penalty", penalty, low=0.0)
        self.qbar = _check_real("qbar", qbar, low=0.0)
        self.delta = _check_real("delta", delta, low=0.0, high=1.0)
        self.noise_bound = _auto_or_real("noise_bound", noise_bound, low=0.0, closed_low=True)
        self.norm_bound = _auto_or_real("norm_bound", norm_bound, low=0.0, closed_low=True)
        self._estimate = self.noise_bound == AUTO
        # Before any reward (and in the paper's setting): the fixed values, the paper's defaults for "auto".
        self.penalty_ = PAPER_DEFAULT if self.penalty == AUTO else float(self.penalty)
        self.noise_bound_ = PAPER_DEFAULT if self.noise_bound == AUTO else float(self.noise_bound)
        self.norm_bound_ = PAPER_DEFAULT if self.norm_bound == AUTO else float(self.norm_bound)
        self.reward_offset_ = 0.0
        self.epsilon = _check_real("epsilon", epsilon, low=0.0, high=1.0, closed_low=True)
        self.beta_scale = _check_real("beta_scale", beta_scale, low=0.0)
        if width not in WIDTHS:
            raise ValueError(f"width must be one of {WIDTHS} (the confidence width with noise_bound='auto'); "
                             f"got {width!r}")
        self.width = width
        if noise_estimate not in NOISE_ESTIMATES:
            raise ValueError(f"noise_estimate must be one of {NOISE_ESTIMATES} (how noise_bound='auto' is "
                             f"estimated); got {noise_estimate!r}")
        self.noise_estimate = noise_estimate
        self.kernel, self._scale = scaled_kernel(kernel, sigma, self.arms.shape[1])
        self._points = self._scaled(self.arms)
        self.rng = np.random.default_rng(random_state)
        n = self.arms.shape[0]
        self.kernel_diag_ = self.kernel.diag(self._points).astype(np.float64)
        self.kappa2_ = float(self.kernel_diag_.max())
        self.counts_ = np.zeros(n, dtype=np.int64)
        self.reward_sums_ = np.zeros(n)
        self._reward_squares = np.zeros(n)  # per arm: the sum of its squared rewards (for the noise estimate)
        self.t_ = 0
        self.dictionary_ = np.zeros(0, dtype=np.int64)
        self.dictionary_size_: list[int] = []
        self._pending: Counter[int] = Counter()
        self._excluded = np.zeros(n, dtype=bool)
        self._refresh_posterior()
        self._update_beta()

    # ------------------------------------------------------------------ public
    @property
    def n_arms(self) -> int:
        return int(self.arms.shape[0])

    def ucb(self) -> np.ndarray:
        """``u~_t`` of every arm (``-inf`` for excluded arms)."""
        u = self.mean_ + self.beta_ * np.sqrt(self.variance_)
        u[self._excluded] = -np.inf
        return u

    def ask(self) -> int:
        """The index of the arm to evaluate next (the largest UCB; ties broken at random)."""
        self._check_arms_left()
        index = self._argmax(self.ucb())
        self._pending[index] += 1
        return index

    def tell(self, index: Any, reward: Any) -> None:
        """Record the reward of an arm returned by :meth:`ask`, then update the model."""
        i = self._take_pending(index, reward)
        self._observe([i], [float(reward)])
        self._update()

    def tell_many(self, indices: Sequence[Any], rewards: Sequence[Any]) -> None:
        """:meth:`tell` for several asked arms at once, with one update of the model."""
        if len(indices) != len(rewards):
            raise ValueError(f"{len(indices)} indices but {len(rewards)} rewards")
        taken = [self._take_pending(i, r) for i, r in zip(indices, rewards, strict=True)]
        self._observe(taken, [float(r) for r in rewards])
        self._update()

    def exclude(self, index: Any) -> None:
        """Never ask arm ``index`` again (for example a candidate whose evaluation failed);
        a pending ask of it is cancelled."""
        i = self._check_index(index)
        self._excluded[i] = True
        self._pending.pop(i, None)

    def add_arms(self, arms: Any) -> np.ndarray:
        """Append arms to the arm set (between steps: no arm may be pending); returns their indices.

        The new arms have no observations; the dictionary and every reward so far are
        kept, and the posterior and ``beta~`` are recomputed over the larger set.
        """
        if self._pending:
            raise ValueError(f"arms can be added only when no reward is pending; pending arms: {self.pending}")
        new = check_arms(arms)
        if new.shape[1] != self.arms.shape[1]:
            raise ValueError(f"the new arms have {new.shape[1]} coordinates; the arm set has {self.arms.shape[1]}")
        start, n_new = self.n_arms, new.shape[0]
        points = self._scaled(new)
        diag = self.kernel.diag(points).astype(np.float64)
        self.arms = np.concatenate([self.arms, new])
        self._points = np.concatenate([self._points, points])
        self.kernel_diag_ = np.concatenate([self.kernel_diag_, diag])
        self.kappa2_ = float(self.kernel_diag_.max())
        self.counts_ = np.concatenate([self.counts_, np.zeros(n_new, dtype=np.int64)])
        self.reward_sums_ = np.concatenate([self.reward_sums_, np.zeros(n_new)])
        self._reward_squares = np.concatenate([self._reward_squares, np.zeros(n_new)])
        self._excluded = np.concatenate([self._excluded, np.zeros(n_new, dtype=bool)])
        with blas_threads(1):  # small matrices: see _update
            self._refresh_posterior()
            self._update_beta(self._beta_ratio)
        return np.arange(start, start + n_new)

    @property
    def n_arms_left(self) -> int:
        """Arms not excluded."""
        return int(self.n_arms - self._excluded.sum())

    @property
    def pending(self) -> list[int]:
        """Asked arms whose reward has not been told yet."""
        return sorted(self._pending.elements())

    # -------------------------------------------------------------- internals
    def _scaled(self, arms: np.ndarray) -> np.ndarray:
        """Arms in the kernel's coordinates (divided by the per-coordinate length, if any)."""
        return arms if self._scale is None else arms * self._scale

    def _check_arms_left(self) -> None:
        if self._excluded.all():
            raise ValueError("every arm is excluded: no valid arm is left to ask")

    def _argmax(self, u: np.ndarray) -> int:
        best = np.flatnonzero(u == u.max())
        return int(best[0] if best.size == 1 else self.rng.choice(best))

    def _check_index(self, index: Any) -> int:
        if isinstance(index, bool) or not isinstance(index, Integral):
            raise TypeError(f"an arm index must be an integer; got {index!r}")
        i = int(index)
        if not 0 <= i < self.n_arms:
            raise IndexError(f"arm index {i} is out of range for {self.n_arms} arms")
        return i

    def _take_pending(self, index: Any, reward: Any) -> int:
        i = self._check_index(index)
        if isinstance(reward, bool) or not isinstance(reward, Real) or not math.isfinite(float(reward)):
            raise ValueError(f"the reward of arm {i} must be a finite real number; got {reward!r}")
        if self._pending[i] == 0:
            self._pending.pop(i, None)
            raise ValueError(f"arm {i} was not asked (or its reward was already told): tell only "
                             f"the arms that ask() returned; pending arms: {self.pending}")
        self._pending[i] -= 1
        if self._pending[i] == 0:
            del self._pending[i]
        return i

    def _observe(self, indices: Sequence[int], rewards: Sequence[float]) -> None:
        for i, r in zip(indices, rewards, strict=True):
            self.counts_[i] += 1
            self.reward_sums_[i] += r
            self._reward_squares[i] += r * r
        self.t_ += len(indices)

    def _update(self, ratio: float = 1.0) -> None:
        """Resample the dictionary with the variances before the new rewards, then refit."""
        # One BLAS thread: the matrices are small (m x m, A x m), and threads cost more
        # than they save (25x slower per step on a loaded 2-core machine).
        with blas_threads(1):
            self._resample_dictionary(self.variance_)
            Z = nystrom_embedding(self.kernel, self._points, self.dictionary_)
            if self._estimate:
                self._estimate_scales(Z)
            self._refresh_posterior(Z)
            self._update_beta(ratio)

    def _resample_dictionary(self, variance: np.ndarray) -> None:
        """Keep each pulled arm with probability ``1 - (1 - min(qbar var, 1))^count``; with no
        arm pulled yet (a first batch whose evaluations all failed) the dictionary stays empty."""
        pulled = np.flatnonzero(self.counts_)
        p = np.minimum(self.qbar * variance[pulled], 1.0)
        keep_prob = 1.0 - (1.0 - p) ** self.counts_[pulled]
        kept = pulled[self.rng.random(pulled.size) < keep_prob]
        if kept.size == 0 and pulled.size:
            # An empty dictionary would forget every reward: keep the most uncertain pulled arm.
            kept = pulled[[int(np.argmax(variance[pulled]))]]
        self.dictionary_ = kept
        self.dictionary_size_.append(int(kept.size))

    def _estimate_scales(self, Z: np.ndarray) -> None:
        """The prior mean, ``s^2`` and ``xi`` from the rewards so far (see the class Notes), by the
        evidence on the new dictionary's embedding ``Z``, or the running mean and the residuals of the
        current posterior mean; then ``lambda`` and ``F`` where they are "auto"."""
        if self.t_ == 0:  # a first batch whose evaluations all failed: nothing to estimate from
            return
        if self.noise_estimate == "evidence":
            self._estimate_by_evidence(Z)
            return
        t = float(self.t_)
        pulled = np.flatnonzero(self.counts_)
        c, sums, squares = self.counts_[pulled], self.reward_sums_[pulled], self._reward_squares[pulled]
        offset = float(sums.sum()) / t
        signal = max(float(squares.sum()) / t - offset**2, 0.0)
        # residuals of the posterior mean (fitted before these rewards' update) to every reward told
        mean = self.mean_[pulled]
        rss = max(float(np.sum(squares - 2.0 * mean * sums + c * mean**2)), 0.0)
        # d_eff = tr(hat) = sum over pulls of z^T G^{-1} z, the projected part of the unit-noise variance
        dof = float(c @ self.posterior_.projected_variance[pulled])
        noise = rss / (t - dof) if t - dof >= 1.0 else signal
        noise = min(max(noise, MIN_NOISE_RATIO * signal), signal)
        self._set_scales(offset, signal, noise)

    def _estimate_by_evidence(self, Z: np.ndarray) -> None:
        """``lambda``, ``s^2`` and the prior mean that maximise the evidence of the rewards
        (:func:`evidence_penalty`; over the given ``penalty`` alone when it is a number), ``xi^2 = lambda s^2``."""
        grid = EVIDENCE_GRID if self.penalty == AUTO else np.array([float(self.penalty)])
        penalty, signal, offset = evidence_penalty(Z, self.counts_, self.reward_sums_, self._reward_squares, grid)
        self._set_scales(offset, signal, penalty * signal)

    def _set_scales(self, offset: float, signal: float, noise: float) -> None:
        self.reward_offset_ = offset
        if signal > 0.0:  # all rewards equal so far (one reward): keep the previous scales, not a zero width
            self.noise_bound_ = math.sqrt(noise)
            if self.penalty == AUTO:
                self.penalty_ = noise / signal
            if self.norm_bound == AUTO:
                self.norm_bound_ = math.sqrt(signal)

    def _refresh_posterior(self, Z: np.ndarray | None = None) -> None:
        if Z is None:
            Z = nystrom_embedding(self.kernel, self._points, self.dictionary_)
        centred = self.reward_sums_ - self.reward_offset_ * self.counts_
        self.posterior_ = NystromPosterior(Z, self.kernel_diag_, self.counts_, centred, self.penalty_)
        self.mean_ = self.posterior_.mean + self.reward_offset_
        self.variance_ = self.posterior_.variance

    def _update_beta(self, ratio: float = 1.0) -> None:
        self._beta_ratio = ratio  # add_arms recomputes beta~ with the same widening
        if self._estimate:
            # The estimated model is a GP prior s^2 k with noise xi^2, where xi sigma~ is the posterior
            # standard deviation in the rewards' units: the width is a number of those (see the class Notes).
            # A batch's variance ratio C widens it by sqrt(C) (GP-BUCB, Desautels et al. 2014).
            if self.width == "arms":
                deviations = bayesian_width(n_arms=self.n_arms, t=self.t_ + 1, delta=self.delta, epsilon=self.epsilon)
            else:
                deviations = dimension_width(n_features=self.arms.shape[1], t=self.t_ + 1)
            self.beta_ = self.beta_scale * self.noise_bound_ * math.sqrt(ratio) * deviations
            return
        self.beta_ = self.beta_scale * confidence_width(
            variance_sum=float(self.variance_ @ self.counts_), t=self.t_, kappa2=self.kappa2_,
            penalty=self.penalty_, noise_bound=self.noise_bound_, norm_bound=self.norm_bound_,
            delta=self.delta, epsilon=self.epsilon, ratio=ratio,
        )
