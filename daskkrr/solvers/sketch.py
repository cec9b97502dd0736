"""The row sketch behind the preconditioner: ``s`` training rows drawn uniformly.

FALKON approximates ``K_nM^T K_nM`` by ``(n / M) K_MM^2``, i.e. it uses the
centers themselves as a sample of the data rows. With a small penalty the
effective dimension of the problem exceeds what ``M`` rows can represent, and CG
needs many iterations (36 at n = 1e5, M = 2000, lambda = 1e-6 on the synthetic
benchmark, to a residual of 1e-3). Drawing ``s`` rows of the data instead and
using ``(n / s) K_sM^T K_sM`` (sketch-to-precondition, Avron, Clarkson and
Woodruff 2017) cuts that to 21 iterations with ``s = 2 M`` and 11 with
``s = 4 M``, for about ``2 s M^2`` flops on the client, once.

The rows are chosen from a seed derived from the centers, so a resumed fit (whose
centers come from its checkpoint) rebuilds the same preconditioner.

With row weights the rows are still drawn uniformly (drawing them in proportion
to the weights would need every weight on the client) and each counts
``w_i / mean(w)`` times in the sketch, an unbiased estimate of
``K_nM^T W K_nM / sum(w)``; zero-weight rows drawn add nothing.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for

#: Fewest and most sketch rows per center chosen by ``preconditioner_rows="auto"``.
AUTO_ROWS_PER_CENTER = (4, 16)
#: Rows of the sketch turned into kernel rows at a time (bounds the client's memory).
SKETCH_BLOCK_ROWS = 256


def auto_sketch_rows(n: int, n_centers: int) -> int:
    """``preconditioner_rows="auto"``: ``r M`` rows, ``r = sqrt(n / M) / 2`` within [4, 16], at most ``n``.

    The sketch costs ``2 s M^2`` flops once, a CG iteration ``O(n M d)``: the more
    rows per center, the more a saved iteration is worth. Measured on the synthetic
    benchmark (d = 20, lambda = 1e-6, residual 1e-3): n = 1e5, M = 2000 took 36
    iterations with FALKON's preconditioner, 11 with ``s = 4 M`` (fit 2x faster)
    and 7 with ``8 M`` (no faster); n = 1e6, M = 1000 took 6 with ``16 M``.
    """
    lo, hi = AUTO_ROWS_PER_CENTER
    per_center = min(hi, max(lo, round(0.5 * math.sqrt(n / max(1, n_centers)))))
    return int(min(n, per_center * n_centers))


def sketch_indices(n: int, rows: int, centers: np.ndarray) -> np.ndarray:
    """``rows`` distinct row indices in ``[0, n)``, sorted, seeded by the centers' bytes."""
    if not 0 < rows <= n:
        raise ValueError(f"the sketch needs 0 < rows <= n = {n}; got {rows}")
    digest = hashlib.sha256(np.ascontiguousarray(centers).tobytes()).digest()
    rng = np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))
    if rows == n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=rows, replace=False)).astype(np.int64)


class KernelRowSketch:
    """The kernel rows ``k(x_i, Z)`` of the sketch rows, produced block by block.

    Iterating yields float64 arrays of at most :data:`SKETCH_BLOCK_ROWS` rows, so
    the whole ``s x M`` matrix never exists at once; with ``row_weights``, pairs
    ``(block, weights of its rows)``.
    """

    def __init__(self, kernel: Kernel, rows: np.ndarray, centers: np.ndarray,
                 row_weights: np.ndarray | None = None):
        self.kernel = kernel
        self.X = np.ascontiguousarray(rows)
        self.Z = np.ascontiguousarray(centers, dtype=self.X.dtype)
        self.row_weights = None if row_weights is None else np.asarray(row_weights, dtype=np.float64).reshape(-1)
        if self.row_weights is not None and self.row_weights.shape[0] != self.X.shape[0]:
            raise ValueError(f"{self.X.shape[0]} sketch rows but {self.row_weights.shape[0]} row weights")

    @property
    def rows(self) -> int:
        return int(self.X.shape[0])

    def __iter__(self) -> Iterator[Any]:
        engine = engine_for(self.kernel)
        for start in range(0, self.rows, SKETCH_BLOCK_ROWS):
            block = engine.kernel_block(self.kernel, self.X[start:start + SKETCH_BLOCK_ROWS], self.Z)
            block = np.asarray(block, dtype=np.float64)
            if self.row_weights is None:
                yield block
            else:
                yield block, self.row_weights[start:start + SKETCH_BLOCK_ROWS]
