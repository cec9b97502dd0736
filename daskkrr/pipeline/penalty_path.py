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

:class:`~daskkrr.models.ExactKernelRidge` has a path too, where it would factor
directly: one eigendecomposition of the ``n x n`` kernel matrix
(:func:`~daskkrr.solvers.exact.exact_krr_path`) for all the penalties, which takes
about 20 times one factorisation (3x a whole direct fit at n = 2000, 6x at n = 5000).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from daskkrr.pipeline.run import run_fit


def path_unsupported(estimator: Any, n_rows: int | None = None, n_features: int | None = None) -> str | None:
    """Why ``estimator`` cannot be fitted along a penalty path (None: it can).

    The estimator answers through its ``_penalty_path_unsupported(n_rows, n_features)``
    (squared-loss regressors define it; :class:`~daskkrr.models.ExactKernelRidge` refuses
    ``solver="pcg"``, and ``solver="auto"`` where ``n_rows``, when given, would take PCG);
    an estimator without it is not a squared-loss kernel ridge regressor.
    """
    if getattr(estimator, "compute_std", False):
        return "compute_std=True keeps a posterior for one penalty"
    unsupported = getattr(estimator, "_penalty_path_unsupported", None)
    if unsupported is None:
        return f"{type(estimator).__name__} is not a squared-loss kernel ridge regressor"
    why: str | None = unsupported(n_rows, n_features)
    return why


def fit_penalty_path(estimator: Any, X: Any, y: Any, penalties: Sequence[float] | np.ndarray) -> Any:
    """A clone of ``estimator`` fitted at every one of ``penalties`` at once.

    Its ``coef_`` is ``(M, P)`` and its ``intercept_`` ``(P,)``, so ``predict`` returns one
    column per penalty. ``y`` must be one target. The path is computed in float64 (the clone's
    ``dtype``), whatever ``estimator``'s. Raises ValueError where
    :func:`path_unsupported` says why not. The clone and its stages come from the
    estimator's ``_penalty_path_plan(penalties)``.
    """
    why = path_unsupported(estimator)
    if why is not None:
        raise ValueError("a penalty path needs a squared-loss Nystrom regressor with uniform centers, or "
                         f"ExactKernelRidge's direct solve: {why}")
    lams = np.asarray(penalties, dtype=np.float64).reshape(-1)
    if lams.size == 0 or not np.all(np.isfinite(lams)) or not np.all(lams > 0):
        raise ValueError(f"penalties must be a non-empty sequence of positive numbers; got {penalties!r}")
    model, stages, fitted = estimator._penalty_path_plan(lams)
    model._validate_params()
    X, y = model._check_fit_input(X, y)
    if np.ndim(y) != 1:
        raise ValueError(f"a penalty path fits one target; got y of shape {np.shape(y)}")
    ctx = run_fit(model, X, y, stages)
    for name, value in {**fitted, **ctx.fitted}.items():
        setattr(model, name, value)
    model.penalties_ = lams
    return model
