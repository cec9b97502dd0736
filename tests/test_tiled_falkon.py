"""The tiled FALKON preconditioner (daskkrr.parallel.tiled_falkon) and its route (factor_cost).

The tiled route must give the dense route's solution. Both solve the Nystrom system
``E alpha = b`` (``E = K_nM^T W K_nM / n + lambda K_MM``) by CG on ``op beta = r`` with
``op = P^T E P``; a relative residual ``rho`` bounds the error in ``E``'s norm:
``||alpha - alpha*||_E / ||alpha*||_E <= rho sqrt(cond(op))`` (``||x||_E = ||beta||_op``,
``||r|| <= sqrt(lambda_max) ||beta*||_op``, ``||op^{-1} res||_op <= ||res|| / sqrt(lambda_min)``).
So two solutions differ by at most ``(rho_1 + rho_2) sqrt(cond(op))`` relative to ``||alpha||_E``;
``cond(op)`` is measured on the dense preconditioner (the tiled one has the same factors up to
round-off), and ``rho`` is each CG's last residual.
"""

from __future__ import annotations

import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.kernels import GaussianKernel
from daskkrr.parallel import factor_cost
from daskkrr.parallel.cost import Budget
from daskkrr.parallel.executor import Executor
from daskkrr.parallel.factor_cost import dense_bytes, plan_factor
from daskkrr.parallel.tiled_falkon import TiledFalkonPreconditioner
from daskkrr.solvers import FalkonPreconditioner, falkon_solve
from daskkrr.solvers.falkon import jitter_floor

from .checkpoint_crash import SimulatedCrash, crash_after_cg_save

N, M, PENALTY = 2000, 300, 1e-4


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.05 * rng.normal(size=N)
    return X, y


def energy_gap(a1: np.ndarray, a2: np.ndarray, E: np.ndarray) -> float:
    d = a1 - a2
    return float(np.sqrt(d @ E @ d / (a1 @ E @ a1)))


def op_condition(pre: FalkonPreconditioner, H: np.ndarray) -> float:
    """cond(P^T E P) of the dense preconditioner, applied to the identity."""
    op = pre.operator(lambda U: H @ U)(np.eye(pre.n_centers))
    w = np.linalg.eigvalsh((op + op.T) / 2)
    return float(w[-1] / w[0])


@pytest.mark.parametrize(("dtype", "weighted", "center"), [
    ("float64", False, False), ("float64", True, True),
    pytest.param("float32", True, False, marks=pytest.mark.slow),  # 100 iterations of tile solves: ~20 s
])
def test_tiled_preconditioner_gives_the_dense_solution(problem, dtype, weighted, center):
    """Same CG, dense and tiled factors (tiles of 100), in float64 and with float32 factors
    (penalty term through recomputed kernel tiles), with center weights and the intercept's centring."""
    X, y = problem
    kernel = GaussianKernel(sigma=1.0)
    Z = X[:M]
    weights = np.random.default_rng(1).uniform(0.5, 2.0, M) if weighted else None
    Knm = kernel(X, Z)
    H, b = Knm.T @ Knm, Knm.T @ y
    jitter = jitter_floor(dtype, PENALTY)
    dense = FalkonPreconditioner.from_kernel_matrix(kernel(Z, Z), penalty=PENALTY, n=N, weights=weights,
                                                    relative_jitter=jitter, factor_precision=dtype,
                                                    center_sketch=center)
    tiled = TiledFalkonPreconditioner.from_centers(Executor(), Z, kernel, penalty=PENALTY, n=N, tile=100,
                                                   weights=weights, relative_jitter=jitter, factor_precision=dtype,
                                                   center_sketch=center)
    try:
        # the same policy on the same diagonal, whose mean the dense route takes in the factors' precision
        assert tiled.jitter == pytest.approx(dense.jitter, rel=M * np.finfo(dtype).eps)
        tol = 1e-7 if dtype == "float64" else 1e-5  # float32 factors: CG's products carry eps_32 round-off
        a1, r1 = falkon_solve(dense, lambda u: H @ u, b, tol=tol, max_iter=100)
        a2, r2 = falkon_solve(tiled, lambda u: H @ u, b, tol=tol, max_iter=100)
    finally:
        tiled.close()
    E = H / N + PENALTY * kernel(Z, Z)
    rho = float(r1.residuals[-1].max() + r2.residuals[-1].max())
    assert energy_gap(a1, a2, E) <= rho * np.sqrt(op_condition(dense, H))


# ---------------------------------------------------------------- the route
def test_plan_keeps_dense_where_the_client_holds_it():
    """No regression: M <= 10 000 on a machine with 8 GiB free keeps the dense route (2.4 GB)."""
    budget = Budget(cores=2, memory_bytes=8 * 2**30)
    for m in (1000, 5000, 10_000):
        plan = plan_factor(m, 4, budget, client_memory=8 * 2**30)
        assert plan.route == "dense" and plan.storage == "client", plan.reason
    big = plan_factor(50_000, 4, budget, client_memory=8 * 2**30)
    assert big.route == "tiled" and big.storage == "zarr" and "more than 50%" in big.reason
    # float32 factors: T and A (4.85 GiB each) and the float64 kernel tiles (9.7 GiB) in memory; spilled, the kernel
    # tiles are recomputed, and the disk holds T, the inner matrix and A (3 x 4.85 GiB)
    assert "the tiles need 19.4 GiB" in big.reason and "14.5 GiB on disk" in big.reason
    assert dense_bytes(50_000) == 3 * 8 * 50_000**2
    within = plan_factor(5000, 4, Budget(cores=2, memory_bytes=2**30), client_memory=2**30, route="tiled")
    assert within.route == "tiled" and within.storage == "memory" and "asked for" in within.reason
    with pytest.raises(ValueError, match="preconditioner_route must be one of"):
        plan_factor(10, 8, budget, client_memory=2**30, route="blocked")


FIT = dict(n_centers=200, penalty=1e-4, tol=1e-7, max_iter=100, random_state=0, preconditioner_rows=None,
           fit_intercept=False, sigma=1.5)


def nystrom_energy(model, X: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, float]:
    """``E`` of the model's Nystrom system (standardised data, centers as fitted), ``H`` and ``n``."""
    Xs = model.scaler_.transform(X)
    K = model.kernel_(Xs, model.centers_)
    n = float(len(X) if w is None else np.sum(w))
    H = K.T @ (K if w is None else w[:, None] * K)
    return H / n + model.penalty * model.kernel_(model.centers_, model.centers_), H, n


def check_same_solution(dense, tiled, X, w=None) -> None:
    E, H, n = nystrom_energy(dense, X, w)
    # the same rows; their standardisation sums n rows in another order on a cluster (round-off <= n eps)
    np.testing.assert_allclose(tiled.centers_, dense.centers_, rtol=0,
                               atol=len(X) * np.finfo(float).eps * np.abs(dense.centers_).max())
    Kmm = dense.kernel_(dense.centers_, dense.centers_)
    weights = None if np.all(dense.center_weights_ == 1) else dense.center_weights_
    pre = FalkonPreconditioner.from_kernel_matrix(Kmm, penalty=dense.penalty, n=n, weights=weights,
                                                  relative_jitter=jitter_floor(dense.dtype, dense.penalty))
    rho = float(dense.residuals_[-1].max() + tiled.residuals_[-1].max())
    assert energy_gap(dense.coef_, tiled.coef_, E) <= rho * np.sqrt(op_condition(pre, H))


def test_tiny_memory_budget_takes_the_tiled_route(problem, monkeypatch):
    """memory_budget below the dense factors: auto takes the tiled route, spilled to Zarr, and the same
    solution (float64 data: float32 blocks stop CG near 1e-4 here, where the bound says little; float32
    factors are checked above, on the preconditioner)."""
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 70)
    X, y = problem
    dense = FalkonRegressor(**FIT).fit(X, y)
    tiled = FalkonRegressor(memory_budget=100_000, **FIT).fit(X, y)
    assert dense.preconditioner_route_["route"] == "dense"
    route = tiled.preconditioner_route_
    assert route["route"] == "tiled" and route["storage"] == "zarr" and route["tile"] == 70
    assert "more than 50% of its memory budget" in route["reason"]
    assert tiled.strategy_ != "gram" and tiled.preconditioner_rows_ == 0
    check_same_solution(dense, tiled, X)


def test_tiled_route_with_weights_and_leverage_score_centers(problem, monkeypatch):
    """Forced tiled route, tiles in memory: row weights and SQUEAK's weighted centers."""
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 70)
    X, y = problem
    w = np.random.default_rng(5).uniform(0.2, 3.0, N)
    fit = {**FIT, "sampler": "squeak", "penalty": 1e-3}
    dense = FalkonRegressor(**fit).fit(X, y, sample_weight=w)
    tiled = FalkonRegressor(preconditioner_route="tiled", **fit).fit(X, y, sample_weight=w)
    assert tiled.preconditioner_route_["storage"] == "memory"
    assert not np.all(dense.center_weights_ == 1)  # leverage-score centers carry importance weights
    check_same_solution(dense, tiled, X, w)


def test_tiled_route_resumes_to_the_uninterrupted_fit(problem, tmp_path, monkeypatch):
    """A tiled fit interrupted after a checkpoint and resumed rebuilds the same factors and ends where
    the uninterrupted fit does."""
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 70)
    X, y = problem
    fit = {**FIT, "max_iter": 30, "preconditioner_route": "tiled"}
    reference = FalkonRegressor(**fit).fit(X, y)

    with crash_after_cg_save(4), pytest.raises(SimulatedCrash):
        FalkonRegressor(**fit).fit(X, y, checkpoint=tmp_path / "ck", checkpoint_every=2)
    resumed = FalkonRegressor(**fit).fit(X, y, checkpoint=tmp_path / "ck", resume=True)
    assert resumed.n_iter_ == reference.n_iter_
    np.testing.assert_array_equal(resumed.coef_, reference.coef_)


def test_tiled_route_refuses_what_needs_the_client_matrices(problem):
    X, y = problem
    with pytest.raises(ValueError, match="strategy='gram' keeps M x M matrices on the client"):
        FalkonRegressor(preconditioner_route="tiled", strategy="gram", **FIT).fit(X, y)
    with pytest.raises(ValueError, match="std_method='fast' cannot be used on the tiled preconditioner route"):
        FalkonRegressor(preconditioner_route="tiled", compute_std=True, std_method="fast", **FIT).fit(X, y)



@pytest.mark.slow  # about 3 minutes on the busy 2-core machine (a CG iteration is a few tile graphs on 2 workers)
def test_tiled_route_on_a_local_cluster(problem, cluster2, monkeypatch):
    """The tiled factors as futures on two worker processes: the threaded dense fit's solution (releasing
    the inner matrix once cancelled the factor built from it, and the next pass lost its dependencies)."""
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 70)
    X, y = problem
    dense = FalkonRegressor(**FIT).fit(X, y)
    with cluster2.as_current():
        tiled = FalkonRegressor(preconditioner_route="tiled", **FIT).fit(X, y)
    assert tiled.preconditioner_route_["storage"] == "memory"
    check_same_solution(dense, tiled, X)


@pytest.mark.parametrize(("dtype", "spill"), [("float32", False), ("float64", False), ("float32", True)])
def test_tiled_operator_is_the_preconditioned_system(problem, dtype, spill):
    """One application of the tiled operator against the same algebra in numpy on the same tiles:
    ``A^{-T} (T^{-T} D H D t / n + lambda T^{-T} P t)`` with ``t = T^{-1} A^{-1} beta`` and ``P = D K_MM D``
    (float32 factors: the kept float64 kernel tiles; spilled to Zarr, the tiles recomputed in each product
    instead of written and read back) or ``P = T^T T - jitter I`` (float64 factors, applied as
    ``v - jitter T^{-T} t``).
    Both sides do the same float64 arithmetic in another order: four triangular solves, each off by at most
    ``M eps cond`` of its factor (Higham, Thm 8.5), relative to the result."""
    X, _ = problem
    kernel = GaussianKernel(sigma=1.0)
    Z = X[:M]
    w = np.random.default_rng(1).uniform(0.5, 2.0, M)
    pre = TiledFalkonPreconditioner.from_centers(Executor(), Z, kernel, penalty=PENALTY, n=N, tile=70, weights=w,
                                                 relative_jitter=jitter_floor("float32", PENALTY),
                                                 factor_precision=dtype, spill=spill)
    try:  # float32's jitter floor on both: the exact penalty term, and factors whose condition the bound can use
        assert (pre.kmm is not None) == (dtype == "float32" and not spill) and pre.exact_penalty
        assert (pre.kmm_source is not None) == (dtype == "float32" and spill)
        T = pre.T.to_numpy().astype(np.float64)
        A = pre.A.to_numpy().astype(np.float64)
        beta = np.random.default_rng(2).normal(size=(M, 2))
        Knm = kernel(X, Z)
        H = Knm.T @ Knm
        got = pre.operator(lambda u: H @ u)(beta)
    finally:
        pre.close()
    d = np.sqrt(w)[:, None]
    v = np.linalg.solve(A, beta)
    t = np.linalg.solve(T, v)
    data = d * (H @ (d * t)) / N
    if dtype == "float32":  # the dense route's T^{-T} D c / n + lambda T^{-T} (D K_MM D t), one solve for both
        inner = np.linalg.solve(T.T, data + PENALTY * (d * kernel(Z, Z) * d.T) @ t)
    else:  # its T^{-T} D c / n + lambda (v - jitter T^{-T} t): T^{-T} (T^T T - jitter I) T^{-1} v = v - ...
        inner = np.linalg.solve(T.T, data - PENALTY * pre.jitter * t) + PENALTY * v
    want = np.linalg.solve(A.T, inner)
    eps = np.finfo(np.float64).eps
    tol = 4 * M * eps * np.linalg.cond(T) * np.linalg.cond(A)
    assert tol < 1e-3  # the bound says something here
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
