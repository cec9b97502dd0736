"""FALKON's CG (numpy, with guards) and exact KRR's PCG (any vectors, no guards) are one recurrence."""

from __future__ import annotations

import numpy as np

from daskkrr.solvers.cg import CGState, NumpyOps, conjugate_gradient
from daskkrr.solvers.pcg import pcg


def _system(seed: int = 0, m: int = 60, t: int = 2):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(m, m)))
    A = (Q * np.logspace(0, 2, m)) @ Q.T  # SPD, condition 1e2
    A = (A + A.T) / 2
    D = 1.0 / np.diag(A)  # Jacobi preconditioner
    return A, D, rng.normal(size=(m, t))


def test_pcg_and_conjugate_gradient_take_the_same_steps():
    """Where the guards do not fire, the guarded numpy CG and the unguarded PCG do the same
    arithmetic in the same order: equal bit for bit, not only to a tolerance."""
    A, D, B = _system()
    kw = dict(preconditioner=lambda R: D[:, None] * R, tol=1e-9, max_iter=500, true_residual_every=10)
    guarded = conjugate_gradient(lambda P: A @ P, B, **kw)
    plain = pcg(lambda P: A @ P, B, NumpyOps(), **kw)
    assert guarded.converged and plain.converged and not guarded.stagnated
    assert guarded.n_iter == plain.n_iter and guarded.n_matvec == plain.n_matvec
    np.testing.assert_array_equal(guarded.x, plain.x)
    np.testing.assert_array_equal(guarded.residuals, plain.residuals)
    np.testing.assert_array_equal(guarded.alphas, plain.alphas)


def test_pcg_resumes_bitwise_from_a_saved_state():
    """A PCG stopped after any iteration and continued from its state (through the arrays a
    checkpoint stores) ends on the same iterate as the solve never stopped."""
    A, D, B = _system(1)
    kw = dict(preconditioner=lambda R: D[:, None] * R, tol=1e-9, max_iter=500)
    whole = pcg(lambda P: A @ P, B, NumpyOps(), **kw)
    saved: list[CGState] = []
    pcg(lambda P: A @ P, B, NumpyOps(), **{**kw, "max_iter": 7}, on_state=saved.append, state_every=3)
    assert [s.iteration for s in saved] == [3, 6, 7]
    state = CGState.from_arrays(saved[1].to_arrays())
    resumed = pcg(lambda P: A @ P, B, NumpyOps(), **kw, state=state)
    assert resumed.n_iter == whole.n_iter
    np.testing.assert_array_equal(resumed.x, whole.x)
    np.testing.assert_array_equal(resumed.residuals, whole.residuals)
