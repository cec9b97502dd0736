"""The preconditioner's row sketch summed on the workers (daskkrr.parallel.sketch_pass): the same
Gram as the client's, the same float32 decision, the same fit; and the cost model's choice of where
(issue 17, item 5: the serial part of a fit on many workers)."""

from __future__ import annotations

import dataclasses

import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.data.synthetic import make_regression
from daskkrr.kernels import GaussianKernel
from daskkrr.parallel.cost import Budget, Problem
from daskkrr.parallel.executor import Executor
from daskkrr.parallel.preconditioner_cost import (
    choose_sketch_rows,
    preconditioner_seconds,
    sketch_cost,
    worker_sketch_fits,
    worker_sketch_overhead_seconds,
)
from daskkrr.parallel.sketch_pass import WorkerRowSketch
from daskkrr.parallel.strategies import sketch_place
from daskkrr.solvers.falkon import FalkonPreconditioner, block_sketch_sums, sketch_gram
from daskkrr.solvers.sketch import KernelRowSketch, sketch_indices, unpack_sketch_partial
from daskkrr.utils.linalg import cholesky_jitter

from .checkpoint_crash import SimulatedCrash, crash_after_cg_save


def _problem(n=4000, M=150, d=6, seed=0, sigma=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    Z = X[rng.choice(n, M, replace=False)]
    kernel = GaussianKernel(sigma=float(np.sqrt(d)) if sigma is None else sigma)
    Z64 = Z.astype(np.float64)
    T, _ = cholesky_jitter(kernel(Z64, Z64))
    return X, Z, kernel, T


def _chunks_with_an_empty_block(n: int, idx: np.ndarray) -> tuple[int, ...]:
    """Uneven row blocks, one of which (7 rows, in a gap of the sketch's rows) holds none of them."""
    i = next(i for i in range(len(idx) - 1) if idx[i] > n // 3 and idx[i + 1] - idx[i] > 8)
    a = int(idx[i]) + 1
    return (a, 7, 1100, n - a - 1107)


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("center", [False, True])
def test_the_workers_sum_the_clients_gram(precision, weighted, center):
    X, Z, kernel, T = _problem()
    idx = sketch_indices(len(X), 600, Z)
    rows = _chunks_with_an_empty_block(len(X), idx)
    assert not np.any((idx >= rows[0]) & (idx < rows[0] + 7))
    w = np.random.default_rng(3).uniform(0.2, 3.0, len(idx)) if weighted else None
    d = np.random.default_rng(4).uniform(0.5, 1.5, len(Z))  # center weights (leverage-score centers)
    passes = Executor().passes(da.from_array(X, chunks=(rows, (X.shape[1],))))
    here = KernelRowSketch(kernel, X[idx], Z, row_weights=w, dtype=precision)
    there = WorkerRowSketch(passes, kernel, idx, Z, row_weights=w)
    g_here, used_here = sketch_gram(T, d, here, center, precision=precision, penalty=1e-6)
    g_there, used_there = sketch_gram(T, d, there, center, precision=precision, penalty=1e-6)
    assert used_here == used_there == precision
    np.testing.assert_array_equal(g_there, g_there.T)
    rtol = 1e-12 if precision == "float64" else 1e-6  # the same sums, added in another order
    assert np.linalg.norm(g_there - g_here) <= rtol * np.linalg.norm(g_here)
    assert passes.n_passes == 1


def test_float32_falls_back_to_float64_on_the_workers_as_on_the_client():
    """A wide kernel: the sketch's first rows show float32 solves too inaccurate, on both sides."""
    X, Z, kernel, T = _problem(n=2000, M=300, d=20, sigma=3 * np.sqrt(20))
    idx = sketch_indices(len(X), 800, Z)
    passes = Executor().passes(da.from_array(X, chunks=500))
    K = kernel(Z.astype(np.float64), Z.astype(np.float64))
    built = {}
    for name, sketch in [("client", KernelRowSketch(kernel, X[idx], Z, dtype=np.float32)),
                         ("workers", WorkerRowSketch(passes, kernel, idx, Z))]:
        built[name] = FalkonPreconditioner.from_kernel_matrix(K, penalty=1e-10, n=len(X), sketch=sketch,
                                                              precision="float32")
    assert built["client"].precision == built["workers"].precision == "float64"
    # The same float64 Gram summed in another order: its entries differ by about (blocks + log2(rows))
    # * eps = 3e-15 relative; the Cholesky factor A moves by at most that times cond(A) (below 1e5 at
    # penalty 1e-10 with this jitter), well inside 1e-9 on any CPU's kernels.
    np.testing.assert_allclose(built["workers"].A, built["client"].A, rtol=1e-9, atol=1e-12)


def test_partial_sums_are_checked_for_their_size():
    with pytest.raises(ValueError, match="13 entries"):
        unpack_sketch_partial(np.zeros(12), 3)
    _, Z, kernel, T = _problem(n=50, M=5)
    with pytest.raises(ValueError, match="sorted and distinct"):
        WorkerRowSketch(None, kernel, np.array([3, 1]), Z)
    for out in (np.zeros((4, 4), order="F"), np.zeros((5, 5), order="C"), np.zeros((5, 5), np.float32, order="F")):
        with pytest.raises(ValueError, match="Fortran-ordered float64"):
            block_sketch_sums(T, np.ones(5), [], False, out=out)
    gram, total, rows = block_sketch_sums(T, np.ones(5), [], False)  # no rows in the block: zeros
    assert rows == 0 and not gram.any() and not total.any()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from daskkrr.data.synthetic import write_regression_zarr

    path = tmp_path_factory.mktemp("sketch") / "train.zarr"
    write_regression_zarr(path, 6000, 8, chunk_rows=1000, dtype="float32", random_state=0)
    return path


# The unweighted case differs from the weighted one only in row_weights=None, whose workers' sums
# test_the_workers_sum_the_clients_gram[weighted=False] checks against the client's: its four fits on the
# cluster repeat the weighted case's path: slow.
@pytest.mark.parametrize("weighted", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_fit_with_the_sketch_on_the_workers_is_the_fit_with_it_on_the_client(cluster2, store, monkeypatch,
                                                                                weighted):
    X, y = (np.asarray(a) for a in make_regression(6000, 8, chunk_rows=1000, dtype="float32", random_state=0))
    sw = np.random.default_rng(5).uniform(0.5, 2.0, len(y)) if weighted else None
    fits = {}
    with cluster2.as_current():
        for on in ("client", "workers"):
            monkeypatch.setenv("DASKKRR_SKETCH_ON", on)
            model = FalkonRegressor(n_centers=200, penalty=1e-6, dtype="float32", preconditioner_rows=1200,
                                    tol=1e-6, max_iter=200, random_state=0)
            fits[on] = model.fit(str(store), sample_weight=sw) if weighted else model.fit(str(store))
    client, workers = fits["client"], fits["workers"]
    assert [c["on"] for c in workers.preconditioner_costs_ if c["rows"] == 1200] == ["workers"]
    assert [c["on"] for c in client.preconditioner_costs_ if c["rows"] == 1200] == ["client"]
    assert workers.preconditioner_rows_ == client.preconditioner_rows_ == 1200
    assert workers.preconditioner_dtype_ == client.preconditioner_dtype_ == "float32"
    assert workers.converged_ and client.converged_
    assert abs(workers.n_iter_ - client.n_iter_) <= 1
    # float32 fits converged to tol=1e-6, summed in other orders: predictions of targets of order 1
    # differ by about kappa * tol plus float32 round-off (eps32 = 1.2e-7 times a few) <= 1e-4.
    np.testing.assert_allclose(workers.predict(X[:500]), client.predict(X[:500]), rtol=0, atol=1e-4)


# --------------------------------------------------------------------------- where, by the cost model
PROBLEM = Problem(n=10**6, d=20, n_centers=2000, n_targets=1, itemsize=4)


def test_many_workers_and_a_small_client_sum_the_sketch_on_the_workers():
    cluster = Budget(cores=16, memory_bytes=16 * 2**33, n_workers=16, client_cores=2)
    fixed = dict(max_iter=100, tol=1e-4, sketch_itemsize=4)
    rows, costs = choose_sketch_rows(PROBLEM, cluster, **fixed)
    chosen = next(c for c in costs if c.rows == rows)
    assert rows == 16 * PROBLEM.n_centers and chosen.on == "workers"
    assert {c.on for c in costs if c.rows == 0} == {"client"}  # FALKON's own has no sketch to place
    on_client = sketch_cost(rows, PROBLEM, cluster, on="client", **fixed)
    assert chosen.preconditioner_s < 0.6 * on_client.preconditioner_s
    assert chosen.seconds < min(c.seconds for c in choose_sketch_rows(PROBLEM, cluster, on="client", **fixed)[1])


def test_moving_the_partial_sums_is_priced():
    """T to every worker and the partial sums up the reduction tree, M x M each, over the network:
    on 64 workers at n = 1e6 that outweighs the 32 000-row sketch's flops, and a small sketch on
    the client wins; at n = 1e7, where iterations cost more, the large sketch on the workers."""
    cluster = Budget(cores=64, memory_bytes=64 * 2**33, n_workers=64, client_cores=2)
    fixed = dict(max_iter=100, tol=1e-4, sketch_itemsize=4)
    small = worker_sketch_overhead_seconds(PROBLEM, dataclasses.replace(cluster, cores=2, n_workers=2))
    assert worker_sketch_overhead_seconds(PROBLEM, cluster) > small > 0
    rows, costs = choose_sketch_rows(PROBLEM, cluster, **fixed)
    assert 0 < rows < 16 * PROBLEM.n_centers and next(c.on for c in costs if c.rows == rows) == "client"
    rows, costs = choose_sketch_rows(dataclasses.replace(PROBLEM, n=10**7), cluster, **fixed)
    assert rows == 16 * PROBLEM.n_centers and next(c.on for c in costs if c.rows == rows) == "workers"


def test_a_client_with_the_workers_cores_keeps_the_sketch():
    """Two workers on the client's two cores: summing on them saves no flops and adds the partial sums."""
    two = Budget(cores=2, memory_bytes=16 * 2**30, n_workers=2, client_cores=2)
    for rows in (4000, 32000):
        assert sketch_cost(rows, PROBLEM, two, max_iter=100, tol=1e-4, sketch_itemsize=4).on == "client"
        assert preconditioner_seconds(rows, PROBLEM, two, 4, on="workers") > preconditioner_seconds(
            rows, PROBLEM, two, 4, on="client")


def test_the_workers_sketch_needs_room_for_its_partial_sums():
    big = dataclasses.replace(PROBLEM, n_centers=20_000)  # 3.2 GB per M x M float64
    cluster = Budget(cores=64, memory_bytes=64 * 2**33, n_workers=64, client_cores=2)  # 8 GiB a worker
    assert worker_sketch_fits(PROBLEM, cluster) and not worker_sketch_fits(big, cluster)
    assert sketch_cost(40_000, big, cluster, max_iter=100, tol=1e-4).on == "client"
    assert sketch_cost(40_000, big, cluster, max_iter=100, tol=1e-4, on="workers").on == "workers"  # asked for
    assert not worker_sketch_fits(PROBLEM, dataclasses.replace(cluster, n_workers=0))  # no workers at all


def test_where_can_be_forced_and_is_checked(monkeypatch):
    for raw, want in [("", "auto"), ("auto", "auto"), ("Workers", "workers"), (" client ", "client")]:
        monkeypatch.setenv("DASKKRR_SKETCH_ON", raw)
        assert sketch_place() == want
    monkeypatch.setenv("DASKKRR_SKETCH_ON", "gpu")
    with pytest.raises(ValueError, match="DASKKRR_SKETCH_ON"):
        sketch_place()
    with pytest.raises(ValueError, match="one of"):
        sketch_cost(100, PROBLEM, Budget(cores=2, memory_bytes=2**30), max_iter=10, tol=1e-4, on="gpu")
    with pytest.raises(ValueError, match="summed on"):
        preconditioner_seconds(100, PROBLEM, Budget(cores=2, memory_bytes=2**30), 4, on="gpu")


def test_a_resumed_fit_sums_its_sketch_where_the_interrupted_one_did(tmp_path, monkeypatch):
    """The CG state of a checkpoint belongs to its preconditioner: summed elsewhere, the same sums
    come out in another order. The place is saved with the sketch's size and kept on resume.

    Why this test once failed on Intel (issue 37, item 1; 7.2e-7 relative at rtol=1e-8): the
    interrupted fit ran with ``max_iter=3, tol=1e-12`` and the uninterrupted one with ``max_iter=300,
    tol=1e-9``. The cost model picks the operator's strategy from the iterations and the tolerance
    (``plan_strategy``), so the first 3 CG steps ran with other arithmetic (another summation order
    of ``K_nM^T K_nM u``) than the uninterrupted fit's: the saved state differed in round-off, and
    this system (penalty 1e-7) amplifies that by its condition number, by how much depends on the
    CPU's kernels. Interrupted with the uninterrupted fit's own parameters, every step runs the same
    arithmetic in this process (one BLAS thread, fixed reduction trees), and the resume is bitwise.
    """
    X, y = (np.asarray(a) for a in make_regression(3000, 5, chunk_rows=500, random_state=1))
    common = dict(n_centers=100, penalty=1e-7, preconditioner_rows=600, random_state=0, chunks=500,
                  max_iter=300, tol=1e-9)
    ckpt = tmp_path / "ck"
    monkeypatch.setenv("DASKKRR_SKETCH_ON", "workers")
    uninterrupted = FalkonRegressor(**common).fit(X, y)
    with crash_after_cg_save(3), pytest.raises(SimulatedCrash):
        FalkonRegressor(**common).fit(X, y, checkpoint=ckpt, checkpoint_every=1)
    monkeypatch.delenv("DASKKRR_SKETCH_ON")  # the cost model alone would sum it on the client here
    assert [c["on"] for c in FalkonRegressor(**common).fit(X, y).preconditioner_costs_
            if c["rows"] == 600] == ["client"]
    resumed = FalkonRegressor(**common).fit(X, y, checkpoint=ckpt, resume=True)
    assert [c["on"] for c in resumed.preconditioner_costs_ if c["rows"] == 600] == ["workers"]
    assert resumed.converged_ and resumed.n_iter_ == uninterrupted.n_iter_
    assert resumed.strategy_ == uninterrupted.strategy_
    # Bitwise: the same operations in the same order (see the docstring); a sketch summed on the
    # client instead gives a preconditioner that differs in round-off, which this test would see.
    np.testing.assert_array_equal(resumed.coef_, uninterrupted.coef_)
