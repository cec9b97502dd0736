"""The stages of a kernel fit: statistics -> centers -> preconditioner -> operator -> solve.

Each stage is a function of the :class:`~daskkrr.pipeline.context.FitContext`:
it reads what earlier stages left there, schedules its work through
``ctx.executor`` (the execution layer), reports through ``ctx.events`` and
leaves its own results for the next stage. An estimator is a list of stages
(:func:`nystrom_stages`); a new estimator reuses the first ones and brings its
own solve (a Newton loop, an eigensolver, a PCG on the exact system).

Resume: a stage whose result the interrupted fit saved (``ctx.store``) takes it
instead of recomputing, and says so in its event (``restored=True``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from sklearn.exceptions import ConvergenceWarning

from daskkrr import events as ev
from daskkrr.data import Standardizer
from daskkrr.data.extremes import check_fit_magnitudes, times_power_of_two
from daskkrr.data.feature_names import fitted_feature_names
from daskkrr.data.inputs import is_in_memory, load_training_data, refuse_unknown_chunks
from daskkrr.data.sample_weight import open_sample_weight
from daskkrr.data.sparse import is_sparse_array, refuse_centering
from daskkrr.kernels.sparse import dense_rows
from daskkrr.parallel.guards import check_quadratic, quadratic_cost
from daskkrr.parallel.sketch_pass import WorkerRowSketch
from daskkrr.parallel.strategies import (
    make_operator,
    plan_factor_route,
    plan_sketch,
    plan_strategy,
    prepare_passes,
)
from daskkrr.parallel.tiled_falkon import TiledFalkonPreconditioner
from daskkrr.parallel.tiled_posterior import FAST_STD_REFUSED
from daskkrr.parallel.weighted import make_weighted_operator, with_weights
from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.fingerprint import fit_fingerprint
from daskkrr.sampling import FixedCenters, make_sampler
from daskkrr.solvers import FalkonPreconditioner, falkon_solve
from daskkrr.solvers.exact import exact_krr_path, exact_krr_solve
from daskkrr.solvers.falkon import factor_precision, jitter_floor
from daskkrr.solvers.intercept import centered_gram_matvec
from daskkrr.solvers.sketch import SKETCH_SEED, KernelRowSketch, sketch_indices, sketch_precision
from daskkrr.solvers.variance import exact_posterior

logger = logging.getLogger("daskkrr")


@dataclasses.dataclass(frozen=True)
class Stage:
    """A named step of a fit: ``run(ctx)``."""

    name: str
    run: Callable[[FitContext], None]


# --------------------------------------------------------------------------- statistics
def statistics(ctx: FitContext) -> None:
    """Open and validate the data; one pass for the feature and target statistics; scale.

    Leaves the scaled features ``ctx.X`` (row-chunked, in the fit's dtype), the
    centred 2-D targets ``ctx.Y``, the row weights ``ctx.sample_weight`` (None
    without) and their sum ``ctx.weight_sum``, and the kernel with resolved
    parameters, then opens the checkpoint store (which may refuse another fit's
    checkpoint). With weights the statistics are weighted (a row of weight k
    counts k times), and bad weights (NaN, inf, negative, all zero, wrong length)
    are refused here, before anything is written.
    """
    p = ctx.params
    t0 = time.perf_counter()
    Xd, yd = load_training_data(ctx.X_in, ctx.y_in, p.chunks)
    w = open_sample_weight(ctx.sample_weight_in, ctx.X_in, Xd, p.chunks)
    n, d = (int(s) for s in Xd.shape)
    ctx.input_dtype = Xd.dtype
    given_centers = isinstance(getattr(p, "sampler", None), np.ndarray)  # n_centers is not used then
    scaler = start_statistics(ctx, Xd, getattr(p, "n_centers", None), clamp=not given_centers)
    if ctx.encode_targets is None:
        raise RuntimeError("the fit context has no target encoder; the estimator must set encode_targets")
    Y = ctx.encode_targets(yd)
    row_weights = getattr(p, "_row_weights", None)
    if row_weights is not None:  # e.g. a classifier's class_weight, multiplied into the sample weights
        w = row_weights(yd, w)
    # One pass: statistics and finiteness of X, Y and the weights, and (for a checkpoint) every block's digest.
    checkpointing = bool(getattr(ctx.store, "enabled", False))
    scaler.fit(Xd, Y, sample_weight=w, digest_blocks=checkpointing)
    ctx.events.emit(ev.PassDone("statistics", Xd.numblocks[0]))
    # Extreme magnitudes are refused (or weights renormalised) before any kernel is evaluated.
    weight_exponent = check_fit_magnitudes(scaler.magnitudes_, standardize=p.standardize,
                                           fit_dtype=p._feature_dtype(), input_dtype=Xd.dtype, scale=scaler.scale_)
    if w is not None and weight_exponent:  # w * 2**k: exact; the model depends on the weights' ratios only
        w = da.map_blocks(times_power_of_two, w, weight_exponent, dtype=w.dtype)
    logger.info("statistics pass over %d rows in %.2fs", n, time.perf_counter() - t0)
    ctx.block_digests = getattr(scaler, "block_digests_", None)
    ctx.sample_weight = w
    ctx.one_d = yd.ndim == 1 and getattr(p, "_squeeze_single_target", True)
    ctx.kernel = p._make_kernel(d)
    _use_statistics(ctx, scaler, Xd, Y, weight_exponent)
    ctx.store.start(lambda: fit_fingerprint(ctx))  # loads (and checks) a saved state
    saved = getattr(ctx.store, "saved_statistics", lambda: None)()
    if saved is not None:  # the statistics the saved centers, rhs and CG state were computed with
        _use_statistics(ctx, Standardizer.from_dict(saved), Xd, Y, weight_exponent)
    elif checkpointing:
        ctx.store.save_statistics(scaler.to_dict())  # type: ignore[attr-defined]


def start_statistics(ctx: FitContext, Xd: da.Array, n_centers: int | None, *, clamp: bool = True) -> Standardizer:
    """The statistics pass's start, supervised or not: ``ctx.n_centers``, the data announced, the scaler to fit.

    ``n_centers`` above the ``n`` rows becomes ``n`` with a warning (unless ``clamp`` is False), as
    scikit-learn's Nystroem: the defaults still fit tiny data, with at most one center per row. Sparse
    rows are scaled, not centred (a mean would fill in the zeros): refused where that changes the model.
    """
    p = ctx.params
    n, d = (int(s) for s in Xd.shape)
    if clamp and n_centers is not None and n_centers > n:
        warnings.warn(
            f"n_centers={n_centers} is larger than the number of training rows ({n}); using n_centers={n}",
            UserWarning, stacklevel=3,
        )
        n_centers = n
    ctx.n_centers = n_centers
    ctx.events.emit(ev.DataOpened(n, Xd.numblocks[0], d))
    sparse = is_sparse_array(Xd)
    if sparse:
        refuse_centering(type(p).__name__, p._make_kernel(d), p.standardize)
    ctx.events.emit(ev.PassStarted("statistics", Xd.numblocks[0]))
    return Standardizer(with_mean=p.standardize and not sparse, with_std=p.standardize)


def _use_statistics(ctx: FitContext, scaler: Standardizer, Xd: da.Array, Y: da.Array, weight_exponent: int) -> None:
    """Scale the features and centre the targets with ``scaler``'s statistics (lazily), and keep
    them for the fitted model."""
    p = ctx.params
    d = int(Xd.shape[1])
    centre_y = p.standardize or bool(getattr(p, "fit_intercept", False))
    ctx.scaler = scaler if p.standardize else None
    ctx.y_mean = (np.asarray(scaler.y_mean_, dtype=np.float64).reshape(-1) if centre_y
                  else np.zeros(Y.shape[1]))
    Xs = scaler.transform(Xd) if p.standardize else Xd
    ctx.X = Xs.astype(p._feature_dtype())
    ctx.Y = Y - ctx.y_mean if centre_y else Y
    # the weights were multiplied by 2**weight_exponent (exact) when their magnitude was extreme
    ctx.weight_sum = math.ldexp(float(scaler.weight_sum_), weight_exponent)
    ctx.fitted.update(
        scaler_=ctx.scaler, y_mean_=ctx.y_mean, intercept_=ctx.y_mean.copy(),  # final unless fitted
        n_features_in_=d, kernel_=ctx.kernel, **fitted_feature_names(p, ctx.X_in, d),
    )


# --------------------------------------------------------------------------- centers
def choose_centers(ctx: FitContext) -> None:
    """The Nystrom centers: the sampler's choice, or the interrupted fit's.

    A sampler whose ``select`` takes ``sample_weight`` gets the row weights of a
    weighted fit (the uniform sampler then draws rows in proportion to them); the
    others choose as if unweighted."""
    p = ctx.params
    saved = ctx.store.saved_centers()
    if saved is not None:
        dictionary = saved
        ctx.events.emit(ev.CentersChosen(dictionary, restored=True))
    else:
        t0 = time.perf_counter()
        sampler = make_sampler(p.sampler)
        if isinstance(sampler, FixedCenters):  # the user's centers are in X's units: scale them as X
            sampler = sampler.in_units_of(ctx.scaler)
        weighted = ctx.sample_weight is not None and "sample_weight" in inspect.signature(sampler.select).parameters
        dictionary = sampler.select(
            ctx.X, ctx.kernel, n_centers=ctx.n_centers, penalty=float(p.penalty),
            random_state=seed_of(p.random_state), executor=ctx.executor,
            **({"sample_weight": ctx.sample_weight} if weighted else {}),
        )
        logger.info("selected %d centers with %s in %.2fs", dictionary.size, type(sampler).__name__,
                    time.perf_counter() - t0)
        ctx.events.emit(ev.CentersChosen(dictionary))
    ctx.dictionary = dictionary
    ctx.centers = np.ascontiguousarray(dictionary.centers, dtype=ctx.X.dtype)


# --------------------------------------------------------------------------- preconditioner
def falkon_preconditioner(ctx: FitContext, *, sketch: bool = True, iterative: bool = True) -> None:
    """FALKON's factors ``T`` and ``A`` from ``K_MM`` (weighted by the centers' weights),
    optionally with ``A`` from a sketch of sampled rows (:mod:`daskkrr.solvers.sketch`).
    ``iterative=False`` (a direct solve) keeps a float64 fit's round-off jitter
    (:func:`~daskkrr.solvers.falkon.jitter_floor`).

    The sketch's size is the estimator's ``preconditioner_rows``, or with "auto"
    the one of least expected time to ``tol`` (:func:`~daskkrr.parallel.strategies.plan_sketch`);
    its Gram matrix runs in float32 for a float32 fit where that is accurate
    (:func:`~daskkrr.solvers.sketch.sketch_precision`)."""
    p = ctx.params
    Z = ctx.centers
    if Z is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    n = ctx.n
    precision = sketch_precision(ctx.X.dtype)
    rows = 0
    factoring = factor_precision(ctx.X.dtype, Z.shape[0])
    # A direct solve factors the M x M system on the client anyway: the dense route is its only one.
    ctx.factor_plan = plan_factor_route(Z.shape[0], factoring, route=getattr(p, "preconditioner_route", "auto")
                                        if iterative else "dense", memory_budget=getattr(p, "memory_budget", None),
                                        executor=ctx.executor)
    tiled = ctx.factor_plan.route == "tiled"
    if tiled and getattr(p, "compute_std", False) and getattr(p, "std_method", "exact") == "fast":
        # refused before the data passes: the tiled posterior (daskkrr.parallel.tiled_posterior) is exact only
        raise ValueError(f"std_method='fast' cannot be used on the tiled preconditioner route "
                         f"({ctx.factor_plan.reason}): {FAST_STD_REFUSED}. Pass std_method='exact' or 'auto' (both "
                         "then give the exact variance), or fewer centers (or preconditioner_route='dense' where the "
                         "client has the memory for "
                         f"{Z.shape[0]} x {Z.shape[0]} matrices)")
    if sketch:
        saved = getattr(ctx.store, "saved_sketch_rows", lambda: None)()  # a resumed fit keeps its sketch
        saved_on = getattr(ctx.store, "saved_sketch_on", lambda: None)()  # ... and where it was summed
        max_iter, tol = int(getattr(p, "max_iter", 1)), float(getattr(p, "tol", 1e-7))
        budget: dict[str, Any] = {"max_iter": max_iter, "tol": tol}
        replan = saved is not None and _sketch_planned_for_other_budget(ctx, budget)
        if saved and getattr(ctx.store, "saved_sketch_seed", lambda: SKETCH_SEED)() != SKETCH_SEED:
            ctx.store.restart_solver("its sketch rows were drawn by an older daskkrr, from the centers' last bits "
                                     "(which the chunking and the CPU change); this one draws them from the "
                                     "centers' row indices, a different preconditioner")
        ctx.sketch_plan = plan_sketch(
            None if tiled else p._sketch_rows() if saved is None or replan else (saved or None), ctx.X,
            n_centers=Z.shape[0],
            n_targets=int(ctx.Y.shape[1]) + bool(getattr(p, "fit_intercept", False)) + (ctx.sample_weight is not None),
            max_iter=max_iter, tol=tol,
            strategy=getattr(p, "strategy", "auto"), sketch_itemsize=np.dtype(precision).itemsize,
            executor=ctx.executor, in_memory=ctx.in_memory, on=saved_on,
        )
        rows = ctx.sketch_plan.rows
        if replan and rows != saved:
            ctx.store.restart_solver(
                f"preconditioner_rows='auto' plans {rows} sketch rows for max_iter={max_iter}, "
                f"tol={tol:g}, but the interrupted fit planned {saved} for its own max_iter and tol; "
                "its CG state belongs to that preconditioner")
        save_rows = getattr(ctx.store, "save_sketch_rows", None)
        if save_rows is not None and getattr(ctx.store, "enabled", False):
            # the budget the rows were planned for; rows kept from an older checkpoint keep its (unknown) one
            save_rows(rows, ctx.sketch_plan.on, planned_for=budget if saved is None or replan else None,
                      seed=SKETCH_SEED)
    if tiled:  # FALKON's own preconditioner, no sketch (see daskkrr.parallel.tiled_falkon)
        _tiled_preconditioner(ctx, iterative, factoring)
        return
    row_sketch: KernelRowSketch | WorkerRowSketch | None = None
    if rows:
        idx = sketch_indices(n, rows, Z, ctx.dictionary.indices)
        weights = sketch_row_weights(ctx, idx)
        if ctx.sketch_plan is not None and ctx.sketch_plan.on == "workers":  # each block sums its own rows
            row_sketch = WorkerRowSketch(ctx.executor.passes(ctx.X), ctx.kernel, idx, Z, row_weights=weights)
        else:
            sampled = ctx.executor.passes(ctx.X).gather_rows(idx)
            row_sketch = KernelRowSketch(ctx.kernel, sampled, Z, row_weights=weights, dtype=precision)
    Z64 = Z.astype(np.float64)
    t0 = time.perf_counter()
    ctx.preconditioner = FalkonPreconditioner.from_kernel_matrix(
        ctx.kernel(Z64, Z64), penalty=float(p.penalty), n=weight_sum(ctx),
        weights=None if ctx.dictionary.is_uniform else ctx.dictionary.weights, sketch=row_sketch,
        center_sketch=bool(getattr(p, "fit_intercept", False)), precision=precision, overwrite_kmm=True,
        relative_jitter=jitter_floor(ctx.X.dtype, float(p.penalty), iterative=iterative),
        factor_precision=factoring,
    )
    ctx.sketch_rows = 0 if row_sketch is None else int(row_sketch.rows)
    logger.info("preconditioner from %d sketch rows (%s, on the %s), factored in %s, in %.2fs", ctx.sketch_rows,
                ctx.preconditioner.precision, "client" if ctx.sketch_plan is None else ctx.sketch_plan.on,
                ctx.preconditioner.factor_precision, time.perf_counter() - t0)


def _sketch_planned_for_other_budget(ctx: FitContext, budget: dict[str, Any]) -> bool:
    """Whether a resumed fit re-plans its sketch: with ``preconditioner_rows="auto"``, when the
    interrupted fit planned it for another ``max_iter`` or ``tol``. The cost model sizes the sketch
    for the iterations it may take (a fit stopped by ``max_iter=3`` gets none, FALKON's own
    preconditioner); kept for a resume to ``max_iter=30``, that plan would end the CG unconverged
    where the uninterrupted fit converges."""
    planned = getattr(ctx.store, "saved_sketch_budget", lambda: None)()
    return ctx.params._sketch_rows() == "auto" and planned is not None and planned != budget


def _tiled_preconditioner(ctx: FitContext, iterative: bool, factoring: str) -> None:
    """FALKON's factors as tiles on the workers (or spilled), as the factor plan says."""
    p, Z, plan = ctx.params, ctx.centers, ctx.factor_plan
    if Z is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    t0 = time.perf_counter()
    ctx.preconditioner = TiledFalkonPreconditioner.from_centers(
        ctx.executor, Z.astype(np.float64), ctx.kernel, penalty=float(p.penalty), n=weight_sum(ctx), tile=plan.tile,
        weights=None if ctx.dictionary.is_uniform else ctx.dictionary.weights,
        center_sketch=bool(getattr(p, "fit_intercept", False)),
        relative_jitter=jitter_floor(ctx.X.dtype, float(p.penalty), iterative=iterative),
        factor_precision=factoring, spill=plan.storage == "zarr",
    )
    ctx.sketch_rows = 0
    logger.info("tiled preconditioner (%s) factored in %s in %.2fs", plan.reason, factoring,
                time.perf_counter() - t0)


def weight_sum(ctx: FitContext) -> float:
    """The "n" of the penalty: the sum of the row weights (the number of rows without weights)."""
    return float(ctx.weight_sum) if ctx.sample_weight is not None else float(ctx.n)


def sketch_row_weights(ctx: FitContext, idx: np.ndarray) -> np.ndarray | None:
    """Weights of the sketch rows ``idx`` (drawn uniformly): ``w_i / mean(w)``, or None without weights.

    ``(1/s) sum_i (w_i / mean(w)) k_i k_i^T`` over uniform rows estimates
    ``K_nM^T W K_nM / W_sum`` as the unweighted sketch estimates ``K_nM^T K_nM / n``;
    only the ``s`` sampled weights travel to the client.
    """
    if ctx.sample_weight is None:
        return None
    w = ctx.executor.passes(ctx.sample_weight[:, None]).gather_rows(idx)[:, 0]
    return np.asarray(w, dtype=np.float64) * (ctx.n / weight_sum(ctx))


# --------------------------------------------------------------------------- operator
def kernel_operator(ctx: FitContext, *, strategy: str | None = None, preconditioned: bool = True) -> None:
    """The operator that gives the solver ``K_nM^T Y`` and ``K_nM^T K_nM u``.

    The strategy (recompute, cache, gram) comes from the cost model unless given
    (see :mod:`daskkrr.parallel.strategies`). With an intercept the targets get a
    column of ones, so the rhs pass also yields ``K_nM^T 1``. With row weights
    the operator is the weighted one (:mod:`daskkrr.parallel.weighted`):
    ``K_nM^T W Y`` and ``K_nM^T W K_nM u``, the weights riding as the targets'
    last column.
    """
    p = ctx.params
    Z = ctx.centers
    if Z is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    Y = ctx.Y
    if getattr(p, "fit_intercept", False):
        ones = da.ones((ctx.n, 1), chunks=(Y.chunks[0], (1,)))
        # "tasks": a column merge needs no shuffle (and Dask's choice would import distributed).
        Y = da.concatenate([Y, ones], axis=1).rechunk({1: -1}, method="tasks")
    weighted = ctx.sample_weight is not None
    if weighted:
        Y = with_weights(Y, ctx.sample_weight)
    ctx.plan = plan_strategy(
        strategy if strategy else getattr(p, "strategy", "auto"), ctx.X, n_centers=Z.shape[0], n_targets=Y.shape[1],
        iterations=int(getattr(p, "max_iter", 1)), tol=float(getattr(p, "tol", 1e-7)),
        executor=ctx.executor, in_memory=ctx.in_memory, sketch_rows=ctx.sketch_rows,
        tiled_factor=ctx.factor_plan is not None and ctx.factor_plan.route == "tiled",
    )
    ctx.passes = prepare_passes(ctx.X, Y, ctx.executor, ctx.plan)
    build = make_weighted_operator if weighted else make_operator
    ctx.operator = build(ctx.plan.strategy, ctx.passes, ctx.kernel, ctx.executor.broadcast(Z),
                         Z.shape[0], preconditioner=ctx.preconditioner if preconditioned else None)


# --------------------------------------------------------------------------- solve
def cg_solve(ctx: FitContext) -> None:
    """FALKON's preconditioned CG; each step is one operator product (a pass, or M x M work)."""
    p = ctx.params
    saved = ctx.store.saved_rhs()
    if saved is None:
        rhs = np.asarray(ctx.operator.rhs(), dtype=np.float64)
        ctx.events.emit(ev.RhsComputed(rhs))
    else:
        rhs = saved
        ctx.events.emit(ev.RhsComputed(rhs, restored=True))
    b, ctx.mu = split_column_sums(rhs, weight_sum(ctx), bool(getattr(p, "fit_intercept", False)))
    gram_matvec = ctx.operator.gram_matvec
    if ctx.mu is not None:
        gram_matvec = centered_gram_matvec(gram_matvec, ctx.mu, weight_sum(ctx))

    def step(iteration: int, rel: np.ndarray) -> None:
        ctx.events.emit(ev.SolverStep(int(iteration), float(np.max(rel))))

    def save(state: Any) -> None:
        ctx.events.emit(ev.SolverState(state))

    try:
        coef, result = falkon_solve(
            ctx.preconditioner, gram_matvec, b, tol=float(p.tol), max_iter=int(p.max_iter), callback=step,
            state=ctx.store.cg_state, on_state=save if getattr(ctx.store, "enabled", False) else None,
            state_every=ctx.store.every,
        )
    finally:
        close = getattr(ctx.preconditioner, "close", None)
        # the tiled factors: free the workers' memory and the spill store, unless the posterior needs T
        # (ctx.close frees them then, however the fit ends)
        if close is not None and not getattr(p, "compute_std", False):
            close()
    ctx.n_iter, ctx.converged = int(result.n_iter), bool(result.converged)
    ctx.fitted.update(n_iter_=ctx.n_iter, residuals_=result.residuals, converged_=ctx.converged)
    if not ctx.converged:
        warn_not_converged(result, tol=float(p.tol), max_iter=int(p.max_iter), dtype=str(ctx.X.dtype))
    _nystrom_model(ctx, coef)


def direct_solve(ctx: FitContext, *, penalties: np.ndarray | None = None) -> None:
    """One Gram pass (the operator's), then the ``M x M`` system on the client.

    ``penalties``: solve it for each of them instead of the estimator's penalty (one target;
    the model gets one column per penalty, see :mod:`daskkrr.pipeline.penalty_path`).
    """
    p = ctx.params
    b, ctx.mu = split_column_sums(ctx.operator.knm_t_y, weight_sum(ctx), bool(getattr(p, "fit_intercept", False)))
    gram = ctx.operator.gram
    if getattr(ctx.operator, "factor", None) is not None:  # accumulated preconditioned (compute_std)
        coef = ctx.preconditioner.direct_solve_preconditioned(gram, b, ctx.mu)
    else:
        if ctx.mu is not None:
            gram -= weight_sum(ctx) * np.outer(ctx.mu, ctx.mu)
        if penalties is None:
            coef = ctx.preconditioner.direct_solve(gram, b)
        else:
            coef = ctx.preconditioner.direct_solve_path(gram, b, penalties)
            ctx.one_d = False  # one column per penalty
    ctx.fitted.update(n_iter_=0, residuals_=np.zeros((1, coef.shape[1])), converged_=True)
    _nystrom_model(ctx, coef)


def _nystrom_model(ctx: FitContext, coef: np.ndarray) -> None:
    """The fitted Nystrom model: centers, coefficients, intercept and how the fit went."""
    if ctx.mu is not None:  # f(x) = k(x, Z) coef + b with b = mean_w(y - K_nM coef), unpenalised
        ctx.fitted["intercept_"] = ctx.y_mean - ctx.mu @ coef.reshape(coef.shape[0], -1)
    d, pre = ctx.dictionary, ctx.preconditioner
    ctx.fitted.update(
        centers_=ctx.centers, center_indices_=d.indices, center_weights_=d.weights,
        sampler_info_=dict(d.info), jitter_=float(pre.jitter),
        coef_=coef[:, 0] if (ctx.one_d and coef.ndim == 2) else coef,
        strategy_=ctx.plan.strategy, preconditioner_rows_=ctx.sketch_rows,
        preconditioner_dtype_="float32" if "float32" in (pre.factor_precision, pre.precision) else "float64",
        preconditioner_costs_=[] if ctx.sketch_plan is None else [c.as_dict() for c in ctx.sketch_plan.costs],
        preconditioner_route_={} if ctx.factor_plan is None else ctx.factor_plan.as_dict(),
        n_data_passes_=ctx.passes.n_passes + 1,  # + the statistics pass
    )


def exact_solve(ctx: FitContext, *, penalties: np.ndarray | None = None) -> None:
    """Exact KRR: the training data on the client, ``(K + penalty n I) c = y`` factored there
    (with weights, the symmetric ``(W^1/2 K W^1/2 + penalty W_sum I)``, see
    :func:`~daskkrr.solvers.exact_krr_coefficients`). With ``penalties`` (one target, no
    ``compute_std``) the coefficients for each, one column per penalty
    (:func:`~daskkrr.solvers.exact.exact_krr_path`, for :mod:`daskkrr.pipeline.penalty_path`)."""
    p = ctx.params
    n = ctx.n
    arrays = (ctx.X, ctx.Y) if ctx.sample_weight is None else (ctx.X, ctx.Y, ctx.sample_weight)
    # sparse X stays sparse (its kernel from sparse dot products); the centers_ are its rows, densified
    Xn, Yn, *wn = (a if is_sparse_array(a) else np.asarray(a) for a in ctx.executor.compute(*arrays))
    post = None
    if penalties is not None:
        coef = exact_krr_path(ctx.kernel(Xn, Xn), Yn, penalties, sample_weight=wn[0] if wn else None)
        ctx.one_d = False  # one column per penalty
    else:
        coef, factor = exact_krr_solve(ctx.kernel(Xn, Xn), Yn, float(p.penalty),
                                       sample_weight=wn[0] if wn else None)
        # compute_std keeps the n x n factor of K + lambda n I (see daskkrr.solvers.variance);
        # a weighted fit refuses compute_std before any work (daskkrr.models.weights.refuse_weighted_std).
        if getattr(p, "compute_std", False):
            post = exact_posterior(factor, Yn, coef, float(p.penalty) * n)
        del factor
    ctx.fitted.update(
        posterior_=post,
        centers_=dense_rows(Xn), center_indices_=np.arange(n, dtype=np.int64),
        center_weights_=np.ones(n), sampler_info_={"sampler": "all"},
        coef_=coef[:, 0] if ctx.one_d else coef, n_iter_=0, residuals_=np.zeros((1, Yn.shape[1])),
        converged_=True, jitter_=0.0, n_data_passes_=2,
    )


#: float64 n x n matrices exact KRR holds at once (K, K + lambda n I, its Cholesky factor)
#: and its flops / n^3 (the Cholesky factorisation).
EXACT_KRR_MATRICES = 3
EXACT_KRR_CUBIC_FLOPS = 1 / 3


def check_exact_resources(params: Any, n: int, d: int, executor: Any = None) -> None:
    """Refuse exact KRR above ``max_samples`` or beyond the memory (see :mod:`daskkrr.parallel.guards`)."""
    cost = quadratic_cost(type(params).__name__, n, d, matrices=EXACT_KRR_MATRICES, cubic=EXACT_KRR_CUBIC_FLOPS)
    check_quadratic(cost, alternative="use FalkonRegressor (Nystrom centers: memory O(n M), not O(n^2))",
                    executor=executor, max_rows=int(params.max_samples), max_rows_name="max_samples")


Guard = Callable[[FitContext, int, int], None]


def sampler_guard(ctx: FitContext, n: int, d: int) -> None:
    """The sampler's own resource check (the exact leverage-score sampler has one)."""
    check = getattr(make_sampler(ctx.params.sampler), "check_resources", None)
    if check is not None:
        check(n, d, ctx.executor)


def exact_guard(ctx: FitContext, n: int, d: int) -> None:
    """Exact KRR's check: ``max_samples`` and the memory of its n x n matrices."""
    check_exact_resources(ctx.params, n, d, ctx.executor)


def training_shape(X: Any, y: Any, chunks: int | None) -> tuple[int, int]:
    """``(n, d)`` of the training features, from their metadata (a store is opened lazily)."""
    refuse_unknown_chunks(X, "X")
    # hasattr last: a dask DataFrame's shape is a lazy expression, built (and warned about under a fit's annotations)
    if (isinstance(X, da.Array) or is_in_memory(X)) and hasattr(X, "shape"):
        shape = tuple(X.shape)
    else:
        shape = tuple(load_training_data(X, y, chunks)[0].shape)
    return int(shape[0]), int(shape[1]) if len(shape) > 1 else 1


def guarded_statistics(guard: Guard) -> Callable[[FitContext], None]:
    """:func:`statistics`, preceded by ``guard(ctx, n, d)``: a fit whose n^2 steps would not fit
    in memory is refused from the data's shape alone, before any pass over the data."""

    def run(ctx: FitContext) -> None:
        n, d = training_shape(ctx.X_in, ctx.y_in, getattr(ctx.params, "chunks", None))
        ctx.params._make_kernel(d)  # e.g. a per-feature sigma of the wrong length: refused before any pass
        guard(ctx, n, d)
        statistics(ctx)

    return run


def exact_stages() -> tuple[Stage, ...]:
    """The stages of exact KRR: statistics (after the resource check), then the n x n solve."""
    return (Stage("statistics", guarded_statistics(exact_guard)), Stage("solve", exact_solve))


# --------------------------------------------------------------------------- helpers
#: A CG that stops above this relative residual says its model may be far from the solution.
FAR_RESIDUAL = 0.1


def warn_not_converged(result: Any, *, tol: float, max_iter: int, dtype: str) -> None:
    """A ConvergenceWarning for a CG that stopped above ``tol``, saying why and what to do."""
    residual = float(np.max(result.residuals[-1]))
    if result.stagnated:
        why = (f"the residual stopped falling after {result.n_iter} iterations (the attainable accuracy"
               f" of {dtype} kernel blocks)")
        advice = "raise tol" + (", or use dtype='float64'" if dtype == "float32" else "")
    elif result.n_iter < max_iter:
        # every column left either converged or stopped where p^T A p <= 0
        why = (f"after {result.n_iter} iterations round-off made the system look indefinite (p^T A p <= 0)"
               f" for a column still above tol")
        advice = "raise tol" + (", or use dtype='float64'" if dtype == "float32" else "")
    else:
        why = f"max_iter={max_iter} iterations were not enough"
        advice = "raise max_iter, or raise tol"
    # Past FAR_RESIDUAL the iterate may be far from the solution (a residual of 1 is the zero model).
    state = ("is usable but not the exact Nystrom solution" if residual <= FAR_RESIDUAL else
             "may be far from the Nystrom solution: check its score before using it")
    warnings.warn(
        f"CG stopped at relative residual {residual:.3g} > tol={tol:g}: {why}. The model {state};"
        f" {advice} (or raise penalty, which makes the system easier)",
        ConvergenceWarning, stacklevel=2,
    )


def split_column_sums(knm_t_y: np.ndarray, n: float, intercept: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``K_nM^T Y`` and, with an intercept, ``mu = K_nM^T 1 / n`` (the last column; with
    weights ``K_nM^T w / W_sum``, ``n`` being the sum of the weights)."""
    if not intercept:
        return knm_t_y, None
    return np.ascontiguousarray(knm_t_y[:, :-1]), knm_t_y[:, -1] / n


def seed_of(random_state: Any) -> int | None:
    """One integer seed from ``random_state`` (int, None, or a numpy Generator/RandomState)."""
    import numbers

    if random_state is None or isinstance(random_state, numbers.Integral):
        return None if random_state is None else int(random_state)
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**63 - 1))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2**31 - 1))
    raise TypeError(f"random_state must be None, an int or a numpy Generator; got {random_state!r}")


def nystrom_stages(solver: str) -> tuple[Stage, ...]:
    """The stages of a Nystrom fit: ``"falkon"`` (preconditioned CG, row sketch, any strategy)
    or ``"direct"`` (one Gram pass, ``M x M`` solve)."""
    if solver == "falkon":
        return (
            Stage("statistics", guarded_statistics(sampler_guard)),
            Stage("centers", choose_centers),
            Stage("preconditioner", falkon_preconditioner),
            Stage("operator", kernel_operator),
            Stage("solve", cg_solve),
        )
    if solver == "direct":
        return (
            Stage("statistics", guarded_statistics(sampler_guard)),
            Stage("centers", choose_centers),
            Stage("preconditioner", lambda ctx: falkon_preconditioner(ctx, sketch=False, iterative=False)),
            Stage("operator", lambda ctx: kernel_operator(ctx, strategy="gram", preconditioned=False)),
            Stage("solve", direct_solve),
        )
    raise ValueError(f"unknown Nystrom solver {solver!r}; expected 'falkon' or 'direct'")
