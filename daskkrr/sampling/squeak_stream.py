"""One SQUEAK pass as a fold over row blocks: ``state = step(state, block)``.

These are the functions the Dask tasks run (see :mod:`daskkrr.sampling.squeak`).
Batches are cut from the *stream* of rows, not from the blocks: rows left over at
the end of a block wait in ``pending`` for the next block. Batch boundaries and the
random stream of each batch (keyed by the seed and the batch's global first row)
therefore do not depend on how ``X`` is chunked, nor on which worker runs a step.

The state between blocks holds the dictionary (O(m^2 + m d)), fewer than one
batch of pending rows, and a short per-block history: never anything of size n.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.sampling.dictionary_state import DictionaryState
from daskkrr.sampling.keyed_random import STREAM_SQUEAK_BATCH, keyed_rng
from daskkrr.sampling.squeak_core import SqueakParams, squeak_batch


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
    """
    block = np.asarray(block)
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
    state = _run_batches(state, buffer, kernel, params, seed, max_dictionary, flush=False)
    _record(state, block_id, params)
    return state


def stream_finish(
    state: StreamState,
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    max_dictionary: int | None = None,
    keep_gram: bool = False,
) -> StreamState:
    """Process the pending rows as a last (shorter) batch; drop the Gram unless asked."""
    state = _copy(state)
    if state.pending.shape[0] and state.stopped is None:
        state = _run_batches(state, state.pending, kernel, params, seed, max_dictionary, flush=True)
        if state.history:
            state.history[-1].update(_summary(state, params))
    if not keep_gram:
        state.dictionary = state.dictionary.without_gram()
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


def _record(state: StreamState, block_id: int, params: SqueakParams) -> None:
    state.history.append({"block": int(block_id), **_summary(state, params)})


def squeak_numpy(
    X: np.ndarray,
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    *,
    block_rows: int | None = None,
    first_row: int = 0,
    max_dictionary: int | None = None,
    keep_gram: bool = False,
) -> StreamState:
    """The same pass on an in-memory array (blocks of ``block_rows``), without Dask."""
    X = np.asarray(X)
    step = X.shape[0] if block_rows is None else max(1, int(block_rows))
    state = StreamState.start(X.shape[1], X.dtype, first_row)
    for k, start in enumerate(range(0, X.shape[0], step)):
        state = stream_block(state, X[start : start + step], k, first_row + start, kernel,
                             params, seed, max_dictionary)
    return stream_finish(state, kernel, params, seed, max_dictionary, keep_gram)
