"""The posterior stage: what ``predict(X, return_std=True)`` needs, computed at the end of a fit.

Runs after the solve when the estimator has ``compute_std=True`` (see
:mod:`daskkrr.solvers.variance` for the Gaussian-process convention). It needs the
preconditioned Gram matrix ``T^{-T} D K_MN K_NM D T^{-1}``, an ``M x M`` matrix:

- the direct Nystrom solve (``NystromRegressor``) and FALKON with ``strategy="gram"``
  accumulate it in their one Gram pass (see :func:`with_posterior`): no extra pass;
- FALKON with the ``recompute`` or ``cache`` strategy makes one extra pass, which
  costs about as much as ``M / d`` CG iterations (``K^T K`` is ``M^2`` flops per
  row against ``2 M d`` for a kernel product);

plus the targets' squared norms (a pass over ``y`` only), the mean of ``k(x, x)`` over
the training rows (a constant for a stationary kernel, else one pass over ``X``; the
amplitude of the centers' miss needs it) and ``M x M`` factorisations on the client, one
of them the triangular inverse behind the residual noise estimate (``noise_variance_``).

A fit on the tiled preconditioner route (many centers) does all of it with tiles instead
(:mod:`daskkrr.parallel.tiled_posterior`): one extra pass accumulates the Gram matrix as
tiles, and no process holds an ``M x M`` matrix. Its posterior has the exact variance only;
``std_method="auto"`` records why in ``preconditioner_route_`` (``"fast"`` is refused before the fit).

Unless ``std_method="exact"``, it then builds the fast variance
(:func:`~daskkrr.solvers.variance.low_rank_variance`: a few ``M x M`` products and an
eigendecomposition on the client).
"""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.parallel.tiled_falkon import TiledFalkonPreconditioner
from daskkrr.parallel.tiled_posterior import FAST_STD_REFUSED, preconditioned_gram, tiled_nystrom_posterior
from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.stages import Stage, kernel_operator, split_column_sums
from daskkrr.solvers.variance import (
    FAST_STD_RTOL,
    LowRankVariance,
    PosteriorVariance,
    fast_rank_cap,
    gram_block,
    low_rank_variance,
    nystrom_posterior,
)

logger = logging.getLogger("daskkrr")


def _targets_square_norms(ctx: FitContext) -> np.ndarray:
    """``||y_j||^2`` of the targets the solver saw (centred when they were)."""
    (y_sq,) = ctx.executor.compute((ctx.Y * ctx.Y).sum(axis=0))
    return np.asarray(y_sq, dtype=np.float64).reshape(-1)


def _preconditioned_gram_and_rhs(ctx: FitContext) -> tuple[np.ndarray, np.ndarray]:
    """``T^{-T} D K_MN K_NM D T^{-1}`` and ``K_MN [Y | 1]``, from the operator or one extra pass."""
    pre = ctx.preconditioner
    T, d = np.asarray(pre.T, dtype=np.float64), np.asarray(pre.d, dtype=np.float64)
    M = T.shape[0]
    operator = ctx.operator
    if getattr(operator, "gram", None) is not None and getattr(operator, "factor", None) is not None:
        return operator.gram, operator.knm_t_y  # the gram strategy, accumulated preconditioned
    GB = ctx.passes.map_reduce(gram_block, ctx.kernel, ctx.executor.broadcast(ctx.centers),
                               ctx.executor.broadcast((T, d)), name="posterior", with_y=True)
    return np.ascontiguousarray(GB[:, :M]), np.ascontiguousarray(GB[:, M:])


def posterior(ctx: FitContext) -> None:
    """The Nystrom model's posterior (``posterior_``) from the fitted state; see the module docstring."""
    p = ctx.params
    if getattr(ctx, "sample_weight", None) is not None:
        raise ValueError("compute_std=True does not support sample_weight yet; fit without one of them")
    t0 = time.perf_counter()
    fits_intercept = bool(getattr(p, "fit_intercept", False))
    coef = np.asarray(ctx.fitted["coef_"], dtype=np.float64)
    mean_kxx = _mean_prior_variance(ctx)
    method = getattr(p, "std_method", "exact")
    if isinstance(ctx.preconditioner, TiledFalkonPreconditioner):
        ctx.fitted["posterior_"] = _tiled_posterior(ctx, coef, mean_kxx)
        # the fast variance would need an M x M eigenproblem ("fast" was refused before the fit)
        ctx.fitted["preconditioner_route_"] = {**ctx.fitted.get("preconditioner_route_", {}), "std_method": "exact",
                                               "std_reason": FAST_STD_REFUSED}
        if method != "exact":
            logger.info("%s", FAST_STD_REFUSED)
    else:
        gram_pre, knm_t_y = _preconditioned_gram_and_rhs(ctx)
        b, mu = split_column_sums(knm_t_y, ctx.n, fits_intercept)
        ctx.fitted["posterior_"] = nystrom_posterior(
            ctx.preconditioner.T, ctx.preconditioner.d, gram_pre, noise_ratio=float(p.penalty) * ctx.n, n=ctx.n,
            mu=mu, y_sq=_targets_square_norms(ctx), knm_t_y=b, coef=coef.reshape(coef.shape[0], -1),
            mean_kxx=mean_kxx,
        )
        if method != "exact":
            ctx.fitted["posterior_"].low_rank = _fast_variance(ctx, ctx.fitted["posterior_"], method, mean_kxx)
    if ctx.passes is not None:
        ctx.fitted["n_data_passes_"] = ctx.passes.n_passes + 1  # the extra pass, if one was made
    logger.info("posterior for return_std in %.2fs", time.perf_counter() - t0)


def _tiled_posterior(ctx: FitContext, coef: np.ndarray, mean_kxx: float) -> PosteriorVariance:
    """The posterior with the preconditioner's tiled ``T``: the Gram pass and the factors as tiles (see
    :mod:`daskkrr.parallel.tiled_posterior`); the preconditioner's tiles are freed after it."""
    pre, Z = ctx.preconditioner, ctx.centers
    if Z is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    gram, knm_t_y = preconditioned_gram(ctx.passes, ctx.kernel, Z, pre.T, pre.d)
    try:
        b, mu = split_column_sums(knm_t_y, ctx.n, bool(getattr(ctx.params, "fit_intercept", False)))
        return tiled_nystrom_posterior(
            pre.T, pre.d, gram, noise_ratio=float(ctx.params.penalty) * ctx.n, n=ctx.n, mu=mu,
            y_sq=_targets_square_norms(ctx), knm_t_y=b, coef=coef.reshape(coef.shape[0], -1), mean_kxx=mean_kxx,
        )
    finally:
        gram.release()
        pre.close()


def _diag_sum(Xb: np.ndarray, kernel: Kernel) -> np.ndarray:
    return np.array([np.sum(kernel.diag(Xb))])


def _mean_prior_variance(ctx: FitContext) -> float:
    """The mean of ``k(x, x)`` over the training rows: a constant for a stationary kernel, else one pass."""
    if ctx.kernel.is_stationary:
        return float(ctx.kernel.diag(np.asarray(ctx.centers, dtype=np.float64)[:1])[0])
    return float(ctx.passes.map_reduce(_diag_sum, ctx.kernel, name="posteriordiag")[0]) / ctx.n


def _accurate_at_centers(ctx: FitContext, post: PosteriorVariance, low_rank: LowRankVariance) -> bool:
    """Whether the fast variance keeps its promise ``v_r >= v`` at the centers' own kernel rows to within
    :data:`FAST_STD_RTOL` of the mean variance.

    ``W = D T^{-1} Y`` is applied to the kernel row directly (no solve), so where ``T`` is nearly singular
    its large entries cancel in ``k^T W`` and the product's round-off, about ``eps |k|^T |W|``, can
    exceed the variance itself; the centers' rows (``M^2`` work) show it.
    """
    Z = np.asarray(ctx.centers, dtype=np.float64)
    Kmm, kzz = ctx.kernel(Z, Z), ctx.kernel.diag(Z)
    deficit = post.unit_variance(Kmm, kzz, exact=True) - low_rank.unit_variance(Kmm, kzz)
    return bool(np.max(deficit) <= FAST_STD_RTOL * low_rank.mean_variance)


def _fast_variance(ctx: FitContext, post: PosteriorVariance, method: str, mean_kxx: float) -> LowRankVariance | None:
    """The fast variance for ``std_method`` "auto" (None past the rank cap: return_std stays exact) or "fast"."""
    cap = fast_rank_cap(ctx.n_features)
    low_rank, rank = low_rank_variance(post, n=ctx.n, mean_kxx=mean_kxx, max_rank=cap if method == "auto" else None)
    if low_rank is not None and not _accurate_at_centers(ctx, post, low_rank):
        message = (f"the fast variance's factor D T^-1 Y (rank {rank}) loses more to round-off at the centers than "
                   f"{FAST_STD_RTOL:.0%} of the mean variance (K_MM is nearly singular, as for a polynomial kernel "
                   f"with more centers than features)")
        _tell(method, message, "return_std uses the exact variance")
        return None
    if rank > cap:
        message = (f"the fast variance needs rank {rank} of {post.n_centers} to keep its mean error within "
                   f"{FAST_STD_RTOL:.0%} of the mean variance, above {cap}, the rank at which return_std costs "
                   f"about 3x predict ({ctx.n_features} features)")
        _tell(method, message, "it is used (conservative, at that cost); std_method='exact' costs two "
                               "M x M triangular solves per row instead")
    return low_rank


def _tell(method: str, message: str, when_fast: str) -> None:
    """Why the fast variance is not as asked: logged for "auto" (which falls back to exact), a warning for "fast"."""
    if method == "auto":
        logger.info("%s: return_std uses the exact variance", message)
    else:
        warnings.warn(f"{message}; {when_fast}", UserWarning, stacklevel=3)


def with_posterior(stages: tuple[Stage, ...], solver: str) -> tuple[Stage, ...]:
    """A Nystrom fit's ``stages`` followed by the posterior stage.

    The direct solve then accumulates the preconditioned Gram matrix (which it solves
    from, :meth:`~daskkrr.solvers.FalkonPreconditioner.direct_solve_preconditioned`)
    instead of the plain ``K_MN K_NM``: the variance near the data is a difference of
    nearly equal terms, which the plain matrix's round-off (amplified by the condition
    number of ``K_MM``) would swamp.
    """
    if solver == "direct":
        stages = tuple(
            Stage("operator", lambda ctx: kernel_operator(ctx, strategy="gram", preconditioned=True))
            if s.name == "operator" else s
            for s in stages
        )
    return (*stages, Stage("posterior", posterior))


__all__ = ["posterior", "with_posterior"]
