"""Preconditioned conjugate gradient for several right-hand sides at once.

The matrix is never needed: the caller passes a ``matvec`` (for FALKON, one
distributed pass over the data) and optionally a ``preconditioner`` (any
approximation of the inverse). Each column of the right-hand side runs its own
CG recurrence; columns that have converged stop moving, and the solve stops when
every column has, or after ``max_iter`` iterations.

The recursive residual drifts from the true one in finite precision, so the true
residual ``b - A x`` is recomputed every ``true_residual_every`` iterations and
before declaring convergence ("residual replacement").

Long solves can be interrupted and continued exactly: ``on_state`` receives a
:class:`CGState` (everything the recurrence needs, as arrays and scalars) every
``state_every`` iterations and at the end, and ``state=`` continues from one.
With a deterministic ``matvec`` the continued solve is bit-for-bit the solve
that was never interrupted.
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
        (the attainable accuracy of the operator was reached), or stopped more than
        :data:`DIVERGED_FACTOR` times above the lowest residual it had reached (CG
        diverged on a nearly singular system); ``x`` is then the iterate with the
        smallest true residual among those compared.
    """

    x: np.ndarray
    n_iter: int
    n_matvec: int
    residuals: np.ndarray
    converged: bool
    stagnated: bool = False


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
        Columns that have not converged.
    history : ndarray (iteration + 1, t)
        Relative residuals so far.
    best_x, best_phi, best_rel
        Best iterate by CG energy, its energy and the best relative residuals
        (the stagnation guard).
    low_x, low_rel : ndarray (m, t) and (t,), or None
        Per column, the iterate with the lowest residual so far and that residual
        (the divergence guard; None in states saved before it existed).
    iteration, n_matvec, last_true, checks_without_progress : int
        Iterations done, matvecs done, iteration of the last true-residual
        recomputation, consecutive checks without progress.
    stagnated : bool
        The solve stopped on stagnation (it will not continue).
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
    checks_without_progress: int = 0
    stagnated: bool = False
    low_x: np.ndarray | None = None
    low_rel: np.ndarray | None = None

    _ARRAYS = ("b", "x", "r", "p", "rz", "active", "history", "best_x", "best_phi", "best_rel")
    _SCALARS = ("iteration", "n_matvec", "last_true", "checks_without_progress", "stagnated")
    _OPTIONAL = ("low_x", "low_rel")

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
            checks_without_progress=int(arrays["checks_without_progress"]),
            stagnated=bool(arrays["stagnated"]),
            **{k: np.asarray(arrays[k], dtype=np.float64) for k in cls._OPTIONAL if k in arrays},
        )
        for k in ("x", "r", "p", "best_x", "low_x"):
            if getattr(state, k) is not None and getattr(state, k).shape != (m, t):
                raise ValueError(f"CG state: {k} has shape {getattr(state, k).shape}, expected {(m, t)}")
        for k in ("rz", "best_phi", "best_rel", "active", "low_rel"):
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
        Stop, returning the best iterate, when this many consecutive true-residual
        checks find the CG energy ``x^T A x / 2 - b^T x`` higher than its best (in
        exact arithmetic it only falls) or the residual 100 times above its best:
        round-off in the operator has taken over.
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

    Raises
    ------
    ValueError
        For ``tol <= 0``, ``max_iter < 0``, ``state_every < 1``, or a ``state``
        that belongs to another right-hand side.
    """
    if tol <= 0:
        raise ValueError(f"tol must be > 0; got {tol!r}")
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0; got {max_iter!r}")
    if on_state is not None and int(state_every) < 1:
        raise ValueError(f"state_every must be >= 1; got {state_every!r}")
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
    if state is None:
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
    else:
        _check_state(state, B)
        X, R, P = state.x.copy(), state.r.copy(), state.p.copy()
        rz, active = state.rz.copy(), state.active.copy()
        history = [row.copy() for row in state.history]
        best_X, best_phi, best_rel = state.best_x.copy(), state.best_phi.copy(), state.best_rel.copy()
        it, n_matvec, last_true = state.iteration, state.n_matvec, state.last_true
        checks_without_progress, stagnated = state.checks_without_progress, state.stagnated

    # The divergence guard: per column, the iterate with the lowest residual so far
    # (from the state; a state saved before the guard existed starts it here).
    if state is not None and state.low_x is not None and state.low_rel is not None:
        low_X, low_rel = state.low_x.copy(), state.low_rel.copy()
    else:
        low_X, low_rel = X.copy(), history[-1].copy()

    def snapshot() -> CGState:
        return CGState(
            b=B.copy(), x=X.copy(), r=R.copy(), p=P.copy(), rz=rz.copy(), active=active.copy(),
            history=np.array(history), best_x=best_X.copy(), best_phi=np.array(best_phi, dtype=np.float64),
            best_rel=best_rel.copy(), iteration=it, n_matvec=n_matvec, last_true=last_true,
            checks_without_progress=checks_without_progress, stagnated=stagnated,
            low_x=low_X.copy(), low_rel=low_rel.copy(),
        )

    while it < max_iter and active.any() and not stagnated:
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
            active = np.zeros(t, dtype=bool)
            break
        history.append(rel.copy())
        lower = rel < low_rel
        if lower.any():
            low_X[:, lower], low_rel[lower] = X[:, lower], rel[lower]
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
        if on_state is not None and it % int(state_every) == 0 and it < max_iter:
            on_state(snapshot())
    if not stagnated and np.any(history[-1] > DIVERGED_FACTOR * np.maximum(low_rel, tol)):
        # Stopped (budget spent, or p^T A p <= 0: round-off made the operator look
        # indefinite) well above the lowest residual seen, i.e. CG diverged on a
        # nearly singular system: return the better of the two iterates per column
        # (by true residual) rather than one that fits worse than an earlier one.
        R = B - A(X)
        R_low = B - A(low_X)
        n_matvec += 2
        rel, rel_low = _colnorm(R) / safe_bnorm, _colnorm(R_low) / safe_bnorm
        rel[bnorm == 0] = rel_low[bnorm == 0] = 0.0
        better = rel_low < rel
        if better.any():
            X[:, better] = low_X[:, better]
            rel[better] = rel_low[better]
            stagnated = True
        history[-1] = rel.copy()  # the residual of the iterate returned
    if on_state is not None:
        on_state(snapshot())
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
