"""The solver strategies of :mod:`daskkrr.parallel.strategies` with row weights.

The operators here answer the same two questions, for the weighted system:

- ``rhs()`` -> ``K_nM^T (w * Y)``;
- ``gram_matvec(u)`` -> ``K_nM^T (w * (K_nM u))``;

(the Gram operator also keeps ``knm_t_y`` and ``gram``, as its unweighted
twin). The weights travel with the targets: the passes' ``Y`` has them as its
last column (:func:`with_weights`), so each block task receives its rows'
weights with its rows and nothing of size n reaches the client. The block
products are :mod:`daskkrr.kernels.weighted`'s.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.kernels.weighted import (
    weighted_gram_and_rhs,
    weighted_gram_matvec,
    weighted_kernel_block,
    weighted_t_matvec,
)
from daskkrr.parallel.executor import BlockPasses
from daskkrr.parallel.strategies import CachedOperator, GramOperator, Operator, RecomputeOperator


def with_weights(Y: da.Array, w: da.Array) -> da.Array:
    """``[Y | w]``: the targets with the row weights as their last column (same row chunks)."""
    col = w.rechunk({0: Y.chunks[0]})[:, None].astype(np.float64)
    return da.concatenate([Y, col], axis=1).rechunk({1: -1}, method="tasks")


# --------------------------------------------------------------------------- block tasks
# Yb is [Y_b | w_b]: the targets, then the weights.
def _rhs_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
    return weighted_t_matvec(kernel, Xb, Z, Yb[:, :-1], Yb[:, -1])


def _gram_matvec_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray, U: np.ndarray) -> np.ndarray:
    return weighted_gram_matvec(kernel, Xb, Z, U, Yb[:, -1])


def _gram_rhs_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray,
                   right: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    return weighted_gram_and_rhs(kernel, Xb, Yb[:, :-1], Z, Yb[:, -1], right=right)


def _kernel_block_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
    return weighted_kernel_block(kernel, Xb, Z, Yb[:, -1])


def _cached_rhs_task(Kb: np.ndarray, Yb: np.ndarray) -> np.ndarray:
    # Kb holds sqrt(w) K: (sqrt(w) K)^T (sqrt(w) Y) = K^T (w Y).
    return engine_for(None).cached_t_matvec(Kb, np.sqrt(Yb[:, -1:]) * Yb[:, :-1])


# --------------------------------------------------------------------------- operators
class WeightedRecomputeOperator(RecomputeOperator):
    """Recompute ``k(X_b, Z)`` on every pass; each product weighs the rows."""

    def rhs(self) -> np.ndarray:
        return self.passes.map_reduce(_rhs_task, self.kernel, self.Z, name="rhs", with_y=True)

    def gram_matvec(self, u: np.ndarray) -> np.ndarray:
        return self.passes.map_reduce(_gram_matvec_task, self.kernel, self.Z, u, name="matvec", with_y=True)


class WeightedCachedOperator(CachedOperator):
    """Keep every ``sqrt(w_b) k(X_b, Z)`` in worker memory; iterations are the unweighted cached products."""

    def __init__(self, passes: BlockPasses, kernel: Kernel, Z: Any):
        self.passes = passes
        self.blocks = passes.keep(_kernel_block_task, kernel, Z, name="cache", with_y=True)

    def rhs(self) -> np.ndarray:
        return self.passes.reduce_kept(self.blocks, _cached_rhs_task, name="rhs", with_y=True)


class WeightedGramOperator(GramOperator):
    """One pass accumulates the weighted Gram matrix and ``K_nM^T (w Y)``; products are ``M x M``.

    As :class:`~daskkrr.parallel.strategies.GramOperator`, whose products it
    reuses: with FALKON's factors it keeps the preconditioned
    ``T^-T D K^T W K D T^-1`` (for CG), otherwise ``K^T W K`` (for the direct solve).
    """

    @staticmethod
    def _block_task() -> Any:
        return _gram_rhs_task


def make_weighted_operator(strategy: str, passes: BlockPasses, kernel: Kernel, Z: Any, n_centers: int,
                           preconditioner: Any | None = None) -> Operator:
    """The weighted operator of a concrete strategy; ``passes`` must carry ``[Y | w]`` (:func:`with_weights`)."""
    if strategy == "recompute":
        return WeightedRecomputeOperator(passes, kernel, Z)
    if strategy == "cache":
        return WeightedCachedOperator(passes, kernel, Z)
    if strategy == "gram":
        return WeightedGramOperator(passes, kernel, Z, n_centers, preconditioner)
    raise ValueError(f"strategy must be one of 'recompute', 'cache', 'gram'; got {strategy!r}")
