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

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import clone

from daskkrr.pipeline.run import run_fit
from daskkrr.pipeline.stages import Stage, direct_solve, exact_solve, exact_stages, nystrom_stages


def path_unsupported(estimator: Any, n_rows: int | None = None, n_features: int | None = None) -> str | None:
    """Why ``estimator`` cannot be fitted along a penalty path (None: it can).

    For :class:`~daskkrr.models.ExactKernelRidge` the path is its direct solve: refused
    with ``solver="pcg"``, and with ``solver="auto"`` where ``n_rows`` (when given) would
    take PCG (:func:`~daskkrr.pipeline.exact_pcg.choose_solver`).
    """
    from daskkrr.models.regressors import ExactKernelRidge, FalkonRegressor, NystromRegressor

    if getattr(estimator, "compute_std", False):
        return "compute_std=True keeps a posterior for one penalty"
    if isinstance(estimator, ExactKernelRidge):
        if estimator.solver == "pcg":
            return "solver='pcg' solves one penalty at a time; the path is the direct solve's"
        if estimator.solver == "auto" and n_rows is not None:
            from daskkrr.pipeline.exact_pcg import choose_solver

            if choose_solver(estimator, int(n_rows), int(n_features or 1)) != "direct":
                return f"solver='auto' takes PCG for {n_rows} rows; the path is the direct solve's"
        return None
    if not isinstance(estimator, (FalkonRegressor, NystromRegressor)):
        return f"{type(estimator).__name__} is not a squared-loss kernel ridge regressor"
    sampler = estimator.get_params().get("sampler", "uniform")
    if not (isinstance(sampler, str) and sampler == "uniform"):
        return f"its centers depend on the penalty (sampler={sampler!r}); only 'uniform' ones do not"
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
        raise ValueError("a penalty path needs a squared-loss Nystrom regressor with uniform centers, or "
                         f"ExactKernelRidge's direct solve: {why}")
    lams = np.asarray(penalties, dtype=np.float64).reshape(-1)
    if lams.size == 0 or not np.all(np.isfinite(lams)) or not np.all(lams > 0):
        raise ValueError(f"penalties must be a non-empty sequence of positive numbers; got {penalties!r}")
    from daskkrr.models.regressors import ExactKernelRidge

    if isinstance(estimator, ExactKernelRidge):
        # its direct solve's stages, solved along the path
        model = clone(estimator).set_params(penalty=float(lams[0]), solver="direct")
        statistics, _ = exact_stages()
        stages: tuple[Stage, ...] = (statistics, Stage("solve", functools.partial(exact_solve, penalties=lams)))
        fitted: dict[str, Any] = {"solver_": "direct"}
    else:
        # NystromRegressor's stages, in float64 whatever the estimator's dtype: a float32 fit factors
        # with a jitter floor that keeps part of the penalty in a near-singular term (each penalty
        # would need its own factorisation), and a float32 Gram pass loses eps_32 ||K||^2, which
        # T^{-1} amplifies. In float64 the factor carries the round-off jitter only, so the path's
        # inner matrix is C + lambda I for every penalty.
        model = clone(estimator).set_params(penalty=float(lams[0]), dtype="float64")
        *shared, _ = nystrom_stages("direct")
        stages = (*shared, Stage("solve", functools.partial(direct_solve, penalties=lams)))
        fitted = {}
    model._validate_params()
    X, y = model._check_fit_input(X, y)
    if np.ndim(y) != 1:
        raise ValueError(f"a penalty path fits one target; got y of shape {np.shape(y)}")
    ctx = run_fit(model, X, y, stages)
    for name, value in {**fitted, **ctx.fitted}.items():
        setattr(model, name, value)
    model.penalties_ = lams
    return model
