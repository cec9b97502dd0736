"""The tuning space: log-uniform ranges of ``sigma`` (scalar or per feature), ``penalty``
and ``n_centers``, and the finite candidate set drawn from it.

Candidates are points of a scrambled Sobol sequence in the unit cube of the
log-parameters, so they cover the space evenly; the bandit's arms are these unit
coordinates (each log-range mapped to [0, 1]).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

import numpy as np
from scipy.stats import qmc

#: Parameters the space can tune, in the order of the arms' coordinates.
TUNABLE = ("sigma", "penalty", "n_centers")


@dataclasses.dataclass(frozen=True)
class Range:
    """A log-uniform range ``[low, high]`` of one parameter (a vector range for ARD sigma)."""

    name: str
    low: np.ndarray
    high: np.ndarray
    integer: bool = False

    @property
    def width(self) -> int:
        return int(self.low.size)

    def values(self, unit: np.ndarray) -> np.ndarray:
        """Parameter values at unit coordinates (n, width)."""
        lo, hi = np.log(self.low), np.log(self.high)
        v = np.exp(lo + unit * (hi - lo))
        return np.rint(v) if self.integer else v


def _bound(name: str, value: Any, width: int) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if arr.ndim != 1 or arr.size not in (1, width):
        raise ValueError(f"the {name} range must hold scalars or vectors of length {width} (one per "
                         f"feature); got shape {np.shape(value)}")
    if not np.all(np.isfinite(arr) & (arr > 0)):
        raise ValueError(f"the {name} range must be > 0 and finite (it is searched in log space); got {value!r}")
    return np.broadcast_to(arr, (width,)).copy()


def parse_space(space: Mapping[str, Any], n_features: int, *, ard: bool) -> list[Range]:
    """The ranges of ``space`` (``{"sigma": (lo, hi), "penalty": (lo, hi), "n_centers": (lo, hi)}``).

    With ``ard`` the sigma range is per feature: ``lo``/``hi`` scalars (the same range
    for every feature) or vectors of length ``n_features``.
    """
    unknown = sorted(set(space) - set(TUNABLE))
    if unknown:
        raise ValueError(f"cannot tune {unknown}; the space takes {list(TUNABLE)}")
    if not space:
        raise ValueError(f"the tuning space is empty; give ranges for some of {list(TUNABLE)}")
    ranges = []
    for name in TUNABLE:
        if name not in space:
            continue
        bounds = space[name]
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
            raise ValueError(f"space[{name!r}] must be a (low, high) pair; got {bounds!r}")
        width = n_features if (name == "sigma" and ard) else 1
        low, high = _bound(name, bounds[0], width), _bound(name, bounds[1], width)
        if np.any(low > high):
            raise ValueError(f"space[{name!r}]: low must be <= high; got {bounds!r}")
        if name == "n_centers":
            for b in bounds:
                if isinstance(b, bool) or not isinstance(b, (Integral, Real)) or b < 1:
                    raise ValueError(f"space['n_centers'] must hold integers >= 1; got {bounds!r}")
        ranges.append(Range(name, low, high, integer=(name == "n_centers")))
    return ranges


def default_space(n_features: int) -> dict[str, tuple[float, float]]:
    """sigma around the estimators' default ``sqrt(d)`` (for standardised features) and
    penalty from 1e-8 to 1e-1 (below, wide kernels are too ill-conditioned: a fit that
    validates well can still blow up on new rows)."""
    root = math.sqrt(n_features)
    return {"sigma": (root / 10, root * 10), "penalty": (1e-8, 1e-1)}


@dataclasses.dataclass
class CandidateSet:
    """Candidates: the bandit's arms (unit coordinates) and the parameters of each."""

    arms: np.ndarray
    params: list[dict[str, Any]]


def draw_candidates(ranges: list[Range], n_candidates: int, random_state: Any,
                    max_centers: int | None = None) -> CandidateSet:
    """``n_candidates`` scrambled-Sobol points of the log-space; candidates with more
    centers than ``max_centers`` (the training rows) are dropped, duplicates too.

    Raises ValueError when no valid candidate is left.
    """
    dim = sum(r.width for r in ranges)
    seed = np.random.default_rng(random_state).integers(2**32)
    unit = qmc.Sobol(dim, scramble=True, seed=int(seed)).random(n_candidates) if dim else np.zeros((1, 0))
    found = candidates_at(ranges, unit, max_centers)
    if not found.params:
        raise ValueError(f"the tuning space has no valid point: every candidate asks for more centers than "
                         f"the {max_centers} training rows of a split; lower space['n_centers']")
    return found


def candidates_at(ranges: list[Range], unit: np.ndarray, max_centers: int | None = None) -> CandidateSet:
    """The candidates at unit coordinates ``unit`` (n, dim), which may lie outside [0, 1]
    (the log-ranges extended); invalid numbers of centers and duplicates are dropped."""
    columns: list[np.ndarray] = []
    values: dict[str, np.ndarray] = {}
    at = 0
    for r in ranges:
        u = unit[:, at : at + r.width]
        values[r.name] = r.values(u)
        # For integers, the arm is where the rounded value lies, so equal values share an arm.
        if r.integer:
            lo, hi = np.log(r.low), np.log(r.high)
            u = (np.log(np.maximum(values[r.name], 1.0)) - lo) / np.where(hi > lo, hi - lo, 1.0)
        columns.append(u)
        at += r.width
    arms = np.column_stack(columns) if columns else np.zeros((unit.shape[0], 0))
    valid = np.ones(arms.shape[0], dtype=bool)
    if "n_centers" in values:
        valid &= values["n_centers"][:, 0] >= 1
        if max_centers is not None:
            valid &= values["n_centers"][:, 0] <= max_centers
    if not valid.any():
        return CandidateSet(arms=np.zeros((0, arms.shape[1])), params=[])
    _, first = np.unique(arms[valid], axis=0, return_index=True)
    keep = np.flatnonzero(valid)[np.sort(first)]
    params = []
    for i in keep:
        p: dict[str, Any] = {}
        for r in ranges:
            v = values[r.name][i]
            if r.integer:
                p[r.name] = int(v[0])
            elif r.width > 1:
                p[r.name] = v.copy()
            else:
                p[r.name] = float(v[0])
        params.append(p)
    return CandidateSet(arms=np.ascontiguousarray(arms[keep]), params=params)


#: How the search box grows past a face (:class:`BoxGrowth`): when the best candidate
#: lies within ``GROW_MARGIN`` of a face (in units of the range's log-width), the
#: range is extended past that face by ``GROW_STEP`` of its log-width, at most
#: ``GROW_MAX`` times per face (so by half the range at most), with ``GROW_POINTS``
#: candidates on the line from the best one outwards.
GROW_MARGIN = 0.1
GROW_STEP = 0.25
GROW_MAX = 2
GROW_POINTS = 4


class BoxGrowth:
    """Extends the search box past the faces the best candidate sits on.

    A box that a user (or :func:`default_space`) gives is a guess: when the best
    score lies on its edge (a grid's corner answer, such as the smallest penalty),
    the optimum may well be outside. The unit cube of the log-ranges is tracked as
    ``[low_j, high_j]`` per coordinate (initially ``[0, 1]``). Growing a face adds
    candidates on the line from the best candidate outwards, across the new slab,
    the other coordinates kept: the search follows the trend it found rather than
    opening a new region to explore (with a budget of a few dozen fits, a slab of
    scattered candidates drew fits away from the best region: with it, 10-fit
    searches lost 0.0052 and 0.0013 test R^2 to a 20-point grid on 537_houses and
    564_fried, paired means over 10 seeds, against 0.0026 and 0.0010 without growth;
    ``workflows/benchmarks/results/tune_pmlb_10seeds_slab_growth.log``).
    ``n_centers`` never grows (its upper bound caps the fits' cost).
    """

    def __init__(self, ranges: list[Range], max_centers: int | None = None) -> None:
        self.ranges = ranges
        self.max_centers = max_centers
        #: (range, index within it) of each coordinate of the unit cube.
        self._coords = [(r, k) for r in ranges for k in range(r.width)]
        self.names = [r.name if r.width == 1 else f"{r.name}[{k}]" for r, k in self._coords]
        # Integer ranges (n_centers) and fixed values (low == high) do not grow.
        self.frozen = np.array([r.integer or bool(r.low[k] == r.high[k]) for r, k in self._coords], dtype=bool)
        self.steps = np.zeros((len(self._coords), 2), dtype=np.int64)  # growths per (coordinate, low/high face)
        self.grown: list[tuple[str, str, float]] = []  # (coordinate, "low"/"high", new bound's value)

    @property
    def low(self) -> np.ndarray:
        """The box's low faces in unit coordinates (0 before any growth)."""
        return -GROW_STEP * self.steps[:, 0]

    @property
    def high(self) -> np.ndarray:
        """The box's high faces in unit coordinates (1 before any growth)."""
        return 1.0 + GROW_STEP * self.steps[:, 1]

    def faces_near(self, arm: np.ndarray) -> list[tuple[int, int]]:
        """``(coordinate, side)`` of each face within the margin of ``arm`` that may still grow (0: low, 1: high)."""
        near = []
        for j, u in enumerate(arm):
            if self.frozen[j]:
                continue
            if u - self.low[j] < GROW_MARGIN and self.steps[j, 0] < GROW_MAX:
                near.append((j, 0))
            if self.high[j] - u < GROW_MARGIN and self.steps[j, 1] < GROW_MAX:
                near.append((j, 1))
        return near

    def grow(self, arm: np.ndarray) -> CandidateSet:
        """Grow every face near ``arm``; the candidates on the lines from ``arm`` across the new slabs."""
        lines = []
        for j, side in self.faces_near(arm):
            sign = -1.0 if side == 0 else 1.0
            face = self.low[j] if side == 0 else self.high[j]
            line = np.repeat(arm[None, :], GROW_POINTS, axis=0)
            line[:, j] = face + sign * GROW_STEP * np.arange(1, GROW_POINTS + 1) / GROW_POINTS
            self.steps[j, side] += 1
            lines.append(line)
            r, k = self._coords[j]
            bound = r.values(np.full((1, r.width), face + sign * GROW_STEP))[0, k]
            self.grown.append((self.names[j], ("low", "high")[side], float(bound)))
        if not lines:
            return CandidateSet(arms=np.zeros((0, len(self.names))), params=[])
        return candidates_at(self.ranges, np.concatenate(lines), self.max_centers)



#: The search's last two rounds (``BKBSearchCV(refine=True)``) search around the best
#: candidate: first each range moved by this fraction of its log-width, down and up,
#: then the vertex of the parabola through the three scores on each range's line. The
#: bandit's arm kernel (length 0.5 of the cube) is too smooth to see a narrow peak,
#: and a validation score can fall by 0.005 R^2 over a twelfth of the sigma range
#: (201_pol, seed 0: 0.9494 at sigma = 0.21 sqrt(d), 0.9437 at 0.18 sqrt(d) and 0.9475
#: at 0.25 sqrt(d), penalty 1e-6).
REFINE_STEP = 1 / 12

#: The vertex step goes at most this many steps from the centre (a parabola through
#: three points that rise to one side extrapolates far).
REFINE_REACH = 2.0


class LocalRefinement:
    """A compass pattern around a centre arm, then the vertex of each range's parabola.

    Each range that may move (not ``n_centers``, whose upper bound caps the cost, nor
    a fixed one) is a direction; a vector range (ARD sigma) moves as a whole, along
    its common scale. :meth:`pattern` gives the ``2 x directions`` arms of the
    compass; :meth:`vertex` takes their scores and gives one arm with every range at
    the peak of the parabola through its three scores (at the better of its points
    where the parabola opens upwards), within ``REFINE_REACH`` steps of the centre.
    Arms are clipped to ``[low, high]`` per coordinate.
    """

    def __init__(self, ranges: list[Range], center: np.ndarray, low: np.ndarray, high: np.ndarray,
                 step: float = REFINE_STEP) -> None:
        self.center = np.asarray(center, dtype=np.float64)
        self.low, self.high, self.step = low, high, step
        self.directions: list[slice] = []
        at = 0
        for r in ranges:
            if not (r.integer or bool(np.all(r.low == r.high))):
                self.directions.append(slice(at, at + r.width))
            at += r.width

    def _moved(self, moves: list[tuple[slice, float]]) -> np.ndarray:
        point = self.center.copy()
        for cols, by in moves:
            point[cols] = np.clip(point[cols] + by, self.low[cols], self.high[cols])
        return point

    def pattern(self) -> np.ndarray:
        """The compass: row ``2 k`` is direction ``k`` moved down by a step, row ``2 k + 1`` up."""
        rows = [self._moved([(cols, sign * self.step)]) for cols in self.directions for sign in (-1.0, 1.0)]
        return np.array(rows) if rows else np.zeros((0, self.center.size))

    def vertex(self, center_score: float, scores: np.ndarray) -> np.ndarray:
        """The arm at each direction's parabola peak, from the pattern's ``scores``
        (NaN where a pattern arm was not evaluated: that direction stays at the centre)."""
        pattern = self.pattern()
        moves = []
        for k, cols in enumerate(self.directions):
            # Offsets in steps (clipping at a face may have shortened a move).
            xd, xu = (float(np.mean(pattern[2 * k + j, cols] - self.center[cols])) / self.step for j in (0, 1))
            fd, fu = float(scores[2 * k]) - center_score, float(scores[2 * k + 1]) - center_score
            if not (math.isfinite(fd) and math.isfinite(fu)) or xd >= 0 or xu <= 0:
                continue
            # The parabola f(x) = a x^2 + b x through (xd, fd), (0, 0), (xu, fu).
            a = (fu / xu - fd / xd) / (xu - xd)
            b = fu / xu - a * xu
            if a < 0:  # a peak
                at = float(np.clip(-b / (2.0 * a), -REFINE_REACH, REFINE_REACH))
            elif max(fd, fu) > 0:  # no peak: to the better side
                at = xd if fd > fu else xu
            else:
                at = 0.0
            moves.append((cols, at * self.step))
        return self._moved(moves)
