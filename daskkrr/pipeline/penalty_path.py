"""One Nystrom fit at many penalties: the regularisation path of a squared-loss model.

For a fixed kernel and fixed centers, the Nystrom solutions for every penalty share
everything but the last ``M x M`` solve: the centers, ``K_MM``'s factor, and
``G = K_nM^T K_nM`` with ``K_nM^T y`` (one Gram pass, as
:class:`~daskkrr.models.NystromRegressor` makes). One eigendecomposition then gives
all of them (:meth:`~daskkrr.solvers.FalkonPreconditioner.direct_solve_path`). The
tuner (:mod:`daskkrr.tune`) uses it to profile the penalty out of a search: it scores
a whole path of penalties for the cost of about one fit.

The path is the exact Nystrom solution at each penalty, the one
:class:`~daskkrr.models.FalkonRegressor`'s CG converges to; it applies only where the
centers do not depend on the penalty (the uniform sampler: the leverage-score
samplers draw with the penalty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import clone

from daskkrr.pipeline.run import run_fit
from daskkrr.pipeline.stages import (
    Stage,
    _nystrom_model,
    choose_centers,
    guarded_statistics,
    kernel_operator,
    sampler_guard,
    split_column_sums,
    weight_sum,
)
from daskkrr.solvers import FalkonPreconditioner


def path_unsupported(estimator: Any) -> str | None:
    """Why ``estimator`` cannot be fitted along a penalty path (None: it can)."""
    from daskkrr.models.regressors import FalkonRegressor, NystromRegressor

    if not isinstance(estimator, (FalkonRegressor, NystromRegressor)):
        return f"{type(estimator).__name__} is not a squared-loss Nystrom regressor"
    sampler = estimator.get_params().get("sampler", "uniform")
    if not (isinstance(sampler, str) and sampler == "uniform"):
        return f"its centers depend on the penalty (sampler={sampler!r}); only 'uniform' ones do not"
    if getattr(estimator, "compute_std", False):
        return "compute_std=True keeps a posterior for one penalty"
    return None


def fit_penalty_path(estimator: Any, X: Any, y: Any, penalties: Sequence[float] | np.ndarray) -> Any:
    """A clone of ``estimator`` fitted at every one of ``penalties`` at once.

    Its ``coef_`` is ``(M, P)`` and its ``intercept_`` ``(P,)``, so ``predict`` returns one
    column per penalty. ``y`` must be one target. The path is computed in float64 (the clone's
    ``dtype``), whatever ``estimator``'s. Raises ValueError where
    :func:`path_unsupported` says why not.
    """
    why = path_unsupported(estimator)
    if why is not None:
        raise ValueError(f"a penalty path needs a squared-loss Nystrom regressor with uniform centers: {why}")
    lams = np.asarray(penalties, dtype=np.float64).reshape(-1)
    if lams.size == 0 or not np.all(np.isfinite(lams)) or not np.all(lams > 0):
        raise ValueError(f"penalties must be a non-empty sequence of positive numbers; got {penalties!r}")
    # In float64 whatever the estimator's dtype: a float32 Gram pass loses eps_32 ||K||^2, which
    # T^{-1} amplifies by 1 / lambda_min(K_MM) (the path's float64 factor carries no float32 jitter
    # floor); the tuner's data is float64 anyway.
    model = clone(estimator).set_params(penalty=float(lams[0]), dtype="float64")
    model._validate_params()
    X, y = model._check_fit_input(X, y)
    if np.ndim(y) != 1:
        raise ValueError(f"a penalty path fits one target; got y of shape {np.shape(y)}")
    stages = (
        Stage("statistics", guarded_statistics(sampler_guard)),
        Stage("centers", choose_centers),
        Stage("preconditioner", _path_factor),
        Stage("operator", lambda ctx: kernel_operator(ctx, strategy="gram", preconditioned=False)),
        Stage("solve", lambda ctx: _path_solve(ctx, lams)),
    )
    ctx = run_fit(model, X, y, stages)
    for name, value in ctx.fitted.items():
        setattr(model, name, value)
    model.penalties_ = lams
    return model


def _path_factor(ctx: Any) -> None:
    """``K_MM``'s factor in float64 with the round-off jitter, whatever the fit's dtype: the path's
    inner matrix is then ``C + lambda I`` for every penalty (float32 factors and the float32 jitter
    floor keep part of the penalty in a near-singular term, see
    :meth:`~daskkrr.solvers.FalkonPreconditioner.direct_solve_path`). The solution is the same
    Nystrom one, to that jitter."""
    Z64 = np.asarray(ctx.centers, dtype=np.float64)
    ctx.preconditioner = FalkonPreconditioner.from_kernel_matrix(
        ctx.kernel(Z64, Z64), penalty=1.0, n=weight_sum(ctx),  # the path puts its penalties in place of 1.0
        weights=None if ctx.dictionary.is_uniform else ctx.dictionary.weights, overwrite_kmm=True)
    ctx.sketch_rows = 0


def _path_solve(ctx: Any, penalties: np.ndarray) -> None:
    """The Gram pass's ``M x M`` system for every penalty; the model with one column per penalty."""
    fit_intercept = bool(getattr(ctx.params, "fit_intercept", False))
    b, ctx.mu = split_column_sums(ctx.operator.knm_t_y, weight_sum(ctx), fit_intercept)
    gram = ctx.operator.gram
    if ctx.mu is not None:
        gram -= weight_sum(ctx) * np.outer(ctx.mu, ctx.mu)
    coef = ctx.preconditioner.direct_solve_path(gram, b, penalties)
    ctx.fitted.update(n_iter_=0, residuals_=np.zeros((1, coef.shape[1])), converged_=True)
    ctx.one_d = False  # one column per penalty
    _nystrom_model(ctx, coef)
