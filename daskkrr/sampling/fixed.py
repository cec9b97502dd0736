"""Centers of the user's own: an array passed as ``sampler=``, used as given.

The array is in the features' original units; a model that standardises its
features (``standardize=True``) maps it with the same scaling as the data before
the fit (:meth:`FixedCenters.in_units_of`), so the centers mean what the user meant.
The centers need not be rows of the training data: their ``indices`` are -1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.sampling import base as _base
from daskkrr.sampling.base import CenterDictionary, CenterSampler

if TYPE_CHECKING:
    from daskkrr.parallel.executor import Executor

#: ``indices`` of a center that is not a training row.
NOT_A_ROW = -1


def check_centers(centers: Any, n_features: int | None = None) -> np.ndarray:
    """The centers as a float64 array of shape (M, n_features); ValueError saying what is wrong.

    Parameters
    ----------
    centers : array-like of shape (M, n_features)
        The centers, one per row.
    n_features : int or None
        Features of the training data (None: not checked).
    """
    arr = np.asarray(centers)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"sampler: the centers must be numbers; got an array of dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(
            f"sampler: the centers must be a 2-D array (M centers, n_features); got shape {arr.shape}. "
            "One center x is written np.atleast_2d(x)"
        )
    if arr.shape[0] == 0:
        raise ValueError(f"sampler: the centers array has no rows (shape {arr.shape}); pass at least one center")
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(
            f"sampler: the centers have {arr.shape[1]} features but X has {n_features}; "
            "pass centers with one column per feature of X, in X's units"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"sampler: the centers hold {int(bad.sum())} non-finite value(s), the first at row {row}, "
            f"column {col} ({arr[row, col]!r}); remove or replace them"
        )
    return np.asarray(arr, dtype=np.float64)


class FixedCenters(CenterSampler):
    """Use the given centers, whatever the data (``FalkonRegressor(sampler=array)``).

    Parameters
    ----------
    centers : array-like of shape (M, n_features)
        The centers in the units of ``X`` (before any standardisation).
    scaler : Standardizer or None
        The data's feature scaling, applied to the centers at ``select``.
    """

    name = "fixed"

    def __init__(self, centers: Any, scaler: Any = None):
        self.centers = centers
        self.scaler = scaler

    def in_units_of(self, scaler: Any) -> FixedCenters:
        """The same centers for a fit whose features are scaled by ``scaler`` (None: unscaled)."""
        return FixedCenters(self.centers, scaler)

    def __repr__(self) -> str:
        return f"FixedCenters(<{np.shape(self.centers)} array>)"

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        """The centers (checked against ``X``'s features), scaled as ``X`` was; nothing is drawn."""
        Z = check_centers(self.centers, int(X.shape[1]))
        if self.scaler is not None:
            Z = np.asarray(self.scaler.transform(Z), dtype=np.float64)
        return CenterDictionary(
            centers=Z.astype(X.dtype), indices=np.full(Z.shape[0], NOT_A_ROW, dtype=np.int64),
            weights=np.ones(Z.shape[0]), info={"sampler": self.name, "unique": int(np.unique(Z, axis=0).shape[0])},
        )


_base.ARRAY_SAMPLER = FixedCenters  # make_sampler(array) -> FixedCenters(array)
