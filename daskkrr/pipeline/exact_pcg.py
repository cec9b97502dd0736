"""The stages of exact kernel ridge regression by preconditioned CG (Avron, Clarkson and Woodruff).

``ExactKernelRidge(solver="pcg")`` solves ``(K + lambda I) c = y`` with
``lambda = penalty * n`` (scikit-learn's ``KernelRidge(alpha=penalty * n)``; with
sample weights ``n`` is their sum and the system is the symmetric
``(W^{1/2} K W^{1/2} + lambda I) c' = W^{1/2} y``, ``c = W^{1/2} c'``):

1. ``statistics`` (after logging, and printing with ``verbose``, the estimated
   time and memory of the ``n x n`` tiles);
2. ``operator``: the tiles of ``K`` (:class:`daskkrr.parallel.tiles.TileOperator`),
   kept in worker memory or recomputed, as the cost model finds room;
3. ``preconditioner``: ``Z`` (random or Nystrom features) and the Cholesky factor
   of ``Z^T Z + lambda_p I`` (Algorithm 1, steps 4-7), with s chosen adaptively
   when ``n_features="auto"`` (:func:`adaptive_features`);
4. ``solve``: PCG on the workers' n-vectors until
   ``||y - (K + lambda I) c|| <= tol ||y||``, its state saved through
   :class:`~daskkrr.events.SolverState` for resume, as FALKON's CG.

Adaptive s (the paper's Section 5, in a form for every kernel): start at
:data:`ADAPTIVE_START` features and double. For each s, :data:`PROBE_STEPS` PCG
steps on a random right-hand side give the Lanczos estimates ``lambda_min``,
``lambda_max`` of the preconditioned operator (:func:`daskkrr.solvers.pcg.ritz_bounds`)
and its condition number ``kappa``. Stop doubling when
``kappa <= KAPPA_FACTOR * max(rho, 1 / rho)`` with ``rho = lambda_p / lambda``
(Theorem 1's preconditioner has ``kappa <= 3`` at ``rho = 1``; a larger ``lambda_p``
alone puts ``lambda_min`` near ``1 / rho``), when s reaches its cap (``n / 2``,
:data:`ADAPTIVE_MAX`), or when the iterations the next doubling is predicted to
save (``sqrt(kappa) ln(2 / tol) / 2``, the paper's PCG bound, with the last ratio
of kappas extrapolated) are fewer than a probe costs.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import dask.array as da
import numpy as np

from daskkrr import events as ev
from daskkrr.kernels.random_features import NystromFeatures, has_random_features, random_features
from daskkrr.kernels.sparse import dense_rows
from daskkrr.parallel import Executor
from daskkrr.parallel.guards import SLOW_SECONDS
from daskkrr.parallel.tiles import (
    BlockOps,
    FeatureBlocks,
    TileOperator,
    TilePlan,
    data_blocks,
    plan_tiles,
    random_vector,
    rechunk_rows,
)
from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.stages import (
    Stage,
    check_exact_resources,
    exact_stages,
    guarded_statistics,
    seed_of,
    warn_not_converged,
)
from daskkrr.sampling import make_sampler
from daskkrr.solvers.pcg import pcg, predicted_iterations, ritz_bounds

logger = logging.getLogger("daskkrr")

#: First s of the adaptive doubling.
ADAPTIVE_START = 256
#: Largest s of the adaptive doubling (also at most n / 2: the paper's s < n).
ADAPTIVE_MAX = 16384
#: PCG steps of each probe of the preconditioned spectrum.
PROBE_STEPS = 10
#: Condition number of the preconditioned system that is good enough, times ``max(rho, 1 / rho)``.
KAPPA_FACTOR = 3.0
#: Iterations expected for the cost estimate before s is known.
EXPECTED_ITERATIONS = 50
#: Largest n that solver="auto" factors directly (beyond, PCG is cheaper: n^2 per iteration).
AUTO_DIRECT_MAX = 10000


def _tile_dtype(p: Any) -> str:
    """Kept tiles in float32 unless tol asks for more than float32 products give (~1e-6)."""
    if p.tile_dtype != "auto":
        return str(p.tile_dtype)
    return "float32" if float(p.tol) >= 1e-5 else "float64"


def _plan(ctx_or_params: Any, n: int, d: int, executor: Executor) -> TilePlan:
    p = ctx_or_params
    return plan_tiles(n, d, resources=executor.resources(), tiles=p.kernel_tiles, tile_rows=p.chunks,
                      tile_dtype=_tile_dtype(p))


def pcg_guard(ctx: FitContext, n: int, d: int) -> None:
    """Log (print with ``verbose``) the time and memory of the ``n x n`` tiles before any work."""
    plan = _plan(ctx.params, n, d, ctx.executor)
    iterations = min(int(ctx.params.max_iter), EXPECTED_ITERATIONS)
    message = plan.describe(n, iterations)
    logger.info(message)
    if getattr(ctx.params, "verbose", False):
        print(message, flush=True)
    if plan.seconds(iterations) > SLOW_SECONDS:
        warnings.warn(f"{message}; FalkonRegressor (Nystrom centers) is much faster if an approximation will do",
                      UserWarning, stacklevel=3)


def choose_solver(params: Any, n: int, d: int, executor: Executor | None = None) -> str:
    """``"direct"`` or ``"pcg"`` for ``solver="auto"``: direct up to :data:`AUTO_DIRECT_MAX` rows
    when its ``n x n`` matrices fit in memory (the guard accepts them), PCG beyond; always direct
    with ``compute_std`` (its guard then decides)."""
    if params.solver != "auto":
        return str(params.solver)
    if getattr(params, "compute_std", False):
        return "direct"  # the predictive std needs the factor of the direct solve
    if n > min(AUTO_DIRECT_MAX, int(params.max_samples)):
        return "pcg"
    try:
        check_exact_resources(params, n, d, executor)
    except (ValueError, MemoryError):
        return "pcg"
    return "direct"


# --------------------------------------------------------------------------- operator
def tile_operator(ctx: FitContext) -> None:
    """Row blocks of tile size; the operator ``K + lambda I`` over them."""
    p = ctx.params
    n, d = ctx.n, ctx.n_features
    ctx.tile_plan = plan = _plan(p, n, d, ctx.executor)
    ctx.X = rechunk_rows(ctx.X, plan.tile_rows)
    ctx.Y = rechunk_rows(ctx.Y, plan.tile_rows)
    weights = getattr(ctx, "sample_weight", None)
    ctx.row_scale = None
    weight_sum = float(getattr(ctx, "weight_sum", n) or n)
    if weights is not None:
        scale = da.sqrt(rechunk_rows(da.asarray(weights, dtype=np.float64), plan.tile_rows)).reshape(-1, 1)
        ctx.row_scale = data_blocks(ctx.executor, scale.rechunk({1: -1}), keep=True)
    ctx.shift = float(p.penalty) * weight_sum
    t0 = time.perf_counter()
    ctx.x_blocks = data_blocks(ctx.executor, ctx.X)
    ctx.operator = TileOperator(ctx.executor, ctx.x_blocks, tuple(ctx.X.chunks[0]), ctx.kernel, ctx.shift, plan,
                                scale=ctx.row_scale)
    logger.info("kernel tiles %s in %.2fs", "computed and kept" if plan.keep else "to recompute",
                time.perf_counter() - t0)


# --------------------------------------------------------------------------- preconditioner
def _feature_map(ctx: FitContext, s: int, seed: int | None) -> Any:
    p = ctx.params
    if p.preconditioner == "nystrom":
        dictionary = make_sampler("uniform").select(
            ctx.X, ctx.kernel, n_centers=min(int(s), ctx.n), penalty=float(p.penalty), random_state=seed,
            executor=ctx.executor,
        )
        return NystromFeatures.from_centers(ctx.kernel, dictionary.centers)
    s2 = p.srht_features
    s1 = int(s) if s2 is None else max(int(s), int(s2) + 1)
    return random_features(ctx.kernel, s1, ctx.n_features, seed=seed, srht_features=s2)


def _features(ctx: FitContext, s: int, seed: int | None) -> FeatureBlocks:
    return FeatureBlocks(ctx.executor, ctx.x_blocks, ctx.n, _feature_map(ctx, s, seed), ctx.preconditioner_penalty,
                         scale=ctx.row_scale)


def probe_condition(ctx: FitContext, features: FeatureBlocks | None, seed: int | None,
                    steps: int = PROBE_STEPS) -> tuple[float, float]:
    """Lanczos estimates ``(lambda_min, lambda_max)`` of the preconditioned system from ``steps``
    PCG steps on a random right-hand side (its coefficients give the tridiagonal matrix)."""
    ops = BlockOps(ctx.executor, ctx.X.chunks[0])
    b = random_vector(ops, 0 if seed is None else seed)
    result = pcg(ctx.operator, b, ops, preconditioner=features, tol=1e-300, max_iter=steps, true_residual_every=0)
    return ritz_bounds(result.alphas, result.betas)


def adaptive_features(ctx: FitContext, seed: int | None) -> tuple[FeatureBlocks, list[dict[str, float]]]:
    """Double s from :data:`ADAPTIVE_START` until the preconditioned system is good enough (module doc)."""
    p = ctx.params
    tol = float(p.tol)
    rho = float(p.preconditioner_penalty)
    target = KAPPA_FACTOR * max(rho, 1.0 / rho)
    cap = max(1, min(ADAPTIVE_MAX, ctx.n // 2))
    s = min(ADAPTIVE_START, cap)
    trace: list[dict[str, float]] = []
    best: FeatureBlocks | None = None
    while True:
        features = _features(ctx, s, seed)
        lo, hi = probe_condition(ctx, features, seed)
        kappa = hi / max(lo, np.finfo(float).tiny)
        its = predicted_iterations(kappa, tol)
        trace.append({"n_features": float(features.n_features), "lambda_min": lo, "lambda_max": hi,
                      "kappa": kappa, "predicted_iterations": float(its)})
        logger.info("adaptive s: s=%d, Ritz values [%.3g, %.3g], kappa ~ %.3g, ~%d PCG iterations",
                    features.n_features, lo, hi, kappa, its)
        if best is not None:
            best.close()
        best = features
        if kappa <= target or s >= cap:
            break
        if len(trace) >= 2:
            ratio = trace[-2]["kappa"] / kappa  # how much the last doubling helped
            next_its = predicted_iterations(kappa / max(ratio, 1.0), tol)
            # Another doubling costs a probe (PROBE_STEPS products) and a larger Z: not worth
            # it when it is predicted to save fewer iterations than that.
            if its - next_its <= PROBE_STEPS:
                break
        s = min(2 * s, cap)
    return best, trace


def feature_preconditioner(ctx: FitContext) -> None:
    """``Z`` and the Woodbury factor (fixed s or adaptive), or nothing for plain CG."""
    p = ctx.params
    ctx.preconditioner_penalty = float(p.preconditioner_penalty) * ctx.shift
    ctx.features = None
    ctx.adaptive_trace = []
    if p.preconditioner is None:
        return
    seed = seed_of(p.random_state)
    t0 = time.perf_counter()
    if p.n_features == "auto":
        ctx.features, ctx.adaptive_trace = adaptive_features(ctx, seed)
    else:
        ctx.features = _features(ctx, int(p.n_features), seed)
    logger.info("%s preconditioner with s=%d features (lambda_p = %.3g) in %.2fs", p.preconditioner,
                ctx.features.n_features, ctx.preconditioner_penalty, time.perf_counter() - t0)


# --------------------------------------------------------------------------- solve
def pcg_solve(ctx: FitContext) -> None:
    """PCG to ``||y - (K + lambda I) c|| <= tol ||y||``; the state checkpointed as FALKON's CG."""
    p = ctx.params
    ops = BlockOps(ctx.executor, ctx.X.chunks[0])
    B = ops.from_dask(ctx.Y)
    if ctx.row_scale is not None:
        B = ops.scale_rows(B, ctx.row_scale)

    def step(iteration: int, rel: np.ndarray) -> None:
        ctx.events.emit(ev.SolverStep(int(iteration), float(np.max(rel))))

    def save(state: Any) -> None:
        ctx.events.emit(ev.SolverState(state))

    result = pcg(
        ctx.operator, B, ops, preconditioner=ctx.features, tol=float(p.tol), max_iter=int(p.max_iter),
        callback=step, state=ctx.store.cg_state, on_state=save if getattr(ctx.store, "enabled", False) else None,
        state_every=ctx.store.every,
    )
    C = result.x if ctx.row_scale is None else ops.scale_rows(result.x, ctx.row_scale)
    coef = ops.to_numpy(C)
    # the centers_ are the training rows (every row is a center), dense as every model's centers_ (n x d):
    # sparse X is densified here, for the model only; the tiles and the preconditioner took it sparse.
    (Xn,) = (dense_rows(a) for a in ctx.executor.compute(ctx.X))
    ctx.n_iter, ctx.converged = int(result.n_iter), bool(result.converged)
    if not ctx.converged:
        warn_not_converged(result, tol=float(p.tol), max_iter=int(p.max_iter), dtype=_tile_dtype(p))
    n = ctx.n
    ctx.fitted.update(
        centers_=np.ascontiguousarray(Xn), center_indices_=np.arange(n, dtype=np.int64),
        center_weights_=np.ones(n), sampler_info_={"sampler": "all"},
        coef_=coef[:, 0] if ctx.one_d else coef, n_iter_=ctx.n_iter, residuals_=result.residuals,
        converged_=ctx.converged, jitter_=0.0, n_data_passes_=1 + ops_passes(result),
        solver_="pcg", n_features_=0 if ctx.features is None else int(ctx.features.n_features),
        preconditioner_penalty_=float(ctx.preconditioner_penalty), kernel_tiles_="keep" if ctx.tile_plan.keep
        else "recompute", adaptive_trace_=list(ctx.adaptive_trace),
    )
    if ctx.features is not None:
        ctx.features.close()


def ops_passes(result: Any) -> int:
    """Products with the kernel matrix (each a pass over all tiles)."""
    return int(result.n_matvec)


def pcg_stages() -> tuple[Stage, ...]:
    """statistics (after the estimate) -> operator -> preconditioner -> solve."""
    return (
        Stage("statistics", guarded_statistics(pcg_guard)),
        Stage("operator", tile_operator),
        Stage("preconditioner", feature_preconditioner),
        Stage("solve", pcg_solve),
    )


def exact_krr_stages(solver: str) -> tuple[Stage, ...]:
    """The stages of ``ExactKernelRidge``: ``"direct"`` (factorisation) or ``"pcg"``."""
    if solver == "direct":
        return exact_stages()
    if solver == "pcg":
        return pcg_stages()
    raise ValueError(f"solver must be 'direct' or 'pcg' here; got {solver!r}")


def check_preconditioner(kernel: Any, preconditioner: Any) -> None:
    """A kernel without random features cannot have the random-feature preconditioner."""
    if preconditioner == "random_features" and not has_random_features(kernel):
        raise ValueError(
            f"{type(kernel).__name__} has no random feature map (there are maps for the gaussian, laplacian, "
            f"matern, polynomial and linear kernels); use preconditioner='nystrom' or preconditioner=None"
        )


__all__ = [
    "ADAPTIVE_MAX",
    "ADAPTIVE_START",
    "KAPPA_FACTOR",
    "PROBE_STEPS",
    "adaptive_features",
    "check_preconditioner",
    "choose_solver",
    "exact_krr_stages",
    "feature_preconditioner",
    "pcg_guard",
    "pcg_solve",
    "pcg_stages",
    "probe_condition",
    "tile_operator",
]
