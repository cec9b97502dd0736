"""The stages of the unsupervised fits: Nystrom kernel PCA and Nystrom kernel k-means.

Both start as the supervised fits do, without a target: one pass for the feature
statistics (:func:`feature_statistics`), then the sampler's centers
(:func:`~daskkrr.pipeline.stages.choose_centers`) and the Nystrom basis
``P = K_MM^{+1/2}`` on the client (:func:`nystrom_basis_stage`). Then:

- kernel PCA (:func:`kpca_solve`): one pass tree-sums the whitened moments of the
  embedding, and the ``r x r`` centred covariance is diagonalised on the client;
- kernel k-means: k-means|| seeding (:func:`kmeans_seed`, ``init_rounds`` passes and
  one for the candidates' weights), then Lloyd (:func:`lloyd_solve`), one pass per
  iteration. The ``n x M`` kernel rows are kept in the workers' memory only when the
  cost model says they fit (:func:`daskkrr.parallel.cost.embedding_fits`).

The arithmetic is in :mod:`daskkrr.solvers.nystrom_embedding` and
:mod:`daskkrr.solvers.kmeans`; the passes go through ``ctx.executor``.
"""

from __future__ import annotations

import dataclasses
import functools
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
from daskkrr.data.extremes import check_fit_magnitudes
from daskkrr.data.feature_names import fitted_feature_names
from daskkrr.data.inputs import load_features
from daskkrr.kernels.sparse import dense_rows
from daskkrr.parallel import BlockPasses
from daskkrr.parallel.cost import Budget, embedding_fits, should_persist
from daskkrr.parallel.strategies import balance_blocks
from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.stages import Stage, choose_centers, sampler_guard, seed_of, start_statistics
from daskkrr.sampling.keyed_random import keyed_rng, resolve_seed, row_uniforms
from daskkrr.solvers.kmeans import (
    LloydStep,
    candidate_weights_block,
    centroid_products,
    labels_block,
    lloyd_block,
    lloyd_kept_block,
    parallel_candidates,
    reduce_candidates,
)
from daskkrr.solvers.nystrom_embedding import (
    center_shift,
    embedded_tiles,
    kernel_tiles,
    kpca_from_moments,
    moments_block,
    nystrom_basis,
    projection,
)

logger = logging.getLogger("daskkrr")

#: Keyed-random stream of the k-means|| draws (see :mod:`daskkrr.sampling.keyed_random`).
STREAM_KMEANS_PARALLEL = 13
#: Keyed-random stream of the first center, random init and the client's k-means++.
STREAM_KMEANS_INIT = 14


@dataclasses.dataclass
class EmbeddingState:
    """What the unsupervised stages share beyond :class:`FitContext`."""

    #: The kernel matrix of the centers and the Nystrom basis ``P`` (M, r).
    K_MM: np.ndarray | None = None
    P: np.ndarray | None = None
    passes: BlockPasses | None = None
    #: Initial centroids (k, r) in the embedding, one array per run (``n_init``), and
    #: ``sum ||phi(x_i)||^2`` if known.
    inits: list[np.ndarray] = dataclasses.field(default_factory=list)
    total_sq_norm: float | None = None


# --------------------------------------------------------------------------- statistics
def feature_statistics(ctx: FitContext) -> None:
    """Open ``X`` (no target), one pass for its statistics and finiteness, scale, resolve the kernel."""
    p = ctx.params
    t0 = time.perf_counter()
    Xd = load_features(ctx.X_in, p.chunks, for_fit=True)
    if Xd.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {Xd.shape}")
    n, d = (int(s) for s in Xd.shape)
    ctx.input_dtype = Xd.dtype
    sampler_guard(ctx, n, d)
    p._check_data_size(n)
    scaler = start_statistics(ctx, Xd, int(p.n_centers))
    scaler.fit(Xd)  # one pass: statistics and finiteness of X (NaN rows named)
    # Extreme magnitudes are refused before any kernel is evaluated (the embedding is in float64).
    check_fit_magnitudes(scaler.magnitudes_, standardize=p.standardize, fit_dtype=np.float64, input_dtype=Xd.dtype,
                         scale=scaler.scale_)
    ctx.events.emit(ev.PassDone("statistics", Xd.numblocks[0]))
    logger.info("statistics pass over %d rows in %.2fs", n, time.perf_counter() - t0)
    ctx.scaler = scaler if p.standardize else None
    ctx.X = (scaler.transform(Xd) if p.standardize else Xd).astype(np.float64)
    ctx.kernel = p._make_kernel(d)
    ctx.fitted.update(scaler_=ctx.scaler, n_features_in_=d, kernel_=ctx.kernel,
                      **fitted_feature_names(p, ctx.X_in, d))


def nystrom_basis_stage(ctx: FitContext, state: EmbeddingState) -> None:
    """``K_MM`` and the Nystrom basis ``P`` (M, r) on the client; the fitted centers."""
    if ctx.centers is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    Z = np.ascontiguousarray(ctx.centers, dtype=np.float64)
    ctx.centers = Z
    state.K_MM = np.asarray(ctx.kernel(Z, Z), dtype=np.float64)
    state.P = nystrom_basis(state.K_MM)
    d = ctx.dictionary
    ctx.fitted.update(centers_=Z, center_indices_=d.indices, center_weights_=d.weights,
                      sampler_info_=dict(d.info), basis_=state.P)


def embedding_passes(ctx: FitContext, *, repeated: bool = False) -> BlockPasses:
    """Passes over the scaled rows, balanced over the task slots; persisted when read repeatedly
    and small (the cost model's rule for the "recompute" strategy)."""
    res = ctx.executor.resources()
    X, _ = balance_blocks(ctx.X, None, res.slots)
    passes = ctx.executor.passes(X)
    passes.thread_budget = res.thread_budget
    budget = Budget(cores=res.cores, memory_bytes=res.memory_bytes, n_workers=res.n_workers)
    if repeated and should_persist("recompute", int(X.shape[0]) * int(X.shape[1]) * 8, budget, ctx.in_memory):
        passes.persist()
    return passes


# --------------------------------------------------------------------------- kernel PCA
def kpca_solve(ctx: FitContext, state: EmbeddingState) -> None:
    """One pass for the centred covariance of the embedding; its eigendecomposition on the client."""
    p = ctx.params
    P, K_MM = state.P, state.K_MM
    if P is None or K_MM is None:
        raise RuntimeError("the Nystrom basis is not computed yet; run nystrom_basis_stage first")
    r = P.shape[1]
    k = r if p.n_components is None else int(p.n_components)
    if k > r:
        raise ValueError(
            f"n_components={k} is larger than the dimension of the Nystrom embedding: M={P.shape[0]}"
            f" centers whose kernel matrix has numerical rank {r}; ask for at most {r} components or use"
            " more centers (n_centers)"
        )
    shift = center_shift(K_MM, P)
    passes = embedding_passes(ctx)
    Zb, Pb = ctx.executor.broadcast(ctx.centers), ctx.executor.broadcast(P)
    moments = passes.map_reduce(moments_block, ctx.kernel, Zb, Pb, shift, name="moments")
    result = kpca_from_moments(moments, ctx.n, shift)
    W, offset = projection(P, result, k)
    trace = float(result.eigenvalues.sum())
    ratio = result.eigenvalues[:k] / trace if trace > 0 else np.zeros(k)
    ctx.fitted.update(
        coef_=W, intercept_=-offset, eigenvalues_=result.eigenvalues[:k].copy(),
        explained_variance_ratio_=ratio, n_components_=k, rank_=int(r),
        n_data_passes_=passes.n_passes + 1, n_iter_=0,
    )


# --------------------------------------------------------------------------- k-means seeding
def _seeding_task(Xb: np.ndarray, first_row: int, kernel: Any, Z: np.ndarray, P: np.ndarray,
                  C: np.ndarray, seed: int, round_: int, cap: int | None) -> tuple:
    """A block of one k-means|| round, tile by tile (see :func:`parallel_candidates`)."""
    cost = 0.0
    kept: tuple | None = None
    for start, E in embedded_tiles(Xb, kernel, Z, P):
        rows = np.arange(first_row + start, first_row + start + E.shape[0], dtype=np.int64)
        u = row_uniforms(seed, STREAM_KMEANS_PARALLEL, round_, rows)
        c, ratio, idx, pts = parallel_candidates(E, rows, u, C, cap)
        cost += c
        if kept is not None:
            ratio, idx, pts = (np.concatenate([a, b]) for a, b in zip(kept, (ratio, idx, pts)))
            order = np.argsort(-ratio, kind="stable")[: cap if cap is not None else None]
            ratio, idx, pts = ratio[order], idx[order], pts[order]
        kept = (ratio, idx, pts)
    if kept is None:
        kept = (np.empty(0), np.empty(0, dtype=np.int64), np.empty((0, P.shape[1])))
    return (cost, *kept)


def _embed_rows(ctx: FitContext, P: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Embedding of scaled rows on the client."""
    return np.asarray(ctx.kernel(rows, ctx.centers), dtype=np.float64) @ P


def _random_rows(ctx: FitContext, passes: BlockPasses, P: np.ndarray, seed: int, count: int,
                 exclude: np.ndarray) -> np.ndarray:
    """Embeddings of ``count`` distinct rows drawn uniformly (keyed by the seed), not in ``exclude``."""
    rng = keyed_rng(seed, STREAM_KMEANS_INIT, 1)
    pool = np.setdiff1d(np.arange(ctx.n, dtype=np.int64), exclude)
    idx = np.sort(rng.choice(pool, size=count, replace=False))
    return _embed_rows(ctx, P, passes.gather_rows(idx))


def kmeans_runs(init: Any, n_init: Any) -> int:
    """How many seedings and Lloyd runs: ``n_init``, where "auto" means 10 for "random"
    and 1 otherwise (scikit-learn's rule for its k-means++), and 1 for given points."""
    if not isinstance(init, str):
        if n_init not in ("auto", 1):
            warnings.warn(f"init is an array of centroids, so one run is made, not n_init={n_init}",
                          RuntimeWarning, stacklevel=3)
        return 1
    if n_init == "auto":
        return 10 if init == "random" else 1
    return int(n_init)


def run_seed(seed: int, run: int) -> int:
    """The seed of run ``run``: the fit's own for the first (``n_init=1`` gives the same model
    whatever ``n_init`` was), then one drawn from the keyed stream."""
    return seed if run == 0 else int(keyed_rng(seed, STREAM_KMEANS_INIT, 3, run).integers(2**62))


def kmeans_seed(ctx: FitContext, state: EmbeddingState) -> None:
    """Initial centroids of every run: k-means|| (a few passes each), ``k`` random rows, or
    the given points."""
    p = ctx.params
    P = state.P
    if P is None:
        raise RuntimeError("the Nystrom basis is not computed yet; run nystrom_basis_stage first")
    k = int(p.n_clusters)
    seed = resolve_seed(seed_of(p.random_state))
    state.passes = passes = embedding_passes(ctx, repeated=True)
    init = p.init
    runs = kmeans_runs(init, getattr(p, "n_init", 1))
    if not isinstance(init, str):
        points = np.asarray(dense_rows(init), dtype=np.float64)  # k rows: a sparse init is densified
        if points.shape != (k, ctx.n_features):
            raise ValueError(f"init has shape {points.shape}; expected (n_clusters, n_features) = "
                             f"({k}, {ctx.n_features})")
        if ctx.scaler is not None:
            points = np.asarray(ctx.scaler.transform(points), dtype=np.float64)
        state.inits = [_embed_rows(ctx, P, points)]
        return
    if init == "random":
        state.inits = [_random_rows(ctx, passes, P, run_seed(seed, r), k, np.empty(0, dtype=np.int64))
                       for r in range(runs)]
        return
    state.inits = [_kmeans_parallel(ctx, state, passes, P, k, run_seed(seed, r)) for r in range(runs)]


def _kmeans_parallel(ctx: FitContext, state: EmbeddingState, passes: BlockPasses, P: np.ndarray, k: int,
                     seed: int) -> np.ndarray:
    """k-means|| (Bahmani et al. 2012): C = one uniform row; each round samples every row
    independently with probability min(1, l d^2(x, C) / psi(C)), l = oversampling_factor * k;
    then weighted k-means++ on the candidates, on the client."""
    p = ctx.params
    t0 = time.perf_counter()
    first = int(keyed_rng(seed, STREAM_KMEANS_INIT, 0).integers(ctx.n))
    C = _embed_rows(ctx, P, passes.gather_rows(np.array([first])))
    rows = [np.array([first], dtype=np.int64)]
    ell = float(p.oversampling_factor) * k
    cap = int(math.ceil(2 * ell)) + 16
    Zb, Pb = ctx.executor.broadcast(ctx.centers), ctx.executor.broadcast(P)
    for round_ in range(int(p.init_rounds)):
        parts = passes.map(_seeding_task, ctx.kernel, Zb, Pb, C, seed, round_, cap, name="seeding",
                           with_offsets=True)
        psi = float(sum(part[0] for part in parts))
        if psi <= 0:
            break  # every row is a candidate already
        threshold = psi / ell  # sampled iff u < l d^2 / psi, i.e. d^2 / u > psi / l
        new_rows, new_points = [], []
        for b, (_, ratio, idx, pts) in enumerate(parts):
            if ratio.size == cap and ratio[-1] > threshold:  # cut short: this block again, uncapped
                _, ratio, idx, pts = passes.map(_seeding_task, ctx.kernel, Zb, Pb, C, seed, round_, None,
                                                name="seeding", with_offsets=True, blocks=[b])[0]
            chosen = ratio > threshold
            new_rows.append(idx[chosen])
            new_points.append(pts[chosen])
        # in row order, so that the candidates do not depend on the blocks
        picked = np.concatenate(new_rows)
        order = np.argsort(picked, kind="stable")
        C = np.vstack([C, np.concatenate(new_points)[order]])
        rows.append(picked[order])
    all_rows = np.concatenate(rows)
    stats = passes.map_reduce(candidate_weights_block, ctx.kernel, Zb, Pb, C, name="seedweights")
    weights, state.total_sq_norm = stats[:-1], float(stats[-1])
    if C.shape[0] < k:  # fewer distinct candidates than clusters: top up with random rows
        C = np.vstack([C, _random_rows(ctx, passes, P, seed, k - C.shape[0], all_rows)])
        weights = np.concatenate([weights, np.ones(k - len(weights))])
    logger.info("k-means|| chose %d candidates in %d rounds (%.2fs)", C.shape[0], int(p.init_rounds),
                time.perf_counter() - t0)
    return reduce_candidates(C, np.maximum(weights, 1e-12), k, keyed_rng(seed, STREAM_KMEANS_INIT, 2))


# --------------------------------------------------------------------------- Lloyd
def _kernel_rows_task(Xb: np.ndarray, kernel: Any, Z: np.ndarray) -> np.ndarray:
    return np.vstack(list(kernel_tiles(Xb, kernel, Z))) if Xb.shape[0] else np.empty((0, Z.shape[0]))


@dataclasses.dataclass
class LloydRun:
    """Where Lloyd's iterations from one initialisation ended."""

    centers: np.ndarray
    inertia: float
    n_iter: int
    converged: bool


def lloyd_solve(ctx: FitContext, state: EmbeddingState) -> None:
    """Lloyd's iterations from each initialisation, one pass each (or a sweep of the kept
    kernel rows); the run of least inertia is the model; then its labels."""
    p = ctx.params
    P, passes = state.P, state.passes
    if P is None or not state.inits or passes is None:
        raise RuntimeError("no initial centroids; run kmeans_seed first")
    M = P.shape[0]
    res = ctx.executor.resources()
    budget = Budget(cores=res.cores, memory_bytes=res.memory_bytes, n_workers=res.n_workers)
    iterations = int(p.max_iter) * len(state.inits)
    keep = p.strategy == "cache" or (p.strategy == "auto" and embedding_fits(ctx.n, M, budget, iterations))
    Zb, Pb = ctx.executor.broadcast(ctx.centers), ctx.executor.broadcast(P)
    kept = passes.keep(_kernel_rows_task, ctx.kernel, Zb, name="kernelrows") if keep else None

    def lloyd_pass(C: np.ndarray, total: float | None) -> np.ndarray:
        A, c_sq = centroid_products(P, C)
        if kept is not None:  # (the local sweep takes arrays, not broadcast handles)
            return passes.reduce_kept(kept, lloyd_kept_block, A, c_sq, P if total is None else None, name="lloyd")
        return passes.map_reduce(lloyd_block, ctx.kernel, Zb, A, c_sq, Pb if total is None else None, name="lloyd")

    def lloyd(C: np.ndarray) -> LloydRun:
        k = C.shape[0]
        tol_abs = None
        converged = strict = False
        inertia = math.inf
        n_iter = 0
        for n_iter in range(1, int(p.max_iter) + 1):
            stats = lloyd_pass(C, state.total_sq_norm)
            if state.total_sq_norm is None:
                state.total_sq_norm = float(stats[k, 1])
            step = LloydStep(stats, C, P, state.total_sq_norm)
            if tol_abs is None:
                tol_abs = float(p.tol) * step.mean_variance
            ctx.events.emit(ev.SolverStep(n_iter, step.shift, solver="Lloyd"))
            inertia, C = step.inertia, step.centers
            if step.shift == 0.0:  # the labels did not change: C is final and so is the inertia
                converged = strict = True
                break
            if step.shift <= tol_abs:
                converged = True
                break
        if not strict:  # labels and inertia of the final centroids (as scikit-learn's last E-step)
            stats = lloyd_pass(C, state.total_sq_norm)
            inertia = max(0.0, float(state.total_sq_norm + stats[k, 0]))
        return LloydRun(C, float(inertia), n_iter, converged)

    try:
        best = lloyd(state.inits[0])
        for run, C0 in enumerate(state.inits[1:], start=2):
            result = lloyd(C0)
            logger.info("k-means run %d of %d: inertia %.6g after %d iterations (best so far %.6g)", run,
                        len(state.inits), result.inertia, result.n_iter, best.inertia)
            if result.inertia < best.inertia:  # ties: the earlier run
                best = result
    finally:
        if kept is not None:
            passes.release(kept)
    ctx.n_iter, ctx.converged = best.n_iter, best.converged
    if not best.converged:
        warnings.warn(
            f"Lloyd's iterations stopped at max_iter={p.max_iter} before the centroids' move fell below "
            f"tol={p.tol:g} (times the data's mean variance in the embedding); raise max_iter or tol",
            ConvergenceWarning, stacklevel=2,
        )
    A, c_sq = centroid_products(P, best.centers)
    if ctx.in_memory:
        labels: Any = np.concatenate(passes.map(labels_block, ctx.kernel, Zb, A, c_sq, name="labels"))
    else:
        labels = lazy_labels(ctx.X, ctx.kernel, chosen_centers(ctx), A, c_sq)
    ctx.fitted.update(
        cluster_centers_=best.centers, inertia_=best.inertia, n_iter_=best.n_iter, converged_=best.converged,
        labels_=labels, strategy_="cache" if kept is not None else "recompute",
        n_data_passes_=passes.n_passes + 1,
    )


def _embedding_stages(*steps: tuple[str, Callable[..., None]]) -> tuple[Stage, ...]:
    """statistics -> centers -> basis -> ``steps`` (name, stage taking ``state=``), on one :class:`EmbeddingState`."""
    state = EmbeddingState()
    steps = (("basis", nystrom_basis_stage), *steps)
    return (Stage("statistics", feature_statistics), Stage("centers", choose_centers),
            *(Stage(name, functools.partial(run, state=state)) for name, run in steps))


def kpca_stages() -> tuple[Stage, ...]:
    """statistics -> centers -> basis -> solve (one pass and an ``r x r`` eigendecomposition)."""
    return _embedding_stages(("solve", kpca_solve))


def kmeans_stages() -> tuple[Stage, ...]:
    """statistics -> centers -> basis -> seeding (k-means||) -> Lloyd."""
    return _embedding_stages(("seeding", kmeans_seed), ("solve", lloyd_solve))


def chosen_centers(ctx: FitContext) -> np.ndarray:
    """The chosen centers (after :func:`choose_centers`)."""
    if ctx.centers is None:
        raise RuntimeError("the centers are not chosen yet; run choose_centers first")
    return ctx.centers


def lazy_labels(X: da.Array, kernel: Any, Z: np.ndarray, A: np.ndarray, c_sq: np.ndarray) -> da.Array:
    """Nearest centroid of every row of the (scaled) dask array ``X``, lazily."""
    block: Any = labels_block
    return X.map_blocks(block, kernel, Z, A, c_sq, drop_axis=1, dtype=np.int64,
                        meta=np.empty(0, dtype=np.int64))


__all__ = [
    "EmbeddingState",
    "embedding_passes",
    "feature_statistics",
    "kmeans_seed",
    "kmeans_stages",
    "kpca_solve",
    "kpca_stages",
    "lazy_labels",
    "lloyd_solve",
    "nystrom_basis_stage",
]
