"""Center-selection interface shared by every sampler.

A sampler looks at the (row-chunked, already scaled) training data and returns a
:class:`CenterDictionary`: the centers ``Z`` that the Nystrom/FALKON solvers use,
where each came from, and the importance weights the weighted FALKON
preconditioner needs.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any

import dask.array as da
import numpy as np

from daskkrr.kernels import Kernel


@dataclasses.dataclass
class CenterDictionary:
    """A set of unique Nystrom centers.

    Attributes
    ----------
    centers : ndarray of shape (m, d)
        The center points, in the (scaled) feature space the model is fitted in.
    indices : ndarray of shape (m,), int64
        Row index of each center in the training data.
    weights : ndarray of shape (m,), float64
        Importance weight of each center, normalised so that uniform sampling gives
        all ones: ``w_j = 1 / (n p_j)`` for a center drawn with per-draw probability
        ``p_j`` (for a SQUEAK dictionary the copies ``q_j`` enter as well). FALKON's
        preconditioner uses ``D = diag(sqrt(w))`` around ``K_MM``.
    counts : ndarray of shape (m,), int64 or None
        Number of copies of each center (SQUEAK/DISQUEAK), or None.
    probabilities : ndarray of shape (m,), float64 or None
        Inclusion probability of each center when it was kept, or None.
    info : dict
        Sampler-specific diagnostics (history, d_eff estimates, ...), JSON-ready.
    """

    centers: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    counts: np.ndarray | None = None
    probabilities: np.ndarray | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.centers = np.ascontiguousarray(np.atleast_2d(self.centers))
        self.indices = np.asarray(self.indices, dtype=np.int64).ravel()
        self.weights = np.asarray(self.weights, dtype=np.float64).ravel()
        m = self.centers.shape[0]
        if self.indices.shape != (m,) or self.weights.shape != (m,):
            raise ValueError(
                f"CenterDictionary: centers {self.centers.shape}, indices {self.indices.shape} and "
                f"weights {self.weights.shape} must agree on the number of centers"
            )
        if np.any(~np.isfinite(self.weights)) or np.any(self.weights <= 0):
            raise ValueError("CenterDictionary: weights must be finite and > 0")

    @property
    def size(self) -> int:
        return int(self.centers.shape[0])

    @property
    def is_uniform(self) -> bool:
        return bool(np.allclose(self.weights, 1.0))


class CenterSampler(ABC):
    """Chooses Nystrom centers from row-chunked data.

    Implementations keep their own parameters (set in ``__init__``) and implement
    :meth:`select`. They must be deterministic for a given ``random_state`` and must
    not depend on the number of workers or on how ``X`` is chunked unless they say
    so in their docstring.
    """

    #: Registry name, used by ``FalkonRegressor(sampler=<name>)``.
    name: str = ""

    @abstractmethod
    def select(
        self,
        X: da.Array,
        kernel: Kernel,
        *,
        n_centers: int | None,
        penalty: float,
        random_state: int | None,
        client: Any = None,
    ) -> CenterDictionary:
        """Return the centers for data ``X`` (n, d), a row-chunked dask array.

        Parameters
        ----------
        X : dask array of shape (n, d)
            Training features, already standardised, one chunk across the columns.
        kernel : Kernel
            The kernel of the model (leverage-score samplers need it).
        n_centers : int or None
            Requested number of centers. Samplers that size their dictionary
            themselves (SQUEAK) may treat it as a budget or ignore it.
        penalty : float
            FALKON's lambda; RLS samplers default to ``gamma = penalty * n``.
        random_state : int or None
            Seed. The result must not depend on the number of workers.
        client : distributed.Client or None
            Client to run on, or None for the current/threaded scheduler.
        """

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"
