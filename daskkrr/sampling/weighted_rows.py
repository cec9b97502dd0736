"""Rows drawn in proportion to their weights, without replacement: the uniform sampler of a weighted fit.

With row weights an integer weight k stands for k copies of the row, so drawing
centers "uniformly from the data" means drawing rows with probability
proportional to their weights; a row of weight 0 is never drawn. This is
Efraimidis and Spirakis' weighted sampling without replacement (2006): every row
gets the key ``log(u_i) / w_i`` with ``u_i`` uniform in (0, 1], and the
``n_centers`` largest keys win. The uniforms come from
:func:`~daskkrr.sampling.keyed_random.row_uniforms`, keyed by the global row
index, so the choice does not depend on the chunking or on the workers. One pass
over the weights: each block keeps its ``n_centers`` best keys, and only those
reach the client.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from daskkrr.sampling.keyed_random import resolve_seed, row_uniforms

#: Stream tag of the weighted draw (apart from the tags of :mod:`daskkrr.sampling.keyed_random`).
STREAM_WEIGHTED_ROWS = 17


def block_best_keys(Wb: np.ndarray, first_row: int, seed: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, keys)`` of the ``k`` largest keys ``log(u) / w`` of one block of weights ``(rows, 1)``.

    Rows of weight 0 have no key (they are never drawn).
    """
    w = np.asarray(Wb, dtype=np.float64).reshape(-1)
    rows = first_row + np.flatnonzero(w > 0)
    w = w[w > 0]
    u = 1.0 - row_uniforms(seed, STREAM_WEIGHTED_ROWS, 0, rows)  # in (0, 1]
    keys = np.log(u) / w
    if keys.size > k:
        best = np.argpartition(keys, keys.size - k)[keys.size - k:]
        rows, keys = rows[best], keys[best]
    return rows.astype(np.int64), keys


def choose_weighted_rows(passes: Any, n_centers: int, random_state: int | None) -> np.ndarray:
    """``n_centers`` distinct row indices (sorted), drawn with probability proportional to the weights.

    ``passes`` are :class:`~daskkrr.parallel.executor.BlockPasses` over the weights
    as an ``(n, 1)`` array. Fewer rows come back (with a warning) when fewer rows
    have a positive weight.
    """
    seed = resolve_seed(random_state)
    parts = passes.map(block_best_keys, seed, int(n_centers), name="weights", with_offsets=True)
    rows = np.concatenate([p[0] for p in parts])
    keys = np.concatenate([p[1] for p in parts])
    if rows.size < n_centers:
        warnings.warn(
            f"only {rows.size} rows have a positive sample_weight; using them all as centers instead of "
            f"n_centers={n_centers}", UserWarning, stacklevel=3,
        )
        return np.sort(rows)
    best = np.argsort(-keys, kind="stable")[:n_centers]
    return np.sort(rows[best])
