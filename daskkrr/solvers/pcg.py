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

import numpy as np
import scipy.linalg as sla

from daskkrr.solvers.cg import CGResult, CGState, NumpyOps, Vector, VectorOps, cg_solve

__all__ = [
    "NumpyOps",
    "PCGResult",
    "VectorOps",
    "WoodburyFactor",
    "pcg",
    "predicted_iterations",
    "ritz_bounds",
]

Operator = Callable[[Vector], Vector]
#: The outcome of :func:`pcg` (``stagnated`` is always False: the guards are off).
PCGResult = CGResult


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
) -> CGResult:
    """Solve ``A x = b`` (symmetric positive definite, several columns) by preconditioned CG.

    :func:`daskkrr.solvers.cg.cg_solve` without the stagnation guards (whose energy
    would cost another reduction over the data per check).

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

    Returns
    -------
    CGResult
        ``x`` of ``ops``' kind, with the CG coefficients ``alphas`` and ``betas`` (for :func:`ritz_bounds`).

    Raises
    ------
    ValueError
        For ``tol <= 0``, ``max_iter < 0`` or a state of another right-hand side.
    """
    return cg_solve(matvec, b, ops, preconditioner=preconditioner, tol=tol, max_iter=max_iter,
                    true_residual_every=true_residual_every, stagnation_checks=None, callback=callback,
                    state=state, on_state=on_state, state_every=max(1, int(state_every)))


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
