"""Conjugate gradient, FALKON preconditioner and the direct solves on in-memory problems."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from daskkrr.kernels import GaussianKernel
from daskkrr.solvers import (
    FalkonPreconditioner,
    JitterWarning,
    cholesky_jitter,
    conjugate_gradient,
    exact_krr_coefficients,
    falkon_solve,
    nystrom_lstsq_coefficients,
)


def _spd(m: int, cond: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(m, m)))
    return (Q * np.geomspace(1, cond, m)) @ Q.T


def test_cg_solves_several_rhs_and_records_history():
    A = _spd(60, 1e3)
    B = np.random.default_rng(1).normal(size=(60, 3))
    res = conjugate_gradient(lambda P: A @ P, B, tol=1e-10, max_iter=500)
    assert res.converged and res.x.shape == (60, 3)
    np.testing.assert_allclose(A @ res.x, B, atol=1e-8 * np.linalg.norm(B))
    assert res.residuals.shape == (res.n_iter + 1, 3)
    assert res.residuals[0].tolist() == [1.0, 1.0, 1.0]
    assert (res.residuals[-1] <= 1e-10).all()


def test_cg_preconditioner_speeds_up():
    A = _spd(80, 1e5)
    b = np.ones(80)
    plain = conjugate_gradient(lambda p: A @ p, b, tol=1e-8, max_iter=1000)
    Ainv = np.linalg.inv(A + 1e-3 * np.eye(80))  # a good but inexact preconditioner
    prec = conjugate_gradient(lambda p: A @ p, b, preconditioner=lambda r: Ainv @ r, tol=1e-8, max_iter=1000)
    assert prec.converged and plain.converged
    assert prec.n_iter < plain.n_iter / 3


def test_cg_stops_on_max_iter_and_reports_not_converged():
    A = _spd(50, 1e6)
    res = conjugate_gradient(lambda p: A @ p, np.ones(50), tol=1e-14, max_iter=3)
    assert res.n_iter == 3 and not res.converged and res.x.shape == (50,)


def test_cg_zero_rhs_and_bad_args():
    res = conjugate_gradient(lambda p: p, np.zeros(4), tol=1e-8)
    assert res.converged and res.n_iter == 0 and not res.x.any()
    with pytest.raises(ValueError, match="tol must be > 0"):
        conjugate_gradient(lambda p: p, np.ones(3), tol=0)


def test_cg_true_residual_is_recomputed():
    A = _spd(40, 1e2)
    calls = []

    def mv(P):
        calls.append(1)
        return A @ P

    res = conjugate_gradient(mv, np.ones(40), tol=1e-12, max_iter=30, true_residual_every=5)
    # search-direction products + periodic true residuals + the confirmation
    assert res.n_matvec == len(calls) > res.n_iter


def test_cg_that_diverges_returns_its_best_iterate_not_the_last():
    """Round-off can make a nearly singular system look indefinite; CG then diverges
    between true-residual checks. The solve must not return an iterate that fits worse
    than one it passed (seen on 197_cpu_act at sigma = 9 sqrt(d), penalty 1e-8: test R^2
    of -18 before, 0.977 after)."""
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((60, 60)))
    eig = np.geomspace(1e-3, 1, 60)
    eig[0] = -2e-3  # one direction pushed below zero
    A = (Q * eig) @ Q.T
    b = rng.standard_normal((60, 2))
    res = conjugate_gradient(lambda P: A @ P, b, tol=1e-10, max_iter=200, true_residual_every=50)
    true = np.linalg.norm(b - A @ res.x, axis=0) / np.linalg.norm(b, axis=0)
    reached = res.residuals[:-1].min(axis=0)  # the lowest residual before the final comparison
    assert res.stagnated and not res.converged
    assert np.all(true <= reached * (1 + 1e-8))
    np.testing.assert_allclose(res.residuals[-1], true, rtol=1e-8)


def test_cholesky_jitter_escalates_with_warning_and_fails_when_singular():
    v = np.ones((5, 1))
    S = v @ v.T - 1e-10 * np.eye(5)  # rank one, slightly indefinite (as round-off makes it)
    with pytest.warns(JitterWarning, match="needed jitter"):
        T, jitter = cholesky_jitter(S)
    assert jitter > 0 and np.allclose(T.T @ T, S + jitter * np.eye(5))
    with pytest.raises(np.linalg.LinAlgError, match="singular"):
        cholesky_jitter(S, max_jitter_ratio=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="NaN"):
        cholesky_jitter(np.full((2, 2), np.nan))


def _problem(n=3000, M=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 4 + 0.05 * rng.normal(size=n)
    k = GaussianKernel(sigma=2.0)
    Z = X[rng.choice(n, M, replace=False)]
    return k(X, Z), k(Z, Z), y


def test_falkon_converges_to_dense_nystrom_solution():
    Knm, Kmm, y = _problem()
    lam, n = 1e-4, Knm.shape[0]
    P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=lam, n=n)
    alpha, res = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-9, max_iter=100)
    reference = nystrom_lstsq_coefficients(Knm, Kmm, y, lam)
    direct = P.direct_solve(Knm.T @ Knm, Knm.T @ y)
    assert res.converged
    np.testing.assert_allclose(Knm @ alpha, Knm @ reference, rtol=1e-6, atol=1e-6)
    assert np.linalg.norm(alpha - direct) <= 1e-5 * np.linalg.norm(direct)


def test_preconditioned_operator_is_well_conditioned():
    Knm, Kmm, y = _problem(M=300)
    n = Knm.shape[0]
    P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-3, n=n)
    op = P.operator(lambda u: Knm.T @ (Knm @ u))
    H = np.column_stack([op(e) for e in np.eye(300)])
    np.testing.assert_allclose(H, H.T, atol=1e-8)
    ev = np.linalg.eigvalsh((H + H.T) / 2)
    # Unpreconditioned, K_nM^T K_nM + lambda n K_MM has condition number ~1e10 here.
    assert ev.min() > 0 and ev.max() / ev.min() < 100


def test_preconditioner_factors_kmm_in_place_only_when_given_up():
    Knm, Kmm, y = _problem(M=200)
    kept = Kmm.copy()
    P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-3, n=Knm.shape[0])
    assert np.array_equal(Kmm, kept)  # the default leaves K_MM alone
    Q = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-3, n=Knm.shape[0], overwrite_kmm=True)
    assert np.shares_memory(Q.T, Kmm)  # factored in K_MM's own memory, no M x M copy
    np.testing.assert_allclose(Q.T, P.T, atol=1e-10)
    np.testing.assert_allclose(Q.A, P.A, atol=1e-10)
    # A from T T^T (LAPACK's triangular lauum) as from the dense product.
    inner = (P.T @ P.T.T) / 200 + 1e-3 * np.eye(200)
    np.testing.assert_allclose(P.A.T @ P.A, inner, atol=1e-10)


def test_weighted_preconditioner_solves_the_same_system():
    Knm, Kmm, y = _problem(M=100)
    n = Knm.shape[0]
    w = np.random.default_rng(3).uniform(0.3, 3.0, size=100)
    P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-3, n=n, weights=w)
    alpha, res = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-11, max_iter=200)
    reference = nystrom_lstsq_coefficients(Knm, Kmm, y, 1e-3)
    np.testing.assert_allclose(Knm @ alpha, Knm @ reference, rtol=1e-6, atol=1e-6)


def test_exact_krr_matches_sklearn():
    from sklearn.kernel_ridge import KernelRidge

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = np.cos(X[:, 0])
    K = GaussianKernel(sigma=1.5)(X, X)
    c = exact_krr_coefficients(K, y, 1e-3)
    kr = KernelRidge(alpha=1e-3 * 200, kernel="rbf", gamma=1 / (2 * 1.5**2)).fit(X, y)
    np.testing.assert_allclose(c, kr.dual_coef_, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="y has 3 rows but K has 200"):
        exact_krr_coefficients(K, y[:3], 1e-3)


def test_no_warning_for_well_posed_preconditioner():
    Knm, Kmm, y = _problem(M=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitterWarning)
        FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-3, n=Knm.shape[0])


def _discrete_problem(n: int = 3000, m: int = 300, seed: int = 0):
    """Features of three values each: the centers repeat, K_MM is singular."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 3, size=(n, 6)).astype(np.float64)
    y = X.sum(axis=1) + np.sin(3 * X[:, 0]) + 0.3 * rng.standard_normal(n)
    k = GaussianKernel(sigma=2.0)
    Z = X[rng.choice(n, m, replace=False)]
    return X, y, Z, k(X, Z), k(Z, Z)


def discrete_nystrom_solution(weighted: bool, lam: float):
    """``_discrete_problem``, center weights (or None) and the Nystrom KRR solution by a dense solve."""
    X, y, Z, Knm, Kmm = _discrete_problem()
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(Z)) if weighted else None
    D = np.ones(len(Z)) if w is None else np.sqrt(w)
    # in the scaled variable (K_MM is singular: lstsq)
    Kd = Knm * D
    exact = D * np.linalg.lstsq(Kd.T @ Kd + lam * len(X) * (D[:, None] * Kmm * D), Kd.T @ y, rcond=None)[0]
    return X, y, Z, Knm, Kmm, w, exact


@pytest.mark.filterwarnings("ignore::daskkrr.utils.linalg.JitterWarning")  # the repeated centers
@pytest.mark.parametrize("weighted", [False, True])
def test_a_larger_jitter_keeps_the_solution_by_keeping_its_part_of_the_penalty(weighted):
    X, y, Z, Knm, Kmm, w, exact = discrete_nystrom_solution(weighted, lam := 1e-3)
    n = len(X)
    D = np.ones(len(Z)) if w is None else np.sqrt(w)
    for relative in (None, 1e-4):
        P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=lam, n=n, weights=w, relative_jitter=relative)
        assert P.exact_penalty == (relative is not None)
        assert P.jitter >= (0 if relative is None else relative * len(Z) * np.mean(D**2 * np.diag(Kmm)))
        alpha, _ = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-10, max_iter=500)
        direct = P.direct_solve(Knm.T @ Knm, Knm.T @ y)
        for coef in (alpha, direct):
            np.testing.assert_allclose(Knm @ coef, Knm @ exact, rtol=0, atol=1e-5 * np.abs(Knm @ exact).max())
    # Dropping the jitter's part (FALKON's penalty) solves another, more regularised problem
    P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=lam, n=n, weights=w, relative_jitter=1e-4)
    P.exact_penalty = False
    other, _ = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-10, max_iter=500)
    assert np.abs(Knm @ other - Knm @ exact).max() > 1e-3 * np.abs(Knm @ exact).max()


def test_float32_fit_with_repeated_centers_converges_like_float64():
    """float32 products with the round-off jitter's T^{-1} lost every digit: CG's residual rose."""
    from daskkrr import FalkonRegressor

    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(20000, 8)).astype(np.float64)
    y = X @ rng.standard_normal(8) + np.sin(2 * X[:, 0]) + 0.3 * rng.standard_normal(len(X))
    common = dict(n_centers=1500, sigma=2.0, penalty=1e-6, max_iter=6, tol=1e-14, standardize=False,
                  fit_intercept=False, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed budget
        f32 = FalkonRegressor(dtype="float32", **common).fit(X, y)
        f64 = FalkonRegressor(dtype="float64", **common).fit(X, y)
    assert np.all(np.diff(f32.residuals_[:, 0]) < 0), f32.residuals_[:, 0]
    rmse32 = np.sqrt(np.mean((f32.predict(X) - y) ** 2))
    rmse64 = np.sqrt(np.mean((f64.predict(X) - y) ** 2))
    assert rmse32 <= 1.01 * rmse64
