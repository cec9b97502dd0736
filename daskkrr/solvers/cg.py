"""Preconditioned conjugate gradient for several right-hand sides at once.

The matrix is never needed: the caller passes a ``matvec`` (for FALKON, one
distributed pass over the data) and optionally a ``preconditioner`` (any
approximation of the inverse). Each column of the right-hand side runs its own
CG recurrence; columns that have converged stop moving, and the solve stops when
every column has stopped (converged, stagnated, or where ``p^T A p <= 0``), or after
``max_iter`` iterations.

The recursive residual drifts from the true one in finite precision, so the true
residual ``b - A x`` is recomputed every ``true_residual_every`` iterations and
before declaring convergence ("residual replacement"); a column that stopped on its
recursive residual but is above ``tol`` by the true one is taken up again.

Long solves can be interrupted and continued exactly: ``on_state`` receives a
:class:`CGState` (everything the recurrence needs, as arrays and scalars) every
``state_every`` iterations and at the end, and ``state=`` continues from one.
With a deterministic ``matvec`` the continued solve is bit-for-bit the solve
that was never interrupted.

The recurrence itself, :func:`cg_solve`, reaches its vectors only through
:class:`VectorOps` (dot products, linear combinations, conversion to numpy), so the
same code serves numpy arrays here and row blocks on the workers
(:func:`daskkrr.solvers.pcg.pcg`); the stagnation and divergence guards are optional.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

MatVec = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class CGResult:
    """Outcome of :func:`conjugate_gradient`.

    Attributes
    ----------
    x : ndarray of shape (m,) or (m, t), or a vector of ``ops``' kind
        The approximate solution (the latter from :func:`cg_solve` and ``pcg``).
    n_iter : int
        Iterations done (matrix-vector products for search directions; the
        true-residual recomputations are counted in ``n_matvec``).
    n_matvec : int
        Total calls to ``matvec``.
    residuals : ndarray of shape (n_iter + 1, t)
        Relative residual ``||r_k|| / ||b||`` of each column after each iteration
        (row 0 is the start).
    converged : bool
        Whether every column reached ``tol``.
    stagnated : bool
        True when a column stopped because its true residual stopped falling (the
        attainable accuracy of the operator was reached; that column keeps its best
        iterate while the others go on), or the solve stopped more than
        :data:`DIVERGED_FACTOR` times above the lowest residual it had reached (CG
        diverged on a nearly singular system; ``x`` is then, per column, the iterate
        with the smaller true residual of the two compared).
    alphas, betas : ndarray of shape (n_iter, t)
        CG step lengths and direction updates (for :func:`daskkrr.solvers.pcg.ritz_bounds`).
    """

    x: Any  # ndarray from conjugate_gradient; a vector of ops' kind from cg_solve and pcg
    n_iter: int
    n_matvec: int
    residuals: np.ndarray
    converged: bool
    stagnated: bool = False
    alphas: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 1)))
    betas: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 1)))


@dataclasses.dataclass
class CGState:
    """The complete state of :func:`conjugate_gradient` between two iterations.

    Passing it back as ``state=`` continues the recurrence exactly where it
    stopped. All arrays are float64 of shape ``(m, t)`` or ``(t,)`` (``history``
    is ``(iteration + 1, t)``); the state is independent of the process, so it can
    be saved (:meth:`to_arrays`) and restored (:meth:`from_arrays`) elsewhere.

    Attributes
    ----------
    b : ndarray (m, t)
        Right-hand side the state belongs to.
    x, r, p : ndarray (m, t)
        Iterate, residual and search direction.
    rz : ndarray (t,)
        ``r^T M^{-1} r`` per column (M the preconditioner).
    active : ndarray (t,) of bool
        Columns still iterating (not converged, not stopped).
    history : ndarray (iteration + 1, t)
        Relative residuals so far.
    best_x, best_phi, best_rel
        Best iterate by CG energy, its energy and the best relative residuals
        (the stagnation guard).
    low_x, low_rel : ndarray (m, t) and (t,), or None
        Per column, the iterate with the lowest residual so far and that residual
        (the divergence guard; None in states saved before it existed).
    stopped : ndarray (t,) of bool, or None
        Columns stopped for good because round-off made ``p^T A p <= 0`` (None in
        states saved before it was kept: inferred on resume).
    stagnated_columns : ndarray (t,) of bool, or None
        Columns stopped for good by the stagnation guard, at their best iterate (None in
        states saved before it was kept: every column when ``stagnated``).
    iteration, n_matvec, last_true : int
        Iterations done, matvecs done, iteration of the last true-residual
        recomputation.
    checks_without_progress : ndarray (t,) of int
        Per column, consecutive checks without progress (one number for all columns in
        states saved before the guard worked per column).
    stagnated : bool
        A column stopped on stagnation, or the divergence guard chose an earlier iterate.
    """

    b: np.ndarray
    x: np.ndarray
    r: np.ndarray
    p: np.ndarray
    rz: np.ndarray
    active: np.ndarray
    history: np.ndarray
    best_x: np.ndarray
    best_phi: np.ndarray
    best_rel: np.ndarray
    iteration: int = 0
    n_matvec: int = 0
    last_true: int = 0
    checks_without_progress: np.ndarray | int = 0
    stagnated: bool = False
    low_x: np.ndarray | None = None
    low_rel: np.ndarray | None = None
    stopped: np.ndarray | None = None
    stagnated_columns: np.ndarray | None = None

    _ARRAYS = ("b", "x", "r", "p", "rz", "active", "history", "best_x", "best_phi", "best_rel")
    _SCALARS = ("iteration", "n_matvec", "last_true", "checks_without_progress", "stagnated")
    _OPTIONAL = ("low_x", "low_rel", "stopped", "stagnated_columns")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numpy arrays (no objects) for ``np.savez``; scalars as 0-d arrays."""
        out = {k: np.array(getattr(self, k)) for k in self._ARRAYS}
        out.update({k: np.array(getattr(self, k)) for k in self._SCALARS})
        out.update({k: np.array(getattr(self, k)) for k in self._OPTIONAL if getattr(self, k) is not None})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> CGState:
        """Inverse of :meth:`to_arrays`; raises ValueError when an entry is missing or misshapen."""
        missing = [k for k in cls._ARRAYS + cls._SCALARS if k not in arrays]
        if missing:
            raise ValueError(f"CG state lacks {missing}")
        b = np.asarray(arrays["b"], dtype=np.float64)
        if b.ndim != 2:
            raise ValueError(f"CG state: b must be 2-D; got shape {b.shape}")
        m, t = b.shape
        state = cls(
            b=b,
            **{k: np.asarray(arrays[k], dtype=np.float64) for k in ("x", "r", "p", "best_x")},
            **{k: np.asarray(arrays[k], dtype=np.float64) for k in ("rz", "best_phi", "best_rel")},
            active=np.asarray(arrays["active"], dtype=bool),
            history=np.asarray(arrays["history"], dtype=np.float64),
            iteration=int(arrays["iteration"]),
            n_matvec=int(arrays["n_matvec"]),
            last_true=int(arrays["last_true"]),
            # one count for all columns in states saved before the guard worked per column
            checks_without_progress=np.broadcast_to(
                np.asarray(arrays["checks_without_progress"], dtype=np.int64), (t,)).copy(),
            stagnated=bool(arrays["stagnated"]),
            **{k: np.asarray(arrays[k], dtype=np.float64) for k in ("low_x", "low_rel") if k in arrays},
            **{k: np.asarray(arrays[k], dtype=bool) for k in ("stopped", "stagnated_columns") if k in arrays},
        )
        for k in ("x", "r", "p", "best_x", "low_x"):
            if getattr(state, k) is not None and getattr(state, k).shape != (m, t):
                raise ValueError(f"CG state: {k} has shape {getattr(state, k).shape}, expected {(m, t)}")
        for k in ("rz", "best_phi", "best_rel", "active", "low_rel", "stopped", "stagnated_columns"):
            if getattr(state, k) is not None and getattr(state, k).shape != (t,):
                raise ValueError(f"CG state: {k} has shape {getattr(state, k).shape}, expected {(t,)}")
        if state.history.shape != (state.iteration + 1, t):
            raise ValueError(
                f"CG state: history has shape {state.history.shape}, expected {(state.iteration + 1, t)}"
            )
        return state


#: A solve that stops with its residual this many times above the lowest one it reached
#: has diverged; it returns the better of the two iterates (see conjugate_gradient).
DIVERGED_FACTOR = 2.0

Vector = Any


class VectorOps(Protocol):
    """What :func:`cg_solve` needs to know about its vectors (``(n, t)``, columns = right-hand sides).

    The recurrence only adds vectors, scales their columns and asks for column dot
    products (``(t,)`` arrays on the client), so the vectors may live anywhere: in
    this process (:class:`NumpyOps`) or as row blocks on the workers
    (:class:`daskkrr.parallel.tiles.BlockOps`). An ``ops`` may also offer
    ``lincombs(combos)`` (several combinations in one round trip) and, for the
    stagnation and divergence guards, ``select(mask, a, b)`` (column ``j`` from ``a``
    where ``mask[j]``, else from ``b``).
    """

    def dots(self, pairs: list[tuple[Vector, Vector]]) -> list[np.ndarray]:
        """Column dot products ``sum_i a_ij b_ij`` (``(t,)`` each) of every pair, at once."""
        ...

    def lincomb(self, terms: list[tuple[Any, Vector]]) -> Vector:
        """``sum_k v_k * c_k`` (in this order) with scalar or per-column ``(t,)`` coefficients."""
        ...

    def to_numpy(self, v: Vector) -> np.ndarray:
        """The vector here (for a checkpoint)."""
        ...

    def from_numpy(self, a: np.ndarray) -> Vector:
        """A vector from a numpy array (to resume from a checkpoint)."""
        ...


class NumpyOps:
    """:class:`VectorOps` for numpy arrays in this process (with the guards' ``select``)."""

    def dots(self, pairs: list[tuple[Vector, Vector]]) -> list[np.ndarray]:
        return [np.einsum("ij,ij->j", a, b) for a, b in pairs]

    def lincomb(self, terms: list[tuple[Any, Vector]]) -> Vector:
        out = None
        for c, v in terms:
            out = v * c if out is None else out + v * c
        return out

    def select(self, mask: np.ndarray, a: Vector, b: Vector) -> Vector:
        return np.where(mask[None, :], a, b)

    def to_numpy(self, v: Vector) -> np.ndarray:
        return np.asarray(v, dtype=np.float64)

    def from_numpy(self, a: np.ndarray) -> Vector:
        return np.asarray(a, dtype=np.float64)


def _lincombs(ops: VectorOps, combos: list[list[tuple[Any, Vector]]]) -> list[Vector]:
    """Several linear combinations, at once when ``ops`` can (one round trip to the workers)."""
    many = getattr(ops, "lincombs", None)
    if many is not None:
        return list(many(combos))
    return [ops.lincomb(terms) for terms in combos]


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


@dataclasses.dataclass
class _Guards:
    """The stagnation and divergence guards' memory (see :func:`cg_solve`).

    All per column: ``best_*``, the iterate with the lowest CG energy at a true-residual
    check, that energy and the lowest residuals seen at checks; ``low_*``, the iterate
    with the lowest residual of any iteration; ``without_progress``, consecutive checks
    without a lower energy.
    """

    checks: int
    best_x: Vector
    best_phi: np.ndarray
    best_rel: np.ndarray
    low_x: Vector
    low_rel: np.ndarray
    without_progress: np.ndarray


class _CG:
    """The recurrence of :func:`cg_solve`; its attributes are the :class:`CGState`."""

    def __init__(self, matvec: Callable[[Vector], Vector], b: Vector, ops: VectorOps,
                 preconditioner: Callable[[Vector], Vector] | None, tol: float) -> None:
        self.matvec, self.b, self.ops, self.tol = matvec, b, ops, tol
        self.M = preconditioner if preconditioner is not None else (lambda r: r)
        (bb,) = ops.dots([(b, b)])
        self.bnorm = np.sqrt(np.maximum(bb, 0.0))
        self.t = self.bnorm.size
        self.safe = np.where(self.bnorm > 0, self.bnorm, 1.0)
        self.alphas: list[np.ndarray] = []
        self.betas: list[np.ndarray] = []
        self.guards: _Guards | None = None
        self.stagnated = False
        self.gave_up = np.zeros(self.t, dtype=bool)  # columns the stagnation guard stopped

    @property
    def halted(self) -> np.ndarray:
        """Columns stopped for good: where ``p^T A p <= 0``, or by the stagnation guard."""
        return self.stopped | self.gave_up

    def relative(self, R: Vector) -> np.ndarray:
        """``||r_j|| / ||b_j||`` per column (0 for a zero right-hand side)."""
        (rr,) = self.ops.dots([(R, R)])
        rel = np.sqrt(np.maximum(rr, 0.0)) / self.safe
        rel[self.bnorm == 0] = 0.0
        return rel

    def true_residual(self, X: Vector) -> Vector:
        self.n_matvec += 1
        return self.ops.lincomb([(1.0, self.b), (-1.0, self.matvec(X))])

    def energy(self, X: Vector, R: Vector) -> np.ndarray:
        """``x^T A x / 2 - b^T x`` per column, from the true residual ``R = b - A x``."""
        (xbr,) = self.ops.dots([(X, self.ops.lincomb([(1.0, self.b), (1.0, R)]))])
        return -0.5 * xbr

    def start(self, x0: Vector | None, stagnation_checks: int | None) -> None:
        ops = self.ops
        self.n_matvec = self.it = self.last_true = 0
        if x0 is None:
            self.X, self.R = ops.lincomb([(0.0, self.b)]), self.b
        else:
            self.X = x0
            self.R = self.true_residual(x0)
        # From x = 0 the relative residual is exactly 1 (spares a reduction over the data).
        rel = np.where(self.bnorm > 0, 1.0, 0.0) if x0 is None else self.relative(self.R)
        self.history = [rel.copy()]
        self.active = rel > self.tol
        self.stopped = np.zeros(self.t, dtype=bool)
        Zr = self.M(self.R)
        self.P = Zr
        (self.rz,) = ops.dots([(self.R, Zr)])
        if stagnation_checks is not None:
            # CG decreases the energy phi(x) = x^T A x / 2 - b^T x at every step in exact
            # arithmetic (the residual norm need not fall); an increase at a check means
            # round-off has taken over. phi comes free with the true residual r = b - A x.
            self.guards = _Guards(stagnation_checks, self.X, self.energy(self.X, self.R), rel.copy(),
                                  self.X, rel.copy(), np.zeros(self.t, dtype=np.int64))

    def resume(self, state: CGState, stagnation_checks: int | None) -> None:
        ops = self.ops
        _check_state(state, ops.to_numpy(self.b))
        self.X, self.R, self.P = (ops.from_numpy(getattr(state, k)) for k in ("x", "r", "p"))
        self.rz = state.rz.copy()
        self.history = [row.copy() for row in state.history]
        self.it, self.n_matvec, self.last_true = state.iteration, state.n_matvec, state.last_true
        # Columns stopped where p^T A p <= 0 stay stopped; a changed tol applies to the others.
        # A state saved before ``stopped`` was kept: a column inactive above tol stays stopped,
        # as every inactive column did then.
        self.stopped = (state.stopped.copy() if state.stopped is not None
                        else ~state.active & (self.history[-1] > self.tol))
        self.stagnated = bool(state.stagnated)
        # A state saved before the guard worked per column ended the whole solve on stagnation.
        self.gave_up = (state.stagnated_columns.copy() if state.stagnated_columns is not None
                        else np.full(self.t, self.stagnated))
        self.active = ~self.halted & (self.history[-1] > self.tol)
        if stagnation_checks is not None:
            # A state saved before the divergence guard existed starts it here.
            low_x, low_rel = self.X, self.history[-1].copy()
            if state.low_x is not None and state.low_rel is not None:
                low_x, low_rel = ops.from_numpy(state.low_x), state.low_rel.copy()
            self.guards = _Guards(stagnation_checks, ops.from_numpy(state.best_x), state.best_phi.copy(),
                                  state.best_rel.copy(), low_x, low_rel,
                                  np.broadcast_to(np.asarray(state.checks_without_progress, dtype=np.int64),
                                                  (self.t,)).copy())

    def snapshot(self) -> CGState:
        ops, g = self.ops, self.guards
        x = np.array(ops.to_numpy(self.X))
        return CGState(
            b=np.array(ops.to_numpy(self.b)), x=x, r=np.array(ops.to_numpy(self.R)),
            p=np.array(ops.to_numpy(self.P)), rz=self.rz.copy(), active=self.active.copy(),
            stopped=self.stopped.copy(), stagnated_columns=self.gave_up.copy(),
            history=np.array(self.history), iteration=self.it, n_matvec=self.n_matvec, last_true=self.last_true,
            stagnated=self.stagnated,
            best_x=x if g is None else np.array(ops.to_numpy(g.best_x)),
            best_phi=np.zeros(self.t) if g is None else np.array(g.best_phi, dtype=np.float64),
            best_rel=self.history[-1].copy() if g is None else g.best_rel.copy(),
            checks_without_progress=np.zeros(self.t, dtype=np.int64) if g is None else g.without_progress.copy(),
            low_x=None if g is None else np.array(ops.to_numpy(g.low_x)),
            low_rel=None if g is None else g.low_rel.copy(),
        )

    def check_progress(self, rel: np.ndarray) -> np.ndarray:
        """The stagnation guard, at a true-residual check, per column: the columns whose energy
        rose (or residual exploded) ``checks`` times in a row, to be stopped at their best iterate."""
        g = self.guards
        if g is None:
            return np.zeros(self.t, dtype=bool)
        phi = self.energy(self.X, self.R)
        # The residual may rise in exact CG too, but not by orders of magnitude from its
        # best once near the round-off floor.
        diverging = rel > 100 * np.maximum(g.best_rel, self.tol)
        better = (phi <= g.best_phi + 1e-12 * np.abs(g.best_phi)) & ~diverging
        if better.all():
            g.best_x = self.X
        elif better.any():
            g.best_x = self.ops.select(better, self.X, g.best_x)  # type: ignore[attr-defined]
        g.best_phi = np.where(better, phi, g.best_phi)
        g.best_rel = np.where(better, np.minimum(g.best_rel, rel), g.best_rel)
        # Only a column still above tol and still iterating can stagnate; one that stagnates
        # no longer holds the others back (they keep their own progress).
        counting = ~better & (rel > self.tol) & ~self.halted
        g.without_progress = np.where(better, 0, g.without_progress + counting)
        return counting & (g.without_progress >= g.checks)

    def step(self, true_residual_every: int, callback: Callable[[int, np.ndarray], None] | None) -> bool:
        """One iteration; False when the solve is over."""
        ops = self.ops
        AP = self.matvec(self.P)
        self.n_matvec += 1
        self.it += 1
        (pAp,) = ops.dots([(self.P, AP)])
        # p^T A p <= 0 only when round-off makes the operator look indefinite: that column stops.
        ok = self.active & (pAp > 0)
        self.stopped |= self.active & ~ok
        alpha = np.where(ok, _safe_div(self.rz, pAp), 0.0)
        self.alphas.append(alpha)
        self.X, self.R = _lincombs(ops, [[(1.0, self.X), (alpha, self.P)], [(1.0, self.R), (-alpha, AP)]])
        rel = self.relative(self.R)
        periodic = bool(true_residual_every) and self.it - self.last_true >= true_residual_every
        if periodic or not (rel > self.tol).any():
            # Residual replacement: periodically, and to confirm convergence.
            self.R = self.true_residual(self.X)
            self.last_true = self.it
            rel = self.relative(self.R)
            give_up = self.check_progress(rel)
            if give_up.any():
                # Round-off in the operator bounds these columns' attainable accuracy; going on
                # would only amplify it. They stop at their best iterate.
                self.X = ops.select(give_up, self.guards.best_x, self.X)  # type: ignore[attr-defined,union-attr]
                self.R = self.true_residual(self.X)
                rel = self.relative(self.R)
                self.gave_up |= give_up
                self.stagnated = True
        self.history.append(rel.copy())
        g = self.guards
        if g is not None:
            lower = rel < g.low_rel
            if lower.any():
                g.low_x = ops.select(lower, self.X, g.low_x)  # type: ignore[attr-defined]
                g.low_rel = np.where(lower, rel, g.low_rel)
        if callback is not None:
            callback(self.it, rel.copy())
        # A column is frozen once its recursive residual reaches tol, but that residual drifts
        # from the true one: a true-residual check that finds a frozen column above tol takes
        # it up again, restarted along its preconditioned residual (beta = 0).
        was_active, self.active = self.active, (rel > self.tol) & ~self.halted
        if not self.active.any():
            return False
        Zr = self.M(self.R)
        (rz_new,) = ops.dots([(self.R, Zr)])
        beta = np.where(self.active & was_active, _safe_div(rz_new, self.rz), 0.0)
        self.betas.append(beta)
        self.P = ops.lincomb([(1.0, Zr), (beta, self.P)])
        self.rz = rz_new
        return True

    def divergence_guard(self) -> None:
        """Stopped (budget spent, or p^T A p <= 0) well above the lowest residual seen, i.e.
        CG diverged on a nearly singular system: return the better of the two iterates per
        column (by true residual) rather than one that fits worse than an earlier one."""
        g = self.guards
        if g is None:
            return
        # a column the stagnation guard stopped already holds its best iterate
        far = ~self.gave_up & (self.history[-1] > DIVERGED_FACTOR * np.maximum(g.low_rel, self.tol))
        if not far.any():
            return
        self.R = self.true_residual(self.X)
        rel, rel_low = self.relative(self.R), self.relative(self.true_residual(g.low_x))
        better = far & (rel_low < rel)
        if better.any():
            self.X = self.ops.select(better, g.low_x, self.X)  # type: ignore[attr-defined]
            rel = np.where(better, rel_low, rel)
            self.stagnated = True
        self.history[-1] = rel  # the residual of the iterate returned


def cg_solve(
    matvec: Callable[[Vector], Vector],
    b: Vector,
    ops: VectorOps,
    *,
    x0: Vector | None = None,
    preconditioner: Callable[[Vector], Vector] | None = None,
    tol: float,
    max_iter: int,
    true_residual_every: int,
    stagnation_checks: int | None = None,
    callback: Callable[[int, np.ndarray], None] | None = None,
    state: CGState | None = None,
    on_state: Callable[[CGState], None] | None = None,
    state_every: int = 1,
) -> CGResult:
    """Preconditioned CG on the vectors of ``ops``: the one recurrence behind
    :func:`conjugate_gradient` (numpy, with the guards) and :func:`daskkrr.solvers.pcg.pcg`.

    Parameters
    ----------
    matvec, preconditioner : callable
        ``A v`` and ``M^{-1} r`` (symmetric positive definite; None: plain CG) on vectors of ``ops``.
    b : vector (m, t)
        Right-hand sides.
    ops : VectorOps
        The vector operations (``select`` is needed when ``stagnation_checks`` is given).
    x0 : vector, optional
        Starting point (zeros by default); ignored when ``state`` is given.
    tol, max_iter, true_residual_every
        As in :func:`conjugate_gradient`.
    stagnation_checks : int or None
        Enable the stagnation and divergence guards (see :func:`conjugate_gradient`) with
        this many consecutive checks; None disables them (no energy is computed).
    callback, state, on_state, state_every
        As in :func:`conjugate_gradient`.

    Returns
    -------
    CGResult
        ``x`` is a vector of ``ops``' kind.

    Raises
    ------
    ValueError
        For ``tol <= 0``, ``max_iter < 0``, ``state_every < 1``, or a ``state``
        that belongs to another right-hand side.
    """
    if not tol > 0:
        raise ValueError(f"tol must be > 0; got {tol!r}")
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0; got {max_iter!r}")
    if on_state is not None and int(state_every) < 1:
        raise ValueError(f"state_every must be >= 1; got {state_every!r}")
    cg = _CG(matvec, b, ops, preconditioner, tol)
    if state is None:
        cg.start(x0, stagnation_checks)
    else:
        cg.resume(state, stagnation_checks)
    while cg.it < max_iter and cg.active.any():
        if not cg.step(true_residual_every, callback):
            break
        if on_state is not None and cg.it % int(state_every) == 0 and cg.it < max_iter:
            on_state(cg.snapshot())
    cg.divergence_guard()
    if on_state is not None:
        on_state(cg.snapshot())
    t = cg.t
    betas = cg.betas + [np.zeros(t)] * (len(cg.alphas) - len(cg.betas))
    return CGResult(
        x=cg.X, n_iter=cg.it, n_matvec=cg.n_matvec, residuals=np.array(cg.history),
        converged=bool((cg.history[-1] <= tol).all()), stagnated=cg.stagnated,
        alphas=np.array(cg.alphas).reshape(-1, t), betas=np.array(betas).reshape(-1, t),
    )


def conjugate_gradient(
    matvec: MatVec,
    b: np.ndarray,
    *,
    x0: np.ndarray | None = None,
    preconditioner: MatVec | None = None,
    tol: float = 1e-7,
    max_iter: int = 100,
    true_residual_every: int = 10,
    stagnation_checks: int = 2,
    callback: Callable[[int, np.ndarray], None] | None = None,
    state: CGState | None = None,
    on_state: Callable[[CGState], None] | None = None,
    state_every: int = 1,
) -> CGResult:
    """Solve ``A x = b`` for symmetric positive definite ``A`` given only ``x -> A x``.

    Parameters
    ----------
    matvec : callable
        ``matvec(P)`` returns ``A @ P`` for ``P`` of shape ``(m, t)``.
    b : ndarray of shape (m,) or (m, t)
        Right-hand side(s).
    x0 : ndarray, optional
        Starting point (zeros by default). Ignored when ``state`` is given.
    preconditioner : callable, optional
        ``preconditioner(R)`` approximates ``A^{-1} R``; must be symmetric positive definite.
    tol : float
        Stop a column when ``||b - A x|| <= tol * ||b||``.
    max_iter : int
        Maximum number of iterations (counted from the first, also when continuing
        from ``state``).
    true_residual_every : int
        Recompute the true residual every this many iterations (0 disables the
        periodic recomputation; it is still done before declaring convergence).
    stagnation_checks : int
        Stop a column at its best iterate when this many consecutive true-residual
        checks find its CG energy ``x^T A x / 2 - b^T x`` higher than its best (in
        exact arithmetic it only falls) or its residual 100 times above its best:
        round-off in the operator has taken over. The other columns go on. When a
        column ends more than :data:`DIVERGED_FACTOR` times above the lowest residual
        it reached, the iterate with the smaller true residual of the two is returned.
    callback : callable, optional
        ``callback(iteration, relative_residuals)`` after each iteration.
    state : CGState, optional
        Continue from this state (saved by ``on_state`` of an earlier, interrupted
        solve of the same system) instead of starting afresh. Its ``b`` must equal
        ``b``.
    on_state : callable, optional
        ``on_state(state)`` with a copy of the :class:`CGState` after every
        ``state_every``-th iteration and once at the end, e.g. to checkpoint it.
    state_every : int, default=1
        How often ``on_state`` is called, in iterations.

    Returns
    -------
    CGResult
        ``x`` of the shape of ``b``.

    Raises
    ------
    ValueError
        For ``tol <= 0``, ``max_iter < 0``, ``state_every < 1``, or a ``state``
        that belongs to another right-hand side.
    """
    b = np.asarray(b, dtype=np.float64)
    vector = b.ndim == 1
    B = b.reshape(b.shape[0], -1)
    m, t = B.shape

    def A(P: np.ndarray) -> np.ndarray:
        return np.asarray(matvec(P), dtype=np.float64).reshape(m, t)

    prec = None if preconditioner is None else (
        lambda R: np.asarray(preconditioner(R), dtype=np.float64).reshape(m, t)
    )
    X0 = None if x0 is None or state is not None else np.array(x0, dtype=np.float64).reshape(m, t)
    result = cg_solve(A, B, NumpyOps(), x0=X0, preconditioner=prec, tol=tol, max_iter=max_iter,
                      true_residual_every=true_residual_every, stagnation_checks=stagnation_checks,
                      callback=callback, state=state, on_state=on_state, state_every=state_every)
    if vector:
        result.x = result.x[:, 0]
    return result


def _check_state(state: CGState, B: np.ndarray) -> None:
    """Refuse a state saved for another system (shape or right-hand side differ)."""
    if not isinstance(state, CGState):
        raise TypeError(f"state must be a CGState; got {type(state).__name__}")
    if state.b.shape != B.shape:
        raise ValueError(
            f"the CG state was saved for a right-hand side of shape {state.b.shape}, "
            f"but this solve has {B.shape}; it belongs to another problem"
        )
    scale = max(float(np.abs(B).max(initial=0.0)), np.finfo(np.float64).tiny)
    if not np.allclose(state.b, B, rtol=1e-10, atol=1e-12 * scale):
        raise ValueError(
            "the CG state was saved for a different right-hand side; it belongs to another "
            "problem (other data, centers or parameters)"
        )
