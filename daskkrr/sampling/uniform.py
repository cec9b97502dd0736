"""Uniform sampling of centers without replacement (in proportion to the row weights of a weighted fit)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.parallel.executor import Executor, gather_rows
from daskkrr.sampling.base import (
    CenterDictionary,
    CenterSampler,
    register,
)
from daskkrr.sampling.weighted_rows import choose_weighted_rows

if TYPE_CHECKING:
    import dask.array as da


@register
class UniformSampler(CenterSampler):
    """Pick ``n_centers`` distinct rows uniformly at random.

    The row indices depend only on ``n``, ``n_centers`` and ``random_state``, so the
    centers are the same for any chunking and any number of workers. Only the chosen
    rows travel to the client.

    With ``sample_weight`` (a weighted fit passes its row weights) the rows are drawn
    in proportion to their weights, still without replacement, as drawing uniformly
    from the data with each row repeated by its weight would
    (:mod:`daskkrr.sampling.weighted_rows`; one pass over the weights, independent
    of the chunking); rows of weight 0 are never drawn.
    """

    name = "uniform"

    def select(
        self,
        X: da.Array,
        kernel: Kernel,
        *,
        n_centers: int | None = None,
        penalty: float | None = None,
        random_state: int | None = None,
        executor: Any = None,
        client: Any = None,
        sample_weight: da.Array | None = None,
    ) -> CenterDictionary:
        return self._timed_select(X, kernel, executor, client, n_centers=n_centers, penalty=penalty,
                                  random_state=random_state, sample_weight=sample_weight)

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor, sample_weight: da.Array | None = None,
                ) -> CenterDictionary:
        n = int(X.shape[0])
        if n_centers is None:
            raise ValueError("UniformSampler needs n_centers")
        if n_centers > n:
            raise ValueError(
                f"n_centers={n_centers} is larger than the number of rows ({n}); "
                f"use n_centers <= {n}"
            )
        if sample_weight is None:
            rng = np.random.default_rng(random_state)
            idx = np.sort(rng.choice(n, size=n_centers, replace=False)).astype(np.int64)
        else:
            idx = choose_weighted_rows(executor.passes(sample_weight[:, None]), n_centers, random_state)
        centers = gather_rows(X, idx, executor)
        # Drawn in proportion to the weights, the centers are a uniform sample of the weighted data:
        # their importance weights (FALKON's D) are all one.
        return CenterDictionary(
            centers=centers, indices=idx, weights=np.ones(idx.size),
            info={"sampler": self.name, **({"weighted": True} if sample_weight is not None else {})},
        )
