"""The block statistics of :class:`~daskkrr.data.scaling.Standardizer`'s one-pass fit: what its tasks run.

Per row block: the row count (or sum of weights), column means, sums of squared deviations
(``M2``), the first non-finite row, the largest magnitudes and optionally a digest of the block's
bytes; summaries of consecutive blocks merge pairwise (Chan et al.'s update, see
:mod:`daskkrr.data.scaling`). Kept apart from the estimator so that a worker unpickling these task
functions imports numpy and the data helpers only, not scikit-learn (the estimator's base classes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from daskkrr.data.extremes import Magnitudes, merge_magnitudes
from daskkrr.data.sparse import csr_parts, first_non_finite_row, is_sparse_array, sparse_moments

__all__ = ["BlockSummary", "Moments", "block_digest", "merge_moments", "merge_summaries", "summarize_block"]


def block_digest(*blocks: np.ndarray) -> str:
    """BLAKE2b (128 bits, hex) of the shapes, dtypes and bytes of some numpy blocks.

    Exact and independent of where or in which order blocks are read: two blocks have the same
    digest only if they hold the same values, in the same layout and dtype.
    """
    h = hashlib.blake2b(digest_size=16)
    for block in blocks:
        if is_sparse_array(block):  # its defining arrays, not the object
            h.update(b"csr;")
            h.update(block_digest(*csr_parts(block)).encode())
            continue
        a = np.ascontiguousarray(block)
        h.update(f"{a.shape}{a.dtype.str};".encode())
        h.update(a.tobytes())
    return h.hexdigest()



@dataclasses.dataclass(frozen=True, eq=False)
class Moments:
    """Count, column means and sums of squared deviations of a set of rows.

    Attributes
    ----------
    count : float
        Number of rows, or the sum of their weights.
    mean : ndarray of shape (d,), float64
    m2 : ndarray of shape (d,), float64
        ``sum((x - mean) ** 2)`` per column.
    shift : ndarray of shape (d,), int, or None
        Columns of extreme magnitude are summarised in the unit ``2**shift``: the
        true mean is ``mean * 2**shift`` and the true ``m2`` is ``m2 * 4**shift``
        (so neither the squares of values ~1e200 overflow nor those of ~1e-200
        underflow). None: every column in its own unit (shift 0).
    weight_shift : int
        Weights of extreme magnitude are summed in the unit ``2**weight_shift``: the
        true count and ``m2`` are ``count * 2**weight_shift`` and ``m2 * 2**weight_shift``
        (their ratio, the variance, is unaffected), so that products with weights
        ~1e300 do not overflow nor those with weights ~1e-300 lose digits.
    """

    count: float
    mean: np.ndarray
    m2: np.ndarray
    shift: np.ndarray | None = None
    weight_shift: int = 0

    @classmethod
    def of(cls, block: np.ndarray, weights: np.ndarray | None = None) -> Moments:
        """Moments of a 2-D block (rows, d), computed in float64 with two passes.

        With ``weights`` (rows,), the weighted moments (count = the sum of the weights).
        A scipy sparse block is summarised from its stored entries (:func:`~daskkrr.data.sparse.sparse_moments`).
        """
        if is_sparse_array(block):
            return cls(*sparse_moments(block, weights))
        x = np.asarray(block, dtype=np.float64)
        shift = magnitude_shift(x)
        if shift is not None:
            x = np.ldexp(x, -shift)  # exact: a power of two per column
        if weights is None:
            mean = x.mean(axis=0)
            return cls(x.shape[0], mean, np.square(x - mean).sum(axis=0), shift)
        w = np.asarray(weights, dtype=np.float64).reshape(-1)
        weight_shift = _weight_shift(w)
        w = np.ldexp(w, -weight_shift) if weight_shift else w  # exact: a power of two
        total = float(w.sum())
        if total == 0:  # rows that count for nothing (merge_moments skips them)
            return cls(0.0, np.zeros(x.shape[1]), np.zeros(x.shape[1]))
        mean = (w @ x) / total
        return cls(total, mean, w @ np.square(x - mean), shift, weight_shift)

    def true_mean(self) -> np.ndarray:
        """The column means in the data's unit (undoing :attr:`shift`)."""
        return self.mean if self.shift is None else np.ldexp(self.mean, self.shift)

    def true_count(self) -> float:
        """The number of rows, or the sum of their weights (undoing :attr:`weight_shift`; may be inf)."""
        if not self.weight_shift:
            return self.count
        with np.errstate(over="ignore"):  # inf: refused by the caller, naming the weights
            return float(np.ldexp(self.count, self.weight_shift))


def _weight_shift(w: np.ndarray) -> int:
    """The exponent of the block's largest weight when it lies beyond ``2**±100`` (else 0)."""
    top = float(w.max()) if w.size else 0.0
    if not top > 0:
        return 0
    exponent = math.frexp(top)[1]
    return exponent if abs(exponent) > 100 else 0


def _in_weight_unit(m: Moments, weight_shift: int) -> Moments:
    """``m`` with its count and ``m2`` in the weight unit ``2**weight_shift`` (>= its own)."""
    delta = m.weight_shift - weight_shift
    if delta == 0:
        return m
    return Moments(float(np.ldexp(m.count, delta)), m.mean, np.ldexp(m.m2, delta), m.shift, weight_shift)


#: Columns with ``max|x|`` outside ``[2^-SHIFT_EXPONENT, 2^SHIFT_EXPONENT]`` get their own unit in
#: :class:`Moments` (their squares would otherwise overflow or underflow float64).
SHIFT_EXPONENT = 500
#: The shift of an all-zero column: below any other, so that a merge takes the other block's unit.
ZERO_SHIFT = -100_000


def magnitude_shift(x: np.ndarray) -> np.ndarray | None:
    """Per-column power-of-two exponents that bring extreme columns to ``max|x|`` in [0.5, 1).

    None when no column is extreme and none is all zero: the moments are then computed
    exactly as without this rescaling (bit for bit).
    """
    if x.shape[0] == 0:
        return None
    absmax = np.abs(x).max(axis=0)
    exponent = np.frexp(absmax)[1].astype(np.int64)
    extreme = (absmax > 0) & (np.abs(exponent) > SHIFT_EXPONENT)
    zero = absmax == 0
    if not extreme.any() and not zero.any():
        return None
    return np.where(extreme, exponent, np.where(zero, ZERO_SHIFT, 0))


def _in_unit(m: Moments, shift: np.ndarray) -> Moments:
    """``m`` expressed in the unit ``2**shift`` (``shift >=`` its own; smaller parts may underflow,
    harmlessly: they are below the column's rounding error)."""
    own = np.zeros_like(shift) if m.shift is None else m.shift
    delta = np.maximum(own - shift, ZERO_SHIFT)
    return Moments(m.count, np.ldexp(m.mean, delta), np.ldexp(m.m2, 2 * delta), shift, m.weight_shift)


def merge_moments(a: Moments, b: Moments) -> Moments:
    """Combine the moments of two disjoint sets of rows (Chan et al., 1979)."""
    if a.count == 0:
        return b
    if b.count == 0:
        return a
    if a.weight_shift != b.weight_shift:  # sum the weights in the larger unit
        a, b = _in_weight_unit(a, max(a.weight_shift, b.weight_shift)), _in_weight_unit(b, max(a.weight_shift,
                                                                                           b.weight_shift))
    if a.shift is not None or b.shift is not None:  # bring both to the larger unit of each column
        zeros = np.zeros(a.mean.shape, dtype=np.int64)
        shift = np.maximum(zeros if a.shift is None else a.shift, zeros if b.shift is None else b.shift)
        a, b = _in_unit(a, shift), _in_unit(b, shift)
    n = a.count + b.count
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / n)
    m2 = a.m2 + b.m2 + np.square(delta) * (a.count * b.count / n)
    return Moments(n, mean, m2, a.shift, a.weight_shift)


@dataclasses.dataclass(frozen=True, eq=False)
class BlockSummary:
    """What the fit pass keeps of a group of row blocks.

    ``x``/``y`` are None when the group contains non-finite values (or, for ``y``,
    when there is no target); ``bad_x``/``bad_y`` then hold the ``(block, row)``
    of the earliest offending row (global row index).
    """

    x: Moments | None
    y: Moments | None
    bad_x: tuple[int, int] | None = None
    bad_y: tuple[int, int] | None = None
    #: ``(block, row)`` of the earliest NaN, inf or negative weight.
    bad_w: tuple[int, int] | None = None
    #: ``(X, y, w)`` digests of each block (:func:`block_digest`, "" for an absent y or w), in block
    #: order; empty unless asked for.
    digests: tuple[tuple[str, str, str], ...] = ()
    #: Largest ``|x|``, ``|y|`` and weight (:mod:`daskkrr.data.extremes`).
    magnitudes: Magnitudes | None = None


def summarize_block(
    X: np.ndarray, y: np.ndarray | None, block: int, start: int, w: np.ndarray | None = None,
    digest: bool = False,
) -> BlockSummary:
    """Moments and finiteness of one row block starting at global row ``start``.

    ``w``: the rows' weights (checked: finite and not negative), or None. ``digest``: also the
    block's ``(X, y, w)`` digests (:func:`block_digest`).
    """
    digests = tuple((block_digest(X), "" if y is None else block_digest(y), "" if w is None else block_digest(w))
                    for _ in range(digest))  # one entry, or none when not asked for
    bad_x = _first_non_finite(X, block, start)
    bad_y = None if y is None else _first_non_finite(y, block, start)
    bad_w = None if w is None else _first_bad_weight(w, block, start)
    if bad_w is not None:
        w = None  # the moments are not used: the fit refuses these weights
    x_moments = Moments.of(X, w) if bad_x is None else None
    y_moments = Moments.of(np.reshape(y, (len(y), -1)), w) if y is not None and bad_y is None else None
    return BlockSummary(x_moments, y_moments, bad_x, bad_y, bad_w, digests, Magnitudes.of(X, y, w))


def merge_summaries(*parts: BlockSummary) -> BlockSummary:
    """Merge summaries of consecutive row blocks, in order; keeps the earliest non-finite location
    and the blocks' digests in block order."""
    x = y = None
    bad_x = min((p.bad_x for p in parts if p.bad_x is not None), default=None)
    bad_y = min((p.bad_y for p in parts if p.bad_y is not None), default=None)
    bad_w = min((p.bad_w for p in parts if p.bad_w is not None), default=None)
    xs = [p.x for p in parts if p.x is not None]  # all of them when no block has a non-finite X
    ys = [p.y for p in parts if p.y is not None]
    if bad_x is None:
        x = _merge_all(xs)
    if bad_y is None and len(ys) == len(parts):
        y = _merge_all(ys)
    digests = tuple(d for p in parts for d in p.digests)
    return BlockSummary(x, y, bad_x, bad_y, bad_w, digests, merge_magnitudes(*(p.magnitudes for p in parts)))


def _merge_all(moments: list[Moments]) -> Moments:
    total = moments[0]
    for m in moments[1:]:
        total = merge_moments(total, m)
    return total


def _first_bad_weight(w: np.ndarray, block: int, start: int) -> tuple[int, int] | None:
    """``(block, row)`` of the first NaN, inf or negative weight of a block, or None."""
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    ok = np.isfinite(w) & (w >= 0)
    if ok.all():
        return None
    return block, start + int(np.argmin(ok))


def _first_non_finite(a: np.ndarray, block: int, start: int) -> tuple[int, int] | None:
    if is_sparse_array(a):
        row = first_non_finite_row(a)
        return None if row is None else (block, start + row)
    if np.asarray(a).dtype.kind not in "fc":  # bool/int cannot hold NaN or inf
        return None
    finite = np.isfinite(a)
    if finite.all():
        return None
    rows_ok = finite.reshape(len(a), -1).all(axis=1)
    return block, start + int(np.argmin(rows_ok))
