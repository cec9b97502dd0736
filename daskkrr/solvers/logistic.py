"""Kernel logistic regression on Nystrom centers: the numpy pieces of the Newton method.

The problem (one column of ``+-1`` codes per binary problem, ``f = K_nM alpha + b``)
is

    minimise  (1/N) sum_i s_i log(1 + exp(-y_i f(x_i))) + (lambda/2) alpha^T K_MM alpha,

with per-row weights ``s_i`` (all 1 by default) and ``N = sum_i s_i``; ``b`` is not
penalised. Marteau-Ferey, Bach and Rudi (2019, "Globally convergent Newton methods for
ill-conditioned generalized self-concordant losses"; FALKON's ``LogisticFalkon``)
solve it by Newton steps along a decreasing sequence of penalties, each Newton
system by FALKON's preconditioned CG with a preconditioner weighted by the loss's
second derivative at the centers:

    T^T T = D K_MM D,     A^T A = T (W_M - centring) T^T / M + lambda I,

where ``W_M`` holds ``l''`` at the centers' current predictions (``D`` the importance
weights of the centers, as in :mod:`daskkrr.solvers.falkon`). The row weights
``s_i`` enter the gradient, the Hessian and the ``N`` that scales the penalty, not
the preconditioner (the centers stand for the rows without their weights): that
changes how fast CG converges, never the solution.

What touches the data are two per-block products, summed over the row blocks:
:func:`gradient_terms` (loss, ``K_b^T l'``, ``K_b^T l''`` and their column sums at the
current point) and :func:`hessian_terms` (``K_b^T (l'' * (K_b U))``). Both take a
kernel block ``K_b``; :func:`gradient_block` and :func:`hessian_block` compute it from
the rows first (the recompute strategy), tile by tile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Concatenate, ParamSpec, Protocol

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.utils.linalg import cholesky_jitter, solve_upper
from daskkrr.utils.threads import blas_threads

#: Bytes of one kernel tile computed at a time by the recompute block tasks.
TILE_BYTES = 32 * 2**20
#: FALKON's rule of thumb: how far the penalty falls per warm-up step, where the
#: schedule starts, and the CG iterations of a warm-up step.
SCHEDULE_FACTOR = 100.0
SCHEDULE_START = 1e-2
WARMUP_CG_ITERATIONS = 3


# --------------------------------------------------------------------------- the loss
def log1pexp(z: np.ndarray) -> np.ndarray:
    """``log(1 + exp(z))`` without overflow."""
    return np.logaddexp(0.0, z)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-z))`` without overflow."""
    out = np.empty_like(z, dtype=np.float64)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def loss_derivatives(Y: np.ndarray, F: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logistic loss ``l = log(1 + exp(-y f))`` and its derivatives in ``f``, elementwise.

    ``l' = -y sigmoid(-y f)`` and ``l'' = sigmoid(f) sigmoid(-f)`` (which does not
    depend on ``y = +-1``).
    """
    m = Y * F
    loss = log1pexp(-m)
    s = sigmoid(-m)
    return loss, -Y * s, s * (1.0 - s)


def split_targets(Yb: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``+-1`` codes (first ``t`` columns) and the row weights (the next one, if any)."""
    Yb = np.asarray(Yb, dtype=np.float64).reshape(len(Yb), -1)
    return Yb[:, :t], (Yb[:, t] if Yb.shape[1] > t else None)


# --------------------------------------------------------------------------- block products
def gradient_terms(Kb: np.ndarray, Yb: np.ndarray, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """The gradient pass's sums over one kernel block ``K_b = k(X_b, Z)``.

    Returns float64 ``(M + 2, 2 t)``: rows ``:M`` are ``[K_b^T (s l') | K_b^T (s l'')]``,
    row ``M`` their column sums ``[sum s l' | sum s l'']`` and row ``M + 1`` the loss
    ``sum s l`` (first ``t`` entries) at ``f = K_b coef + intercept``.
    """
    t = coef.shape[1]
    codes, s = split_targets(Yb, t)
    F = np.asarray(Kb, dtype=np.float64) @ coef + intercept
    loss, d1, d2 = loss_derivatives(codes, F)
    if s is not None:
        loss, d1, d2 = loss * s[:, None], d1 * s[:, None], d2 * s[:, None]
    D = np.concatenate([d1, d2], axis=1)
    out = np.zeros((Kb.shape[1] + 2, 2 * t))
    out[:-2] = np.asarray(Kb, dtype=np.float64).T @ D
    out[-2] = D.sum(axis=0)
    out[-1, :t] = loss.sum(axis=0)
    return out


def hessian_terms(Kb: np.ndarray, Yb: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                  U: np.ndarray) -> np.ndarray:
    """``K_b^T (s l''(f) * (K_b U))`` column by column, with ``f = K_b coef + intercept``: float64 ``(M, t)``."""
    t = coef.shape[1]
    _, s = split_targets(Yb, t)
    K = np.asarray(Kb, dtype=np.float64)
    FP = K @ np.concatenate([coef, U], axis=1)
    F, P = FP[:, :t] + intercept, FP[:, t:]
    sf = sigmoid(F)
    w = sf * (1.0 - sf)
    if s is not None:
        w *= s[:, None]
    return K.T @ (w * P)


def _tiles(kernel: Kernel, Xb: np.ndarray, Z: np.ndarray) -> Iterator[tuple[slice, np.ndarray]]:
    """Kernel tiles ``k(X_b[rows], Z)`` of at most :data:`TILE_BYTES` (bounded task memory)."""
    rows = max(1, TILE_BYTES // (8 * max(1, Z.shape[0])))
    engine = engine_for(kernel)
    for start in range(0, Xb.shape[0], rows):
        sl = slice(start, start + rows)
        yield sl, engine.kernel_block(kernel, Xb[sl], Z)


def gradient_block(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray,
                   intercept: np.ndarray) -> np.ndarray:
    """:func:`gradient_terms` of the rows ``X_b`` (kernel computed tile by tile)."""
    Yb = np.asarray(Yb).reshape(len(Yb), -1)
    return sum((gradient_terms(K, Yb[sl], coef, intercept) for sl, K in _tiles(kernel, Xb, Z)),
               np.zeros((Z.shape[0] + 2, 2 * coef.shape[1])))


def hessian_block(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray,
                  intercept: np.ndarray, U: np.ndarray) -> np.ndarray:
    """:func:`hessian_terms` of the rows ``X_b`` (kernel computed tile by tile)."""
    Yb = np.asarray(Yb).reshape(len(Yb), -1)
    return sum((hessian_terms(K, Yb[sl], coef, intercept, U) for sl, K in _tiles(kernel, Xb, Z)),
               np.zeros(U.shape))


def kernel_and_targets(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(k(X_b, Z), Y_b)``: what the cache strategy keeps of a block (the targets too, so
    that a pass over kept blocks reads nothing else)."""
    return engine_for(kernel).kernel_block(kernel, Xb, Z), np.asarray(Yb, dtype=np.float64).reshape(len(Yb), -1)


def gradient_kept(kept: tuple[np.ndarray, np.ndarray], coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """:func:`gradient_terms` of a block kept by :func:`kernel_and_targets`."""
    return gradient_terms(kept[0], kept[1], coef, intercept)


def hessian_kept(kept: tuple[np.ndarray, np.ndarray], coef: np.ndarray, intercept: np.ndarray,
                 U: np.ndarray) -> np.ndarray:
    """:func:`hessian_terms` of a block kept by :func:`kernel_and_targets`."""
    return hessian_terms(kept[0], kept[1], coef, intercept, U)


# --------------------------------------------------------------------------- penalties
def penalty_path(penalty: float, schedule: Any, newton_iterations: int) -> list[tuple[float, bool]]:
    """The Newton steps as ``(penalty, is_target)``: the warm-up penalties, one step each,
    then ``newton_iterations`` steps at the target ``penalty``.

    ``schedule="auto"`` is FALKON's rule of thumb: ``1e-2`` divided by 100 while above
    ``penalty`` (``[1e-2, 1e-4]`` for ``penalty=1e-6``); a list is used as given
    (each value must be larger than ``penalty``, in decreasing order).
    """
    if isinstance(schedule, str):
        if schedule != "auto":
            raise ValueError(f"penalty_schedule must be 'auto' or a list of penalties; got {schedule!r}")
        warm: list[float] = []
        lam = SCHEDULE_START
        while lam > penalty * (1 + 1e-9):
            warm.append(lam)
            lam /= SCHEDULE_FACTOR
    else:
        warm = [float(v) for v in schedule]
        if any(not np.isfinite(v) or v <= penalty for v in warm):
            raise ValueError(f"penalty_schedule must hold finite penalties larger than penalty={penalty:g}; "
                             f"got {list(schedule)!r}")
        if any(b > a for a, b in zip(warm, warm[1:])):
            raise ValueError(f"penalty_schedule must be decreasing; got {list(schedule)!r}")
    return [(v, False) for v in warm] + [(float(penalty), True)] * int(newton_iterations)


# --------------------------------------------------------------------------- preconditioner
@dataclasses.dataclass
class CenterFactor:
    """``K_MM``, its weighted Cholesky factor ``T`` (``T^T T = D K_MM D + jitter``) and ``D``."""

    Kmm: np.ndarray
    T: np.ndarray
    d: np.ndarray
    jitter: float

    @classmethod
    def from_kernel_matrix(cls, Kmm: np.ndarray, weights: np.ndarray | None = None,
                           relative_jitter: float | None = None) -> CenterFactor:
        """Factor ``D K_MM D`` with at least ``relative_jitter * M * mean(diag)`` of jitter (default:
        round-off). ``T`` only preconditions (the Newton systems apply ``K_MM`` itself), so a float32
        fit can take :data:`~daskkrr.solvers.falkon.FLOAT32_RELATIVE_JITTER`, which bounds ``T^{-1}``
        and with it the float32 round-off of the products ``K_nM u``."""
        Kmm = np.asarray(Kmm, dtype=np.float64)
        M = Kmm.shape[0]
        d = np.ones(M) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64))
        T, jitter = cholesky_jitter(d[:, None] * Kmm * d[None, :], what="center kernel matrix K_MM",
                                    relative_jitter=relative_jitter)
        return cls(Kmm=Kmm, T=T, d=d, jitter=jitter)


@dataclasses.dataclass
class LogisticPreconditioner:
    """One FALKON factor ``A_j`` per binary problem, weighted by ``l''`` at the centers.

    With ``alpha_j = D T^{-1} A_j^{-1} beta_j`` the Newton system of problem ``j``
    becomes ``A_j^{-T} T^{-T} D H_j D T^{-1} A_j^{-1}``, close to the identity when the
    centers represent the data: the centers stand for the rows in
    ``K_nM^T W K_nM / N ~ K_MM D W_M D K_MM / M`` (FALKON's ``LogisticPreconditioner``
    scales by ``1/n`` where this takes the ``1/M`` of FALKON's least-squares
    preconditioner, the consistent estimate). With an intercept the weighted mean is
    taken out, as in the Schur complement the CG solves.
    """

    factor: CenterFactor
    A: list[np.ndarray]

    @classmethod
    def build(cls, factor: CenterFactor, center_curvature: np.ndarray, penalty: float,
              intercept: bool) -> LogisticPreconditioner:
        """``center_curvature``: ``l''`` at the centers' predictions, ``(M, t)``."""
        T, d = factor.T, factor.d
        M = T.shape[0]
        A = []
        for w in np.asarray(center_curvature, dtype=np.float64).T:
            R = T * np.sqrt(w)[None, :]
            inner = R @ R.T
            if intercept:
                v = T @ (d * w)
                inner -= np.outer(v, v) / max(float(np.sum(d * d * w)), np.finfo(float).tiny)
            inner /= M
            inner = (inner + inner.T) / 2
            inner[np.diag_indices(M)] += penalty
            Aj, _ = cholesky_jitter(inner, what="logistic FALKON inner matrix", overwrite=True)
            A.append(Aj)
        return cls(factor=factor, A=A)

    def to_coefficients(self, beta: np.ndarray) -> np.ndarray:
        """``alpha_j = D T^{-1} A_j^{-1} beta_j`` for every column."""
        T, d = self.factor.T, self.factor.d
        V = np.column_stack([solve_upper(Aj, beta[:, j]) for j, Aj in enumerate(self.A)])
        return d[:, None] * solve_upper(T, V)

    def adjoint(self, C: np.ndarray) -> np.ndarray:
        """``A_j^{-T} T^{-T} D c_j`` for every column."""
        T, d = self.factor.T, self.factor.d
        W = solve_upper(T, d[:, None] * C, trans=True)
        return np.column_stack([solve_upper(Aj, W[:, j], trans=True) for j, Aj in enumerate(self.A)])


# --------------------------------------------------------------------------- the Newton state
@dataclasses.dataclass
class NewtonState:
    """Everything the Newton loop needs to continue exactly, as arrays and scalars.

    Attributes
    ----------
    step : int
        Index of the next entry of the penalty path (:func:`penalty_path`).
    coef, intercept : ndarray (M, t), (t,)
        The current point.
    prev_coef, prev_intercept, prev_objective : ndarray
        The point before the last step at the target penalty and its objective
        (the step is halved while the objective rises); ``prev_objective`` is
        ``inf`` where there is none.
    active : ndarray (t,) of bool
        Problems still iterating (the others have converged); shape (1,), as
        ``prev_objective``, ``history`` and ``decrements``, for the multinomial
        model (one problem over the ``t`` classes).
    history : ndarray (k, t)
        Objective at the start of every Newton step so far.
    decrements : ndarray (k, t)
        Squared Newton decrements of those steps (``nan`` for a halving).
    cg_iterations, halvings : int
        CG iterations and step halvings so far.
    """

    step: int
    coef: np.ndarray
    intercept: np.ndarray
    prev_coef: np.ndarray
    prev_intercept: np.ndarray
    prev_objective: np.ndarray
    active: np.ndarray
    history: np.ndarray
    decrements: np.ndarray
    cg_iterations: int = 0
    halvings: int = 0

    #: The checkpoint stores it under keys starting with this prefix (see :mod:`daskkrr.checkpoint`).
    checkpoint_prefix: ClassVar[str] = "newton"
    _ARRAYS: ClassVar[tuple[str, ...]] = ("coef", "intercept", "prev_coef", "prev_intercept", "prev_objective",
                                          "active", "history", "decrements")
    _SCALARS: ClassVar[tuple[str, ...]] = ("step", "cg_iterations", "halvings")

    @property
    def iteration(self) -> int:
        """Newton steps done (what a checkpoint reports as its iteration)."""
        return int(self.step)

    @classmethod
    def start(cls, M: int, intercept: np.ndarray, problems: int | None = None) -> NewtonState:
        """The state before the first step: ``coef = 0``; ``problems`` (default: one per
        column of ``coef``) is the length of the per-problem arrays (1 for the
        multinomial model of :mod:`daskkrr.solvers.softmax`)."""
        t = intercept.shape[0]
        k = t if problems is None else int(problems)
        zero = np.zeros((M, t))
        return cls(step=0, coef=zero, intercept=intercept.astype(np.float64), prev_coef=zero.copy(),
                   prev_intercept=intercept.astype(np.float64), prev_objective=np.full(k, np.inf),
                   active=np.ones(k, dtype=bool), history=np.zeros((0, k)), decrements=np.zeros((0, k)))

    def copy(self) -> NewtonState:
        arrays: dict[str, Any] = {k: np.array(getattr(self, k)) for k in self._ARRAYS}
        return dataclasses.replace(self, **arrays)

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {k: np.array(getattr(self, k)) for k in self._ARRAYS}
        out.update({k: np.array(getattr(self, k)) for k in self._SCALARS})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> NewtonState:
        """Inverse of :meth:`to_arrays`; ValueError when an entry is missing or misshapen."""
        missing = [k for k in (*cls._ARRAYS, *cls._SCALARS) if k not in arrays]
        if missing:
            raise ValueError(f"the Newton state lacks {missing}")
        coef = np.asarray(arrays["coef"], dtype=np.float64)
        if coef.ndim != 2:
            raise ValueError(f"the Newton state's coef has shape {coef.shape}, expected (M, t)")
        t = coef.shape[1]
        kw: dict[str, Any] = {k: np.asarray(arrays[k], dtype=bool if k == "active" else np.float64)
                              for k in cls._ARRAYS}
        for k in ("intercept", "prev_intercept"):
            if kw[k].shape != (t,):
                raise ValueError(f"the Newton state's {k} has shape {kw[k].shape}, expected ({t},)")
        problems = kw["active"].shape
        if problems not in ((t,), (1,)) or kw["prev_objective"].shape != problems:
            raise ValueError(f"the Newton state's active and prev_objective have shapes {problems} and "
                             f"{kw['prev_objective'].shape}, expected ({t},) or (1,) (one problem)")
        kw.update({k: int(arrays[k]) for k in cls._SCALARS})
        return cls(**kw)


@dataclasses.dataclass
class NewtonResult:
    """The outcome of :func:`newton_solve`."""

    coef: np.ndarray
    intercept: np.ndarray
    objective: np.ndarray
    converged: bool
    state: NewtonState


#: Below this many centers the client's M x M algebra (a few triangular solves per CG
#: iteration, a Cholesky factor per class and Newton step) runs on one BLAS thread:
#: multithreaded BLAS on small matrices costs more in synchronisation than it saves,
#: badly so on a loaded machine (0.17 s for a 200 x 200 Cholesky measured at load 10 on 2 cores).
SINGLE_THREAD_CENTERS = 1024
#: Largest relative CG residual of a Newton step at the target penalty.
MAX_FORCING = 0.1


def forcing_tolerance(state: NewtonState, tol: float) -> float:
    """CG's relative residual for the next Newton step at the target (an inexact Newton method).

    Far from the optimum an exact Newton direction is wasted work: the tolerance is
    ``sqrt(lambda^2 / objective)`` of the previous step (at most :data:`MAX_FORCING`,
    at least ``tol``), which falls as the iterates converge and keeps the
    convergence superlinear (Eisenstat and Walker's forcing terms).
    """
    if not len(state.history) or not len(state.decrements):
        return max(tol, MAX_FORCING)
    ratio = state.decrements[-1] / np.maximum(np.abs(state.history[-1]), np.finfo(float).tiny)
    ratio = ratio[state.active] if state.active.any() else ratio
    return float(np.clip(np.sqrt(np.max(np.abs(ratio))), tol, MAX_FORCING))


GradientPass = Callable[[np.ndarray, np.ndarray], np.ndarray]
HessianPass = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


NewtonParams = ParamSpec("NewtonParams")


def center_threads(solve: Callable[Concatenate[CenterFactor, NewtonParams], NewtonResult],
                   ) -> Callable[Concatenate[CenterFactor, NewtonParams], NewtonResult]:
    """Run a Newton solver with one BLAS thread when the center system is small (below
    :data:`SINGLE_THREAD_CENTERS`), where threads cost more than they gain."""

    @functools.wraps(solve)
    def wrapper(factor: CenterFactor, *args: NewtonParams.args, **kwargs: NewtonParams.kwargs) -> NewtonResult:
        small = factor.Kmm.shape[0] < SINGLE_THREAD_CENTERS
        with blas_threads(1) if small else contextlib.nullcontext():
            return solve(factor, *args, **kwargs)

    return wrapper


@dataclasses.dataclass
class NewtonSystem:
    """What a loss needs to compute one Newton direction (see :class:`NewtonLoss`).

    Attributes
    ----------
    factor : CenterFactor
        ``K_MM`` and its factor, for the preconditioner.
    G : ndarray
        The gradient pass's sums at the current point (the loss's ``gradient_terms``).
    coef, intercept : ndarray (M, t), (t,)
        The current point.
    active : ndarray of bool
        Problems still iterating.
    penalty, weight_sum : float
        ``lambda`` of this step and ``N``.
    fit_intercept : bool
        Whether the intercepts are unknowns (eliminated by a Schur complement).
    hessian_pass : callable
        ``hessian_pass(coef, intercept, U)``, the sum of the loss's ``hessian_terms``.
    solve : callable
        ``solve(operator, rhs)``: the preconditioned CG of the step (its tolerance and
        iteration budget set by the driver); returns the solution.
    """

    factor: CenterFactor
    G: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    active: np.ndarray
    penalty: float
    weight_sum: float
    fit_intercept: bool
    hessian_pass: HessianPass
    solve: Callable[[Callable[[np.ndarray], np.ndarray], np.ndarray], np.ndarray]


class NewtonLoss(Protocol):
    """The loss-specific parts of :func:`newton_solve`: :class:`BinaryLogistic` (one problem
    per column) and :class:`daskkrr.solvers.softmax.Multinomial` (one problem over the classes)."""

    def problems(self, t: int) -> int:
        """How many problems ``t`` columns of ``coef`` are (the length of the per-problem arrays)."""
        ...

    def columns(self, problems: np.ndarray, t: int) -> np.ndarray:
        """The columns (of ``t``) of ``coef`` of the problems in the boolean mask ``problems``."""
        ...

    def objective(self, G: np.ndarray, Kmm: np.ndarray, coef: np.ndarray, penalty: float,
                  weight_sum: float) -> np.ndarray:
        """The objective of every problem from the gradient pass's sums."""
        ...

    def direction(self, system: NewtonSystem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The Newton step ``(d_coef, d_intercept)`` (the point moves to ``x - d``) and the
        squared Newton decrement of every problem."""
        ...


class BinaryLogistic:
    """:class:`NewtonLoss` of the binary logistic loss, one independent problem per column."""

    def problems(self, t: int) -> int:
        return t

    def columns(self, problems: np.ndarray, t: int) -> np.ndarray:
        return problems

    def objective(self, G: np.ndarray, Kmm: np.ndarray, coef: np.ndarray, penalty: float,
                  weight_sum: float) -> np.ndarray:
        M, t = coef.shape
        return G[M + 1, :t] / weight_sum + 0.5 * penalty * np.einsum("ij,ij->j", coef, Kmm @ coef)

    def direction(self, system: NewtonSystem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        G, coef, active, lam, N = system.G, system.coef, system.active, system.penalty, system.weight_sum
        Kmm = system.factor.Kmm
        M, t = coef.shape
        # gradient in alpha and b; the Schur complement eliminates b
        g_a = G[:M, :t] / N + lam * (Kmm @ coef)
        g_b = G[M, :t] / N
        h_bb = G[M, t:] / N
        hb = G[:M, t:] / N  # H_ab, one column per problem
        g_s = g_a - hb * (g_b / h_bb)[None, :] if system.fit_intercept else g_a
        g_s[:, ~active] = 0.0
        centers_f = Kmm @ coef + system.intercept  # predictions at the centers
        _, _, curv = loss_derivatives(np.ones_like(centers_f), centers_f)
        pre = LogisticPreconditioner.build(system.factor, curv, lam, system.fit_intercept)

        def schur(U: np.ndarray) -> np.ndarray:
            HU = system.hessian_pass(coef, system.intercept, U) / N + lam * (Kmm @ U)
            if system.fit_intercept:
                HU -= hb * (np.einsum("ij,ij->j", hb, U) / h_bb)[None, :]
            return HU

        x = system.solve(lambda beta: pre.adjoint(schur(pre.to_coefficients(beta.reshape(M, t)))),
                         pre.adjoint(g_s))
        d_a = pre.to_coefficients(x.reshape(M, t))
        d_a[:, ~active] = 0.0
        decrement = np.einsum("ij,ij->j", g_s, d_a)
        d_b = (g_b - np.einsum("ij,ij->j", hb, d_a)) / h_bb if system.fit_intercept else np.zeros(t)
        if system.fit_intercept:
            decrement = decrement + g_b * g_b / h_bb
        d_b[~active] = 0.0
        return d_a, d_b, decrement


@center_threads
def newton_solve(
    factor: CenterFactor,
    gradient_pass: GradientPass,
    hessian_pass: HessianPass,
    *,
    path: list[tuple[float, bool]],
    weight_sum: float,
    intercept0: np.ndarray,
    fit_intercept: bool,
    tol: float,
    max_iter: int,
    loss: NewtonLoss | None = None,
    state: NewtonState | None = None,
    on_state: Callable[[NewtonState], None] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    max_halvings: int = 30,
) -> NewtonResult:
    """Newton's method along ``path``; each system by preconditioned CG (:func:`conjugate_gradient`).

    ``gradient_pass(coef, intercept)`` returns the sum of the loss's ``gradient_terms`` over
    the data, ``hessian_pass(coef, intercept, U)`` the sum of its ``hessian_terms``; ``loss``
    (default :class:`BinaryLogistic`; :class:`daskkrr.solvers.softmax.Multinomial` for the
    softmax model) turns them into objectives and Newton directions. A warm-up
    step makes :data:`WARMUP_CG_ITERATIONS` CG iterations (FALKON's rule), a step at the
    target up to ``max_iter``, to a relative residual ``tol``. A problem stops at the
    target once its squared Newton decrement ``g^T H^{-1} g`` (which bounds twice the
    distance to the optimal objective) is below ``2 tol`` times its objective; at the
    target a step that raised the objective is halved (a safeguard; FALKON has none).
    ``on_state`` receives the state after every Newton step; ``state`` continues from one.
    """
    from daskkrr.solvers.cg import conjugate_gradient

    loss = BinaryLogistic() if loss is None else loss
    Kmm = factor.Kmm
    M = Kmm.shape[0]
    N = float(weight_sum)
    intercept0 = np.asarray(intercept0, dtype=np.float64)
    problems = loss.problems(intercept0.shape[0])
    st = NewtonState.start(M, intercept0, problems=problems) if state is None else state.copy()
    while st.step < len(path) and st.active.any():
        lam, target = path[st.step]
        G = gradient_pass(st.coef, st.intercept)
        objective = loss.objective(G, Kmm, st.coef, lam, N)
        if target:
            rose = st.active & (objective > st.prev_objective + 1e-13 * np.abs(st.prev_objective))
            if rose.any() and st.halvings < max_halvings:
                # Halve the last step of the problems whose objective rose, and look again.
                cols = loss.columns(rose, st.coef.shape[1])
                st.coef[:, cols] = (st.coef[:, cols] + st.prev_coef[:, cols]) / 2
                st.intercept[cols] = (st.intercept[cols] + st.prev_intercept[cols]) / 2
                st.halvings += 1
                continue
        st.history = np.vstack([st.history, objective])

        def callback(it: int, rel: np.ndarray) -> None:
            if on_step is not None:
                on_step(st.cg_iterations + it, float(np.max(rel)))

        def solve(operator: Callable[[np.ndarray], np.ndarray], rhs: np.ndarray, target: bool = target) -> np.ndarray:
            result = conjugate_gradient(operator, rhs, tol=forcing_tolerance(st, tol) if target else tol,
                                        max_iter=max_iter if target else min(max_iter, WARMUP_CG_ITERATIONS),
                                        callback=callback)
            st.cg_iterations += int(result.n_iter)
            return result.x

        d_a, d_b, decrement = loss.direction(NewtonSystem(
            factor=factor, G=G, coef=st.coef.copy(), intercept=st.intercept.copy(), active=st.active, penalty=lam,
            weight_sum=N, fit_intercept=fit_intercept, hessian_pass=hessian_pass, solve=solve))
        st.decrements = np.vstack([st.decrements, decrement])
        st.prev_coef, st.prev_intercept = st.coef.copy(), st.intercept.copy()
        st.prev_objective = objective.copy() if target else np.full(problems, np.inf)
        st.coef = st.coef - d_a
        st.intercept = st.intercept - d_b
        if target:
            st.active &= ~(decrement <= 2 * tol * np.maximum(np.abs(objective), np.finfo(float).tiny))
        st.step += 1
        st.halvings = 0
        if on_state is not None:
            on_state(st.copy())
    converged = not st.active.any()
    G = gradient_pass(st.coef, st.intercept)
    objective = loss.objective(G, Kmm, st.coef, path[-1][0], N)
    return NewtonResult(coef=st.coef, intercept=st.intercept, objective=objective, converged=converged, state=st)
