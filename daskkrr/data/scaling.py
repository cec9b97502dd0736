"""Per-column standardisation fitted in one pass over row blocks.

:meth:`Standardizer.fit` computes, for every row block independently, the row
count, column means and sums of squared deviations (``M2``), and checks the
block for NaN/inf. The block summaries are merged pairwise up a tree with Chan
et al.'s parallel update::

    n = n_a + n_b
    delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    M2 = M2_a + M2_b + delta**2 * n_a * n_b / n

so the whole fit (features, target mean and finiteness checks) is a single
dask computation whose intermediate results are of size ``d``, never ``n``.

With per-row weights ``w`` the counts become sums of weights (``n_a = sum w``),
the means weighted means and ``M2 = sum w (x - mean)^2``: the same merge then
gives the statistics of the data with each row repeated ``w`` times (integer
weights), as scikit-learn's ``StandardScaler(sample_weight=...)``. The weights are
checked in the same pass (finite, not negative).

With ``digest_blocks=True`` each block's task also returns a digest of the block's
bytes (X, y and the weights, :func:`~daskkrr.data.moments.block_digest`), and the merge keeps them in
block order: a content fingerprint of every block, read in the same pass, that does
not depend on how the tree or the cluster is shaped (a checkpoint compares it block
by block on resume, :mod:`daskkrr.checkpoint`).
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.exceptions import NotFittedError

from daskkrr.data.chunking import align_rows, as_row_blocks, numpy_to_dask
from daskkrr.data.extremes import ExtremeValueError
from daskkrr.data.moments import BlockSummary, Moments, block_digest, merge_moments, merge_summaries, summarize_block
from daskkrr.data.sparse import is_sparse_array, scale_sparse, sparse_to_dask
from daskkrr.data.validation import check_feature_columns, check_features, check_target

__all__ = ["Moments", "Standardizer", "block_digest", "merge_moments"]

#: Number of block summaries merged by one task of the reduction tree.
SPLIT_EVERY = 8


# --------------------------------------------------------------------------- estimator


class Standardizer(TransformerMixin, BaseEstimator):
    """Remove the column mean and divide by the column standard deviation.

    Like :class:`sklearn.preprocessing.StandardScaler`, for row-chunked dask
    arrays: :meth:`fit` makes one pass over the blocks (see the module
    docstring), :meth:`transform` is lazy.

    Parameters
    ----------
    with_mean : bool, default=True
        Subtract the column means.
    with_std : bool, default=True
        Divide by the column standard deviations (population, ``ddof=0``).
        Constant columns get a scale of 1 (of ``2**k ~ |mean|`` for a constant column of
        magnitude beyond ``2**500``, so that the mean's rounding error standardises to ~0).

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,) or None
        Column means (None if ``with_mean=False``).
    scale_ : ndarray of shape (n_features,) or None
        Column scales (None if ``with_std=False``).
    n_samples_ : int
        Number of rows seen by :meth:`fit`.
    weight_sum_ : float
        Sum of the rows' weights (``n_samples_`` when fitted without weights).
    n_features_in_ : int
        Number of columns seen by :meth:`fit`.
    y_mean_ : float, ndarray of shape (n_targets,), or None
        Mean of the target passed to :meth:`fit` (None if none was).
    block_digests_ : list of [str, str, str]
        Only after ``fit(..., digest_blocks=True)``: per row block, in block order,
        the :func:`~daskkrr.data.moments.block_digest` of its X, y and sample weights ("" for an absent y
        or weights). Not part of :meth:`to_dict`.

    Examples
    --------
    >>> import dask.array as da
    >>> X = da.from_array([[1.0, 5.0], [3.0, 5.0]], chunks=(1, 2))
    >>> s = Standardizer().fit(X)
    >>> s.mean_, s.scale_
    (array([2., 5.]), array([1., 1.]))
    >>> s.transform(X).compute()
    array([[-1.,  0.],
           [ 1.,  0.]])
    """

    def __init__(self, with_mean: bool = True, with_std: bool = True) -> None:
        self.with_mean = with_mean
        self.with_std = with_std

    def fit(
        self, X: Any, y: Any | None = None, sample_weight: Any | None = None, *, digest_blocks: bool = False
    ) -> Standardizer:
        """Compute column means and scales (and the target mean) in one pass.

        Parameters
        ----------
        X : dask or numpy array of shape (n, d)
            Features; blocks are processed independently.
        y : dask or numpy array of shape (n,) or (n, t), optional
            Target; checked for NaN/inf and averaged in the same pass.
        sample_weight : dask or numpy array of shape (n,), optional
            Row weights: weighted means and variances (a row of integer weight
            ``k`` counts as ``k`` rows). Checked in the same pass: NaN, inf,
            negative weights and weights that sum to zero are refused.
        digest_blocks : bool, default=False
            Also keep a digest of every row block's bytes in ``block_digests_``
            (read in the same pass; a checkpoint's content fingerprint).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            If ``X`` or ``y`` contains NaN or inf, or ``sample_weight`` NaN, inf or
            negative values (the message names the rows), or only zeros.
        """
        X, y = _prepare_inputs(X, y)
        w = None if sample_weight is None else _prepare_weights(sample_weight, X)
        summary = _fit_pass(X, y, w, digest=digest_blocks)
        _raise_if_non_finite(summary, X.chunks[0])
        x = summary.x
        if x is None:  # X's moments are missing only for a non-finite block, which raised above
            raise RuntimeError("the statistics pass returned no moments of X")
        n = x.count
        if not n > 0:
            raise ValueError(
                "sample_weight has only zero weights: no row counts in the fit; give at least one row "
                "a weight > 0"
            )
        if not np.isfinite(x.true_count()):
            raise ExtremeValueError(
                "sample_weight sums to more than float64 can hold (inf); divide the weights by their maximum "
                "(the fit depends only on their ratios)"
            )
        var = x.m2 / n
        self.n_samples_ = int(X.shape[0])
        self.weight_sum_ = float(x.true_count())
        self.n_features_in_ = int(X.shape[1])
        self.mean_ = x.true_mean() if self.with_mean else None
        # the mean's rounding error grows with the number of rows summed, not with their weights
        self.scale_ = _scale_from_variance(var, x.mean, self.n_samples_, x.shift) if self.with_std else None
        y_mean: float | np.ndarray | None
        if summary.y is None:
            y_mean = None
        elif y is not None and y.ndim == 1:
            y_mean = float(summary.y.true_mean()[0])
        else:
            y_mean = summary.y.true_mean()
        self.y_mean_ = y_mean
        if digest_blocks:
            self.block_digests_ = [list(d) for d in summary.digests]
        #: Largest |x| per column, |y| per target and weight (:mod:`daskkrr.data.extremes`); not saved.
        self.magnitudes_ = summary.magnitudes
        return self

    def transform(self, X: Any) -> Any:
        """Standardise ``X``: dask in -> lazy dask out, otherwise numpy out.

        Floating inputs keep their dtype; bool/int inputs become float64.
        """
        return self._apply(X, inverse=False)

    def inverse_transform(self, X: Any) -> Any:
        """Undo :meth:`transform`: ``X * scale_ + mean_``."""
        return self._apply(X, inverse=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready parameters and fitted state (lists of floats)."""
        self._check_fitted()
        y_mean = self.y_mean_
        weighted = getattr(self, "weight_sum_", self.n_samples_) != self.n_samples_
        return {
            "with_mean": bool(self.with_mean),
            "with_std": bool(self.with_std),
            "mean": None if self.mean_ is None else [float(v) for v in self.mean_],
            "scale": None if self.scale_ is None else [float(v) for v in self.scale_],
            "n_samples": int(self.n_samples_),
            **({"weight_sum": float(self.weight_sum_)} if weighted else {}),
            "n_features": int(self.n_features_in_),
            "y_mean": (
                None
                if y_mean is None
                else float(y_mean)
                if np.ndim(y_mean) == 0
                else [float(v) for v in np.asarray(y_mean)]
            ),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Standardizer:
        """Rebuild a fitted Standardizer from :meth:`to_dict` output."""
        required = {"with_mean", "with_std", "mean", "scale", "n_samples", "n_features"}
        missing = sorted(required - set(state))
        if missing:
            raise KeyError(f"Standardizer state is missing keys {missing}; use to_dict() output")
        self = cls(with_mean=bool(state["with_mean"]), with_std=bool(state["with_std"]))
        d = int(state["n_features"])
        self.n_features_in_ = d
        self.n_samples_ = int(state["n_samples"])
        self.weight_sum_ = float(state.get("weight_sum", self.n_samples_))
        self.mean_ = _vector(state["mean"], d, "mean")
        self.scale_ = _vector(state["scale"], d, "scale")
        y_mean = state.get("y_mean")
        self.y_mean_ = (
            None
            if y_mean is None
            else float(y_mean)
            if np.ndim(y_mean) == 0
            else np.asarray(y_mean, dtype=np.float64)
        )
        return self

    # ----------------------------------------------------------------------- helpers

    def _check_fitted(self) -> None:
        if not hasattr(self, "n_samples_"):
            raise NotFittedError(
                "this Standardizer is not fitted yet; call fit(X) (or from_dict) first"
            )

    def _apply(self, X: Any, inverse: bool) -> Any:
        self._check_fitted()
        if is_sparse_array(X):
            return self._apply_sparse(X, inverse)
        lazy = isinstance(X, da.Array)
        if not lazy:
            X = np.asarray(X)
        # A blockwise map: lazy rows of unknown count (a dask DataFrame's) are fine.
        d = check_feature_columns(X, "X") if lazy else check_features(X, "X")[1]
        if d != self.n_features_in_:
            raise ValueError(
                f"X has {d} features but this Standardizer was fitted with {self.n_features_in_}"
            )
        dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float64)
        out = X.astype(dtype, copy=False)
        mean = None if self.mean_ is None else self.mean_.astype(dtype)
        scale = None if self.scale_ is None else self.scale_.astype(dtype)
        if inverse:
            if scale is not None:
                out = out * scale
            if mean is not None:
                out = out + mean
        else:
            if mean is not None:
                out = out - mean
            if scale is not None:
                out = out / scale
        return out


    def _apply_sparse(self, X: Any, inverse: bool) -> Any:
        """Scale the columns of sparse ``X`` (scipy or dask of sparse blocks); it stays sparse.

        A sparse fit is scaled without centering (``with_mean=False``): a mean would fill in the zeros."""
        if self.mean_ is not None:
            raise TypeError(
                "this Standardizer centres the columns (with_mean=True), which would make sparse X dense; "
                "fit it with with_mean=False for sparse features, or pass X.toarray()"
            )
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features but this Standardizer was fitted with {self.n_features_in_}")
        dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float64)
        X = X.astype(dtype)
        if self.scale_ is None:
            return X
        return scale_sparse(X, self.scale_ if inverse else 1.0 / self.scale_)


# --------------------------------------------------------------------------- orchestration


def _prepare_inputs(X: Any, y: Any | None) -> tuple[da.Array, da.Array | None]:
    """Validate and bring (X, y) into the row-block layout without reading data."""
    if is_sparse_array(X) and not isinstance(X, da.Array):
        X = sparse_to_dask(X)
    if not isinstance(X, da.Array):
        X = np.asarray(X)
    n, _ = check_features(X, "X")
    X = numpy_to_dask(X) if isinstance(X, np.ndarray) else as_row_blocks(X)
    if y is None:
        return X, None
    if not isinstance(y, da.Array):
        y = np.asarray(y)
    check_target(y, n, "y", "X")
    if isinstance(y, np.ndarray):
        y = da.from_array(y, chunks=(X.chunks[0],) + y.shape[1:])
    return X, align_rows(y, X)


def _prepare_weights(sample_weight: Any, X: da.Array) -> da.Array:
    """Row weights as a 1-D dask array with the row chunks of ``X`` (length checked)."""
    w = sample_weight if isinstance(sample_weight, da.Array) else np.asarray(sample_weight)
    if w.ndim != 1 or w.shape[0] != X.shape[0]:
        raise ValueError(
            f"sample_weight has shape {w.shape} but X has {X.shape[0]} rows; pass one weight per row"
        )
    if isinstance(w, np.ndarray):
        return da.from_array(w, chunks=(X.chunks[0],))
    return w.rechunk({0: X.chunks[0]})


def _fit_pass(X: da.Array, y: da.Array | None, w: da.Array | None = None, digest: bool = False) -> BlockSummary:
    """Summaries of every block (with ``digest``, and their digests), merged up a tree in block order,
    in one dask computation."""
    x_blocks = X.to_delayed().ravel()
    y_blocks = [None] * len(x_blocks) if y is None else list(y.to_delayed().ravel())
    w_blocks = [None] * len(x_blocks) if w is None else list(w.to_delayed().ravel())
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).tolist()
    summarize = dask.delayed(summarize_block, pure=True)
    merge = dask.delayed(merge_summaries, pure=True)
    level = [
        summarize(xb, yb, i, int(start), wb, digest)
        for i, (xb, yb, wb, start) in enumerate(zip(x_blocks, y_blocks, w_blocks, starts))
    ]
    while len(level) > 1:
        level = [merge(*level[i : i + SPLIT_EVERY]) for i in range(0, len(level), SPLIT_EVERY)]
    (summary,) = dask.compute(level[0])
    return summary


def _raise_if_non_finite(summary: BlockSummary, row_chunks: tuple[int, ...]) -> None:
    bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(int)
    if summary.bad_w is not None:
        block, row = summary.bad_w
        raise ValueError(
            f"sample_weight has NaN, inf or a negative weight in rows {bounds[block]}-{bounds[block + 1] - 1} "
            f"(block {block}, first at row {row}); weights must be finite and >= 0"
        )
    for name, bad in (("X", summary.bad_x), ("y", summary.bad_y)):
        if bad is not None:
            block, row = bad
            raise ValueError(
                f"{name} has NaN or inf in rows {bounds[block]}-{bounds[block + 1] - 1} "
                f"(block {block}, first at row {row}); clean or impute them before fitting"
            )


def _scale_from_variance(var: np.ndarray, mean: np.ndarray, n: float, shift: np.ndarray | None = None) -> np.ndarray:
    """Standard deviations, with 1 for columns that are constant up to rounding.

    A constant column's computed variance is not always exactly 0: the mean of
    ``n`` equal values carries a rounding error of order ``n * eps * |mean|``.
    ``var`` and ``mean`` may be in the unit ``2**shift`` (:class:`~daskkrr.data.moments.Moments`); the
    scales returned are in the data's unit.
    """
    eps = np.finfo(np.float64).eps
    constant = var <= np.square(n * eps * mean)
    if shift is None:
        return np.where(constant, 1.0, np.sqrt(var))
    # A constant column of huge values keeps its mean's rounding error (~ n eps |mean|) after centring:
    # its unit (2**shift) as the scale brings that to ~ n eps, as 1 does for moderate columns.
    scale = np.where(constant, np.ldexp(1.0, np.maximum(shift, 0)), np.ldexp(np.sqrt(var), shift))
    # A positive spread below the smallest subnormal (e.g. [0, 5e-324]) underflows to 0 on the way back from
    # 2**shift: keep it positive, the smallest subnormal, so that transform stays finite and the estimators
    # refuse the column as they refuse any subnormal scale (extremes.check_subnormal_scale).
    return np.where(scale == 0, np.nextafter(0.0, 1.0), scale)


def _vector(values: Any, d: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (d,):
        raise ValueError(f"Standardizer state: {name} has shape {out.shape}, expected ({d},)")
    return out
