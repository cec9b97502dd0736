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

    Parameters
    ----------
    space : mapping
        Parameter name to ``(lo, hi)``.
    n_features : int
        Columns of the features.
    ard : bool
        One sigma range per feature.

    Returns
    -------
    list of Range
        One range per searched dimension.
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
    validates well can still blow up on new rows).

    Parameters
    ----------
    n_features : int
        Columns of the (standardised) features.

    Returns
    -------
    dict
        ``{"sigma": (lo, hi), "penalty": (lo, hi)}``.
    """
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

    Parameters
    ----------
    ranges : list of Range
        The search space, from :func:`parse_space`.
    n_candidates : int
        Points to draw.
    random_state : int, numpy Generator or None
        Seeds the scrambling.
    max_centers : int or None, default=None
        Drop candidates with more centers.

    Returns
    -------
    CandidateSet
        The distinct candidates.

    Raises
    ------
    ValueError
        When no valid candidate is left.
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
    ``workflows/benchmarks/results/tune_pmlb_10seeds_slab_growth.log``, removed from the tree
    in c1ba47e and kept in git history: ``git show c1ba47e^:<path>``).
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

    def outer_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The low and high faces the box may grow to (``GROW_MAX`` growths past each
        face that may grow; 0 and 1 for those that may not)."""
        reach = np.where(self.frozen, 0.0, GROW_STEP * GROW_MAX)
        return -reach, 1.0 + reach

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



#: The search's last rounds (``BKBSearchCV(refine=True)``) search around the best
#: candidate: first each range moved by this fraction of its log-width, down and up
#: (the compass), then trust-region steps on a local quadratic model of the scores.
#: The bandit's arm kernel (length 0.5 of the cube) is too smooth to see a narrow
#: peak, and a validation score can fall by 0.005 R^2 over a twelfth of the sigma
#: range (201_pol, seed 0: 0.9494 at sigma = 0.21 sqrt(d), 0.9437 at 0.18 sqrt(d) and
#: 0.9475 at 0.25 sqrt(d), penalty 1e-6).
REFINE_STEP = 1 / 12

#: Trust-region steps after the compass, at most (fewer on a small budget, see
#: ``BKBSearchCV``). On the eight PMLB sets of ``workflows/benchmarks/tune_pmlb.py``
#: (10 bandit fits, 10 seeds, ``results/tune_pmlb_10seeds_trust5b.*``, in git history before
#: c1ba47e), five steps put
#: seven sets level with the grid search's test R^2 or ahead of it (within two standard
#: errors), 1203_BNG_pwLinear among them, which one step (a model's peak) left behind
#: on every seed.
REFINE_STEPS = 5

#: The model weighs an evaluated candidate at ``r`` steps from the centre by
#: ``exp(-r^2 / (2 REFINE_RADIUS^2))`` (those under 0.02, past 8.4 steps, are left
#: out): near candidates fix the peak, farther ones the ridge it lies on.
REFINE_RADIUS = 3.0

#: The trust region, in steps from the centre per direction: its first size, and its
#: bounds. It doubles after a step that found a better candidate, and halves after one
#: that did not.
TRUST_START, TRUST_MIN, TRUST_MAX = 4.0, 1.0, 8.0

#: A step's candidate is at least this many steps from every evaluated one, so that
#: each fit tells the model something new.
REFINE_GAP = 0.5


def moving_ranges(ranges: list[Range]) -> list[slice]:
    """The unit-cube columns of each range the refinement moves: not ``n_centers``
    (whose upper bound caps the cost), nor a fixed one."""
    slices, at = [], 0
    for r in ranges:
        if not (r.integer or bool(np.all(r.low == r.high))):
            slices.append(slice(at, at + r.width))
        at += r.width
    return slices


class LocalRefinement:
    """A compass pattern around a centre arm, and trust-region steps on a local quadratic model.

    Each range that may move (not ``n_centers``, whose upper bound caps the cost, nor
    a fixed one) is a direction; a vector range (ARD sigma) moves as a whole, along
    its common scale, so there are at most two directions (sigma and penalty).
    :meth:`pattern` gives the ``2 x directions`` arms of the compass. :meth:`step`
    fits a quadratic in the directions' offsets, by least squares weighted by the
    distance to the centre (:data:`REFINE_RADIUS`), to the evaluated candidates, and
    returns the arm where the model is highest within a trust region around the
    centre, away from every evaluated candidate. With candidates off the compass's
    axes the model has the cross term, so it can follow a diagonal ridge (a wider
    sigma wanting a smaller penalty); without, it is one parabola per direction. Arms
    are clipped to ``[low, high]`` per coordinate.
    """

    def __init__(self, ranges: list[Range], center: np.ndarray, low: np.ndarray, high: np.ndarray,
                 step: float = REFINE_STEP) -> None:
        self.center = np.asarray(center, dtype=np.float64)
        self.low, self.high, self.step_size = low, high, step
        self.directions = moving_ranges(ranges)
        self._fixed = np.ones(self.center.size, dtype=bool)
        for cols in self.directions:
            self._fixed[cols] = False

    def _moved(self, offsets: np.ndarray) -> np.ndarray:
        """The centre moved by each row of ``offsets`` (n, directions) steps along each
        direction, clipped to the box (n, unit coordinates)."""
        points = np.repeat(self.center[None, :], len(offsets), axis=0)
        for k, cols in enumerate(self.directions):
            points[:, cols] = np.clip(points[:, cols] + offsets[:, k : k + 1] * self.step_size,
                                      self.low[cols], self.high[cols])
        return points

    def offsets(self, arms: np.ndarray) -> np.ndarray:
        """Each arm's offset from the centre along each direction, in steps (n, directions)."""
        arms = np.atleast_2d(arms)
        return np.column_stack([np.mean(arms[:, cols] - self.center[cols], axis=1) / self.step_size
                                for cols in self.directions]) if self.directions else np.zeros((len(arms), 0))

    def pattern(self) -> np.ndarray:
        """The compass: row ``2 k`` is direction ``k`` moved down by a step, row ``2 k + 1`` up."""
        return self._moved(np.kron(np.eye(len(self.directions)), [[-1.0], [1.0]]))  # rows -e_k, +e_k

    def step(self, arms: np.ndarray, scores: np.ndarray, reach: float = TRUST_START) -> np.ndarray | None:
        """The arm of the quadratic model's highest score within ``reach`` steps of the
        centre (per direction) and at least :data:`REFINE_GAP` steps from every evaluated
        arm, from evaluated ``arms`` (rows, unit coordinates) and their ``scores`` (NaN:
        not evaluated). None when too few candidates are near to fit a model, or no arm
        of the region is far enough from those evaluated."""
        arms, scores = np.atleast_2d(np.asarray(arms, dtype=np.float64)), np.asarray(scores, dtype=np.float64)
        same = np.all(np.isclose(arms[:, self._fixed], self.center[self._fixed]), axis=1)
        x_all = self.offsets(arms)
        weight = np.exp(-0.5 * (np.linalg.norm(x_all, axis=1) / REFINE_RADIUS) ** 2)
        near = np.isfinite(scores) & same & (weight > 0.02)
        x, f, w = x_all[near], scores[near], np.sqrt(weight[near])
        # A direction moves where the candidates lie at three offsets along it or more (a
        # parabola's worth), on one side of the centre too: at the edge of the evaluated
        # region the model extrapolates, within the reach.
        free = [k for k in range(x.shape[1]) if np.unique(np.round(x[:, k], 9)).size >= 3]
        for cross in (True, False):
            design = _quadratic_features(x, free, cross=cross)
            if len(f) >= design.shape[1] and np.linalg.matrix_rank(design) == design.shape[1]:
                break
        else:
            return None
        coef = np.linalg.lstsq(design * w[:, None], f * w, rcond=None)[0]
        # The model's maximum over a lattice of the region (a fortieth of the reach
        # apart), at the clipped arms; those too near an evaluated arm are left out.
        axis = np.linspace(-reach, reach, 81)
        trial = np.zeros((axis.size ** len(free), x.shape[1]))
        if free:
            trial[:, free] = np.stack(np.meshgrid(*[axis] * len(free), indexing="ij"), axis=-1).reshape(-1, len(free))
        moved = self._moved(trial)
        at = self.offsets(moved)
        model = _quadratic_features(at, free, cross=cross) @ coef
        seen = x_all[same]
        gap = np.min(np.linalg.norm(at[:, None, :] - seen[None, :, :], axis=2), axis=1) if len(seen) else np.inf
        model = np.where(gap >= REFINE_GAP - 1e-9, model, -np.inf)
        if not np.isfinite(model).any():
            return None
        return moved[int(np.argmax(model))]


def _quadratic_features(x: np.ndarray, free: list[int], *, cross: bool) -> np.ndarray:
    """``[1, x_k, x_k^2 (k free), x_j x_k (j < k free, with cross)]`` for each row of ``x``."""
    cols = [np.ones(len(x))] + [x[:, k] for k in free] + [x[:, k] ** 2 for k in free]
    if cross:
        cols += [x[:, j] * x[:, k] for i, j in enumerate(free) for k in free[i + 1 :]]
    return np.column_stack(cols)
