"""SQUEAK and DISQUEAK samplers: their passes over the row blocks, on the execution layer.

The numerical work (batches, dictionary updates, merges) is in
:mod:`daskkrr.sampling.squeak_core`; this module decides how it runs:

- :class:`SqueakSampler` folds the row blocks in order
  (:meth:`~daskkrr.parallel.executor.BlockPasses.fold`): each block task receives the
  dictionary state and one block and returns the new state, so every block is read
  once and what moves between tasks is O(m d): the dictionary's rows, not its Gram
  (each update recomputes it). The fold runs in segments of at
  most ``max_inflight_bytes`` of blocks (bounding blocks read ahead of the chain);
  between segments the state stays on the cluster and the ``max_dictionary`` budget
  may stop the pass.
- :class:`DisqueakSampler` folds contiguous row ranges (leaves) in parallel and merges
  their dictionaries pairwise along a tree
  (:meth:`~daskkrr.parallel.executor.BlockPasses.tree_merge`, Alg. 2). A merge whose
  dense factor would exceed the memory budget is driven from the client with the union's
  factor as tiles (:func:`tiled_entry_rls`), the others run as merge tasks.

Both may first pick ``gamma`` from a uniform pilot sample so that the dictionary
fits a center budget (:func:`pilot_gamma`). Randomness is keyed by rows, never by
workers, so for a fixed seed the dictionary is the same for any number of workers
and any scheduler (and, for SQUEAK, any chunking).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.events import SamplingProgress
from daskkrr.kernels import Kernel
from daskkrr.parallel.executor import TREES, Executor, gather_rows
from daskkrr.sampling.base import (
    CenterDictionary,
    CenterSampler,
    as_row_chunked,
    register,
    resolve_gamma,
)
from daskkrr.sampling.dictionary import DictionaryState, thin_to_size
from daskkrr.sampling.keyed_random import (
    STREAM_PILOT,
    STREAM_THINNING,
    keyed_rng,
    resolve_seed,
)
from daskkrr.sampling.squeak_core import (
    SqueakParams,
    StreamState,
    estimates_from_inverse_diagonal,
    factor_bytes,
    merge_states,
    stream_block,
    stream_finish,
)

if TYPE_CHECKING:
    import dask.array as da

#: Default number of copies per new row. In our experiments (n = 300-600, Gaussian
#: kernel, eps = 0.5), qbar = 16 kept 0 <= K - K~ <= 2 gamma I in at least 95% of the
#: seeds with a mean error of 1.3-1.6 gamma, while qbar = 8 failed in up to 90% of them
#: at small gamma (a long stream of resampling steps lets entries drift out of the
#: dictionary); qbar = 48-64 keeps every RLS estimate within the alpha bounds too.
#: Theorem 1's qbar = 39 alpha log(2n/delta) / eps^2 (about 6 000 for n = 1e4) is far
#: more conservative. The unique centers grow more slowly than qbar (duplicates merge).
DEFAULT_QBAR = 16
#: Default accuracy parameter. With qbar fixed the dictionary holds about
#: (1 - eps) qbar d_eff(gamma) copies (the estimates carry the factor 1 - eps) and is
#: gamma / (1 - eps)-accurate: eps = 0.5 gives a 2 gamma bound with half the copies of
#: eps -> 0 (eps = 0.3 measured 1.5x the copies of eps = 0.5).
DEFAULT_EPS = 0.5
#: Default seconds between two progress records of one block task: about the dashboard's
#: and the client's polling period (0.5-1 s), so each record is seen and a long block of
#: a few minutes sends a few hundred small messages.
DEFAULT_PROGRESS_INTERVAL = 0.5


# ------------------------------------------------------------ pilot: gamma for a budget
def expected_unique_centers(
    evals: np.ndarray, evecs_sq: np.ndarray, gamma: float, n: int, qbar: int, eps: float
) -> float:
    """Expected unique SQUEAK centers at ``gamma`` from the pilot's spectrum.

    With ``Phi Phi^T ~ (n/s) Phi_s Phi_s^T``, the RLS of a row is
    ``tau_i(gamma) ~ (s/n) tau^s_i(gamma s / n)`` where ``tau^s`` are the exact RLS of the
    pilot's own kernel matrix. A SQUEAK entry ends with ``p_i ~ (1 - eps) tau_i``, so the
    expected number of unique centers is ``(n/s) sum_j [1 - (1 - p_j)^qbar]`` over the pilot.
    """
    s = evals.shape[0]
    tau_s = evecs_sq @ (evals / (evals + gamma * s / n))
    p = np.clip((1.0 - eps) * (s / n) * tau_s, 0.0, 1.0)
    return float((n / s) * np.sum(1.0 - (1.0 - p) ** qbar))


def pilot_gamma(
    X: da.Array,
    kernel: Kernel,
    n_centers: int,
    *,
    qbar: int,
    eps: float,
    seed: int,
    executor: Any = None,
    pilot_rows: int | None = None,
    overshoot: float = 1.25,
) -> tuple[float, dict[str, Any]]:
    """Smallest gamma whose expected unique dictionary is at most ``overshoot * n_centers``.

    The dictionary grows like ``qbar * d_eff(gamma)``: with FALKON's ``gamma = lambda * n``
    and a small ``lambda`` it can exceed any center budget (and its O(m^3) updates any
    time budget). The expected size as a function of gamma is estimated from a uniform
    pilot sample of ``s`` rows (:func:`expected_unique_centers`), gathered on ``executor``.

    Returns
    -------
    gamma : float
    info : dict
        Pilot size and the predicted dictionary size.
    """
    n = int(X.shape[0])
    s = int(min(n, pilot_rows or int(np.clip(2 * n_centers, 1000, 4000))))
    rng = keyed_rng(seed, STREAM_PILOT)
    idx = np.sort(rng.choice(n, size=s, replace=False))
    P = gather_rows(X, idx, executor)
    K = np.asarray(kernel(P, P), dtype=np.float64)
    evals, evecs = np.linalg.eigh(0.5 * (K + K.T))
    evals = np.maximum(evals, 0.0)
    evecs_sq = evecs**2
    target = overshoot * n_centers
    trace = float(np.sum(evals)) * n / s
    lo, hi = trace * 1e-12 + 1e-12, max(trace, 1e-12)  # at hi, d_eff <= 1
    at_lo = expected_unique_centers(evals, evecs_sq, lo, n, qbar, eps)
    if at_lo <= target:
        return lo, {"pilot_rows": s, "predicted_unique": at_lo}
    for _ in range(60):
        mid = float(np.sqrt(lo * hi))
        if expected_unique_centers(evals, evecs_sq, mid, n, qbar, eps) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return hi, {
        "pilot_rows": s,
        "predicted_unique": expected_unique_centers(evals, evecs_sq, hi, n, qbar, eps),
    }


# ------------------------------------------------------------ shared set-up and finish
def squeak_params(gamma: float, qbar: int, eps: float, batch_min: int,
                  memory_budget: int | None = None) -> SqueakParams:
    return SqueakParams(gamma=float(gamma), qbar=int(qbar), eps=float(eps), batch_min=int(batch_min),
                        memory_budget=None if memory_budget is None else int(memory_budget))


def resolve_memory_budget(memory_budget: int | None, executor: Executor) -> int:
    """Bytes one dictionary update may take: ``memory_budget``, or (None) the memory available
    where it runs: the smaller of this machine's and the workers' figures
    (:func:`~daskkrr.parallel.guards.memory_limits`) and, on a cluster, the smallest single
    worker's memory limit (an update is one task, in one worker, whatever the workers hold in all)."""
    if memory_budget is not None:
        if int(memory_budget) < 1:
            raise ValueError(f"memory_budget must be a positive number of bytes or None; got {memory_budget!r}")
        return int(memory_budget)
    from daskkrr.parallel.guards import memory_limits

    budget = int(min(memory_limits(executor).values()))
    client = getattr(executor, "client", None)
    if client is not None:
        # a worker without a limit reports 0 or None: it is bounded by the machine's figure above
        limits = [int(w.get("memory_limit") or 0) for w in client.scheduler_info()["workers"].values()]
        budget = min([budget, *(limit for limit in limits if limit > 0)])
    return budget


def sampling_event(name: str, payload: dict[str, Any]) -> SamplingProgress:
    """The event of a record a SQUEAK block task published part-way through (see :func:`stream_block`)."""
    return SamplingProgress(name, int(payload["rows_seen"]), int(payload["dictionary_size"]),
                            int(payload["unique"]))


def _stopped(state: StreamState) -> bool:
    """Stop test of the fold, evaluated where the state lives."""
    return state.stopped is not None


class StreamingRLSSampler(CenterSampler):
    """Shared set-up (gamma, seed, row budget) and finish (thinning, weights) of SQUEAK and DISQUEAK."""

    qbar: int
    eps: float
    gamma: float | None
    random_state: int | None
    max_rows: int | None
    batch_min: int
    budget_overshoot: float = 2.0
    memory_budget: int | None = None

    def _params(self, gamma: float, executor: Executor) -> SqueakParams:
        return squeak_params(gamma, self.qbar, self.eps, self.batch_min,
                             resolve_memory_budget(self.memory_budget, executor))

    def _setup(
        self, X: Any, kernel: Kernel, n_centers: int | None, penalty: float | None,
        random_state: int | None, executor: Executor,
    ) -> tuple[da.Array, int, int, float, dict[str, Any]]:
        X = as_row_chunked(X)
        n_total = int(X.shape[0])
        if self.max_rows is not None:
            if int(self.max_rows) < 1:
                raise ValueError(f"max_rows must be >= 1; got {self.max_rows!r}")
            X = X[: int(self.max_rows)]
        seed = resolve_seed(random_state if random_state is not None else self.random_state)
        if n_centers is not None and int(n_centers) < 1:
            raise ValueError(f"n_centers must be >= 1 or None; got {n_centers!r}")
        info: dict[str, Any] = {}
        gamma = resolve_gamma(self.gamma, penalty, n_total)
        info["gamma_source"] = "given" if self.gamma is not None else "penalty * n"
        if self.gamma is None and n_centers is not None and n_centers < X.shape[0]:
            g_budget, pilot_info = pilot_gamma(
                X, kernel, int(n_centers), qbar=int(self.qbar), eps=float(self.eps), seed=seed,
                executor=executor, overshoot=float(self.budget_overshoot),
            )
            info["pilot"] = pilot_info
            if g_budget > gamma:
                gamma = g_budget
                info["gamma_source"] = "raised to fit n_centers (pilot sample)"
        info["gamma"] = gamma
        return X, n_total, seed, gamma, info

    def _finish(
        self, state: StreamState, n_centers: int | None, seed: int, n_rows: int,
        info: dict[str, Any],
    ) -> CenterDictionary:
        d = state.dictionary
        info.update(
            rows_seen=int(state.rows_seen),
            n_rows=int(n_rows),
            stopped=state.stopped,
            batches=int(state.batches),
            dictionary_size=d.n_copies,
            unique=d.size,
            d_eff_estimate=d.d_eff_estimate(int(self.qbar), float(self.eps)),
            history=state.history,
        )
        if n_centers is not None and d.size > n_centers:
            d = thin_to_size(d, int(n_centers), keyed_rng(seed, STREAM_THINNING))
            info["thinned_to"] = int(n_centers)
        # Weights are normalised with the rows the dictionary summarises.
        return d.to_center_dictionary(int(self.qbar), max(1, int(state.rows_seen)), info)


# ------------------------------------------------------------ SQUEAK
@register
class SqueakSampler(StreamingRLSSampler):
    """SQUEAK: ridge-leverage-score centers in a single sequential pass (Calandriello et al.).

    The rows are streamed in order; the dictionary is updated a batch of rows at a
    time (estimate the new rows' RLS against the current dictionary, expand, shrink
    every entry once) with Cholesky factors and Schur-complement updates. The result
    is an (approximately) gamma/(1-eps)-accurate dictionary with about
    ``(1 - eps) qbar d_eff(gamma)`` copies, whose unique rows are the centers.

    Parameters
    ----------
    gamma : float or None
        Ridge regularisation in kernel-matrix units. None: ``gamma = penalty * n``,
        FALKON's penalty lambda times the number of rows (the ridge of FALKON's
        objective in kernel-matrix units). When ``select`` gets a center budget
        ``n_centers``, gamma = None is raised if needed so the dictionary is expected
        to fit the budget (estimated from a pilot sample, see :func:`pilot_gamma`).
    qbar : int
        Copies drawn for each new row (default 16, see ``DEFAULT_QBAR``).
    eps : float
        Accuracy parameter in (0, 1) (default 0.5).
    random_state : int or None
        Seed used when ``select`` is called with ``random_state=None``.
    max_rows : int or None
        Row budget: stop after the first ``max_rows`` rows (the dictionary summarises them).
    max_dictionary : int or None
        Dictionary budget: stop the pass as soon as the dictionary has this many unique
        entries; the remaining blocks are not read when they are in a later segment.
    batch_min : int
        Smallest batch of rows per update (the batch is ``max(batch_min, m)`` rows for a
        dictionary of ``m`` entries, bounded by 64 MiB of ``m x batch`` float64 tiles but
        never under ``m / 8`` rows: each batch refactors the dictionary, so a batch shrinking
        as ``1 / m`` would make a row cost ``m^4`` flops).
    max_inflight_bytes : int
        Bytes of row blocks per computed segment of the pass.
    budget_overshoot : float
        With a budget ``n_centers`` and gamma = None, gamma is chosen so that the expected
        dictionary has ``budget_overshoot * n_centers`` unique rows, then thinned to the
        budget (default 2: in the centers benchmark 1.25 left the rare regions
        under-sampled and 4 pushed gamma to its floor ``penalty * n``).
    progress_interval : float or None
        While a block is processed, publish the dictionary's size (rows seen, copies,
        unique rows) every ``progress_interval`` seconds at most, as
        :class:`~daskkrr.events.SamplingProgress` events on the fit's event bus (the bar
        and the dashboard show them), from the threaded scheduler or from a worker
        (default 0.5; ``0``: after every batch; None: never). A block processed faster
        than this publishes nothing: its end is reported anyway. Publishing only reads
        the dictionary, so the result does not depend on it.
    memory_budget : int or None
        Bytes one dictionary update may hold (its factor and the factor's extension, two
        ``m x m`` float64 matrices, plus the batch's tiles): a larger dictionary raises
        :class:`~daskkrr.parallel.guards.ResourceGuardError`, naming the largest dictionary
        that fits, before allocating. None: the memory available (the smaller of this
        machine's free memory and the smallest worker's limit) when ``select`` starts.

    Notes
    -----
    The returned :class:`CenterDictionary` has ``counts`` q_j, ``probabilities`` p_j and
    weights ``w_j = (M/n) q_j / (qbar p_j)`` (M unique centers, n rows), so that
    ``(n/M) sum_j w_j k(z_j, .) k(z_j, .)^T`` estimates ``K_nM^T K_nM`` restricted to the
    centers; uniform sampling would give all-ones weights. The selection matrix of
    Eq. 3 has entries ``sqrt(q_j / (qbar p_j)) = sqrt((n/M) w_j)``.

    If ``n_centers`` is given and the dictionary has more unique entries, it is thinned
    to exactly ``n_centers`` by keeping each copy with one common probability (a SHRINK
    step, equivalent to a smaller qbar).

    The result depends on the seed, the data order and ``batch_min``, but
    not on the chunking of ``X`` nor on the number of workers: batches are cut from the
    row stream and each batch's random stream is keyed by its first row.
    """

    name = "squeak"

    def __init__(
        self,
        gamma: float | None = None,
        qbar: int = DEFAULT_QBAR,
        eps: float = DEFAULT_EPS,
        random_state: int | None = None,
        max_rows: int | None = None,
        max_dictionary: int | None = None,
        batch_min: int = 64,
        max_inflight_bytes: int = 256 * 2**20,
        budget_overshoot: float = 2.0,
        progress_interval: float | None = DEFAULT_PROGRESS_INTERVAL,
        memory_budget: int | None = None,
    ):
        self.gamma = gamma
        self.qbar = qbar
        self.eps = eps
        self.random_state = random_state
        self.max_rows = max_rows
        self.max_dictionary = max_dictionary
        self.batch_min = batch_min
        self.max_inflight_bytes = max_inflight_bytes
        self.budget_overshoot = budget_overshoot
        self.progress_interval = progress_interval
        self.memory_budget = memory_budget

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        """Run one SQUEAK pass over ``X`` and return its dictionary (see the class docstring)."""
        X, n_total, seed, gamma, info = self._setup(X, kernel, n_centers, penalty, random_state, executor)
        params = self._params(gamma, executor)
        passes = executor.passes(X)
        budget = self.max_dictionary
        with executor.task_progress(functools.partial(sampling_event, self.name),
                                    self.progress_interval) as progress:
            state: StreamState = passes.fold(
                stream_block, None, kernel, params, seed, budget, progress, name="squeak",
                finish=functools.partial(stream_finish, kernel=kernel, params=params, seed=seed,
                                         max_dictionary=budget),
                segment_bytes=int(self.max_inflight_bytes),
                stop=_stopped if budget is not None else None,
            )
        # Segments the fold computed: every block up to the one that stopped the pass
        # records itself in the history, and the fold stops at the end of that segment.
        per_segment = max(1, int(self.max_inflight_bytes) // max(1, passes.max_block_bytes))
        info.update(sampler=self.name, qbar=int(self.qbar), eps=float(self.eps), seed=seed,
                    n_blocks=passes.n_blocks,
                    segments=int(state.history[-1]["block"]) // per_segment + 1)
        return self._finish(state, n_centers, seed, n_total, info)


# ------------------------------------------------------------ DISQUEAK
def leaf_boundaries(X: da.Array, n_leaves: int | None) -> np.ndarray:
    """Row boundaries of the leaves (length n_leaves + 1).

    - ``None``: one leaf per row block;
    - ``n_leaves <= number of blocks``: groups of whole consecutive blocks, cut at the
      block boundaries nearest to an equal split of the rows (every block is read once);
    - more leaves than blocks: near-equal row ranges (a block shared by two leaves is
      read by both).
    """
    n = int(X.shape[0])
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
    if n_leaves is None:
        return offsets
    n_leaves = int(n_leaves)
    if not 1 <= n_leaves <= n:
        raise ValueError(f"n_leaves must be in [1, n={n}]; got {n_leaves}")
    even = np.round(np.linspace(0, n, n_leaves + 1)).astype(np.int64)
    if n_leaves > len(offsets) - 1:
        return even
    inner = offsets[1:-1]
    cuts = []
    for target in even[1:-1]:
        order = np.argsort(np.abs(inner - target), kind="stable")
        cuts.append(next(int(inner[i]) for i in order if int(inner[i]) not in cuts))
    return np.array([0] + sorted(cuts) + [n], dtype=np.int64)


@register
class DisqueakSampler(StreamingRLSSampler):
    """DISQUEAK: SQUEAK dictionaries built in parallel on leaves, merged along a tree.

    The rows are split into ``n_leaves`` contiguous ranges. Each leaf runs a SQUEAK pass
    over its rows, the leaves run in parallel on the workers, and the dictionaries are
    merged along a tree: Dict-Merge (union) then Dict-Update with the Eq. 5 estimator,
    whose inner regularisation is ``(1 + eps) gamma``
    (:func:`~daskkrr.sampling.squeak_core.merge_dictionaries`). A leaf's batches are
    keyed by their first global row exactly as SQUEAK's (one leaf reproduces SQUEAK), a
    merge node by the row range it covers.

    Parameters
    ----------
    gamma : float or None
        Ridge regularisation in kernel-matrix units; None means ``penalty * n``
        (raised to fit ``n_centers`` as in :class:`SqueakSampler`).
    qbar : int
        Copies drawn for each new row (default 16).
    eps : float
        Accuracy parameter in (0, 1) (default 0.5). Merges use the Eq. 5 estimator with
        ``(1 + eps) gamma``; the RLS estimates are then within
        ``alpha = (1 + 3 eps) / (1 - eps)`` of the exact ones (Lemma 4).
    random_state : int or None
        Seed used when ``select`` gets ``random_state=None``.
    n_leaves : int or None
        Number of leaves; None = one per row block of ``X``. Up to the number of
        blocks, a leaf is a group of consecutive whole blocks (of near-equal total
        rows); beyond it, leaves are near-equal row ranges.
    tree : {"balanced", "chain"}
        ``"balanced"``: adjacent leaves merged pairwise, level by level (depth
        ``log2(n_leaves)``); ``"chain"``: ((L1 + L2) + L3) + ..., sequential like SQUEAK.
    max_rows : int or None
        Use only the first ``max_rows`` rows.
    batch_min : int
        Smallest SQUEAK batch inside a leaf (batches follow :class:`SqueakSampler`'s rule).
    memory_budget : int or None
        Bytes one dictionary update or merge may hold in one process (an update: its factor and the
        factor's extension, two ``m x m`` float64 matrices, plus the batch's tiles; a merge: one
        ``m x m`` matrix). A leaf's SQUEAK update
        over it raises :class:`~daskkrr.parallel.guards.ResourceGuardError`, naming the largest
        dictionary that fits, before allocating; a merge over it takes the tiled route (below).
        None: the memory available (the smaller of this machine's free memory and the smallest
        worker's limit) when ``select`` starts. The budget is per task: leaves (and the dense merges
        of one tree level) run side by side, one per thread, so a process with ``k`` threads may
        hold ``k`` budgets at once (pass about ``memory / k`` to bound the process).
    factor_route : {"auto", "dense", "tiled"}
        Where a merge factors the union's ``D K D + (1 + eps) gamma I``: in one merge task
        ("dense", ``8 m^2`` bytes: its Gram, factor and inverse share one matrix) or as tiles on the
        workers, or spilled to Zarr where they do not hold them, driven from the client
        (``"tiled"``, the tiled Cholesky of :mod:`daskkrr.parallel.tiled_linalg`, as
        :class:`~daskkrr.sampling.BlessSampler`'s); the
        entries are then scored, as in the dense route, from the diagonal of the inverse, the factor's
        inverse built over its tiles (``m^3 / 3`` flops). ``"auto"`` (default) takes the tiled route
        for the merges whose dense factor would exceed ``memory_budget``. With "auto" and "tiled"
        the leaves come back to the client (their rows: O(m d)) and the tree is merged a level at
        a time; "dense" keeps today's one graph. The route of each merge is in
        ``info["history"]`` (``factor_route`` of the records with a ``node``).

    Notes
    -----
    Weights follow :class:`SqueakSampler`: ``w_j = (M/n) q_j / (qbar p_j)``. For a
    fixed seed the dictionary depends on the leaves and the tree, not on the workers, nor on
    the merges' route (to round-off of the estimates).
    """

    name = "disqueak"

    def __init__(
        self,
        gamma: float | None = None,
        qbar: int = DEFAULT_QBAR,
        eps: float = DEFAULT_EPS,
        random_state: int | None = None,
        n_leaves: int | None = None,
        tree: str = "balanced",
        max_rows: int | None = None,
        batch_min: int = 64,
        memory_budget: int | None = None,
        factor_route: str = "auto",
    ):
        self.gamma = gamma
        self.qbar = qbar
        self.eps = eps
        self.random_state = random_state
        self.n_leaves = n_leaves
        self.tree = tree
        self.max_rows = max_rows
        self.batch_min = batch_min
        self.memory_budget = memory_budget
        self.factor_route = factor_route

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        """Build the leaf dictionaries in parallel, merge them, return the root's centers."""
        if self.tree not in TREES:
            raise ValueError(f"tree must be one of {TREES}; got {self.tree!r}")
        if self.factor_route not in FACTOR_ROUTES:
            raise ValueError(f"factor_route must be one of {FACTOR_ROUTES}; got {self.factor_route!r}")
        X, n_total, seed, gamma, info = self._setup(X, kernel, n_centers, penalty, random_state, executor)
        params = self._params(gamma, executor)
        bounds = leaf_boundaries(X, self.n_leaves)
        merge_here = None if self.factor_route == "dense" else functools.partial(
            _tiled_merge_if_needed, kernel=kernel, params=params, seed=seed, executor=executor,
            route=self.factor_route, memory_budget=self.memory_budget)
        state: StreamState = executor.passes(X).tree_merge(
            stream_block, kernel, params, seed, None, name="disqueak", bounds=bounds.tolist(),
            merge=functools.partial(merge_states, kernel=kernel, params=params, seed=seed),
            leaf_finish=functools.partial(stream_finish, kernel=kernel, params=params, seed=seed,
                                          max_dictionary=None),
            tree=self.tree, merge_here=merge_here,
        )
        info.update(sampler=self.name, qbar=int(self.qbar), eps=float(self.eps), seed=seed,
                    n_leaves=len(bounds) - 1, tree=self.tree, factor_route=self.factor_route)
        return self._finish(state, n_centers, seed, n_total, info)


#: Where DISQUEAK's merges factor the union (see :class:`DisqueakSampler`'s ``factor_route``).
FACTOR_ROUTES = ("auto", "dense", "tiled")


def _tiled_merge_if_needed(left: StreamState, right: StreamState, *, kernel: Kernel, params: SqueakParams,
                           seed: int, executor: Executor, route: str,
                           memory_budget: int | None) -> Any:
    """The tiled merge of ``left`` and ``right``, driven from here, where the route says so (``"tiled"``, or
    ``"auto"`` and a dense factor of the union over ``params.memory_budget``: the one that would raise in a
    merge task); None: the pair is merged densely in a task."""
    m = left.dictionary.size + right.dictionary.size
    if route != "tiled" and (params.memory_budget is None or factor_bytes(m, 0) <= params.memory_budget):
        return None
    from daskkrr.parallel.strategies import plan_factor_route

    plan = plan_factor_route(m, "float64", route="tiled", memory_budget=memory_budget, executor=executor)
    entry_rls = functools.partial(tiled_entry_rls, kernel=kernel, params=params, executor=executor,
                                  tile=plan.tile, spill=plan.storage == "zarr")
    return functools.partial(merge_states, kernel=kernel, params=params, seed=seed, entry_rls=entry_rls,
                             factor_route=f"tiled ({plan.storage})")


def tiled_entry_rls(union: DictionaryState, reg: float, *, kernel: Kernel, params: SqueakParams,
                    executor: Executor, tile: int, spill: bool) -> np.ndarray:
    """Eq. 4/5 estimates of a dictionary's own entries with ``A = D K D + reg I`` factored as tiles
    (:func:`~daskkrr.parallel.tiled_linalg.kernel_cholesky`, spilled to Zarr with ``spill``): the dense route's
    ``g (1 - g (A^{-1})_ii) / w_i`` (:func:`~daskkrr.sampling.squeak_core.entry_estimates`), with ``diag(A^{-1})``
    from the tiled inverse of the factor (``m^3 / 3`` flops; scoring the entries by triangular solves, as
    BLESS scores its candidates, took ``m^3`` and read the factor once per chunk of entries)."""
    from daskkrr.parallel.tiled_linalg import TileStore, inverse_row_squares, kernel_cholesky
    from daskkrr.sampling.dictionary import _GAMMA_ADVICE

    store = TileStore() if spill else None
    try:
        T, jitter, sw = kernel_cholesky(executor, union.points, kernel, tile=tile,
                                        weights=union.selection_weights(params.qbar), store=store, regularizer=reg,
                                        what="regularised dictionary Gram matrix D K D + (1 + eps) gamma I",
                                        advice=_GAMMA_ADVICE)
        inv_diag = inverse_row_squares(T)
    finally:
        if store is not None:
            store.close()
    return estimates_from_inverse_diagonal(inv_diag, sw, reg + jitter, params)
