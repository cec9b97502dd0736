"""FALKON's CG (numpy, with guards) and exact KRR's PCG (any vectors, no guards) are one recurrence."""

from __future__ import annotations

import numpy as np
import pytest

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


@pytest.mark.parametrize("saved_before_stopped", [False, True])
def test_a_column_frozen_on_a_drifted_residual_is_taken_up_again(saved_before_stopped):
    """A column stops iterating when its recursive residual reaches tol, but round-off makes
    that residual drift from the true one (Fashion-MNIST, float32 blocks: a column frozen at a
    true 1.02e-3 against tol 1e-3 ended the solve after 10 of 100 iterations, unconverged, with a
    warning that blamed max_iter). The true-residual check must take such a column up again.
    Here column 0 is frozen with a recursive residual of 0 three iterations in, far from its
    solution; the solve still ends with both true residuals within tol (also from a state saved
    before ``stopped`` was kept)."""
    A, D, B = _system(2)
    kw = dict(preconditioner=lambda R: D[:, None] * R, tol=1e-8, max_iter=500)
    saved: list[CGState] = []
    conjugate_gradient(lambda P: A @ P, B, **{**kw, "max_iter": 3}, on_state=saved.append, state_every=3)
    arrays = saved[0].to_arrays()
    arrays["r"][:, 0] = 0.0
    arrays["active"][0] = False
    arrays["history"][-1, 0] = 0.0
    if saved_before_stopped:
        del arrays["stopped"]
    res = conjugate_gradient(lambda P: A @ P, B, **kw, state=CGState.from_arrays(arrays))
    true = np.linalg.norm(B - A @ res.x, axis=0) / np.linalg.norm(B, axis=0)
    assert res.converged and not res.stagnated
    assert np.all(true <= 1e-8 * (1 + 1e-4))


def test_a_column_where_the_operator_looks_indefinite_stays_stopped():
    """p^T A p <= 0 stops a column for good; true-residual checks do not take it up again (it
    would only stop again), and the other column still converges."""
    rng = np.random.default_rng(4)
    Q, _ = np.linalg.qr(rng.normal(size=(40, 40)))
    eig = np.geomspace(1e-2, 1, 40)
    eig[0] = -1e-2
    A = (Q * eig) @ Q.T
    B = np.stack([Q[:, 1:] @ rng.normal(size=39), Q[:, 0]], axis=1)  # column 1: the negative direction
    res = conjugate_gradient(lambda P: A @ P, B, tol=1e-10, max_iter=300, true_residual_every=5)
    assert not res.converged and res.n_iter < 300
    assert res.residuals[-1, 0] <= 1e-10 and res.residuals[-1, 1] > 0.5


def _one_noisy_column(seed: int = 5):
    """A 2-column system whose column 1 sees round-off-like noise in the operator (its attainable
    accuracy is about 3e-4) while column 0 is exact."""
    rng = np.random.default_rng(seed)
    m = 60
    Q, _ = np.linalg.qr(rng.normal(size=(m, m)))
    A = (Q * np.logspace(0, 3, m)) @ Q.T
    A = (A + A.T) / 2

    def matvec(P):
        out = A @ P
        out[:, 1] += 1e-6 * np.linalg.norm(P[:, 1]) * np.sin(1e4 * P[:, 1])  # not linear in P
        return out

    return A, matvec, rng.normal(size=(m, 2))


def test_a_column_that_stagnates_does_not_hold_the_others_back():
    """The stagnation guard stops a column at its best iterate when round-off bounds its accuracy;
    the other columns go on to tol (one-vs-all classes, several targets). Stopping them all at the
    last check where every column improved left column 0 here at 1.2e-5 instead of 1e-10."""
    A, matvec, B = _one_noisy_column()
    res = conjugate_gradient(matvec, B, tol=1e-10, max_iter=400, true_residual_every=10)
    true = np.linalg.norm(B - A @ res.x, axis=0) / np.linalg.norm(B, axis=0)
    assert res.stagnated and not res.converged
    assert true[0] <= 1e-10 * (1 + 1e-3)  # as alone: the exact operator's column reaches tol
    assert res.residuals[-1, 1] > 1e-5  # the noisy one stopped at its floor...
    assert res.residuals[-1, 1] <= res.residuals[:, 1].min() * 100  # ...near the best it reached


@pytest.mark.parametrize("saved_before_per_column", [False, True])
def test_a_solve_resumed_after_a_column_stagnated_ends_as_the_uninterrupted_one(saved_before_per_column):
    """Exact resume through the per-column guard: a state saved after column 1 stopped (and one
    saved before it, with the old one-count-for-all fields) continues to the same iterate."""
    A, matvec, B = _one_noisy_column()
    kw = dict(tol=1e-10, max_iter=400, true_residual_every=10)
    whole = conjugate_gradient(matvec, B, **kw)
    saved: list[CGState] = []
    conjugate_gradient(matvec, B, **kw, on_state=saved.append, state_every=5)
    after = [s for s in saved if s.stagnated_columns is not None and s.stagnated_columns[1] and s.active[0]]
    before = [s for s in saved if not s.stagnated and s.iteration >= 20]
    state = (before if saved_before_per_column else after)[0]
    arrays = state.to_arrays()
    if saved_before_per_column:
        del arrays["stagnated_columns"]
        arrays["checks_without_progress"] = np.array(int(arrays["checks_without_progress"].max()))
    resumed = conjugate_gradient(matvec, B, **kw, state=CGState.from_arrays(arrays))
    assert resumed.n_iter == whole.n_iter and resumed.stagnated == whole.stagnated
    np.testing.assert_array_equal(resumed.x, whole.x)
    np.testing.assert_array_equal(resumed.residuals, whole.residuals)
