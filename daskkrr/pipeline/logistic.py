"""The stages of logistic FALKON: statistics -> centers -> block passes -> Newton.

The first two stages are those of every Nystrom fit. Then :func:`logistic_passes`
lays out the row blocks (codes and, when the fit is weighted, the row weights as
one more column) and chooses how kernel blocks are obtained: kept in worker
memory ("cache") or recomputed on every pass ("recompute"); the Gram strategy
does not apply, since the weights change at every Newton step. :func:`newton`
runs :func:`daskkrr.solvers.logistic.newton_solve`: each gradient and each
Hessian-vector product is one pass whose block tasks return ``M``-sized sums,
so nothing of size ``n`` reaches the client. The Newton state is reported as a
:class:`~daskkrr.events.SolverState` after every Newton step (the checkpoint
saves it) and taken back from the checkpoint on resume.

With ``multi_class="multinomial"`` and more than two classes the same stages
run the softmax model of :mod:`daskkrr.solvers.softmax` (:class:`SoftmaxPasses`
and its Newton loop); otherwise the one-vs-rest problems (a single one for two
classes) of :mod:`daskkrr.solvers.logistic`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import dask.array as da
import numpy as np
from sklearn.exceptions import ConvergenceWarning

from daskkrr import events as ev
from daskkrr.parallel.strategies import plan_strategy, prepare_passes
from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.stages import Stage, choose_centers, guarded_statistics, sampler_guard, weight_sum
from daskkrr.solvers import softmax
from daskkrr.solvers.falkon import jitter_floor
from daskkrr.solvers.logistic import (
    BinaryLogistic,
    CenterFactor,
    NewtonState,
    gradient_block,
    gradient_kept,
    hessian_block,
    hessian_kept,
    kernel_and_targets,
    newton_solve,
    penalty_path,
)

logger = logging.getLogger("daskkrr")

#: Strategies the Newton passes support ("gram" would need a weighted Gram pass per step).
LOGISTIC_STRATEGIES = ("auto", "recompute", "cache")


class LogisticPasses:
    """The Newton method's two passes over the row blocks, with kernel blocks kept or recomputed."""

    # The block tasks (module functions, so that they travel to the workers by reference).
    gradient_block = staticmethod(gradient_block)
    gradient_kept = staticmethod(gradient_kept)
    hessian_block = staticmethod(hessian_block)
    hessian_kept = staticmethod(hessian_kept)

    def __init__(self, passes: Any, kernel: Any, Z: Any, strategy: str):
        self.passes, self.kernel, self.Z = passes, kernel, Z
        self.strategy = strategy
        self.blocks: list[Any] | None = None
        if strategy == "cache":
            self.blocks = passes.keep(kernel_and_targets, kernel, Z, name="cache", with_y=True)

    def gradient(self, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
        if self.blocks is not None:
            return self.passes.reduce_kept(self.blocks, self.gradient_kept, coef, intercept, name="gradient")
        return self.passes.map_reduce(self.gradient_block, self.kernel, self.Z, coef, intercept,
                                      name="gradient", with_y=True)

    def hessian(self, coef: np.ndarray, intercept: np.ndarray, U: np.ndarray) -> np.ndarray:
        if self.blocks is not None:
            return self.passes.reduce_kept(self.blocks, self.hessian_kept, coef, intercept, np.asarray(U),
                                           name="hessian")
        return self.passes.map_reduce(self.hessian_block, self.kernel, self.Z, coef, intercept, np.asarray(U),
                                      name="hessian", with_y=True)

    def close(self) -> None:
        if self.blocks is not None:
            self.passes.release(self.blocks)
            self.blocks = None


class SoftmaxPasses(LogisticPasses):
    """The same passes for the multinomial model: per block ``V_b = k(X_b, Z) D`` and
    ``k(X_b, Z)^T (s_i H_i V_b[i])`` row by row (:mod:`daskkrr.solvers.softmax`)."""

    gradient_block = staticmethod(softmax.gradient_block)
    gradient_kept = staticmethod(softmax.gradient_kept)
    hessian_block = staticmethod(softmax.hessian_block)
    hessian_kept = staticmethod(softmax.hessian_kept)


def is_multinomial(ctx: FitContext) -> bool:
    """Whether the fit is the softmax model: ``multi_class="multinomial"`` and more than two
    classes (two classes are the same single-logit model either way)."""
    return getattr(ctx.params, "multi_class", "ovr") == "multinomial" and int(ctx.Y.shape[1]) > 1


def newton_targets(ctx: FitContext) -> da.Array:
    """The ``+-1`` codes (uncentred) and, for a weighted fit, the row weights as a last column."""
    codes = ctx.Y if ctx.y_mean is None else ctx.Y + ctx.y_mean
    codes = da.sign(codes)  # exactly +-1 again after centring and uncentring
    weights = getattr(ctx, "sample_weight", None)
    if weights is None:
        return codes
    w = da.asarray(weights, dtype=np.float64).rechunk({0: codes.chunks[0]})[:, None]
    return da.concatenate([codes, w], axis=1).rechunk({1: -1}, method="tasks")


def logistic_passes(ctx: FitContext) -> None:
    """Lay out the passes and choose the strategy ("auto": cache when it fits in memory)."""
    p = ctx.params
    Z = ctx.centers
    if Z is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    Y = newton_targets(ctx)
    plan = plan_strategy("auto", ctx.X, n_centers=Z.shape[0], n_targets=Y.shape[1],
                         iterations=int(p.max_iter) * max(1, int(p.newton_iterations)),
                         executor=ctx.executor, in_memory=ctx.in_memory)
    strategy = p.strategy
    if strategy == "auto":
        strategy = "cache" if plan.costs["cache"].feasible else "recompute"
    plan.strategy = strategy
    ctx.plan = plan
    ctx.passes = prepare_passes(ctx.X, Y, ctx.executor, plan)
    passes = SoftmaxPasses if is_multinomial(ctx) else LogisticPasses
    ctx.operator = passes(ctx.passes, ctx.kernel, ctx.executor.broadcast(Z), strategy)


def _start_intercept(ctx: FitContext, t: int) -> np.ndarray:
    """The log-odds of each problem's positive class (from the code means), or 0 without intercept;
    for the multinomial model the centred log-frequencies of the classes."""
    if not getattr(ctx.params, "fit_intercept", False) or ctx.y_mean is None or not np.any(ctx.y_mean):
        return np.zeros(t)
    p = np.clip((1.0 + np.asarray(ctx.y_mean, dtype=np.float64)) / 2.0, 1e-6, 1 - 1e-6)
    if is_multinomial(ctx):
        return softmax.start_intercept(p)
    return np.log(p / (1.0 - p))


def newton(ctx: FitContext) -> None:
    """The Newton loop along the penalty path (see :func:`~daskkrr.solvers.logistic.newton_solve`)."""
    p = ctx.params
    Z = ctx.centers
    if Z is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    t = int(ctx.Y.shape[1])
    Z64 = Z.astype(np.float64)
    factor = CenterFactor.from_kernel_matrix(
        ctx.kernel(Z64, Z64), None if ctx.dictionary.is_uniform else ctx.dictionary.weights,
        relative_jitter=jitter_floor(ctx.X.dtype, float(p.penalty)))
    path = penalty_path(float(p.penalty), p.penalty_schedule, int(p.newton_iterations))
    saved = getattr(ctx.store, "saved_state", lambda prefix: None)(NewtonState.checkpoint_prefix)
    state = None if saved is None else NewtonState.from_arrays(saved)
    multinomial = is_multinomial(ctx)
    problems = 1 if multinomial else t
    if state is not None and (state.coef.shape != (Z.shape[0], t) or state.active.shape != (problems,)):
        raise ValueError(f"the checkpoint's Newton state has shape {state.coef.shape} for {state.active.shape[0]} "
                         f"problem(s), expected {(Z.shape[0], t)} for {problems}")
    enabled = bool(getattr(ctx.store, "enabled", False))

    def step(iteration: int, rel: float) -> None:
        ctx.events.emit(ev.SolverStep(int(iteration), float(rel)))

    def save(s: NewtonState) -> None:
        ctx.events.emit(ev.SolverState(s))

    fit_intercept = bool(getattr(p, "fit_intercept", False))
    result = newton_solve(
        factor, ctx.operator.gradient, ctx.operator.hessian, path=path,
        loss=softmax.Multinomial() if multinomial else BinaryLogistic(),
        weight_sum=weight_sum(ctx), intercept0=_start_intercept(ctx, t),
        fit_intercept=fit_intercept, tol=float(p.tol), max_iter=int(p.max_iter), state=state,
        on_state=save if enabled else None, on_step=step,
    )
    st = result.state
    ctx.n_iter, ctx.converged = int(st.step), bool(result.converged)
    if not result.converged:
        ratio = float(np.max(st.decrements[-1] / np.maximum(st.history[-1], 1e-300))) if len(st.history) else np.nan
        warnings.warn(
            f"the Newton method did not reach tol={float(p.tol):g} in newton_iterations={int(p.newton_iterations)}"
            f" steps at the target penalty (largest squared Newton decrement / objective: {ratio:.3g})."
            " The model is usable; raise newton_iterations or max_iter, or raise tol",
            ConvergenceWarning, stacklevel=2,
        )
    d = ctx.dictionary
    one = t == 1 and ctx.one_d
    ctx.fitted.update(
        centers_=ctx.centers, center_indices_=d.indices, center_weights_=d.weights,
        sampler_info_=dict(d.info), jitter_=float(factor.jitter),
        coef_=result.coef[:, 0] if one else result.coef,
        intercept_=result.intercept if fit_intercept else np.zeros(t),
        y_mean_=np.zeros(t), n_iter_=int(st.step), cg_iterations_=int(st.cg_iterations),
        objective_=result.objective, objective_history_=st.history,
        penalty_path_=np.array([lam for lam, _ in path[: st.step]]),
        residuals_=st.decrements, converged_=bool(result.converged), strategy_=ctx.operator.strategy,
        preconditioner_rows_=0, n_data_passes_=ctx.passes.n_passes + 1,
    )
    logger.info("logistic FALKON: %d Newton steps, %d CG iterations, objective %s", st.step, st.cg_iterations,
                np.array2string(result.objective, precision=6))


def logistic_stages() -> tuple[Stage, ...]:
    """The stages of :class:`~daskkrr.models.logistic.LogisticFalkonClassifier`'s fit."""
    return (
        Stage("statistics", guarded_statistics(sampler_guard)),
        Stage("centers", choose_centers),
        Stage("operator", logistic_passes),
        Stage("solve", newton),
    )
