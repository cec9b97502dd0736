"""SQUEAK on Dask: one pass over the row blocks, in order, as a chain of tasks.

Each task receives the dictionary state and one row block and returns the new state
(:func:`~daskkrr.sampling.squeak_stream.stream_block`), so every block is read exactly
once and the state that moves between tasks is O(m^2 + m d), independent of n.

The chain is computed in *segments* of consecutive blocks whose total size is at
most ``max_inflight_bytes``: within a segment, the scheduler may read blocks ahead of
the chain (free threads take the next ready read), so bounding the segment bounds
the memory held by blocks read but not yet consumed. Between segments the state
stays on the cluster (a Future) when a distributed client runs the pass, and the
early-stopping budget is checked.
"""

from __future__ import annotations

import math
import time
from typing import Any

import dask
import dask.array as da

from daskkrr.kernels import Kernel
from daskkrr.sampling.base import CenterDictionary, CenterSampler
from daskkrr.sampling.dask_inputs import (
    active_client,
    as_row_chunked,
    compute_one,
    fetch,
    max_block_bytes,
    row_offsets,
)
from daskkrr.sampling.dictionary_state import thin_to_size
from daskkrr.sampling.keyed_random import STREAM_THINNING, keyed_rng, resolve_seed
from daskkrr.sampling.pilot import pilot_gamma
from daskkrr.sampling.regularization import resolve_gamma
from daskkrr.sampling.squeak_core import DEFAULT_BATCH_BYTES, SqueakParams
from daskkrr.sampling.squeak_stream import StreamState, stream_block, stream_finish

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


def squeak_params(
    gamma: float, qbar: int, eps: float, batch_min: int, batch_bytes: int = DEFAULT_BATCH_BYTES
) -> SqueakParams:
    return SqueakParams(gamma=float(gamma), qbar=int(qbar), eps=float(eps), batch_min=int(batch_min),
                        batch_bytes=int(batch_bytes))


def chain_delayed(
    state: Any,
    blocks: list[Any],
    block_ids: list[int],
    first_rows: list[int],
    kernel: Kernel,
    params: SqueakParams,
    seed: int,
    max_dictionary: int | None,
) -> Any:
    """Delayed ``stream_block`` calls folding ``blocks`` into ``state`` (a value, Future or Delayed)."""
    step = dask.delayed(stream_block, pure=True, traverse=False)
    for blk, k, r0 in zip(blocks, block_ids, first_rows):
        state = step(state, blk, k, r0, kernel, params, seed, max_dictionary)
    return state


def _stopped(state: StreamState) -> str | None:
    return state.stopped


class StreamingRLSSampler(CenterSampler):
    """Shared set-up (gamma, seed, row budget) and finish (thinning, weights) of SQUEAK and DISQUEAK."""

    qbar: int
    eps: float
    gamma: float | None
    random_state: int | None
    max_rows: int | None

    def _setup(
        self, X: Any, kernel: Kernel, n_centers: int | None, penalty: float,
        random_state: int | None, client: Any,
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
                client=client, overshoot=float(getattr(self, "budget_overshoot", 2.0)),
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
        to fit the budget (estimated from a pilot sample, see
        :func:`~daskkrr.sampling.pilot.pilot_gamma`).
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
        Smallest batch of rows per update (the batch is ``max(batch_min, m)`` rows,
        bounded by ``batch_bytes``).
    max_inflight_bytes : int
        Bytes of row blocks per computed segment of the chain.
    budget_overshoot : float
        With a budget ``n_centers`` and gamma = None, gamma is chosen so that the expected
        dictionary has ``budget_overshoot * n_centers`` unique rows, then thinned to the
        budget (default 2: in the centers benchmark 1.25 left the rare regions
        under-sampled and 4 pushed gamma to its floor ``penalty * n``).

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

    The result depends on the seed, the data order and ``batch_min``/``batch_bytes``, but
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

    def select(
        self,
        X: da.Array,
        kernel: Kernel,
        *,
        n_centers: int | None = None,
        penalty: float | None = None,
        random_state: int | None = None,
        client: Any = None,
    ) -> CenterDictionary:
        """Run one SQUEAK pass over ``X`` and return its dictionary (see the class docstring)."""
        t0 = time.perf_counter()
        X, n_total, seed, gamma, info = self._setup(X, kernel, n_centers, penalty, random_state, client)
        params = squeak_params(gamma, self.qbar, self.eps, self.batch_min)
        client = active_client(client)
        offsets = row_offsets(X)
        blocks = list(X.to_delayed().ravel())
        per_segment = max(1, int(self.max_inflight_bytes // max(1, max_block_bytes(X))))
        state: Any = None
        n_segments = math.ceil(len(blocks) / per_segment)
        for seg in range(n_segments):
            ids = list(range(seg * per_segment, min(len(blocks), (seg + 1) * per_segment)))
            delayed_state = chain_delayed(
                state, [blocks[k] for k in ids], ids, [int(offsets[k]) for k in ids],
                kernel, params, seed, self.max_dictionary,
            )
            last = seg == n_segments - 1
            if last:
                delayed_state = dask.delayed(stream_finish, pure=True, traverse=False)(
                    delayed_state, kernel, params, seed, self.max_dictionary
                )
            state = compute_one(delayed_state, client)
            if not last and self.max_dictionary is not None:
                stopped = (fetch(client.submit(_stopped, state), client) if client is not None
                           else state.stopped)
                if stopped is not None:
                    finish = dask.delayed(stream_finish, pure=True, traverse=False)
                    state = compute_one(
                        finish(state, kernel, params, seed, self.max_dictionary), client
                    )
                    break
        result: StreamState = fetch(state, client)
        info.update(sampler=self.name, qbar=int(self.qbar), eps=float(self.eps), seed=seed,
                    n_blocks=len(blocks), segments=seg + 1)
        out = self._finish(result, n_centers, seed, n_total, info)
        out.info["seconds"] = time.perf_counter() - t0
        return out
