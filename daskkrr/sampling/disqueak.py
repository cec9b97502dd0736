"""DISQUEAK on Dask: per-leaf SQUEAK dictionaries merged pairwise along a tree (Alg. 2).

The rows are split into ``n_leaves`` contiguous ranges (default: one per row block).
Each leaf runs a SQUEAK pass over its rows (a chain of tasks, as in
:mod:`daskkrr.sampling.squeak`), the leaves run in parallel on the workers, and the
dictionaries are merged along a tree: Dict-Merge (union) then Dict-Update with the
Eq. 5 estimator, whose inner regularisation is ``(1 + eps) gamma``
(:func:`~daskkrr.sampling.squeak_core.merge_dictionaries`).

Randomness is keyed by rows, never by workers: a leaf's batches by their first
global row (exactly as SQUEAK's, so one leaf reproduces SQUEAK), a merge node by the
row range it covers. For a fixed seed the dictionary is the same for any number of
workers and any scheduler.
"""

from __future__ import annotations

import time
from typing import Any

import dask
import dask.array as da
import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.sampling.base import CenterDictionary
from daskkrr.sampling.dask_inputs import active_client, compute_one, fetch, row_offsets
from daskkrr.sampling.keyed_random import STREAM_MERGE_NODE, keyed_rng
from daskkrr.sampling.squeak import (
    DEFAULT_EPS,
    DEFAULT_QBAR,
    StreamingRLSSampler,
    chain_delayed,
    squeak_params,
)
from daskkrr.sampling.squeak_core import SqueakParams, merge_dictionaries
from daskkrr.sampling.squeak_stream import StreamState, stream_finish

TREES = ("balanced", "chain")


def merge_states(
    left: StreamState, right: StreamState, kernel: Kernel, params: SqueakParams, seed: int
) -> StreamState:
    """Merge two adjacent row ranges' dictionaries (the body of one merge task)."""
    if left.next_row != right.first_row:
        raise ValueError(
            f"merge of non-adjacent row ranges [{left.first_row}, {left.next_row}) and "
            f"[{right.first_row}, {right.next_row})"
        )
    rng = keyed_rng(seed, STREAM_MERGE_NODE, left.first_row, right.next_row)
    merged = merge_dictionaries(left.dictionary, right.dictionary, kernel, params, rng)
    history = left.history + right.history
    history.append({
        "node": [int(left.first_row), int(right.next_row)],
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


def _strip(state: StreamState) -> StreamState:
    state = StreamState(**{**vars(state)})
    state.dictionary = state.dictionary.without_gram()
    return state


def leaf_boundaries(X: da.Array, n_leaves: int | None) -> np.ndarray:
    """Row boundaries of the leaves (length n_leaves + 1).

    - ``None``: one leaf per row block;
    - ``n_leaves <= number of blocks``: groups of whole consecutive blocks, cut at the
      block boundaries nearest to an equal split of the rows (every block is read once);
    - more leaves than blocks: near-equal row ranges (a block shared by two leaves is
      read by both).
    """
    n = int(X.shape[0])
    offsets = row_offsets(X)
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


def merge_tree(nodes: list[Any], merge: Any, tree: str) -> Any:
    """Reduce ``nodes`` (in row order) with ``merge(left, right)`` along the chosen tree."""
    if tree == "chain":
        acc = nodes[0]
        for node in nodes[1:]:
            acc = merge(acc, node)
        return acc
    level = list(nodes)
    while len(level) > 1:
        nxt = [merge(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


class DisqueakSampler(StreamingRLSSampler):
    """DISQUEAK: SQUEAK dictionaries built in parallel on leaves, merged along a tree.

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
        Smallest SQUEAK batch inside a leaf.

    Notes
    -----
    Weights follow :class:`SqueakSampler`: ``w_j = (M/n) q_j / (qbar p_j)``. For a
    fixed seed the dictionary depends on the leaves and the tree, not on the workers.
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
    ):
        self.gamma = gamma
        self.qbar = qbar
        self.eps = eps
        self.random_state = random_state
        self.n_leaves = n_leaves
        self.tree = tree
        self.max_rows = max_rows
        self.batch_min = batch_min

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
        """Build the leaf dictionaries in parallel, merge them, return the root's centers."""
        if self.tree not in TREES:
            raise ValueError(f"tree must be one of {TREES}; got {self.tree!r}")
        t0 = time.perf_counter()
        X, n_total, seed, gamma, info = self._setup(X, kernel, n_centers, penalty, random_state, client)
        params = squeak_params(gamma, self.qbar, self.eps, self.batch_min)
        client = active_client(client)
        bounds = leaf_boundaries(X, self.n_leaves)
        finish = dask.delayed(stream_finish, pure=True, traverse=False)
        leaves = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = X[int(a) : int(b)]
            offs = row_offsets(part) + int(a)
            blocks = list(part.to_delayed().ravel())
            ids = list(range(len(blocks)))
            chain = chain_delayed(None, blocks, ids, [int(o) for o in offs[:-1]], kernel, params,
                                  seed, None)
            leaves.append(finish(chain, kernel, params, seed, None, True))
        merge = dask.delayed(merge_states, pure=True, traverse=False)
        root = merge_tree(leaves, lambda l, r: merge(l, r, kernel, params, seed), self.tree)
        root = dask.delayed(_strip, pure=True, traverse=False)(root)
        state: StreamState = fetch(compute_one(root, client), client)
        info.update(sampler=self.name, qbar=int(self.qbar), eps=float(self.eps), seed=seed,
                    n_leaves=len(leaves), tree=self.tree)
        out = self._finish(state, n_centers, seed, n_total, info)
        out.info["seconds"] = time.perf_counter() - t0
        return out
