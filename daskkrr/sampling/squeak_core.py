"""SQUEAK and DISQUEAK on numpy blocks: the functions their block tasks run (no Dask here).

The drivers in :mod:`daskkrr.sampling.squeak` hand these to the execution layer:
:func:`stream_block` is the step of SQUEAK's fold over the row blocks (and of each
DISQUEAK leaf), :func:`stream_finish` closes a pass, :func:`merge_states` is a
DISQUEAK merge node.

How one batch of new rows is processed (:func:`squeak_batch`), following Alg. 1 of
Calandriello, Lazaric & Valko, a batch at a time instead of a point at a time:

1. *Estimate* each new row's RLS against the current dictionary plus the row itself
   (Eq. 4/5 with ``qbar`` copies of ``qbar^{-1/2} e_x``, i.e. weight 1):
   with ``A = D K_DD D + gamma I = L L^T`` (``D = diag(sqrt(s))``) and
   ``r_x = (k_xx - ||L^{-1} D k_D(x)||^2) / gamma``, Sherman-Morrison gives
   ``tau~_x = (1 - eps) r_x / (1 + r_x)``.
2. *Expand*: ``p_x = max(min(tau~_x, 1), floor_x)``, ``q_x ~ Binomial(qbar, p_x)``;
   rows with ``q_x > 0`` join the dictionary. The factor ``L`` is extended with
   their rows by a Schur complement (the old entries keep their weights).
3. *Shrink* every entry once: Eq. 4 against the expanded dictionary,
   ``tau~_i = (1 - eps) / gamma * (k_ii - ||L'^{-1} D' k_D'(z_i)||^2)``,
   ``p_i <- max(min(tau~_i, p_i), floor_i)``, ``q_i ~ Binomial(q_i, p_new / p_old)``;
   entries left with no copy are dropped for good.

The floors reproduce the ``p/2`` clause of Alg. 1 (an RLS at most halves when one
point is added, Lemma 1), compounded over the batch: ``p_old 2^{-b}`` for old entries
and ``2^{-(b - j)}`` for the j-th of b new rows (whose previous probability is 1).

:func:`merge_dictionaries` is DISQUEAK's Dict-Merge + Dict-Update (Alg. 2): the union
of two dictionaries resampled with the Eq. 5 estimator, whose inner regularisation
is ``(1 + eps) gamma`` because both halves are only eps-accurate.

Batches are cut from the *stream* of rows, not from the blocks: rows left over at
the end of a block wait in :attr:`StreamState.pending` for the next block. Batch
boundaries and the random stream of each batch (keyed by the seed and the batch's
global first row) therefore do not depend on how ``X`` is chunked, nor on which
worker runs a step; a merge node's stream is keyed by the row range it covers. The
state between blocks holds the dictionary's rows and per-entry numbers (O(m d): no
Gram, each update recomputes it from the rows), fewer than one batch of pending rows,
and a short per-block history: never anything of size n or m^2. Inside an update at
most two m x m float64 matrices exist at once, in a merge one (:func:`factor_bytes`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.kernels.sparse import dense_pieces, dense_rows, is_sparse
from daskkrr.sampling.dictionary import (
    DictionaryState,
    extend_cholesky,
    factor_in_place,
    forward_solve,
    inverse_diagonal,
    weighted_gram,
    weighted_kernel_gram,
)
from daskkrr.sampling.keyed_random import (
    STREAM_MERGE_NODE,
    STREAM_SQUEAK_BATCH,
    keyed_rng,
)

if TYPE_CHECKING:
    from daskkrr.parallel.task_progress import TaskProgress

#: Kernel/solve tiles are bounded by this many bytes (rows of a batch x entries x 8) ...
DEFAULT_BATCH_BYTES = 64 * 2**20
#: ... unless that leaves a batch under this fraction of the dictionary (see ``SqueakParams``).
DEFAULT_BATCH_FRACTION = 0.125


@dataclasses.dataclass(frozen=True)
class SqueakParams:
    """Parameters of the dictionary updates.

    Attributes
    ----------
    gamma : float
        Regularisation in kernel-matrix units.
    qbar : int
        Copies drawn for a new row.
    eps : float
        Accuracy parameter in (0, 1).
    batch_min : int
        Smallest batch of new rows (the batch grows with the dictionary: ``max(batch_min, m)``).
    batch_bytes : int
        Bound on ``batch rows x entries x 8`` bytes, lifted where it would leave a batch under
        ``batch_fraction * m`` rows.
    batch_fraction : float
        Fewest rows of a batch, as a fraction of the dictionary's ``m`` entries (default 1/8). Each
        batch refactors the dictionary (about ``(2/3) m^3`` flops), so a row costs
        ``(2/3) m^3 / b``: with ``b`` bounded by ``batch_bytes`` alone (``b ~ 8.4e6 / m``) that is
        ``m^4 / 1.3e7``, the time wall of large dictionaries; with ``b >= m / 8`` it is about
        ``6 m^2`` (``5.3 m^2``, plus ``m^2`` for the row's own triangular solve). The batch's
        ``m x b`` tiles then take at most half an ``m x m`` matrix beside the factor's two
        (:func:`factor_bytes`: 2.8 instead of 2 at the peak).
    halving_floor : bool
        Apply the ``p/2``-per-point floor of Alg. 1.
    memory_budget : int or None
        Bytes a batch's (or merge's) factorisation may take (:func:`factor_bytes`); above
        it the update raises :class:`~daskkrr.parallel.guards.ResourceGuardError` before
        allocating. None: no check.
    """

    gamma: float
    qbar: int
    eps: float
    batch_min: int = 64
    batch_bytes: int = DEFAULT_BATCH_BYTES
    batch_fraction: float = DEFAULT_BATCH_FRACTION
    halving_floor: bool = True
    memory_budget: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be finite and > 0; got {self.gamma!r}")
        if int(self.qbar) != self.qbar or self.qbar < 1:
            raise ValueError(f"qbar must be a positive integer; got {self.qbar!r}")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps must be in (0, 1); got {self.eps!r}")
        if self.batch_min < 1:
            raise ValueError(f"batch_min must be >= 1; got {self.batch_min!r}")
        if not 0.0 <= self.batch_fraction <= 1.0:
            raise ValueError(f"batch_fraction must be in [0, 1]; got {self.batch_fraction!r}")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise ValueError(f"memory_budget must be a positive number of bytes or None; got {self.memory_budget!r}")

    def batch_rows(self, n_entries: int) -> int:
        """Rows in the next batch for a dictionary of ``n_entries`` unique entries.

        ``max(batch_min, m)`` rows, bounded by ``batch_bytes`` but never below ``batch_fraction * m``.
        The rule depends on the parameters and ``m`` only (not on the memory found at run time), so
        the batches, hence the dictionary drawn for a seed, are the same on every machine.
        """
        m = max(0, int(n_entries))
        cap = max(1, self.batch_bytes // (8 * max(1, m)), math.ceil(self.batch_fraction * m))
        return int(max(1, min(max(self.batch_min, m), cap)))


def _factor(
    state: DictionaryState, kernel: Kernel, params: SqueakParams, reg: float, where: str, new_rows: int = 0
) -> tuple[np.ndarray, np.ndarray, float]:
    """Cholesky factor of ``D K_DD D + reg I``, ``sqrt(s)`` and the diagonal shift it holds.

    The Gram is recomputed from the entries' points (states carry none) in the memory the
    factor then takes. ``new_rows``: rows about to extend the factor, counted in the
    memory check (``where`` names the update in its message). The shift is ``reg`` plus
    the jitter the factorisation added.
    """
    check_factor_memory(state.size, new_rows, params, where)
    sw = np.sqrt(state.selection_weights(params.qbar))
    L, jitter = factor_in_place(weighted_kernel_gram(state.points, sw, kernel, reg, params.batch_bytes))
    return L, sw, reg + jitter


def factor_bytes(m: int, new_rows: int) -> int:
    """Peak bytes of a batch's dictionary work with ``m`` entries and ``new_rows`` new rows.

    The factor of the ``m`` entries and its extension to at most ``m + new_rows`` are held
    together while the extension is copied (two ``m x m`` float64 matrices at the peak), beside
    the batch's ``m x new_rows`` tiles (kernel columns, their scaled copy, the solve and the
    kept columns: four at most). A merge (``new_rows = 0``) has no extension: its Gram, factor and
    inverse share one ``m x m`` matrix, beside the kernel's temporaries while the Gram is built a
    block of rows at a time (two blocks of at most a quarter of the rows and ``DEFAULT_BATCH_BYTES``,
    :func:`~daskkrr.sampling.dictionary.weighted_kernel_gram`).
    """
    m, b = int(m), int(new_rows)
    if b == 0:
        return 8 * m * m + 2 * min(DEFAULT_BATCH_BYTES, 2 * m * m)
    return 8 * (m * m + (m + b) ** 2 + 4 * m * b)


def check_factor_memory(m: int, new_rows: int, params: SqueakParams, where: str) -> None:
    """Raise :class:`~daskkrr.parallel.guards.ResourceGuardError` before a factor that exceeds the budget."""
    budget = params.memory_budget
    if budget is None or m == 0:
        return
    need = factor_bytes(m, new_rows)
    if need <= budget:
        return
    from daskkrr.parallel.guards import ResourceGuardError

    fits = largest_dictionary(params, budget, batches=new_rows > 0)
    raise ResourceGuardError(
        f"{where}: the dictionary has m = {m} entries (+ {new_rows} new rows) and its factorisation "
        f"needs {need / 1e9:.2f} GB at once ("
        f"{'two m x m float64 matrices and the batch m x b tiles' if new_rows else 'one m x m float64 matrix'}), over "
        f"memory_budget = {budget / 1e9:.2f} GB. Fix: stop the dictionary before it grows that large "
        f"(SqueakSampler's max_dictionary <= {fits} fits this budget), raise gamma "
        f"(or the penalty) so the dictionary is smaller, pass n_centers with gamma=None, use DisqueakSampler "
        f"with more leaves (each leaf's dictionary is smaller, and merges over the budget are factored as "
        f"tiles), or raise memory_budget if the memory is there"
    )


def largest_dictionary(params: SqueakParams, budget: int, batches: bool = True) -> int:
    """Largest ``m`` whose update fits ``budget`` bytes: a batch of ``params.batch_rows(m)`` rows
    (``batches``) or a merge (no new rows). At least 1."""
    def fits(m: int) -> bool:
        return factor_bytes(m, params.batch_rows(m) if batches else 0) <= budget

    lo, hi = 1, max(2, math.isqrt(max(1, budget // 8)) + 1)  # factor_bytes(m, b) >= 8 m^2 > budget at hi
    while hi - lo > 1:  # the bytes grow with m (the batch rule never shrinks a batch faster than m grows)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def estimate_new_rows(
    state: DictionaryState,
    L: np.ndarray,
    sqrt_w: np.ndarray,
    Xb: np.ndarray,
    kernel: Kernel,
    params: SqueakParams,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eq. 4 estimates of new rows against the dictionary plus the row itself.

    Returns
    -------
    tau : ndarray of shape (b,)
        ``(1 - eps) r / (1 + r)``.
    K_Db : ndarray of shape (m, b)
        Kernel between the entries and the new rows (float64).
    V : ndarray of shape (m, b)
        ``L^{-1} D K_Db`` (reused to extend the factor).
    """
    kb = np.asarray(kernel.diag(Xb), dtype=np.float64)
    if state.size:
        K_Db = np.asarray(kernel(state.points, Xb), dtype=np.float64)
        V = forward_solve(L, sqrt_w[:, None] * K_Db)
        resid = kb - np.einsum("ij,ij->j", V, V)
    else:
        K_Db = np.zeros((0, Xb.shape[0]))
        V = K_Db
        resid = kb
    r = np.maximum(resid, 0.0) / params.gamma
    return (1.0 - params.eps) * r / (1.0 + r), K_Db, V


def entry_estimates(
    L: np.ndarray, sqrt_w: np.ndarray, shift: np.ndarray | float, params: SqueakParams
) -> np.ndarray:
    """Eq. 4/5 estimates of the entries themselves from the factor ``L`` of their weighted Gram.

    ``tau~_i = (1 - eps) / gamma * (k_ii - ||L^{-1} D k_D(z_i)||^2)`` where
    ``L L^T = A = D K D + diag(shift)`` (the inner regularisation, gamma or (1 + eps) gamma,
    plus the jitter of each part of the factor). With ``DKD = A - diag(shift)``,
    ``(DKD A^{-1} DKD)_ii = A_ii - 2 g_i + g_i^2 (A^{-1})_ii`` (``g = shift``), so
    ``k_ii - ||L^{-1} D k_i||^2 = g_i (1 - g_i (A^{-1})_ii) / w_i``: the diagonal of ``A^{-1}``
    replaces the solve with ``m`` right-hand sides (``m^3 / 3`` flops, no ``m x m`` copy).
    ``L`` is overwritten.
    """
    if L.shape[0] == 0:
        return np.zeros(0)
    return estimates_from_inverse_diagonal(inverse_diagonal(L), sqrt_w, shift, params)


def estimates_from_inverse_diagonal(inv_diag: np.ndarray, sqrt_w: np.ndarray, shift: np.ndarray | float,
                                    params: SqueakParams) -> np.ndarray:
    """:func:`entry_estimates` given ``diag(A^{-1})`` (the tiled route computes it from tiles)."""
    resid = shift * (1.0 - shift * inv_diag) / sqrt_w**2
    return (1.0 - params.eps) / params.gamma * np.maximum(resid, 0.0)


def resample(
    probs: np.ndarray,
    copies: np.ndarray,
    tau: np.ndarray,
    floor: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """SHRINK: ``p' = max(min(tau, p), floor)``, ``q' ~ Binomial(q, p'/p)``."""
    p_new = np.maximum(np.minimum(tau, probs), np.minimum(floor, probs))
    ratio = np.clip(p_new / probs, 0.0, 1.0)
    return p_new, rng.binomial(copies, ratio)


def squeak_batch(
    state: DictionaryState,
    Xb: np.ndarray,
    first_row: int,
    kernel: Kernel,
    params: SqueakParams,
    rng: np.random.Generator,
) -> DictionaryState:
    """Process one batch of new rows: estimate, expand, then shrink every entry once.

    Parameters
    ----------
    state : DictionaryState
        Dictionary of the rows seen so far (its Gram must be present).
    Xb : ndarray of shape (b, d)
        The new rows, in stream order.
    first_row : int
        Global row index of ``Xb[0]``.
    kernel : Kernel
    params : SqueakParams
    rng : numpy Generator
        The batch's own random stream.
    """
    b = Xb.shape[0]
    if b == 0:
        return state
    qbar, gamma = params.qbar, params.gamma
    L, sw, shift = _factor(state, kernel, params, gamma, f"SQUEAK batch of rows [{first_row}, {first_row + b})",
                           new_rows=b)
    tau_new, K_Db, V = estimate_new_rows(state, L, sw, Xb, kernel, params)

    # EXPAND
    if params.halving_floor:
        floor_new = np.exp2(-(b - np.arange(b, dtype=np.float64)))
        floor_old = state.probs * math.ldexp(1.0, -min(b, 1000))
    else:
        floor_new = np.zeros(b)
        floor_old = np.zeros(state.size)
    p_new = np.maximum(np.minimum(tau_new, 1.0), floor_new)
    q_new = rng.binomial(qbar, p_new)
    kept = np.flatnonzero(q_new > 0)
    w_kept = q_new[kept] / (qbar * p_new[kept])
    sw_kept = np.sqrt(w_kept)
    K_nn = np.asarray(kernel(Xb[kept], Xb[kept]), dtype=np.float64)
    corner = weighted_gram(K_nn, sw_kept, gamma)
    del K_Db  # the new entries' kernel columns live on in V
    L_ext, corner_jitter = extend_cholesky(L, V[:, kept] * sw_kept[None, :], corner)
    del L, V  # one m x m matrix again
    expanded = DictionaryState(
        points=np.concatenate([state.points, Xb[kept].astype(state.points.dtype, copy=False)]),
        indices=np.concatenate([state.indices, first_row + kept.astype(np.int64)]),
        probs=np.concatenate([state.probs, p_new[kept]]),
        copies=np.concatenate([state.copies, q_new[kept]]),
        rls=np.concatenate([state.rls, tau_new[kept]]),
        gram=state.gram[:0, :0],
    )

    # SHRINK every entry once, against the expanded dictionary.
    sw_ext = np.concatenate([sw, sw_kept])
    shift_ext = np.concatenate([np.full(state.size, shift), np.full(kept.size, gamma + corner_jitter)])
    tau = entry_estimates(L_ext, sw_ext, shift_ext, params)
    floor = np.concatenate([floor_old, floor_new[kept]])
    probs, copies = resample(expanded.probs, expanded.copies, tau, floor, rng)
    expanded.probs, expanded.copies, expanded.rls = probs, copies, tau
    return expanded.take(copies > 0)


#: ``entry_rls(union, reg)``: the Eq. 4/5 estimates of a dictionary's own entries with inner regularisation
#: ``reg`` (:func:`dense_entry_rls` here; the samplers' driver has a tiled one for dictionaries too large for it).
EntryRLS = Callable[[DictionaryState, float], np.ndarray]


def dense_entry_rls(union: DictionaryState, reg: float, kernel: Kernel, params: SqueakParams,
                    where: str = "DISQUEAK merge") -> np.ndarray:
    """The entries' estimates from the factor of ``D K D + reg I`` built in this process (its memory checked
    against ``params.memory_budget`` first)."""
    L, sw, shift = _factor(union, kernel, params, reg, where)
    return entry_estimates(L, sw, shift, params)


def merge_dictionaries(
    left: DictionaryState,
    right: DictionaryState,
    kernel: Kernel,
    params: SqueakParams,
    rng: np.random.Generator,
    entry_rls: EntryRLS | None = None,
) -> DictionaryState:
    """DISQUEAK's Dict-Merge then Dict-Update with the Eq. 5 estimator.

    ``tau~_i = (1 - eps) / gamma * (k_ii - k_i^T S (S^T K S + (1 + eps) gamma I)^{-1} S^T k_i)``
    for every entry of the union, ``p_i <- min(tau~_i, p_i)``,
    ``q_i ~ Binomial(q_i, p_new / p_old)``. ``entry_rls`` computes the estimates (None:
    :func:`dense_entry_rls`).
    """
    if left.size == 0:
        return right
    if right.size == 0:
        return left
    union = DictionaryState(
        points=np.concatenate([left.points, right.points.astype(left.points.dtype, copy=False)]),
        indices=np.concatenate([left.indices, right.indices]),
        probs=np.concatenate([left.probs, right.probs]),
        copies=np.concatenate([left.copies, right.copies]),
        rls=np.concatenate([left.rls, right.rls]),
        gram=left.gram[:0, :0],
    )
    reg = (1.0 + params.eps) * params.gamma
    tau = dense_entry_rls(union, reg, kernel, params) if entry_rls is None else entry_rls(union, reg)
    probs, copies = resample(union.probs, union.copies, tau, np.zeros(union.size), rng)
    union.probs, union.copies, union.rls = probs, copies, tau
    return union.take(copies > 0)


# ------------------------------------------------------------ a pass over blocks
@dataclasses.dataclass
class StreamState:
    """Dictionary plus bookkeeping of a SQUEAK pass over a contiguous range of rows.

    Attributes
    ----------
    dictionary : DictionaryState
    pending : ndarray of shape (r, d)
        Rows received but not yet processed (fewer than one batch).
    next_row : int
        Global index of the first pending row (or of the next row expected).
    first_row : int
        Global index of the first row of the range this pass summarises.
    rows_seen : int
        Rows processed into the dictionary.
    batches : int
        Batches processed.
    history : list of dict
        One record per block: ``block``, ``rows_seen``, ``dictionary_size`` (copies),
        ``unique`` (entries), ``rls_sum`` (sum of the entries' estimated RLS) and
        ``d_eff_estimate`` (the importance-weighted sum ``sum_j s_j tau~_j / (1 - eps)``,
        an estimate of d_eff(gamma) of the rows seen).
    stopped : str or None
        Why the pass stopped early (``"max_dictionary"``), or None.
    """

    dictionary: DictionaryState
    pending: np.ndarray
    next_row: int
    first_row: int
    rows_seen: int = 0
    batches: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stopped: str | None = None

    @classmethod
    def start(cls, n_features: int, dtype: Any, first_row: int) -> StreamState:
        return cls(
            dictionary=DictionaryState.empty(n_features, dtype),
            pending=np.zeros((0, n_features), dtype=dtype),
            next_row=int(first_row),
            first_row=int(first_row),
        )


def _run_batches(
    state: StreamState,
    buffer: np.ndarray,
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    max_dictionary: int | None,
    flush: bool,
    publish: Callable[[Callable[[], dict[str, Any]]], bool] | None = None,
) -> StreamState:
    pos = 0
    d = state.dictionary
    start = state.next_row
    while pos < buffer.shape[0] and state.stopped is None:
        b = params.batch_rows(d.size)
        if buffer.shape[0] - pos < b and not flush:
            break
        batch = buffer[pos : pos + b]
        row0 = start + pos
        d = squeak_batch(d, batch, row0, kernel, params, keyed_rng(seed, STREAM_SQUEAK_BATCH, row0))
        pos += batch.shape[0]
        state.rows_seen += batch.shape[0]
        state.batches += 1
        if max_dictionary is not None and d.size >= max_dictionary:
            state.stopped = "max_dictionary"
        if publish is not None:  # reads the dictionary only: the random stream is untouched
            publish(functools.partial(_live_record, state.rows_seen, d))
    state.dictionary = d
    state.pending = buffer[pos:] if state.stopped is None else buffer[:0]
    state.next_row = start + pos
    return state


def stream_block(
    state: StreamState | None,
    block: np.ndarray,
    block_id: int,
    block_first_row: int,
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    max_dictionary: int | None = None,
    progress: TaskProgress | None = None,
) -> StreamState:
    """Fold one row block into the pass (the body of one Dask task).

    Parameters
    ----------
    state : StreamState or None
        The state after the previous block (None: this block starts the pass).
    block : ndarray of shape (b, d)
    block_id : int
        Position of the block in the pass (for the history).
    block_first_row : int
        Global row index of ``block[0]``; must continue the previous block.
    progress : TaskProgress or None
        Where to publish the dictionary's size while the block is processed (after a
        batch, at most once per ``progress.interval`` seconds); None publishes nothing.
    """
    if is_sparse(block) and block.shape[0]:  # dense rows a bounded piece at a time (the dictionary is dense)
        for rows, piece in dense_pieces(block):
            state = stream_block(state, piece, block_id, block_first_row + rows.start, kernel, params, seed,
                                 max_dictionary)
        return state  # type: ignore[return-value]  # a non-empty block ran at least one piece
    block = dense_rows(block)  # an empty sparse block (no rows), or dense rows
    if block.ndim != 2:
        raise ValueError(f"SQUEAK blocks must be 2-D (rows, features); got shape {block.shape}")
    if state is None:
        state = StreamState.start(block.shape[1], block.dtype, block_first_row)
    if state.stopped is not None:
        return state
    state = _copy(state)
    expected = state.next_row + state.pending.shape[0]
    if block_first_row != expected:
        raise ValueError(
            f"SQUEAK received block {block_id} starting at row {block_first_row}, but the pass "
            f"expected row {expected}: blocks must arrive in order and without gaps"
        )
    buffer = block if state.pending.shape[0] == 0 else np.concatenate([state.pending, block])
    publish = progress.publisher() if progress is not None else None
    state = _run_batches(state, buffer, kernel, params, seed, max_dictionary, flush=False, publish=publish)
    _record(state, block_id, params)
    return state


def stream_finish(
    state: StreamState,
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    max_dictionary: int | None = None,
) -> StreamState:
    """Process the pending rows as a last (shorter) batch."""
    state = _copy(state)
    if state.pending.shape[0] and state.stopped is None:
        state = _run_batches(state, state.pending, kernel, params, seed, max_dictionary, flush=True)
        if state.history:
            state.history[-1].update(_summary(state, params))
    return state


def _copy(state: StreamState) -> StreamState:
    """Tasks never modify their input (a retried task must see the same state)."""
    return dataclasses.replace(state, history=[dict(h) for h in state.history])


def _summary(state: StreamState, params: SqueakParams) -> dict[str, Any]:
    d = state.dictionary
    return {
        "rows_seen": int(state.rows_seen),
        "dictionary_size": d.n_copies,
        "unique": d.size,
        "rls_sum": float(d.rls.sum()),
        "d_eff_estimate": d.d_eff_estimate(params.qbar, params.eps),
    }


def _live_record(rows_seen: int, d: DictionaryState) -> dict[str, Any]:
    """What a block task publishes part-way through (plain numbers: it may travel as a worker event)."""
    return {"rows_seen": int(rows_seen), "dictionary_size": int(d.n_copies), "unique": int(d.size)}


def _record(state: StreamState, block_id: int, params: SqueakParams) -> None:
    state.history.append({"block": int(block_id), **_summary(state, params)})


# ------------------------------------------------------------ DISQUEAK merge nodes
def merge_states(
    left: StreamState, right: StreamState, kernel: Kernel, params: SqueakParams, seed: int,
    entry_rls: EntryRLS | None = None, factor_route: str = "dense",
) -> StreamState:
    """Merge two adjacent row ranges' dictionaries (the body of one merge task; ``entry_rls`` and its
    ``factor_route`` label: see :func:`merge_dictionaries`; a merge with an empty side factors nothing and
    records "none")."""
    if left.next_row != right.first_row:
        raise ValueError(
            f"merge of non-adjacent row ranges [{left.first_row}, {left.next_row}) and "
            f"[{right.first_row}, {right.next_row})"
        )
    rng = keyed_rng(seed, STREAM_MERGE_NODE, left.first_row, right.next_row)
    merged = merge_dictionaries(left.dictionary, right.dictionary, kernel, params, rng, entry_rls)
    history = left.history + right.history
    history.append({
        "node": [int(left.first_row), int(right.next_row)],
        "factor_route": factor_route if left.dictionary.size and right.dictionary.size else "none",
        "rows_seen": int(left.rows_seen + right.rows_seen),
        "dictionary_size": merged.n_copies,
        "unique": merged.size,
        "rls_sum": float(merged.rls.sum()),
        "d_eff_estimate": merged.d_eff_estimate(params.qbar, params.eps),
    })
    return StreamState(
        dictionary=merged,
        pending=left.pending[:0],
        next_row=right.next_row,
        first_row=left.first_row,
        rows_seen=left.rows_seen + right.rows_seen,
        batches=left.batches + right.batches,
        history=history,
    )
