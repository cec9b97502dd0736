"""A float32 fit's preconditioner factored in float32: the factors only precondition, the solution stays.

See :mod:`daskkrr.solvers.falkon` (``factor_precision``) and :mod:`daskkrr.utils.mixed_solve`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg as sla

from daskkrr.kernels import GaussianKernel
from daskkrr.solvers import FalkonPreconditioner, cholesky_jitter, falkon_solve
from daskkrr.solvers import falkon as falkon_module
from daskkrr.solvers.falkon import FLOAT32_FACTOR_MIN_CENTERS, FLOAT32_RELATIVE_JITTER, factor_precision
from daskkrr.utils import mixed_solve
from daskkrr.utils.linalg import MIXED_SOLVE_MAX_COLUMNS, solve_upper

from .test_solvers import _discrete_problem, discrete_nystrom_solution


def _upper32(m: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, 8))
    S = A @ A.T / 8 + 1e-2 * np.eye(m)  # ill-conditioned (cond ~ 1e3), as FALKON's T is
    return np.asfortranarray(sla.cholesky(S, lower=False), dtype=np.float32)


@pytest.mark.parametrize("columns", [None, 1, 3, MIXED_SOLVE_MAX_COLUMNS + 1])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("numba", [True, False])
def test_mixed_solves_are_float64_solves_with_the_float32_factor(columns, trans, numba, monkeypatch):
    if not numba:
        monkeypatch.setattr(mixed_solve, "numba_installed", lambda: False)
    T = _upper32(300)
    rng = np.random.default_rng(1)
    B = rng.standard_normal(300) if columns is None else rng.standard_normal((300, columns))
    expected = sla.solve_triangular(T.astype(np.float64), B, lower=False, trans="T" if trans else "N")
    x = solve_upper(T, B, trans=trans)
    assert x.dtype == np.float64 and x.shape == B.shape
    # float64 round-off (times the condition number), far below float32's 6e-8
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-11 * np.abs(expected).max())
    assert B.base is None or not np.shares_memory(x, B)


def test_cholesky_keeps_float32_and_can_refuse_to_escalate():
    S = np.asfortranarray(np.eye(4, dtype=np.float32) + 0.5)
    T, jitter = cholesky_jitter(S, what="S")
    assert T.dtype == np.float32 and jitter == pytest.approx(4 * np.finfo(np.float32).eps * 1.5)
    np.testing.assert_allclose(T.T @ T, S + jitter * np.eye(4), rtol=1e-6)
    singular = np.asfortranarray(np.ones((4, 4)))  # rank one: needs more than round-off
    kept = singular.copy()
    with pytest.raises(np.linalg.LinAlgError):
        cholesky_jitter(singular, what="S", initial_jitter=0.0, overwrite=True, escalate=False)
    np.testing.assert_array_equal(singular, kept)  # factored in place, then restored


def test_the_rule_picks_float32_factors_for_float32_fits_with_many_centers():
    assert factor_precision(np.float32, FLOAT32_FACTOR_MIN_CENTERS) == "float32"
    assert factor_precision(np.float32, FLOAT32_FACTOR_MIN_CENTERS - 1) == "float64"
    assert factor_precision(np.float64, 10 * FLOAT32_FACTOR_MIN_CENTERS) == "float64"


@pytest.mark.filterwarnings("ignore::daskkrr.utils.linalg.JitterWarning")  # the repeated centers
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("sketched", [False, True])
def test_float32_factors_converge_to_the_nystrom_solution(weighted, sketched):
    _converge_to_the_nystrom_solution(weighted, sketched, center=False)


@pytest.mark.filterwarnings("ignore::daskkrr.utils.linalg.JitterWarning")
@pytest.mark.parametrize("sketched", [False, True])
def test_float32_factors_of_a_centred_preconditioner_converge_too(sketched):
    """An intercept centres FALKON's rows (``center_sketch``): in float32 too without a sketch."""
    _converge_to_the_nystrom_solution(False, sketched, center=True)


def _converge_to_the_nystrom_solution(weighted: bool, sketched: bool, center: bool) -> None:
    X, y, Z, Knm, Kmm, w, exact = discrete_nystrom_solution(weighted, lam := 1e-3)
    n = len(X)
    sketch = [Knm[:400], Knm[400:900]] if sketched else None
    P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=lam, n=n, weights=w, sketch=sketch, center_sketch=center,
                                                relative_jitter=FLOAT32_RELATIVE_JITTER, factor_precision="float32")
    assert P.factor_precision == "float32" and P.T.dtype == np.float32
    assert P.A.dtype == (np.float64 if sketched else np.float32)  # a sketch's Gram sums in float64
    assert P.kmm is not None and P.kmm.dtype == np.float64
    alpha, result = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-10, max_iter=500)
    assert result.converged
    direct = P.direct_solve(Knm.T @ Knm, Knm.T @ y)
    for coef in (alpha, direct):
        np.testing.assert_allclose(Knm @ coef, Knm @ exact, rtol=0, atol=1e-6 * np.abs(Knm @ exact).max())
    # Without the kept K_MM (the jitter formula, which assumes T^T T = K_MM + jitter exactly) the
    # float32 round-off of T would change the problem: that is what the exact penalty term is for
    P.kmm = None
    other, _ = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-10, max_iter=500)
    assert np.abs(Knm @ other - Knm @ exact).max() > 10 * np.abs(Knm @ alpha - Knm @ exact).max()


def test_float32_factors_precondition_as_well_as_float64_ones():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4000, 5))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(len(X))
    k = GaussianKernel(sigma=2.0)
    Z = X[:500]
    Knm, Kmm = k(X, Z), k(Z, Z)
    iterations = {}
    for precision in ("float64", "float32"):
        P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-6, n=len(X), factor_precision=precision,
                                                    relative_jitter=FLOAT32_RELATIVE_JITTER)
        _, result = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-6, max_iter=200)
        iterations[precision] = result.n_iter
    assert iterations["float32"] <= iterations["float64"] + 2, iterations


def test_an_indefinite_float32_inner_matrix_is_factored_in_float64(monkeypatch):
    X, y, Z, Knm, Kmm = _discrete_problem(n=1000, m=100)
    calls = []
    real = falkon_module.cholesky_jitter

    def float32_inner_fails(S, **kwargs):
        calls.append((S.dtype, kwargs.get("what")))
        if S.dtype == np.float32 and "inner" in kwargs.get("what", ""):
            raise np.linalg.LinAlgError("not positive definite in float32")
        return real(S, **kwargs)

    monkeypatch.setattr(falkon_module, "cholesky_jitter", float32_inner_fails)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=1e-3, n=len(X), factor_precision="float32",
                                                    relative_jitter=FLOAT32_RELATIVE_JITTER)
    assert [dt for dt, what in calls if "inner" in what] == [np.float32, np.float64]
    assert P.T.dtype == np.float32 and P.A.dtype == np.float64
    alpha, result = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), Knm.T @ y, tol=1e-10, max_iter=500)
    direct = P.direct_solve(Knm.T @ Knm, Knm.T @ y)
    np.testing.assert_allclose(Knm @ alpha, Knm @ direct, rtol=0, atol=1e-6 * np.abs(Knm @ direct).max())


@pytest.mark.parametrize("repeated", [False, True])
def test_a_float32_fit_with_float32_factors_matches_float64_factors(repeated, monkeypatch):
    """The fit-level choice (recorded as ``preconditioner_dtype_``) changes CG's path, not the model."""
    from daskkrr import FalkonRegressor

    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(6000, 8)).astype(np.float64) if repeated else rng.standard_normal((6000, 8))
    y = np.sin(X[:, :2].sum(axis=1)) + 0.1 * rng.standard_normal(len(X))
    common = dict(n_centers=600, sigma=2.0, penalty=1e-6, dtype="float32", standardize=False, fit_intercept=False,
                  random_state=0, preconditioner_rows=None)
    models = {}
    for minimum in (10**9, 600):  # float64 factors, then float32 ones
        monkeypatch.setattr(falkon_module, "FLOAT32_FACTOR_MIN_CENTERS", minimum)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # repeated centers: jitter
            models[minimum] = FalkonRegressor(**common, max_iter=300, tol=1e-5).fit(X, y)
    f64, f32 = models[10**9], models[600]
    assert f64.preconditioner_dtype_ == "float64" and f32.preconditioner_dtype_ == "float32"
    assert f32.converged_ and f64.converged_
    expected = f64.predict(X)
    np.testing.assert_allclose(f32.predict(X), expected, rtol=0, atol=1e-4 * np.abs(expected).max())
    assert abs(f32.n_iter_ - f64.n_iter_) <= 2
    # and a short budget on the repeated centers still makes steady progress (float32 products)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        short = FalkonRegressor(**common, max_iter=6, tol=1e-14).fit(X, y)
    assert np.all(np.diff(short.residuals_[:, 0]) < 0), short.residuals_[:, 0]


def test_the_predictive_std_of_a_float32_fit_does_not_depend_on_the_factors(monkeypatch):
    """The posterior takes ``T`` as a factor of ``K_MM``: float32's round-off stays below the jitter's effect."""
    from daskkrr import FalkonRegressor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(len(X))
    Xt = rng.standard_normal((200, 4))
    stds = {}
    for minimum in (10**9, 300):
        monkeypatch.setattr(falkon_module, "FLOAT32_FACTOR_MIN_CENTERS", minimum)
        model = FalkonRegressor(n_centers=300, sigma=1.5, penalty=1e-4, dtype="float32", compute_std=True,
                                max_iter=100, tol=1e-5, random_state=0).fit(X, y)
        stds[minimum] = model.predict(Xt, return_std=True)[1]
    assert model.preconditioner_dtype_ == "float32"
    np.testing.assert_allclose(stds[300], stds[10**9], rtol=1e-3)
