"""The preconditioner's row sketch summed on the workers, where its rows are.

The client's sketch (:class:`daskkrr.solvers.sketch.KernelRowSketch`) gathers the
``s`` sampled rows, forms their kernel rows and sums ``W^T W`` on the client's
cores: about ``2 s M^2`` flops, serial however many workers there are. On a cluster
whose workers have more cores than the client, each row block sums its own sketch
rows instead (:func:`daskkrr.solvers.sketch.block_sketch_partial`), the ``M x M``
partial sums add along the reduction tree, and only their total reaches the client.
It is one pass over the data, as the gathering was. The client still factors
``K_MM`` first (the blocks need ``T``) and ``A`` last. The cost model chooses where
(:func:`daskkrr.parallel.preconditioner_cost.sketch_cost`); ``DASKKRR_SKETCH_ON=client``
or ``workers`` overrides it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.solvers.falkon import FLOAT32_PROBE_ROWS, float32_sketch_accurate
from daskkrr.solvers.sketch import KernelRowSketch, block_sketch_partial, unpack_sketch_partial

__all__ = ["WorkerRowSketch"]


class WorkerRowSketch:
    """A row sketch whose Gram is summed block by block on the workers (see the module docstring).

    ``passes`` are the fit's :class:`~daskkrr.parallel.executor.BlockPasses`; ``idx``
    the sorted sketch rows (:func:`~daskkrr.solvers.sketch.sketch_indices`) and
    ``row_weights`` theirs (or None). The blocks compute in float32 where
    :func:`~daskkrr.solvers.falkon.sketch_gram` asks for it and the client's check
    (:meth:`float32_accurate`) allows, as the client's sketch does.
    """

    def __init__(self, passes: Any, kernel: Kernel, idx: np.ndarray, centers: np.ndarray,
                 row_weights: np.ndarray | None = None):
        self.passes = passes
        self.kernel = kernel
        self.idx = np.asarray(idx, dtype=np.int64)
        if np.any(np.diff(self.idx) <= 0):
            raise ValueError("the sketch rows must be sorted and distinct")
        self.centers = np.ascontiguousarray(centers)
        self.row_weights = None if row_weights is None else np.asarray(row_weights, dtype=np.float64)

    @property
    def rows(self) -> int:
        return int(self.idx.shape[0])

    def float32_accurate(self, T64: np.ndarray, d: np.ndarray, penalty: float) -> bool:
        """The client's float32 check on the sketch's first rows (a few hundred, gathered here)."""
        probe = self.passes.gather_rows(self.idx[:FLOAT32_PROBE_ROWS])
        K = next(iter(KernelRowSketch(self.kernel, probe, self.centers, dtype=np.float32)))
        return float32_sketch_accurate(T64, d, K, penalty)

    def sketch_sums(self, T64: np.ndarray, d: np.ndarray, single: bool) -> tuple[np.ndarray, np.ndarray, float]:
        """``(sum W^T W, sum W, rows)`` over the sketch rows, summed on the workers."""
        ex = self.passes.executor
        weights = None if self.row_weights is None else ex.broadcast(self.row_weights)
        # the blocks solve with T in the arithmetic they use (half the bytes to send in float32)
        T = np.asfortranarray(T64, dtype=np.float32 if single else np.float64)
        flat = self.passes.map_reduce(
            block_sketch_partial, ex.broadcast(self.idx), weights, self.kernel, ex.broadcast(self.centers),
            ex.broadcast(T), d, bool(single), name="sketch", with_offsets=True)
        return unpack_sketch_partial(np.asarray(flat, dtype=np.float64), T64.shape[0])
