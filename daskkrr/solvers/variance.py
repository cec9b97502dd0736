"""Predictive standard deviation: the posterior of the Gaussian process behind kernel ridge regression.

The convention (the same for exact KRR and the Nystrom models):

* prior ``f ~ GP(0, s^2 k)`` with the model's kernel ``k`` (in standardised
  feature units), noise ``y_i = f(x_i) + e_i``, ``e_i ~ N(0, s^2 lambda n)``: the
  posterior mean of this GP is the kernel ridge solution with ``penalty = lambda``
  (``(K + lambda n I) c = y``), whatever ``s^2``. So ``penalty * n`` is the
  noise-to-signal ratio ``sigma_n^2 / s^2``, and scikit-learn's
  ``GaussianProcessRegressor(kernel=ConstantKernel(s^2) * k, alpha=s^2 * penalty * n)``
  is the same model;
* ``s^2``, the prior variance, is not set by the ridge problem; it is estimated
  per target by maximum likelihood given that ratio, in closed form:
  ``s^2 = y^T (K + lambda n I)^{-1} y / n`` (the "process variance" of kriging),
  which is in units of ``y`` squared;
* the Nystrom models are the "deterministic training conditional" (DTC) GP of
  their centers ``Z``: training values ``f_n = K_nM w`` with ``w ~ N(0, s^2 K_MM^{-1})``
  (the Nystrom prior), so the posterior mean is the Nystrom KRR solution, and at a
  new point the exact prior variance ``k(x, x)``. Its variance, for unit ``s^2``
  and ``sigma^2 = lambda n``, is

  ``v(x) = k(x, x) - k_M(x)^T K_MM^{-1} k_M(x) + sigma^2 k_M(x)^T (K_MN K_NM + sigma^2 K_MM)^{-1} k_M(x)``,

  the formula of BKB's ``sigma~_t^2`` (Calandriello et al. 2019) times ``sigma^2``; with
  every training point a center it equals the exact GP's;
* an unpenalised intercept (``fit_intercept=True``) is a constant with a flat
  prior, estimated with the function (as in ordinary kriging): ``k_M(x)`` becomes
  ``k_M(x) - mu`` in the last term (``mu = K_MN 1 / n``), the Gram matrix
  ``K_MN K_NM - n mu mu^T``, and ``v`` gains ``sigma^2 / n`` (its variance);
* ``s^2`` as used by ``return_std`` is calibrated on the training residuals: the noise
  variance is estimated as ``sigma_hat^2 = RSS / (n - d_eff)`` (the residual sum of
  squares of the fit over its residual degrees of freedom, ``d_eff`` the trace of the
  hat matrix, plus one for an intercept), and ``s^2 = sigma_hat^2 / (lambda n)``, so
  that the GP's noise variance ``s^2 lambda n`` is that estimate. The maximum-likelihood
  ``s^2`` above is kept as ``likelihood_prior_variance`` (scikit-learn's GP with that
  amplitude has the std ``sqrt(likelihood_prior_variance v(x))``);
* the Nystrom models' ``v`` has two terms, the centers' miss ``k(x, x) - k_M^T K_MM^{-1} k_M``
  (what the centers do not span: the whole prior far from them) and the rest, the posterior
  variance of the part they span (``fit``). ``s^2`` is tied to the penalty (``1 / penalty`` times
  the noise), right for ``fit`` but not for the miss: at a penalty far below the data's noise to
  signal ratio it made the std many times too wide (issue 37). The miss has its own amplitude
  ``a <= s^2`` (:func:`miss_amplitude`: a moment estimate from the targets' mean square, which does
  not depend on the penalty), stored as ``miss_ratio = a / s^2``. Exact KRR has no miss;
* ``std`` is the standard deviation of the latent function ``f(x)`` (plus the
  intercept), ``sqrt(a miss(x) + s^2 fit(x))`` (``sqrt(s^2 v(x))`` for exact KRR and models
  saved before the split), as scikit-learn's ``return_std``; a new observation ``y`` at ``x``
  has variance ``std^2 + s^2 lambda n``.

``d_eff`` and ``RSS`` come from what the posterior already has: with the factor ``R``
below, ``d_eff = tr(G (G + sigma^2 I)^{-1}) = M - ||R^{-1}||_F^2``, and
``RSS = ||y||^2 - 2 (K_MN y) . alpha + alpha^T G alpha`` with the Gram matrix ``G`` (centred
for an intercept) the posterior accumulates; exact KRR has ``y - K c = sigma^2 c`` and
``d_eff = n - sigma^2 ||R^{-1}||_F^2``.

Numerically the variance is kept in the stable form of sparse GP codes: with an
upper factor ``T`` of ``D K_MM D`` (FALKON's preconditioner factor, ``D`` the
centers' weights, any positive diagonal works) and ``c(x) = T^{-T} D k_M(x)``,

    v(x) = k(x, x) - ||c(x)||^2 + ||R^{-T} (c(x) - m)||^2 + offset,
    R^T R = I + T^{-T} D G_c D T^{-1} / sigma^2,    m = T^{-T} D mu,

and the Gram matrix enters only preconditioned (``T^{-T} D G D T^{-1}``), as the
gram strategy accumulates it. Exact KRR is the case ``T^T T = K + sigma^2 I``
without the last term.

The fast variance (``std_method="auto"`` or ``"fast"``, :class:`LowRankVariance`) replaces the two
``M x M`` solves per row by one ``M x r`` product. Written in ``c``,
``v = k(x, x) - c^T Q c - 2 (P m)^T c + m^T P m + offset`` with ``P = (R^T R)^{-1}`` and the PSD
``Q = I - P``. ``Q`` is truncated in the metric of the training rows: with
``S = E[c c^T] = T^{-T} D K_MN K_NM D T^{-1} / n = L L^T`` and ``H = L^T Q L = V Lambda V^T``,
``Q_r = Y Y^T``, ``Y = Q L V_r Lambda_r^{-1/2}`` (the top ``r`` eigenpairs; ``Q^{1/2} L V_r Lambda_r^{-1/2}``
has orthonormal columns, so ``Q - Q_r`` is PSD, whether or not ``L`` is invertible). Hence

* the fast variance is never below the exact one: ``v_r(x) - v(x) = c^T (Q - Q_r) c >= 0`` (conservative);
* over rows drawn like the training rows the mean of that difference is
  ``tr((Q - Q_r) S) = sum_{i > r} lambda_i(H)`` exactly (the ``bound``, known at fit time);
* the mean exact variance over the training rows is ``E[k(x, x)] - tr(Q S) - m^T P m + offset``
  (``E[c] = m`` with an intercept), so ``r`` is the smallest rank whose ``bound`` is at most
  :data:`FAST_STD_RTOL` of it.

``c^T Y = k^T D T^{-1} Y``, so the stored factor is ``W = D T^{-1} Y`` (``M x r``) and the fast variance
costs ``2 M r`` flops per row on the kernel row the mean needs anyway.

With the miss's own amplitude the unit variance is ``v_rho = rho miss + fit`` (``rho`` the largest
``miss_ratio``), ``rho k(x, x) - c^T A c - 2 (P m)^T c + m^T P m + offset`` with ``A = rho I - P``; ``Q`` above
is the case ``rho = 1`` (``A`` PSD, truncated as ``Q`` was). For ``rho < 1`` (a penalty below the data's
ratio) ``A = A_+ - N N^T``, ``N`` from the eigenvectors of ``P`` with eigenvalues above
``rho`` (directions the data hardly determines); ``A_+`` is truncated and ``N`` kept whole, so the three
statements above hold with ``A_+`` for ``Q`` and the rank counts ``N``'s columns too.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import scipy.linalg as sla

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.kernels.reference import DEFAULT_TILE_BYTES
from daskkrr.solvers.tiled_factor import TileFile
from daskkrr.utils.linalg import JitterWarning, cholesky_jitter, solve_upper

#: Prior variances are kept at least this fraction of the targets' mean square (a perfect fit
#: would otherwise give a zero prior variance, hence zero std everywhere).
MIN_PRIOR_VARIANCE_RATIO = 1e-12


#: The fast variance's rank is the smallest whose mean error over rows drawn like the training rows
#: (its ``bound``) is at most this fraction of their mean exact variance: the fast std is then
#: on average at most about 2.5% wider than the exact one (``sqrt(1.05) = 1.025``).
FAST_STD_RTOL = 0.05


def fast_rank_cap(n_features: int) -> int:
    """The largest rank ``std_method="auto"`` uses: the fast variance then costs at most about 3x ``predict``.

    ``predict`` costs a kernel row per query row, about ``M (2 d + 20)`` flops (the distances and the
    exponential, about 20 flops' worth); ``return_std`` builds that row as a block (about twice
    ``predict``'s time with the BLAS engine) and adds ``2 M r`` flops of matrix product, which BLAS runs
    a few times faster per flop. Measured (AMD EPYC, 2 shared cores, M = 2000, d = 10, 20 000 rows):
    the product took 0.4-0.9 times ``predict`` at r = 100, 1.2-1.4 at r = 200, so ``4 (d + 10)``
    keeps the total near 3x.
    """
    return 4 * (int(n_features) + 10)


#: Prefix of the fast variance's arrays among the posterior's.
LOW_RANK_PREFIX = "low_rank_"


@dataclasses.dataclass
class LowRankVariance:
    """The fast variance: ``v_r(x) = k(x, x) - ||W^T k||^2 - 2 a . k + constant``, ``k = k(x, Z)``.

    ``v_r(x) >= v(x)`` at every ``x`` (conservative), and over rows drawn like the training rows
    ``E[v_r - v] = bound`` (see the module docstring for the derivation).

    Attributes
    ----------
    factor : ndarray of shape (M, r)
        ``W = D T^{-1} Y`` (``Y Y^T`` the rank-``r`` truncation of ``Q`` in the training rows' metric).
    linear : ndarray of shape (M,)
        ``a = D T^{-1} P m`` (zeros without an intercept).
    constant : float
        ``m^T P m + offset``.
    bound : float
        The mean of ``v_r - v`` over rows drawn like the training rows, ``sum_{i > r} lambda_i(H)``,
        for unit prior variance (times ``prior_variance`` in squared units of ``y``).
    mean_variance : float
        The mean exact ``v`` over the training rows (unit prior variance).
    """

    factor: np.ndarray
    linear: np.ndarray
    constant: float
    bound: float
    mean_variance: float
    negative: np.ndarray | None = None
    miss_ratio: float = 1.0

    @property
    def rank(self) -> int:
        """Columns of ``factor`` and ``negative`` together: ``2 M rank`` flops per row."""
        return int(self.factor.shape[1]) + (0 if self.negative is None else int(self.negative.shape[1]))

    def unit_variance(self, Kxm: np.ndarray, kxx: np.ndarray) -> np.ndarray:
        """``v_r(x)`` for kernel rows ``Kxm = k(X, Z)`` (n_b, M) and ``kxx = k(x, x)``; clipped at 0."""
        K = np.asarray(Kxm, dtype=np.float64)
        U = K @ self.factor
        v = (self.miss_ratio * np.asarray(kxx, dtype=np.float64) - np.einsum("ij,ij->i", U, U)
             - 2 * (K @ self.linear) + self.constant)
        if self.negative is not None and self.negative.shape[1]:
            N = K @ self.negative
            v += np.einsum("ij,ij->i", N, N)
        return np.maximum(v, 0.0)

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"factor": self.factor, "linear": self.linear,
                  "numbers": np.array([self.constant, self.bound, self.mean_variance, self.miss_ratio])}
        if self.negative is not None:
            arrays["negative"] = self.negative
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], n_centers: int) -> LowRankVariance:
        """Inverse of :meth:`to_arrays`; ValueError when the shapes do not fit ``n_centers``."""
        factor = np.asarray(arrays["factor"], dtype=np.float64)
        linear = np.asarray(arrays["linear"], dtype=np.float64)
        numbers = np.asarray(arrays["numbers"], dtype=np.float64).reshape(-1)
        # files written before the centers' miss had its own amplitude have 3 numbers and no negative part
        negative = arrays.get("negative")
        negative = None if negative is None else np.asarray(negative, dtype=np.float64)
        if (factor.ndim != 2 or factor.shape[0] != n_centers or factor.shape[1] > n_centers
                or linear.shape != (n_centers,) or numbers.size not in (3, 4)
                or (negative is not None and (negative.ndim != 2 or negative.shape[0] != n_centers))):
            raise ValueError(f"the fast variance's arrays (factor {factor.shape}, linear {linear.shape}, "
                             f"{numbers.size} numbers) do not fit {n_centers} centers")
        return cls(factor=factor, linear=linear, constant=float(numbers[0]), bound=float(numbers[1]),
                   mean_variance=float(numbers[2]), negative=negative,
                   miss_ratio=float(numbers[3]) if numbers.size > 3 else 1.0)


@dataclasses.dataclass
class PosteriorVariance:
    """What the predictive standard deviation needs: two triangular factors and a few numbers.

    ``v(x) = k(x, x) - ||c||^2 + ||correction^{-T} (c - shift)||^2 + offset`` with
    ``c = factor^{-T} (scale * k(x, Z))``, and ``std_t(x) = sqrt(prior_variance_t v(x))``
    (see the module docstring for where each comes from).

    Attributes
    ----------
    factor : ndarray of shape (M, M) or TileFile
        Upper-triangular ``T``; a :class:`~daskkrr.solvers.tiled_factor.TileFile` (tiles in a Zarr array, solved
        tile by tile) for a model fitted on the tiled preconditioner route.
    scale : ndarray of shape (M,)
        Positive diagonal ``D`` applied to the kernel row before the solve.
    correction : ndarray of shape (M, M), TileFile or None
        Upper-triangular ``R`` of the Nystrom correction (tiled as ``factor`` is); None for exact KRR.
    shift : ndarray of shape (M,)
        ``m = T^{-T} D mu`` for a fitted intercept, else zeros.
    offset : float
        The intercept's variance (``lambda`` = ``sigma^2 / n``), else 0.
    prior_variance : ndarray of shape (n_targets,)
        ``s^2`` per target, in squared units of ``y``: the calibrated amplitude
        ``residual noise variance / noise_ratio`` (what ``return_std`` uses).
    noise_ratio : float
        ``sigma^2 / s^2 = penalty * n``.
    likelihood_prior_variance : ndarray of shape (n_targets,) or None
        The maximum-likelihood ``s^2`` given ``noise_ratio`` (the amplitude of models
        saved before the calibration, which then had it as ``prior_variance``).
    effective_dof : float
        ``d_eff``, the trace of the hat matrix (NaN for models saved before it).
    low_rank : LowRankVariance or None
        The fast variance, used by ``return_std`` unless ``std_method="exact"``; None when the
        model was fitted with ``std_method="exact"``, when ``"auto"`` found it needs more than
        :func:`fast_rank_cap` of rank, for exact KRR, and in models saved before it.
    miss_ratio : ndarray of shape (n_targets,) or None
        ``rho = a / s^2 <= 1`` per target: the amplitude ``a`` of the centers' miss
        ``k(x, x) - k_M^T K_MM^{-1} k_M`` (see :func:`miss_amplitude`) over ``prior_variance``.
        None (exact KRR, models saved before it): ``rho = 1``, one amplitude.
    storage : object or None
        What keeps the tiled factors' files (a temporary folder of the fit) alive; None otherwise.
    """

    factor: np.ndarray | TileFile
    scale: np.ndarray
    correction: np.ndarray | TileFile | None
    shift: np.ndarray
    offset: float
    prior_variance: np.ndarray
    noise_ratio: float
    likelihood_prior_variance: np.ndarray | None = None
    effective_dof: float = float("nan")
    low_rank: LowRankVariance | None = None
    miss_ratio: np.ndarray | None = None
    storage: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def n_centers(self) -> int:
        return int(self.factor.shape[0])

    @property
    def tiled(self) -> bool:
        """Whether the factors are tiles in Zarr arrays (a model fitted on the tiled preconditioner route)."""
        return isinstance(self.factor, TileFile)

    @property
    def noise_variance(self) -> np.ndarray:
        """The GP's noise variance per target, ``s^2 * penalty * n`` (squared units of ``y``): the
        residual estimate ``RSS / (n - d_eff)`` (see the module docstring)."""
        return self.prior_variance * self.noise_ratio

    @property
    def _rho(self) -> np.ndarray:
        return np.ones_like(self.prior_variance) if self.miss_ratio is None else self.miss_ratio

    @property
    def fast_variance_bound(self) -> np.ndarray | None:
        """Per target, in squared units of ``y``: the mean amount by which the fast variance exceeds the
        exact one over rows drawn like the training rows (never below it); None without a fast variance."""
        return None if self.low_rank is None else self.low_rank.bound * self.prior_variance

    def variance_parts(self, Kxm: np.ndarray, kxx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two terms of the exact ``v(x) = miss + fit`` for kernel rows ``Kxm = k(X, Z)`` (n_b, M) and
        ``kxx = k(x, x)`` (n_b,): the centers' miss ``k(x, x) - ||c||^2`` and the rest (the posterior
        variance of the part the centers span, with the intercept's); exact KRR has the whole ``v`` in ``fit``.
        """
        K = np.asarray(Kxm, dtype=np.float64)
        C = _solve_transposed(self.factor, self.scale[:, None] * K.T)  # (M, n_b)
        if self.correction is None:  # exact KRR: T^T T = K + sigma^2 I, no miss
            return np.zeros(K.shape[0]), np.asarray(kxx, dtype=np.float64) - np.einsum("ij,ij->j", C, C)
        miss = np.asarray(kxx, dtype=np.float64) - np.einsum("ij,ij->j", C, C)
        C -= self.shift[:, None]
        E = _solve_transposed(self.correction, C)
        return miss, np.einsum("ij,ij->j", E, E) + self.offset

    def unit_variance(self, Kxm: np.ndarray, kxx: np.ndarray, exact: bool = False) -> np.ndarray:
        """``v_rho(x) = rho miss + fit`` (see :meth:`variance_parts`), ``rho`` the largest ``miss_ratio``;
        clipped at 0.

        The fast variance (:class:`LowRankVariance`, never below ``v_rho``) when there is one and not ``exact``.
        """
        if self.low_rank is not None and not exact:
            return self.low_rank.unit_variance(Kxm, kxx)
        miss, fit = self.variance_parts(Kxm, kxx)
        return np.maximum(float(np.max(self._rho)) * miss + fit, 0.0)

    def std(self, Kxm: np.ndarray, kxx: np.ndarray, exact: bool = False) -> np.ndarray:
        """Standard deviation per row and target, ``(n_b, n_targets)``: ``sqrt(a_t miss + s_t^2 fit)``.

        The fast variance is built for the largest ``rho``, so for a target with a smaller one it is
        wider than its exact std (still never below it).
        """
        if self.low_rank is not None and not exact:
            return np.sqrt(self.low_rank.unit_variance(Kxm, kxx)[:, None] * self.prior_variance[None, :])
        miss, fit = self.variance_parts(Kxm, kxx)
        v = np.maximum(miss[:, None] * self._rho[None, :] + fit[:, None], 0.0)
        return np.sqrt(v * self.prior_variance[None, :])

    # ------------------------------------------------------------------ persistence
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Numeric arrays for a model file (no pickle): factor, scale, correction, shift, numbers; without the
        factors when they are tiled (:attr:`tiled`: the model file keeps their tiles in a Zarr store)."""
        arrays: dict[str, np.ndarray] = {
            "scale": self.scale, "shift": self.shift,
            "prior_variance": self.prior_variance,
            "numbers": np.array([self.offset, self.noise_ratio, self.effective_dof]),
        }
        if self.miss_ratio is not None:
            arrays["miss_ratio"] = self.miss_ratio
        if self.likelihood_prior_variance is not None:
            arrays["likelihood_prior_variance"] = self.likelihood_prior_variance
        if not self.tiled:
            arrays["factor"] = np.asarray(self.factor)
            if self.correction is not None:
                arrays["correction"] = np.asarray(self.correction)
        if self.low_rank is not None:
            arrays.update({LOW_RANK_PREFIX + k: v for k, v in self.low_rank.to_arrays().items()})
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray],
                    tiles: tuple[TileFile, TileFile] | None = None) -> PosteriorVariance:
        """Inverse of :meth:`to_arrays`, with ``tiles`` (``T`` and ``R``) for a tiled posterior (whose arrays then
        hold neither factor nor a fast variance); ValueError when the shapes do not fit together."""
        square = sorted(k for k in ("factor", "correction") if k in arrays)
        if tiles is not None and (square or any(k.startswith(LOW_RANK_PREFIX) for k in arrays)):
            raise ValueError(f"a tiled posterior keeps its factors in tiles and has no fast variance, but the "
                             f"arrays hold {square or 'the fast variance'}")
        factor: np.ndarray | TileFile
        correction: Any
        if tiles is None:
            factor = np.asarray(arrays["factor"], dtype=np.float64)
            correction = arrays.get("correction")
            correction = None if correction is None else np.asarray(correction, dtype=np.float64)
        else:
            factor, correction = tiles
        M = factor.shape[0] if len(factor.shape) == 2 else -1
        numbers = np.asarray(arrays["numbers"], dtype=np.float64).reshape(-1)
        prior = np.asarray(arrays["prior_variance"], dtype=np.float64).reshape(-1)
        # Files written before the calibration hold the maximum-likelihood amplitude as prior_variance.
        likelihood = np.asarray(arrays.get("likelihood_prior_variance", prior), dtype=np.float64).reshape(-1)
        post = cls(
            factor=factor, scale=np.asarray(arrays["scale"], dtype=np.float64), correction=correction,
            shift=np.asarray(arrays["shift"], dtype=np.float64), offset=float(numbers[0]),
            prior_variance=prior,
            noise_ratio=float(numbers[1]) if numbers.size > 1 else float("nan"),
            likelihood_prior_variance=likelihood,
            effective_dof=float(numbers[2]) if numbers.size > 2 else float("nan"),
            # files written before the centers' miss had its own amplitude have one amplitude
            miss_ratio=None if "miss_ratio" not in arrays else np.asarray(arrays["miss_ratio"], np.float64).reshape(-1),
        )
        square_shape = (M, M)
        if (factor.shape != square_shape or post.scale.shape != (M,) or post.shift.shape != (M,)
                or (post.correction is not None and post.correction.shape != square_shape)
                or numbers.size not in (2, 3) or likelihood.shape != prior.shape
                or (post.miss_ratio is not None and post.miss_ratio.shape != prior.shape)):
            raise ValueError(f"the posterior arrays do not fit together (factor of shape {factor.shape})")
        low_rank = {k[len(LOW_RANK_PREFIX):]: v for k, v in arrays.items() if k.startswith(LOW_RANK_PREFIX)}
        if low_rank:  # files written before the fast variance, or fitted with std_method="exact", have none
            post.low_rank = LowRankVariance.from_arrays(low_rank, M)
        return post


# --------------------------------------------------------------------------- building it
def prior_variance(y_sq: np.ndarray, knm_t_y: np.ndarray, coef: np.ndarray, noise_ratio: float,
                   n: int) -> np.ndarray:
    """Maximum-likelihood ``s^2`` per target: ``y^T (Q + sigma^2 I)^{-1} y / n``.

    For the (Nystrom) KRR solution ``alpha`` of ``(K_MN K_NM + sigma^2 K_MM) alpha = K_MN y``,
    ``y^T (Q + sigma^2 I)^{-1} y = (||y||^2 - (K_MN y) . alpha) / sigma^2`` (Woodbury), so it
    needs the targets' squared norms ``y_sq``, the right-hand side and the coefficients
    only. With an intercept ``y`` is centred (the constant is profiled out).
    """
    b = np.asarray(knm_t_y, dtype=np.float64).reshape(np.shape(knm_t_y)[0], -1)
    a = np.asarray(coef, dtype=np.float64).reshape(b.shape)
    y_sq = np.asarray(y_sq, dtype=np.float64).reshape(-1)
    quad = y_sq - np.einsum("ij,ij->j", b, a)
    return _at_least(quad / (noise_ratio * n), y_sq, n)


def nystrom_posterior(
    T: np.ndarray,
    d: np.ndarray,
    gram_pre: np.ndarray,
    *,
    noise_ratio: float,
    n: int,
    mu: np.ndarray | None,
    y_sq: np.ndarray,
    knm_t_y: np.ndarray,
    coef: np.ndarray,
    mean_kxx: float | None = None,
) -> PosteriorVariance:
    """The posterior of a Nystrom model from FALKON's factor and the preconditioned Gram matrix.

    Parameters
    ----------
    T, d : ndarray of shape (M, M) and (M,)
        Upper ``T`` with ``T^T T = D K_MM D`` (plus round-off jitter), ``D = diag(d)``.
    gram_pre : ndarray of shape (M, M)
        ``T^{-T} D K_MN K_NM D T^{-1}`` (not centred).
    noise_ratio : float
        ``sigma^2 = penalty * n``.
    n : int
        Training rows.
    mu : ndarray of shape (M,) or None
        ``K_MN 1 / n`` when an intercept was fitted.
    y_sq, knm_t_y, coef
        ``||y||^2`` per target, ``K_MN y`` and the coefficients, with ``y`` as the
        solver saw it (centred when the targets were centred); see :func:`prior_variance`.
    mean_kxx : float or None, default=None
        The mean of ``k(x, x)`` over the training rows: the centers' miss then gets its own amplitude
        (:func:`miss_amplitude`); None keeps one amplitude for the whole variance.
    """
    M = T.shape[0]
    shift = np.zeros(M) if mu is None else solve_upper(T, d * np.asarray(mu, dtype=np.float64), trans=True)
    inner = np.array(gram_pre, dtype=np.float64, order="F")  # a copy: the caller's matrix is kept
    if mu is not None:
        inner -= n * np.outer(shift, shift)
    inner /= noise_ratio
    inner = (inner + inner.T) / 2  # the accumulated Gram matrix is symmetric up to round-off
    inner[np.diag_indices(M)] += 1.0
    R, _ = cholesky_jitter(inner, what=POSTERIOR_MATRIX, overwrite=True)
    return assemble_nystrom_posterior(
        np.asarray(T, dtype=np.float64), d, R, shift, noise_ratio=noise_ratio, n=n, intercept=mu is not None,
        inverse_square_norm=_inverse_square_norm(R),
        rss=nystrom_rss(T, d, gram_pre, shift, n=n, y_sq=y_sq, knm_t_y=knm_t_y, coef=coef),
        y_sq=y_sq, knm_t_y=knm_t_y, coef=coef,
        gram_trace=None if mean_kxx is None else float(np.trace(gram_pre)),
    )


#: The name of ``I + G / sigma^2`` in the jitter's warnings and errors.
POSTERIOR_MATRIX = "posterior matrix I + G / (penalty n)"


def assemble_nystrom_posterior(
    T: np.ndarray | TileFile,
    d: np.ndarray,
    R: np.ndarray | TileFile,
    shift: np.ndarray,
    *,
    noise_ratio: float,
    n: int,
    intercept: bool,
    inverse_square_norm: float,
    rss: np.ndarray,
    y_sq: np.ndarray,
    knm_t_y: np.ndarray,
    coef: np.ndarray,
    gram_trace: float | None,
    storage: Any = None,
) -> PosteriorVariance:
    """The Nystrom posterior from its factors and the few numbers computed from them, dense or tiled.

    Parameters
    ----------
    T, d, R : factors
        ``T`` and ``R`` (upper, ``M x M``: arrays, or tiles for the tiled route) and ``D = diag(d)``.
    shift : ndarray of shape (M,)
        ``m = T^{-T} D mu`` (zeros without an intercept).
    noise_ratio : float
        ``sigma^2 = penalty * n``.
    n : int
        Training rows.
    intercept : bool
        Whether an intercept was fitted.
    inverse_square_norm : float
        ``||R^{-1}||_F^2``: ``d_eff = M - ||R^{-1}||_F^2`` (one more for the intercept).
    rss : ndarray of shape (n_targets,)
        The training residual sum of squares (:func:`nystrom_rss`).
    y_sq, knm_t_y, coef
        As for :func:`nystrom_posterior`.
    gram_trace : float or None
        ``tr(T^{-T} D K_MN K_NM D T^{-1})``: the centers' miss then gets its own amplitude; None keeps one.
    storage : object, optional
        What keeps tiled factors' files alive (the posterior's ``storage``).

    Returns
    -------
    PosteriorVariance
    """
    M = T.shape[0]
    # d_eff = tr(G (G + sigma^2 I)^{-1}) = M - tr((I + G / sigma^2)^{-1}), one more for the intercept
    dof = M - inverse_square_norm + (1.0 if intercept else 0.0)
    post = _calibrated(
        PosteriorVariance(
            factor=T, scale=np.asarray(d, dtype=np.float64), correction=R,
            shift=shift, offset=noise_ratio / n if intercept else 0.0,
            prior_variance=prior_variance(y_sq, knm_t_y, coef, noise_ratio, n), noise_ratio=float(noise_ratio),
            storage=storage,
        ),
        rss, dof, y_sq, n,
    )
    if gram_trace is None:
        return post
    # E||c||^2 over the training rows, c = T^{-T} D k_M(x): the mean of the Nystrom k_M^T K_MM^{-1} k_M
    amplitude = miss_amplitude(post.noise_variance, np.asarray(y_sq, dtype=np.float64).reshape(-1) / n,
                               gram_trace / n - float(shift @ shift), post.prior_variance)
    return dataclasses.replace(post, miss_ratio=amplitude / post.prior_variance)


def miss_amplitude(noise_variance: np.ndarray, mean_square: np.ndarray, mean_spanned: float,
                   prior_variance: np.ndarray) -> np.ndarray:
    """The amplitude ``a`` of the centers' miss ``k(x, x) - k_M^T K_MM^{-1} k_M``: ``min(a_moments, s^2)``.

    Under the prior ``f ~ GP(0, a k)`` with noise ``sigma_n^2`` the targets' mean square is
    ``E[||y||^2 / n] = a E[k(x, x)] + sigma_n^2``. The Nystrom fit sees the part the centers span,
    ``a E[k_M^T K_MM^{-1} k_M]`` (``mean_spanned``, less the spatial mean's share ``mu^T K_MM^{-1} mu`` when
    ``y`` was centred for an intercept); with the noise estimate ``RSS / (n - d_eff)`` (which holds the
    miss at the training rows too) this gives the moment estimate
    ``a_moments = (||y||^2 / n - noise) / mean_spanned`` (at least 0), which does not depend on the penalty.

    ``s^2 = noise / (penalty n)`` estimates the same amplitude when the penalty is the data's noise to
    signal ratio, and grows as ``1 / penalty`` below it: the smaller of the two keeps the std as it was
    at and above that penalty, and stops the miss's ``1 / penalty`` growth below it. (Taking the miss's
    share ``a r_bar`` out of the noise as well would centre the intervals on 564_fried, but on inputs with
    heavy tails, where a few rows hold most of the miss, it left nearly no noise for the others.)
    """
    noise = np.asarray(noise_variance, dtype=np.float64)
    a = np.maximum(np.asarray(mean_square, dtype=np.float64) - noise, 0.0) / max(mean_spanned, np.finfo(float).tiny)
    return np.minimum(a, np.asarray(prior_variance, dtype=np.float64))


def low_rank_variance(post: PosteriorVariance, *, n: int, mean_kxx: float, rtol: float = FAST_STD_RTOL,
                      max_rank: int | None = None) -> tuple[LowRankVariance | None, int]:
    """The fast variance of a Nystrom posterior and the rank it needs (see the module docstring).

    Parameters
    ----------
    post : PosteriorVariance
        A Nystrom posterior (with its ``correction``); its Gram matrix ``S`` is recovered from
        ``R^T R = I + (n S - n m m^T) / sigma^2``.
    n : int
        Training rows.
    mean_kxx : float
        The mean of ``k(x, x)`` over the training rows.
    rtol : float, default=FAST_STD_RTOL
        The largest ``bound / mean exact variance``.
    max_rank : int or None, default=None
        None (or more rank needed than this) gives ``(None, rank needed)``.

    Returns
    -------
    low_rank : LowRankVariance or None
        The factor, or None when the rank it needs exceeds ``max_rank``.
    rank : int
        The smallest rank meeting ``rtol``.
    """
    if not isinstance(post.factor, np.ndarray):  # tiled
        raise ValueError(f"the fast variance needs the {post.n_centers} x {post.n_centers} factors whole (an "
                         "eigenproblem of that size); a tiled posterior has the exact variance only")
    T = post.factor
    R = np.asarray(post.correction, dtype=np.float64)
    M, sigma2, m = R.shape[0], post.noise_ratio, post.shift
    rho = 1.0 if post.miss_ratio is None else float(np.max(post.miss_ratio))
    Rinv = solve_upper(R, np.eye(M))
    P = Rinv @ Rinv.T  # (R^T R)^{-1}
    S = (sigma2 * (R.T @ R - np.eye(M)) + n * np.outer(m, m)) / n
    S = (S + S.T) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JitterWarning)  # a jitter makes the bound larger, never wrong
        L = cholesky_jitter(S, what="Gram matrix of the fast variance", max_jitter_ratio=1.0)[0].T  # L L^T = S
    positive, negative = _split_quadratic_form(rho, P, Rinv)
    AL = positive(L)
    H = L.T @ AL  # L^T A_+ L
    H = (H + H.T) / 2
    lam = np.maximum(np.linalg.eigvalsh(H)[::-1], 0.0)  # descending; negative ones are round-off
    Pm = P @ m
    constant = float(m @ Pm) + post.offset
    trace_s = float(np.trace(S))
    mean_variance = float(rho * mean_kxx - (rho * trace_s - np.einsum("ij,ji->", P, S)) - m @ Pm + post.offset)
    tails = np.append(np.cumsum(lam[::-1])[::-1], 0.0)  # tails[r] = sum_{i >= r} lambda_i (0-based)
    rank = int(np.argmax(tails <= rtol * max(mean_variance, 0.0)))  # tails[M] = 0 always qualifies
    if max_rank is not None and rank + negative.shape[1] > max_rank:
        return None, rank + negative.shape[1]
    if rank:
        top, V = sla.eigh(H, subset_by_index=[M - rank, M - 1])
        keep = top > 0
        Y = (AL @ V[:, keep]) / np.sqrt(top[keep])  # A_+ L V Lambda^{-1/2}
    else:
        Y = np.zeros((M, 0))
    scale = post.scale[:, None]
    factor = scale * solve_upper(T, Y)  # D T^{-1} Y
    linear = post.scale * solve_upper(T, Pm)
    return LowRankVariance(
        factor=factor, linear=linear, constant=constant, bound=float(tails[rank]), mean_variance=mean_variance,
        negative=scale * solve_upper(T, negative) if negative.shape[1] else None, miss_ratio=rho,
    ), rank + negative.shape[1]


def _split_quadratic_form(rho: float, P: np.ndarray, Rinv: np.ndarray) -> tuple[Any, np.ndarray]:
    """``A = rho I - P = A_+ - N N^T``: the product ``X -> A_+ X`` and the factor ``N`` of the negative part.

    ``P = (R^T R)^{-1}`` has eigenvalues in ``(0, 1]``: for ``rho >= 1``, ``A = (rho - 1) I + Q`` is PSD
    (``Q = I - P``, applied as ``X - R^{-1} (R^{-T} X)``) and ``N`` has no column; for ``rho < 1`` the
    eigenvectors of ``P`` with eigenvalue ``p > rho`` make ``N`` (columns ``u sqrt(p - rho)``), kept
    whole so that truncating ``A_+`` alone keeps the fast variance above the exact one.
    """
    M = P.shape[0]
    if rho >= 1.0:
        return (lambda X: rho * X - Rinv @ (Rinv.T @ X)), np.zeros((M, 0))
    p, U = np.linalg.eigh((P + P.T) / 2)
    A_plus = (U * np.maximum(rho - p, 0.0)) @ U.T
    over = p > rho
    return (lambda X: A_plus @ X), U[:, over] * np.sqrt(p[over] - rho)


def nystrom_rss(T: np.ndarray, d: np.ndarray, gram_pre: np.ndarray, shift: np.ndarray, *, n: int,
                y_sq: np.ndarray, knm_t_y: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """The training residual sum of squares per target, without a pass over the data.

    ``||y - K_nM alpha||^2 = ||y||^2 - 2 (K_MN y) . alpha + alpha^T K_MN K_NM alpha``, with
    ``alpha^T K_MN K_NM alpha = u^T gram_pre u``, ``u = T D^{-1} alpha``; with an intercept
    (``shift`` nonzero, ``y`` centred) the fitted constant removes ``n (mu . alpha)^2 = n (shift . u)^2``.
    Clipped at 0 (round-off when the fit is nearly exact).
    """
    a = np.asarray(coef, dtype=np.float64).reshape(np.shape(knm_t_y)[0], -1)
    u = np.asarray(T, dtype=np.float64) @ (a / np.asarray(d, dtype=np.float64)[:, None])
    return rss_from_gram_product(u, np.asarray(gram_pre, dtype=np.float64) @ u, shift, n=n, y_sq=y_sq,
                                 knm_t_y=knm_t_y, coef=coef)


def rss_from_gram_product(u: np.ndarray, gram_u: np.ndarray, shift: np.ndarray, *, n: int, y_sq: np.ndarray,
                          knm_t_y: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """:func:`nystrom_rss` from ``u = T D^{-1} alpha`` (``(M, t)``) and ``gram_pre u``, however they were computed
    (the tiled route applies ``T`` and the Gram matrix tile by tile)."""
    b = np.asarray(knm_t_y, dtype=np.float64).reshape(np.shape(knm_t_y)[0], -1)
    a = np.asarray(coef, dtype=np.float64).reshape(b.shape)
    fitted_sq = np.einsum("ij,ij->j", u, gram_u) - n * (shift @ u) ** 2
    y_sq = np.asarray(y_sq, dtype=np.float64).reshape(-1)
    return np.maximum(y_sq - 2 * np.einsum("ij,ij->j", b, a) + fitted_sq, 0.0)


#: Fewer residual degrees of freedom than this make the noise estimate warn: its relative
#: standard deviation, ``sqrt(2 / (n - d_eff))`` for Gaussian noise, is then above 45%.
MIN_RESIDUAL_DOF = 10.0


def residual_noise_variance(rss: np.ndarray, n: int, dof: float) -> np.ndarray:
    """``RSS / (n - d_eff)``, the noise variance estimate of a linear smoother (ridge, splines, GP).

    The denominator is kept at least 1: a model that interpolates its training data
    (``d_eff`` close to ``n``) leaves no residual degrees of freedom to estimate from,
    and a UserWarning says so below :data:`MIN_RESIDUAL_DOF`.
    """
    residual_dof = float(n) - float(dof)
    if residual_dof < MIN_RESIDUAL_DOF:
        warnings.warn(
            f"compute_std: the fit nearly interpolates its {n} training rows (effective degrees of freedom "
            f"{dof:.1f}), so the noise variance estimate RSS / (n - d_eff) behind return_std rests on "
            f"{max(residual_dof, 0.0):.1f} residual degrees of freedom and is unreliable; raise penalty or "
            f"sigma, or use fewer centers", UserWarning, stacklevel=2)
    return np.asarray(rss, dtype=np.float64) / max(residual_dof, 1.0)


def _solve_transposed(F: np.ndarray | TileFile | None, B: np.ndarray) -> np.ndarray:
    """``F^{-T} B`` for an upper-triangular factor held whole or in tiles (read one at a time)."""
    if F is None:
        raise ValueError("the posterior has no such factor")
    if isinstance(F, TileFile):
        return F.solve(B, trans=True)
    return solve_upper(F, B, trans=True)


def _inverse_square_norm(R: np.ndarray) -> float:
    """``||R^{-1}||_F^2 = tr((R^T R)^{-1})`` for an upper-triangular ``R`` (one triangular inverse)."""
    Rinv = solve_upper(np.asarray(R, dtype=np.float64), np.eye(R.shape[0]))
    return float(np.einsum("ij,ij->", Rinv, Rinv))


def _calibrated(post: PosteriorVariance, rss: np.ndarray, dof: float, y_sq: np.ndarray, n: int) -> PosteriorVariance:
    """``post`` with ``s^2 = RSS / (n - d_eff) / noise_ratio`` and the maximum-likelihood ``s^2`` kept aside."""
    noise = residual_noise_variance(rss, n, dof)
    return dataclasses.replace(
        post, likelihood_prior_variance=post.prior_variance, effective_dof=float(dof),
        prior_variance=_at_least(noise / post.noise_ratio, np.asarray(y_sq, dtype=np.float64).reshape(-1), n),
    )


def exact_posterior(R: np.ndarray, y: np.ndarray, coef: np.ndarray, noise_ratio: float) -> PosteriorVariance:
    """The exact GP's posterior from ``R^T R = K + sigma^2 I`` (exact KRR's factor) and its solution."""
    n = R.shape[0]
    Y = np.asarray(y, dtype=np.float64).reshape(n, -1)
    c = np.asarray(coef, dtype=np.float64).reshape(Y.shape)
    # s^2 = y^T (K + sigma^2 I)^{-1} y / n = y . c / n
    y_sq = np.einsum("ij,ij->j", Y, Y)
    s2 = _at_least(np.einsum("ij,ij->j", Y, c) / n, y_sq, n)
    # y - K c = sigma^2 c; d_eff = tr(K (K + sigma^2 I)^{-1}) = n - sigma^2 tr((K + sigma^2 I)^{-1})
    rss = noise_ratio**2 * np.einsum("ij,ij->j", c, c)
    dof = n - noise_ratio * _inverse_square_norm(R)
    post = PosteriorVariance(
        factor=np.asarray(R, dtype=np.float64), scale=np.ones(n), correction=None, shift=np.zeros(n), offset=0.0,
        prior_variance=s2, noise_ratio=float(noise_ratio),
    )
    return _calibrated(post, rss, dof, y_sq, n)


def _at_least(s2: np.ndarray, y_sq: np.ndarray, n: int) -> np.ndarray:
    """``s2`` floored at :data:`MIN_PRIOR_VARIANCE_RATIO` of the targets' mean square."""
    return np.maximum(s2, MIN_PRIOR_VARIANCE_RATIO * np.maximum(y_sq, np.finfo(np.float64).tiny) / max(n, 1))


# --------------------------------------------------------------------------- per block
#: Query rows per step of ``return_std`` with a tiled posterior: a step reads ``T`` and ``R`` from their Zarr arrays
#: once (``8 M^2`` bytes in float64) and solves ``2 M^2`` flops a row, so 1024 rows make the arithmetic about 250
#: times the bytes read; the step holds two ``M x 1024`` float64 blocks (0.8 GB at M = 50 000).
TILED_STD_ROWS = 1024

def gram_block(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray,
               right: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``[W^T W | K^T Y]`` of one row block, ``W = k(Xb, Z) D T^{-1}``: the posterior's extra pass."""
    return engine_for(kernel).gram_and_rhs(kernel, Xb, Yb, Z, right=right)


def predict_with_std(
    Xb: np.ndarray,
    kernel: Kernel,
    Z: np.ndarray,
    coef: np.ndarray,
    intercept: np.ndarray,
    posterior: PosteriorVariance,
    max_tile_bytes: int = DEFAULT_TILE_BYTES,
    exact: bool = False,
) -> np.ndarray:
    """Mean and standard deviation of one row block, side by side: ``(n_b, 2 t)``.

    Each tile of rows builds ``k(X_t, Z)`` once (the engine's kernel block) for both
    the mean ``k coef + intercept`` and the variance; the exact variance (``exact``, or
    a posterior without a fast one) costs two ``M x M`` triangular solves per row, the
    fast one an ``M x r`` product, against ``M d`` for the mean. A tiled posterior solves
    :data:`TILED_STD_ROWS` rows at a time, reading its factors' tiles once per step.
    """
    C = np.asarray(coef, dtype=np.float64).reshape(Z.shape[0], -1)
    t = C.shape[1]
    out = np.empty((Xb.shape[0], 2 * t))
    step = max(1, int(max_tile_bytes // max(1, Z.shape[0] * 8)))
    if posterior.tiled:  # each step reads both factors' tiles (8 M^2 bytes): enough rows to outweigh the reads
        step = max(step, TILED_STD_ROWS)
    engine = engine_for(kernel)
    for start in range(0, Xb.shape[0], step):
        Xt = Xb[start : start + step]
        K = np.asarray(engine.kernel_block(kernel, Xt, Z), dtype=np.float64)
        out[start : start + Xt.shape[0], :t] = K @ C + intercept
        out[start : start + Xt.shape[0], t:] = posterior.std(K, kernel.diag(Xt), exact)
    return out


def posterior_from_model(model: Any) -> PosteriorVariance:
    """The fitted ``posterior_`` of ``model``; ValueError saying how to get one when it has none."""
    post = getattr(model, "posterior_", None)
    if post is None:
        raise ValueError(
            f"{type(model).__name__} was fitted without compute_std=True, so it has no posterior "
            f"for return_std; fit it with compute_std=True (see the user guide, 'Predictive uncertainty')"
        )
    return post


def noise_variance(posterior: PosteriorVariance | None) -> np.ndarray | None:
    """The fitted ``noise_variance_``: the posterior's residual noise estimate, None without a posterior."""
    return None if posterior is None else posterior.noise_variance


__all__ = [
    "FAST_STD_RTOL",
    "POSTERIOR_MATRIX",
    "LowRankVariance",
    "PosteriorVariance",
    "assemble_nystrom_posterior",
    "exact_posterior",
    "fast_rank_cap",
    "gram_block",
    "low_rank_variance",
    "noise_variance",
    "nystrom_posterior",
    "nystrom_rss",
    "posterior_from_model",
    "predict_with_std",
    "prior_variance",
    "residual_noise_variance",
    "rss_from_gram_product",
]
