"""Finite but extreme values: the magnitudes the statistics pass records, and the decisions taken on them.

The statistics pass (:mod:`daskkrr.data.scaling`) records, next to the moments of
every row block, the largest ``|x|`` of each feature column, the largest ``|y|`` of
each target column and the largest weight (:class:`Magnitudes`). After the pass,
before any kernel is evaluated, the fit decides:

* **Features, ``standardize=True``**: the moments are computed in an exactly
  rescaled (power of two) unit per column (see :class:`~daskkrr.data.moments.Moments`),
  so any finite magnitude standardises correctly; only values so large that
  ``x - mean`` would overflow the input's float type are refused.
* **Features, ``standardize=False``**: the kernel forms squared distances (and
  inner products) of raw rows, at most ``4 d max|x|^2``; a column that makes this
  overflow the fit's float type (float32 with ``dtype="float32"``) is refused,
  naming the column and the limit.
* **Targets**: the solvers form sums of squares of the targets (CG residual norms
  ``sum_i y_i^2 <= n max|y|^2``); ``|y| > 1e150`` overflows them for n up to ~1.8e8
  rows and ``0 < max|y| < 1e-150`` underflows them to zero (a silent all-zero
  model). Either is refused, naming the target column and the rescaling to apply.
* **Weights**: the fit's objective is invariant under one common factor on all
  weights (the penalty is scaled by their sum), so weights whose largest value is
  beyond ``2^±100`` are divided by a power of two (exact) before the solve.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from daskkrr.data.sparse import column_absmax

__all__ = ["ExtremeValueError", "Magnitudes", "check_feature_magnitudes", "check_fit_magnitudes",
           "check_subnormal_scale", "check_target_magnitudes", "feature_limit", "merge_magnitudes",
           "times_power_of_two", "weight_normalizer"]

#: Largest ``|y|`` the solvers take: ``n max|y|^2`` stays below float64's maximum (1.8e308) up to n ~ 1.8e8 rows.
TARGET_MAX = 1e150
#: Smallest non-zero ``max|y|``: below it the squares ``y^2`` underflow (float64's smallest normal is 2.2e-308).
TARGET_MIN = 1e-150
#: Weights whose largest value lies outside ``[2^-WEIGHT_EXPONENT, 2^WEIGHT_EXPONENT]`` are renormalised.
WEIGHT_EXPONENT = 100


class ExtremeValueError(ValueError):
    """Finite input whose magnitude the fit cannot represent; the message names the column or target."""


@dataclasses.dataclass(frozen=True, eq=False)
class Magnitudes:
    """Largest absolute values of a set of rows.

    Attributes
    ----------
    x_absmax : ndarray of shape (d,)
        ``max |x|`` per feature column.
    y_absmax : ndarray of shape (t,) or None
        ``max |y|`` per target column (None without a target).
    w_max : float or None
        Largest row weight (None without weights).
    """

    x_absmax: np.ndarray
    y_absmax: np.ndarray | None = None
    w_max: float | None = None

    @classmethod
    def of(cls, X: Any, y: Any | None = None, w: Any | None = None) -> Magnitudes:
        """Magnitudes of one block (NaN/inf are reported by the finiteness check, not here)."""
        return cls(_column_absmax(X), None if y is None else _column_absmax(np.reshape(y, (len(y), -1))),
                   None if w is None else _absmax_or_zero(np.asarray(w, dtype=np.float64)))


def merge_magnitudes(*parts: Magnitudes | None) -> Magnitudes | None:
    """Magnitudes of the union of disjoint row sets (None parts are skipped)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    ys = [p.y_absmax for p in present if p.y_absmax is not None]
    ws = [p.w_max for p in present if p.w_max is not None]
    return Magnitudes(
        np.max([p.x_absmax for p in present], axis=0),
        np.max(ys, axis=0) if len(ys) == len(present) else None,
        max(ws) if len(ws) == len(present) else None,
    )


def _column_absmax(a: Any) -> np.ndarray:
    if sp.issparse(a):
        return column_absmax(a)
    a = np.asarray(a)
    if a.shape[0] == 0:
        return np.zeros(a.shape[1])
    with np.errstate(invalid="ignore"):
        return np.nanmax(np.abs(a.astype(np.float64, copy=False)), axis=0) if a.dtype.kind == "f" \
            else np.abs(a.astype(np.float64)).max(axis=0)


def _absmax_or_zero(a: np.ndarray) -> float:
    return float(np.nanmax(np.abs(a))) if a.size else 0.0


# --------------------------------------------------------------------------- decisions


def feature_limit(dtype: Any, n_features: int) -> float:
    """Largest ``|x|`` whose squared distances ``<= 4 d max|x|^2`` stay finite in ``dtype``."""
    return math.sqrt(float(np.finfo(dtype).max) / (4.0 * n_features))


def check_feature_magnitudes(
    x_absmax: np.ndarray, *, standardize: bool, fit_dtype: Any, input_dtype: Any, name: str = "X",
) -> None:
    """Refuse feature columns whose magnitude overflows the kernel (or the standardisation).

    Parameters
    ----------
    x_absmax : ndarray of shape (d,)
        ``max |x|`` per column, from the statistics pass.
    standardize : bool
        Whether the fit standardises the columns first (then only ``x - mean`` must be finite).
    fit_dtype : dtype
        Precision of the kernel blocks (the estimator's ``dtype``).
    input_dtype : dtype
        dtype of the input (the standardisation runs in it when it is a float type).

    Raises
    ------
    ExtremeValueError
        Naming the first offending column, its largest ``|x|``, the limit and the fix.
    """
    d = int(x_absmax.shape[0])
    if standardize:
        work = np.dtype(input_dtype) if np.dtype(input_dtype).kind == "f" else np.dtype(np.float64)
        limit = float(np.finfo(work).max) / 4  # |x - mean| <= 2 max|x| stays finite, with a margin of 2
        reason = f"x - mean overflows {work} (values up to {limit:.3g} are standardised exactly)"
        fix = f"divide the column by a constant (e.g. {name}[:, j] / 1e100) or convert {name} to float64"
    else:
        limit = feature_limit(fit_dtype, d)
        reason = (f"squared distances (up to 4 d max|x|^2, d={d}) overflow {np.dtype(fit_dtype)}: the largest "
                  f"|x| without standardize is {limit:.3g}")
        fix = "fit with standardize=True (exact for any finite magnitude) or divide the column by a constant"
    bad = np.flatnonzero(x_absmax > limit)
    if bad.size:
        j = int(bad[0])
        more = f" (and {bad.size - 1} more column(s): {bad[1:6].tolist()})" if bad.size > 1 else ""
        raise ExtremeValueError(
            f"{name} column {j} has |x| up to {x_absmax[j]:.3g}{more}: {reason}; {fix}"
        )


def check_subnormal_scale(scale: np.ndarray, name: str = "X") -> None:
    """Refuse standardising a column whose standard deviation is subnormal (below 2.2e-308).

    A subnormal number carries fewer than 53 significant bits (about 14 at 1e-314): the
    column's scale, and so every standardised value, would be off by up to
    ``2^-1074 / std`` relatively, far more than the float64 rounding the fit assumes.
    """
    bad = np.flatnonzero((scale > 0) & (scale < np.finfo(np.float64).tiny))
    if bad.size:
        j = int(bad[0])
        raise ExtremeValueError(
            f"{name} column {j} has a standard deviation of {scale[j]:.3g}, in float64's subnormal range (below "
            f"{np.finfo(np.float64).tiny:.3g}, fewer than 53 significant bits): standardising it would lose "
            f"digits; multiply the column by a constant (e.g. {name}[:, {j}] * 1e300) before fitting"
        )


def check_target_magnitudes(y_absmax: np.ndarray | None, name: str = "y") -> None:
    """Refuse targets whose squares overflow (``|y| > 1e150``) or underflow (``max|y| < 1e-150``).

    Raises
    ------
    ExtremeValueError
        Naming the target column, its largest ``|y|`` and the rescaling to apply.
    """
    if y_absmax is None:
        return
    for t, top in enumerate(np.asarray(y_absmax, dtype=np.float64).reshape(-1)):
        where = f"{name}" if np.size(y_absmax) == 1 else f"{name} target column {t}"
        if top > TARGET_MAX:
            raise ExtremeValueError(
                f"{where} has |y| up to {top:.3g} > {TARGET_MAX:g}: the solver's sums of squares of the targets "
                f"would overflow float64; fit on {name} / {top:.0e} and multiply the predictions by {top:.0e} "
                "(kernel ridge regression is linear in the target, so the model is the same)"
            )
        if 0 < top < TARGET_MIN:
            raise ExtremeValueError(
                f"{where} has |y| at most {top:.3g} < {TARGET_MIN:g}: the solver's squares of the targets would "
                f"underflow to zero (an all-zero model); fit on {name} / {top:.0e} and multiply the predictions "
                f"by {top:.0e} (kernel ridge regression is linear in the target, so the model is the same)"
            )


def weight_normalizer(w_max: float | None) -> int:
    """The exponent ``k`` such that ``w_max * 2**k`` lies in ``[0.5, 1)``, or 0 when ``w_max`` is moderate.

    The fit is invariant under one factor on all weights (the penalty is scaled by
    their sum), and multiplying by a power of two is exact: the normalised weights give
    the same model without the overflow of ``w * K`` (weights ~1e300) or the lost digits
    of subnormal products (weights ~1e-300).
    """
    if w_max is None or not w_max > 0 or not math.isfinite(w_max):
        return 0
    exponent = math.frexp(w_max)[1]
    if -WEIGHT_EXPONENT <= exponent <= WEIGHT_EXPONENT:
        return 0
    return -exponent  # applied with ldexp: 2**1074 itself would overflow, the product does not


def times_power_of_two(a: np.ndarray, exponent: int) -> np.ndarray:
    """``a * 2**exponent``, exact (barring under/overflow) even where ``2**exponent`` itself overflows."""
    return np.ldexp(a, exponent)


def check_fit_magnitudes(magnitudes: Magnitudes | None, *, standardize: bool, fit_dtype: Any,
                         input_dtype: Any, scale: np.ndarray | None = None) -> int:
    """All the decisions after the statistics pass: refuse extreme features or targets, and return
    the exponent ``k`` (0 when none is needed) of the power of two to multiply the row weights by.

    Raises
    ------
    ExtremeValueError
        See :func:`check_feature_magnitudes` and :func:`check_target_magnitudes`.
    """
    if magnitudes is None:  # the pass found no rows (refused elsewhere)
        return 0
    check_feature_magnitudes(magnitudes.x_absmax, standardize=standardize, fit_dtype=fit_dtype,
                             input_dtype=input_dtype)
    if standardize and scale is not None:
        check_subnormal_scale(scale)
    check_target_magnitudes(magnitudes.y_absmax)
    return weight_normalizer(magnitudes.w_max)
