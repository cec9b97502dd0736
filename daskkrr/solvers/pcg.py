"""Preconditioned CG on vectors that live anywhere, and the random-feature preconditioner.

Avron, Clarkson and Woodruff ("Faster kernel ridge regression using sketching
and preconditioning", Algorithm 1) solve the exact system
``(K + lambda I) c = y`` by PCG with the preconditioner ``Z Z^T + lambda_p I``,
``Z`` the ``n x s`` random features of the rows. Its inverse comes from the
Woodbury identity and the Cholesky factor of the small ``Z^T Z + lambda_p I_s``::

    (Z Z^T + lambda_p I)^{-1} r = (r - Z (Z^T Z + lambda_p I_s)^{-1} Z^T r) / lambda_p

(:class:`WoodburyFactor`). The paper forms ``U = L^{-T} Z^T`` to apply it with
two GEMMs; here ``Z`` stays in row blocks on the workers, ``Z^T r`` is a reduction
whose ``s x t`` result is solved on the client, and ``Z w`` is a blockwise product,
which is the same arithmetic without an ``n x s`` matrix on the client.

:func:`pcg` is written against :class:`VectorOps`, so its n-vectors can be numpy
arrays (:class:`NumpyOps`) or row-chunked dask arrays kept on the workers
(:class:`daskkrr.parallel.tiles.DaskOps`): it only adds vectors, scales their
columns and asks ``ops`` for column dot products (scalars). It stops a column at
the paper's criterion ``||y - (K + lambda I) c|| <= tol ||y||``, confirmed on the
true residual. :func:`ritz_bounds` turns the CG coefficients into Lanczos estimates
of the extreme eigenvalues of the preconditioned operator (the adaptive choice of
s, Section 5); :func:`predicted_iterations` is the paper's iteration bound.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import scipy.linalg as sla

from daskkrr.solvers.cg import CGState

__all__ = [
    "NumpyOps",
    "PCGResult",
    "VectorOps",
    "WoodburyFactor",
    "pcg",
    "predicted_iterations",
    "ritz_bounds",
]

Vector = Any
Operator = Callable[[Vector], Vector]


class VectorOps(Protocol):
    """What :func:`pcg` needs to know about its vectors (``(n, t)``, columns = right-hand sides)."""

    def dots(self, pairs: list[tuple[Vector, Vector]]) -> list[np.ndarray]:
        """Column dot products ``sum_i a_ij b_ij`` (``(t,)`` each) of every pair, at once."""
        ...

    def lincomb(self, terms: list[tuple[Any, Vector]]) -> Vector:
        """``sum_k c_k v_k`` with scalar or per-column ``(t,)`` coefficients, materialised where it lives."""
        ...

    def to_numpy(self, v: Vector) -> np.ndarray:
        """The vector here (for a checkpoint)."""
        ...

    def from_numpy(self, a: np.ndarray) -> Vector:
        """A vector from a numpy array (to resume from a checkpoint)."""
        ...


class NumpyOps:
    """:class:`VectorOps` for numpy arrays in this process."""

    def dots(self, pairs: list[tuple[Vector, Vector]]) -> list[np.ndarray]:
        return [np.einsum("ij,ij->j", a, b) for a, b in pairs]

    def lincomb(self, terms: list[tuple[Any, Vector]]) -> Vector:
        out = None
        for c, v in terms:
            out = v * c if out is None else out + v * c
        return out

    def to_numpy(self, v: Vector) -> np.ndarray:
        return np.asarray(v, dtype=np.float64)

    def from_numpy(self, a: np.ndarray) -> Vector:
        return np.asarray(a, dtype=np.float64)


@dataclasses.dataclass
class PCGResult:
    """Outcome of :func:`pcg`.

    Attributes
    ----------
    x : vector (n, t)
        The solution, of the kind ``ops`` works with.
    n_iter : int
        Iterations (products with the operator for new search directions).
    n_matvec : int
        All products with the operator (true-residual checks included).
    residuals : ndarray (n_iter + 1, t)
        Relative residuals ``||b - A x|| / ||b||`` after each iteration.
    converged : bool
        Every column reached ``tol``.
    alphas, betas : ndarray (n_iter, t)
        CG step lengths and direction updates (for :func:`ritz_bounds`).
    stagnated : bool
        Always False (for the not-converged warning shared with FALKON's CG).
    """

    x: Vector
    n_iter: int
    n_matvec: int
    residuals: np.ndarray
    converged: bool
    alphas: np.ndarray
    betas: np.ndarray
    stagnated: bool = False


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def pcg(
    matvec: Operator,
    b: Vector,
    ops: VectorOps,
    *,
    preconditioner: Operator | None = None,
    tol: float = 1e-6,
    max_iter: int = 1000,
    true_residual_every: int = 50,
    callback: Callable[[int, np.ndarray], None] | None = None,
    state: CGState | None = None,
    on_state: Callable[[CGState], None] | None = None,
    state_every: int = 1,
) -> PCGResult:
    """Solve ``A x = b`` (symmetric positive definite, several columns) by preconditioned CG.

    Parameters
    ----------
    matvec : callable
        ``A @ v`` for a vector ``v`` of ``ops``' kind.
    b : vector (n, t)
        Right-hand sides.
    ops : VectorOps
        Dot products, materialisation and conversion of the vectors.
    preconditioner : callable, optional
        ``M^{-1} r`` (symmetric positive definite); None for plain CG.
    tol : float
        Stop a column at ``||b - A x|| <= tol ||b||`` (the true residual confirms it).
    max_iter : int
        Most iterations (counted from the first, also when resuming).
    true_residual_every : int
        Replace the recursive residual by ``b - A x`` this often (0: only to confirm convergence).
    callback : callable, optional
        ``callback(iteration, relative_residuals)`` after each iteration.
    state : CGState, optional
        Continue from a state saved by ``on_state`` (same ``b``).
    on_state : callable, optional
        Receives the state (numpy arrays: :class:`~daskkrr.solvers.CGState`, as FALKON's CG
        saves it) every ``state_every`` iterations and at the end.
    state_every : int
        How often ``on_state`` is called.

    Raises
    ------
    ValueError
        For ``tol <= 0``, ``max_iter < 0`` or a state of another right-hand side.
    """
    if not tol > 0:
        raise ValueError(f"tol must be > 0; got {tol!r}")
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0; got {max_iter!r}")
    M = preconditioner if preconditioner is not None else (lambda r: r)
    (bb,) = ops.dots([(b, b)])
    bnorm = np.sqrt(bb)
    t = bnorm.size
    safe = np.where(bnorm > 0, bnorm, 1.0)
    alphas: list[np.ndarray] = []
    betas: list[np.ndarray] = []
    if state is None:
        X = ops.lincomb([(0.0, b)])
        R = b
        Zr = M(R)
        P = Zr
        (rz,) = ops.dots([(R, Zr)])
        rel = np.where(bnorm > 0, 1.0, 0.0)
        history = [rel.copy()]
        it = n_matvec = last_true = 0
    else:
        if state.b.shape[1] != t or not np.allclose(ops.to_numpy(b), state.b, rtol=1e-10, atol=1e-12 * safe.max()):
            raise ValueError("the PCG state was saved for a different right-hand side; it belongs to another problem")
        X, R, P = (ops.from_numpy(getattr(state, k)) for k in ("x", "r", "p"))
        rz = state.rz.copy()
        history = [row.copy() for row in state.history]
        rel = history[-1].copy()
        it, n_matvec, last_true = state.iteration, state.n_matvec, state.last_true
    active = rel > tol

    def snapshot() -> CGState:
        xn = ops.to_numpy(X)
        return CGState(
            b=ops.to_numpy(b), x=xn, r=ops.to_numpy(R), p=ops.to_numpy(P), rz=rz.copy(), active=active.copy(),
            history=np.array(history), best_x=xn, best_phi=np.zeros(t), best_rel=rel.copy(),
            iteration=it, n_matvec=n_matvec, last_true=last_true,
        )

    while it < max_iter and active.any():
        AP = matvec(P)
        n_matvec += 1
        it += 1
        (pAp,) = ops.dots([(P, AP)])
        alpha = np.where(active, _safe_div(rz, pAp), 0.0)
        X, R = _lincombs(ops, [[(1.0, X), (alpha, P)], [(1.0, R), (-alpha, AP)]])
        (rr,) = ops.dots([(R, R)])
        rel = np.sqrt(np.maximum(rr, 0.0)) / safe
        if (true_residual_every and it - last_true >= true_residual_every) or not (rel > tol).any():
            R = ops.lincomb([(1.0, b), (-1.0, matvec(X))])  # residual replacement; confirms convergence
            n_matvec += 1
            last_true = it
            (rr,) = ops.dots([(R, R)])
            rel = np.sqrt(np.maximum(rr, 0.0)) / safe
        rel[bnorm == 0] = 0.0
        history.append(rel.copy())
        alphas.append(alpha)
        if callback is not None:
            callback(it, rel.copy())
        active = rel > tol
        if not active.any():
            betas.append(np.zeros(t))
            break
        Zr = M(R)
        (rz_new,) = ops.dots([(R, Zr)])
        beta = np.where(active, _safe_div(rz_new, rz), 0.0)
        betas.append(beta)
        P = ops.lincomb([(1.0, Zr), (beta, P)])
        rz = rz_new
        if on_state is not None and it % max(1, int(state_every)) == 0 and it < max_iter:
            on_state(snapshot())
    if on_state is not None:
        on_state(snapshot())
    if len(betas) < len(alphas):
        betas.append(np.zeros(t))
    return PCGResult(
        x=X, n_iter=it, n_matvec=n_matvec, residuals=np.array(history), converged=bool((history[-1] <= tol).all()),
        alphas=np.array(alphas).reshape(-1, t), betas=np.array(betas).reshape(-1, t),
    )


def _lincombs(ops: VectorOps, combos: list[list[tuple[Any, Vector]]]) -> list[Vector]:
    """Several linear combinations, at once when ``ops`` can (one round trip to the workers)."""
    many = getattr(ops, "lincombs", None)
    if many is not None:
        return list(many(combos))
    return [ops.lincomb(terms) for terms in combos]


def ritz_bounds(alphas: np.ndarray, betas: np.ndarray) -> tuple[float, float]:
    """Smallest and largest Ritz values of the preconditioned operator ``M^{-1} A``.

    CG's coefficients define the Lanczos tridiagonal matrix ``T`` (diagonal
    ``1/alpha_k + beta_{k-1}/alpha_{k-1}``, off-diagonal ``sqrt(beta_k)/alpha_k``)
    whose eigenvalues approach those of ``M^{-1} A`` from inside its spectrum: a few
    steps give a lower bound on ``lambda_max`` and an upper bound on ``lambda_min``
    that tighten quickly at the extremes. Uses the first column.
    """
    a = np.asarray(alphas, dtype=np.float64).reshape(len(alphas), -1)[:, 0]
    bt = np.asarray(betas, dtype=np.float64).reshape(len(betas), -1)[:, 0]
    k = int(np.flatnonzero(a > 0).size)
    if k == 0:
        raise ValueError("no CG step to estimate the spectrum from")
    a, bt = a[:k], bt[:k]
    diag = 1.0 / a
    diag[1:] += bt[:-1] / a[:-1]
    off = np.sqrt(np.maximum(bt[:-1], 0.0)) / a[:-1]
    ev = sla.eigh_tridiagonal(diag, off, eigvals_only=True)
    return float(ev[0]), float(ev[-1])


def predicted_iterations(kappa: float, tol: float) -> int:
    """The paper's PCG bound ``ceil(sqrt(kappa) ln(2 / tol) / 2)`` for condition number ``kappa``."""
    return int(math.ceil(math.sqrt(max(kappa, 1.0)) * math.log(2.0 / tol) / 2.0))


@dataclasses.dataclass(frozen=True)
class WoodburyFactor:
    """The inverse of ``Z Z^T + lambda_p I`` through ``Z^T Z + lambda_p I_s`` (Algorithm 1, steps 6-7).

    Attributes
    ----------
    cho : tuple
        scipy's Cholesky factor of ``Z^T Z + lambda_p I_s``.
    penalty : float
        ``lambda_p``.
    """

    cho: tuple
    penalty: float

    @classmethod
    def from_gram(cls, ZtZ: np.ndarray, penalty: float) -> WoodburyFactor:
        """Factor ``Z^T Z + penalty I`` (``ZtZ`` from one reduction over the row blocks)."""
        if not penalty > 0:
            raise ValueError(f"the preconditioner penalty must be > 0; got {penalty!r}")
        G = np.array(ZtZ, dtype=np.float64)
        G = (G + G.T) / 2
        G[np.diag_indices_from(G)] += penalty
        return cls(sla.cho_factor(G, lower=True), float(penalty))

    def solve_small(self, ZtR: np.ndarray) -> np.ndarray:
        """``w = (Z^T Z + lambda_p I)^{-1} Z^T r`` (``s x t``, on the client)."""
        return sla.cho_solve(self.cho, np.asarray(ZtR, dtype=np.float64))

    def apply(self, Z: np.ndarray, R: np.ndarray) -> np.ndarray:
        """``(Z Z^T + lambda_p I)^{-1} R`` for an in-memory ``Z`` (small problems, tests)."""
        return (R - Z @ self.solve_small(Z.T @ R)) / self.penalty
