"""Preconditioned conjugate gradient for several right-hand sides at once.

The matrix is never needed: the caller passes a ``matvec`` (for FALKON, one
distributed pass over the data) and optionally a ``preconditioner`` (any
approximation of the inverse). Each column of the right-hand side runs its own
CG recurrence; columns that have converged stop moving, and the solve stops when
every column has, or after ``max_iter`` iterations.

The recursive residual drifts from the true one in finite precision, so the true
residual ``b - A x`` is recomputed every ``true_residual_every`` iterations and
before declaring convergence ("residual replacement").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

MatVec = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class CGResult:
    """Outcome of :func:`conjugate_gradient`.

    Attributes
    ----------
    x : ndarray of shape (m,) or (m, t)
        The approximate solution.
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
        True when the solve stopped because the true residual stopped falling
        (the attainable accuracy of the operator was reached); ``x`` is then the
        iterate with the smallest true residual.
    """

    x: np.ndarray
    n_iter: int
    n_matvec: int
    residuals: np.ndarray
    converged: bool
    stagnated: bool = False


def _energy(X: np.ndarray, B: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``x^T A x / 2 - b^T x`` per column, from the true residual ``R = B - A X``."""
    return -0.5 * np.einsum("ij,ij->j", X, B + R)


def _colnorm(a: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->j", a, a))


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
) -> CGResult:
    """Solve ``A x = b`` for symmetric positive definite ``A`` given only ``x -> A x``.

    Parameters
    ----------
    matvec : callable
        ``matvec(P)`` returns ``A @ P`` for ``P`` of shape ``(m, t)``.
    b : ndarray of shape (m,) or (m, t)
        Right-hand side(s).
    x0 : ndarray, optional
        Starting point (zeros by default).
    preconditioner : callable, optional
        ``preconditioner(R)`` approximates ``A^{-1} R``; must be symmetric positive definite.
    tol : float
        Stop a column when ``||b - A x|| <= tol * ||b||``.
    max_iter : int
        Maximum number of iterations.
    true_residual_every : int
        Recompute the true residual every this many iterations (0 disables the
        periodic recomputation; it is still done before declaring convergence).
    stagnation_checks : int
        Stop, returning the best iterate, when this many consecutive true-residual
        checks find the CG energy ``x^T A x / 2 - b^T x`` higher than its best (in
        exact arithmetic it only falls) or the residual 100 times above its best:
        round-off in the operator has taken over.
    callback : callable, optional
        ``callback(iteration, relative_residuals)`` after each iteration.
    """
    if tol <= 0:
        raise ValueError(f"tol must be > 0; got {tol!r}")
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0; got {max_iter!r}")
    b = np.asarray(b, dtype=np.float64)
    vector = b.ndim == 1
    B = b.reshape(b.shape[0], -1)
    m, t = B.shape

    def A(P: np.ndarray) -> np.ndarray:
        out = np.asarray(matvec(P), dtype=np.float64).reshape(m, t)
        if out.shape != (m, t):  # pragma: no cover - defensive
            raise ValueError(f"matvec returned shape {out.shape}; expected {(m, t)}")
        return out

    Mprec = (lambda R: R) if preconditioner is None else (
        lambda R: np.asarray(preconditioner(R), dtype=np.float64).reshape(m, t)
    )

    bnorm = _colnorm(B)
    safe_bnorm = np.where(bnorm > 0, bnorm, 1.0)
    X = np.zeros((m, t)) if x0 is None else np.array(x0, dtype=np.float64).reshape(m, t)
    n_matvec = 0
    if x0 is None:
        R = B.copy()
    else:
        R = B - A(X)
        n_matvec += 1
    rel = _colnorm(R) / safe_bnorm
    rel[bnorm == 0] = 0.0
    history = [rel.copy()]
    active = rel > tol
    Zr = Mprec(R)
    P = Zr.copy()
    rz = np.einsum("ij,ij->j", R, Zr)
    it = 0
    last_true = 0
    # CG decreases the energy phi(x) = x^T A x / 2 - b^T x at every step in exact
    # arithmetic (the residual norm need not fall); an increase at a check means
    # round-off has taken over. phi comes free with the true residual r = b - A x.
    # The residual norm may rise in exact CG too, but not by orders of magnitude
    # from its best once near the round-off floor.
    best_phi, best_rel, best_X = _energy(X, B, R), rel.copy(), X.copy()
    checks_without_progress = 0
    stagnated = False
    while it < max_iter and active.any():
        AP = A(P)
        n_matvec += 1
        it += 1
        pAp = np.einsum("ij,ij->j", P, AP)
        step = np.zeros(t)
        ok = active & (pAp > 0)
        step[ok] = rz[ok] / pAp[ok]
        X += P * step
        R -= AP * step
        rel = _colnorm(R) / safe_bnorm
        rel[bnorm == 0] = 0.0
        periodic = bool(true_residual_every) and it - last_true >= true_residual_every
        if periodic or not (rel > tol).any():
            # Residual replacement: periodically, and to confirm convergence.
            R = B - A(X)
            n_matvec += 1
            last_true = it
            rel = _colnorm(R) / safe_bnorm
            rel[bnorm == 0] = 0.0
            phi = _energy(X, B, R)
            diverging = np.any(rel > 100 * np.maximum(best_rel, tol))
            if np.all(phi <= best_phi + 1e-12 * np.abs(best_phi)) and not diverging:
                best_phi, best_X = phi, X.copy()
                best_rel = np.minimum(best_rel, rel)
                checks_without_progress = 0
            elif (rel > tol).any():
                checks_without_progress += 1
                if checks_without_progress >= stagnation_checks:
                    # Round-off in the operator bounds the attainable accuracy;
                    # going on would only amplify it. Keep the best iterate.
                    X, stagnated = best_X, True
        if stagnated:
            R = B - A(X)
            n_matvec += 1
            rel = _colnorm(R) / safe_bnorm
            rel[bnorm == 0] = 0.0
            history.append(rel.copy())
            break
        history.append(rel.copy())
        if callback is not None:
            callback(it, rel.copy())
        active = (rel > tol) & ok
        if not active.any():
            break
        Zr = Mprec(R)
        rz_new = np.einsum("ij,ij->j", R, Zr)
        beta = np.zeros(t)
        beta[active] = rz_new[active] / np.where(rz[active] != 0, rz[active], 1.0)
        P = Zr + P * beta
        rz = rz_new
    converged = bool((history[-1] <= tol).all())
    x_out = X[:, 0] if vector else X
    return CGResult(
        x=x_out,
        n_iter=it,
        n_matvec=n_matvec,
        residuals=np.array(history),
        converged=converged,
        stagnated=stagnated,
    )
