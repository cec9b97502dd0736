"""Uniform sampling of centers without replacement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.parallel.executor import gather_rows
from daskkrr.sampling.base import (
    CenterDictionary,
    CenterSampler,
    register,
    resolve_executor,
)

if TYPE_CHECKING:
    import dask.array as da


@register
class UniformSampler(CenterSampler):
    """Pick ``n_centers`` distinct rows uniformly at random.

    The row indices depend only on ``n``, ``n_centers`` and ``random_state``, so the
    centers are the same for any chunking and any number of workers. Only the chosen
    rows travel to the client.
    """

    name = "uniform"

    def select(
        self,
        X: da.Array,
        kernel: Kernel,
        *,
        n_centers: int | None,
        penalty: float,
        random_state: int | None,
        executor: Any = None,
        client: Any = None,
    ) -> CenterDictionary:
        n = int(X.shape[0])
        if n_centers is None:
            raise ValueError("UniformSampler needs n_centers")
        if n_centers > n:
            raise ValueError(
                f"n_centers={n_centers} is larger than the number of rows ({n}); "
                f"use n_centers <= {n}"
            )
        rng = np.random.default_rng(random_state)
        idx = np.sort(rng.choice(n, size=n_centers, replace=False)).astype(np.int64)
        centers = gather_rows(X, idx, resolve_executor(executor, client))
        return CenterDictionary(
            centers=centers, indices=idx, weights=np.ones(n_centers), info={"sampler": self.name}
        )
