"""The preconditioner's cost: the float32 sketch Gram, the choice of the sketch size by
expected time to the tolerance, and what the fitted model records (issue 17, item 2)."""

from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from daskkrr import FalkonRegressor, NystromRegressor, load
from daskkrr.kernels import GaussianKernel
from daskkrr.parallel.cost import TYPICAL_CONVERGENCE_FACTOR, Budget, Problem
from daskkrr.parallel.preconditioner_cost import (
    choose_sketch_rows,
    convergence_factor,
    sketch_candidates,
    sketch_cost,
)
from daskkrr.solvers import FalkonPreconditioner, falkon_solve
from daskkrr.solvers import falkon as falkon_module
from daskkrr.solvers.falkon import sketch_gram
from daskkrr.solvers.sketch import KernelRowSketch, sketch_indices, sketch_precision
from daskkrr.utils.linalg import cholesky_jitter

BUDGET = Budget(cores=2, memory_bytes=16 * 2**30, n_workers=1)


def _rows_and_centers(n=3000, M=200, d=20, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    return X, X[rng.choice(n, M, replace=False)]


# --------------------------------------------------------------------------- float32 sketch Gram
@pytest.mark.parametrize("weighted", [False, True])
def test_float32_sketch_gram_equals_the_float64_one_to_float32_accuracy(weighted):
    X, Z = _rows_and_centers()
    kernel = GaussianKernel(sigma=np.sqrt(20))
    Z64 = Z.astype(np.float64)
    T, _ = cholesky_jitter(kernel(Z64, Z64))
    d = np.ones(len(Z))
    c = np.random.default_rng(1).uniform(0.5, 2.0, len(X)) if weighted else None
    grams = {}
    for precision in ("float64", "float32"):
        blocks = KernelRowSketch(kernel, X, Z, row_weights=c, dtype=precision)
        assert all((b[0] if weighted else b).dtype == np.dtype(precision) for b in blocks)
        grams[precision] = sketch_gram(T, d, blocks, center=True, precision=precision, penalty=1e-6)
    (g64, used64), (g32, used32) = grams["float64"], grams["float32"]
    assert (used64, used32) == ("float64", "float32")
    assert g32.dtype == np.float64
    np.testing.assert_array_equal(g32, g32.T)
    # float32 accuracy relative to the matrix (its entries are O(1/M)), far below the penalty
    assert np.linalg.norm(g32 - g64, 2) <= 1e-5 * np.linalg.norm(g64, 2)
    assert np.linalg.norm(g32 - g64, 2) <= 0.1 * 1e-6


def test_float32_sketch_falls_back_to_float64_where_its_solves_are_inaccurate():
    """A wide kernel makes K_MM (and T) so ill-conditioned that float32 solves would spoil A."""
    X, Z = _rows_and_centers(n=2000, M=400)
    kernel = GaussianKernel(sigma=3 * np.sqrt(20))
    Z64 = Z.astype(np.float64)
    K = kernel(Z64, Z64)
    blocks = list(KernelRowSketch(kernel, X, Z, dtype=np.float32))
    P32 = FalkonPreconditioner.from_kernel_matrix(K, penalty=1e-10, n=len(X), sketch=blocks, precision="float32")
    P64 = FalkonPreconditioner.from_kernel_matrix(K, penalty=1e-10, n=len(X), sketch=blocks, precision="float64")
    assert P32.precision == P64.precision == "float64"
    np.testing.assert_array_equal(P32.A, P64.A)
    # no sketch: nothing ran in float32
    assert FalkonPreconditioner.from_kernel_matrix(K, penalty=1e-6, n=10, precision="float32").precision == "float64"
    with pytest.raises(ValueError, match="precision"):
        sketch_gram(P64.T, P64.d, blocks, center=False, precision="float16")


@pytest.mark.parametrize("penalty", [1e-6, 1e-8])
def test_float32_preconditioner_converges_as_fast_to_the_same_solution(penalty):
    X, Z = _rows_and_centers(n=6000, M=300)
    kernel = GaussianKernel(sigma=np.sqrt(20))
    y = np.sin(X[:, :3].sum(axis=1)) + 0.1 * np.random.default_rng(2).standard_normal(len(X))
    Z64 = Z.astype(np.float64)
    Knm = kernel(X.astype(np.float64), Z64)
    rhs = Knm.T @ y
    idx = sketch_indices(len(X), 4 * len(Z), Z)
    out = {}
    for precision in ("float64", "float32"):
        P = FalkonPreconditioner.from_kernel_matrix(
            kernel(Z64, Z64), penalty=penalty, n=len(X), precision=precision,
            sketch=KernelRowSketch(kernel, X[idx], Z, dtype=precision))
        assert P.precision == precision
        out[precision] = falkon_solve(P, lambda u: Knm.T @ (Knm @ u), rhs, tol=1e-8, max_iter=300)
    (a64, r64), (a32, r32) = out["float64"], out["float32"]
    assert r64.converged and r32.converged
    assert abs(r32.n_iter - r64.n_iter) <= 1, (r32.n_iter, r64.n_iter)
    assert np.linalg.norm(a32 - a64) <= 1e-6 * np.linalg.norm(a64)


def test_sketch_precision_follows_the_fit_dtype():
    assert sketch_precision(np.float32) == "float32"
    assert sketch_precision("float64") == sketch_precision(np.dtype(np.float64)) == "float64"


# --------------------------------------------------------------------------- the cost model
def test_iterations_depend_on_the_sketch_and_are_capped():
    assert convergence_factor(0, 1000) == pytest.approx(TYPICAL_CONVERGENCE_FACTOR)
    factors = [convergence_factor(r * 1000, 1000) for r in (0, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(factors, factors[1:]))  # more rows, faster CG
    problem = Problem(n=10**6, d=20, n_centers=1000, itemsize=4)
    its = [sketch_cost(r, problem, BUDGET, max_iter=50, tol=1e-4).iterations for r in (0, 4000, 16000)]
    assert its[0] == 42 and its[0] > its[1] > its[2]  # log(1e-4) / log(0.8) = 41.3
    assert sketch_cost(16000, problem, BUDGET, max_iter=5, tol=1e-4).iterations == 5


def test_no_sketch_for_a_fixed_iteration_budget():
    """tol too small to stop any candidate before max_iter: the sketch saves nothing."""
    for n, M, itemsize in [(10**5, 5000, 4), (10**6, 1000, 4), (10**5, 2000, 8)]:
        problem = Problem(n=n, d=20, n_centers=M, n_targets=2, itemsize=itemsize)
        rows, costs = choose_sketch_rows(problem, BUDGET, max_iter=20, tol=1e-15, sketch_itemsize=itemsize)
        assert rows == 0, (n, M, [(c.rows, c.seconds) for c in costs])
        assert {c.iterations for c in costs} == {20}
        assert [c.rows for c in costs] == list(sketch_candidates(n, M))


def test_a_sketch_when_tol_stops_cg_early_and_n_is_large():
    problem = Problem(n=10**6, d=20, n_centers=1000, n_targets=2, itemsize=4)
    rows, costs = choose_sketch_rows(problem, BUDGET, max_iter=100, tol=1e-4, sketch_itemsize=4)
    assert rows >= 4000
    by_rows = {c.rows: c for c in costs}
    assert by_rows[rows].seconds == min(c.seconds for c in costs) < 0.5 * by_rows[0].seconds
    # the issue's case: M = 5000 at n = 1e5 and 20 iterations, a sketch of 4 M costs more than it saves
    issue = Problem(n=10**5, d=20, n_centers=5000, n_targets=2, itemsize=4)
    assert choose_sketch_rows(issue, BUDGET, max_iter=20, tol=1e-4, sketch_itemsize=4)[0] == 0
    # float32 halves the sketch's flops
    float32 = sketch_cost(20000, issue, BUDGET, max_iter=20, tol=1e-4, sketch_itemsize=4).preconditioner_s
    float64 = sketch_cost(20000, issue, BUDGET, max_iter=20, tol=1e-4, sketch_itemsize=8).preconditioner_s
    assert float32 < 0.7 * float64


def test_the_preconditioner_is_priced_on_the_clients_cores_and_the_passes_on_the_workers():
    """On a 64-core cluster driven from a 2-core client the sketch Gram, summed on the client, runs at
    the client's rate: the model takes a smaller sketch than it would if the client had the workers'
    cores (summed on the workers, see tests/test_sketch_pass.py, it need not)."""
    problem = Problem(n=10**6, d=20, n_centers=2000, n_targets=1, itemsize=4)
    cluster = Budget(cores=64, memory_bytes=64 * 2**34, n_workers=64)
    small_client = dataclasses.replace(cluster, client_cores=2)
    assert cluster.preconditioner_cores == 64 and small_client.preconditioner_cores == 2
    fixed = dict(max_iter=100, tol=1e-4, sketch_itemsize=4, on="client")
    for rows in (0, 8000, 32000):
        on_client = sketch_cost(rows, problem, small_client, **fixed)
        everywhere = sketch_cost(rows, problem, cluster, **fixed)
        assert on_client.solve_s == everywhere.solve_s  # CG's passes still run on the 64 cores
        # the client's work as on a 2-core cluster (which also reads the data on 2 cores)
        two = sketch_cost(rows, dataclasses.replace(problem, in_memory=True), BUDGET, **fixed)
        assert sketch_cost(rows, dataclasses.replace(problem, in_memory=True), small_client,
                           **fixed).preconditioner_s == pytest.approx(two.preconditioner_s)
        assert on_client.preconditioner_s > (8 if rows else 1) * everywhere.preconditioner_s
    rows_cluster = choose_sketch_rows(problem, cluster, **fixed)[0]
    rows_client = choose_sketch_rows(problem, small_client, **fixed)[0]
    assert rows_client < rows_cluster == 16 * 2000


def test_a_fit_plans_its_sketch_with_the_cores_of_the_process_that_builds_it(monkeypatch):
    """``plan_sketch`` takes the workers' cores from the resources and the client's from this process.

    Summed on a 2-core client, the sketch is smaller than on a 64-core one. By default, where
    iterations cost enough for a large sketch to pay (n = 1e7), a 2-core client has the 64
    workers sum it instead, and keeps its size."""
    import dask.array as da

    from daskkrr.parallel import strategies
    from daskkrr.parallel.resources import Resources

    many = Resources(slots=64, cores=64, memory_bytes=64 * 2**34, n_workers=64, thread_budget=1)
    plans = {}
    for n in (10**6, 10**7):
        X = da.zeros((n, 20), chunks=(n // 8, 20), dtype=np.float32)
        for on in ("client", "auto"):
            monkeypatch.setenv("DASKKRR_SKETCH_ON", on)
            for client_cores in (64, 2):
                monkeypatch.setattr(strategies, "available_cores", lambda c=client_cores: c)
                plans[n, on, client_cores] = strategies.plan_sketch(
                    "auto", X, n_centers=2000, n_targets=1, max_iter=100, tol=1e-4, sketch_itemsize=4,
                    resources=many)
    assert plans[10**6, "client", 2].rows < plans[10**6, "client", 64].rows
    assert plans[10**6, "client", 2].on == plans[10**6, "client", 64].on == "client"
    slow = {c.rows: c.preconditioner_s for c in plans[10**6, "client", 2].costs}
    fast = {c.rows: c.preconditioner_s for c in plans[10**6, "client", 64].costs}
    assert all(slow[r] > fast[r] for r in fast)
    auto = plans[10**7, "auto", 2]
    assert auto.on == "workers" and auto.rows == plans[10**7, "client", 64].rows == 32000
    assert "on the workers" in auto.describe()
    # each size goes where it is cheaper: on the 64 workers the large sketch costs more than on a
    # 64-core client (the partial sums), less than on 2 cores; small ones stay on the client
    spread = {c.rows: c.preconditioner_s for c in auto.costs}
    slow = {c.rows: c.preconditioner_s for c in plans[10**7, "client", 2].costs}
    fast = {c.rows: c.preconditioner_s for c in plans[10**7, "client", 64].costs}
    assert all(fast[r] <= spread[r] <= slow[r] for r in fast)
    assert spread[32000] < 0.6 * slow[32000]


# --------------------------------------------------------------------------- fits
@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((3000, 5))
    y = np.sin(X[:, :3].sum(axis=1)) + 0.1 * rng.standard_normal(3000)
    Xt = rng.standard_normal((300, 5))
    common = dict(n_centers=120, sigma=2.0, penalty=1e-4, random_state=0)
    reference = NystromRegressor(**common).fit(X, y)  # float64, the direct solve
    return X, y, Xt, common, reference


#: The default run fits these four, which take every value of every axis at least once (the sketch on the
#: workers with a dtype whose placement is checked); the other 32 of the 3 x 4 x 3 product are marked slow.
SKETCH_DEFAULT = [("recompute", None, "float64"), ("cache", 480, "float32"),
                  ("gram", "480 on the workers", "float64"), ("recompute", "auto", "float32 factors")]
SKETCH_CASES = [case if case in SKETCH_DEFAULT else pytest.param(*case, marks=pytest.mark.slow)
                for case in itertools.product(["recompute", "cache", "gram"], [None, 480, "480 on the workers", "auto"],
                                              ["float64", "float32", "float32 factors"])]


@pytest.mark.parametrize("strategy, rows, dtype", SKETCH_CASES)
def test_every_strategy_sketch_and_precision_agree_with_the_float64_reference(data, strategy, rows, dtype,
                                                                              monkeypatch):
    X, y, Xt, common, reference = data
    if rows == "480 on the workers":  # summed block by block (daskkrr.parallel.sketch_pass)
        monkeypatch.setenv("DASKKRR_SKETCH_ON", "workers")
        rows = 480
    factors32 = dtype == "float32 factors"
    if factors32:  # factored in float32 too (a float32 fit with >= FLOAT32_FACTOR_MIN_CENTERS centers)
        monkeypatch.setattr(falkon_module, "FLOAT32_FACTOR_MIN_CENTERS", common["n_centers"])
        dtype = "float32"
    model = FalkonRegressor(**common, strategy=strategy, preconditioner_rows=rows, dtype=dtype, max_iter=200,
                            tol=1e-9 if dtype == "float64" else 1e-5, chunks=1000).fit(X, y)
    assert model.strategy_ == strategy
    expected = reference.predict(Xt)
    # float64: the converged CG is the direct solve; float32: the kernel blocks' round-off
    rtol = 1e-6 if dtype == "float64" else 2e-3
    assert np.max(np.abs(model.predict(Xt) - expected)) <= rtol * np.max(np.abs(expected))
    assert np.linalg.norm(model.coef_ - reference.coef_) <= 10 * rtol * np.linalg.norm(reference.coef_)
    if factors32:
        assert model.preconditioner_dtype_ == "float32"
    elif rows == 480:
        assert model.preconditioner_rows_ == 480
        assert model.preconditioner_dtype_ == dtype
        placed = [c["on"] for c in model.preconditioner_costs_ if c["rows"] == 480]
        assert placed == ["workers" if os.environ.get("DASKKRR_SKETCH_ON") == "workers" else "client"]
    elif rows is None:
        assert model.preconditioner_rows_ == 0 and model.preconditioner_dtype_ == "float64"


def test_the_choice_and_its_expected_times_are_recorded_and_saved(data, tmp_path):
    X, y, Xt, common, _ = data
    model = FalkonRegressor(**common, dtype="float32", max_iter=100, tol=1e-4).fit(X, y)
    costs = model.preconditioner_costs_
    assert [c["rows"] for c in costs] == list(sketch_candidates(len(X), 120))
    best = min(costs, key=lambda c: (c["seconds"], c["rows"]))
    assert model.preconditioner_rows_ == best["rows"] > 0  # tol stops CG early, n / M = 25: a sketch
    assert model.preconditioner_dtype_ == "float32"
    assert all(c["seconds"] == pytest.approx(c["preconditioner_s"] + c["solve_s"]) for c in costs)
    # a fixed iteration budget: FALKON's own
    with pytest.warns(ConvergenceWarning):
        fixed = FalkonRegressor(**common, dtype="float32", max_iter=10, tol=1e-15).fit(X, y)
    assert fixed.preconditioner_rows_ == 0 and fixed.n_iter_ == 10
    # an explicit size is kept, and the expected cost of every candidate still recorded
    explicit = FalkonRegressor(**common, preconditioner_rows=500, max_iter=30).fit(X, y)
    assert explicit.preconditioner_rows_ == 500 and 500 in [c["rows"] for c in explicit.preconditioner_costs_]
    model.save(tmp_path / "m")
    loaded = load(tmp_path / "m")
    for name in ("strategy_", "preconditioner_rows_", "preconditioner_dtype_", "preconditioner_costs_"):
        assert getattr(loaded, name) == getattr(model, name), name
    np.testing.assert_array_equal(loaded.predict(Xt), model.predict(Xt))


def test_a_resumed_fit_plans_the_sketch_for_its_own_tol(data, tmp_path):
    """"auto" sizes the sketch for the resumed fit's tol, not the interrupted one's: the CG starts over
    (with a warning) from the saved centers, and the resumed fit is the uninterrupted one at the new tol."""
    X, y, _, common, _ = data
    ckpt = tmp_path / "ck"
    with pytest.warns(ConvergenceWarning):
        first = FalkonRegressor(**common, max_iter=5, tol=1e-15).fit(X, y, checkpoint=ckpt, checkpoint_every=2)
    assert first.preconditioner_rows_ == 0  # a fixed budget: FALKON's own
    fresh = FalkonRegressor(**common, max_iter=100, tol=1e-6).fit(X, y)
    assert fresh.preconditioner_rows_ > 0
    with pytest.warns(UserWarning, match="CG starts over"):
        resumed = FalkonRegressor(**common, max_iter=100, tol=1e-6).fit(X, y, checkpoint=ckpt, resume=True)
    assert resumed.preconditioner_rows_ == fresh.preconditioner_rows_ and resumed.converged_
    assert resumed.n_iter_ == fresh.n_iter_
    # the same centers, sketch and a CG from zero: the same arithmetic (test_resume_replan.py checks bit equality
    # with the strategy fixed; here the cost model's choices are the same for both fits on one machine)
    np.testing.assert_allclose(resumed.coef_, fresh.coef_, rtol=1e-10, atol=1e-12)
