"""Solver strategies (recompute, cache, gram): same solution, chosen by the cost model."""

from __future__ import annotations

import dataclasses

import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonRegressor, NystromRegressor
from daskkrr.config import check_model_config
from daskkrr.data import write_zarr
from daskkrr.parallel.cost import (
    CACHE_LARGE_SAVING,
    CACHE_MEMORY_FRACTION,
    Budget,
    Problem,
    choose_strategy,
    estimate,
    expected_iterations,
    should_persist,
)
from daskkrr.parallel.preconditioner_cost import choose_sketch_rows
from daskkrr.parallel.resources import Resources
from daskkrr.parallel.strategies import balance_blocks, plan_strategy

STRATEGIES = ("recompute", "cache", "gram")
# (kernel, params, centers): the dot-product kernels have finite rank (15 for degree 2 in
# 4 features, 4 for linear), so they get fewer centers than that and K_MM stays regular.
KERNELS = [
    ("gaussian", None, 50),
    ("laplacian", None, 50),
    ("matern", {"nu": 0.5}, 50),
    ("matern", {"nu": 1.5}, 50),
    ("matern", {"nu": 2.5}, 50),
    ("polynomial", {"degree": 2, "gamma": 0.1}, 12),
    ("linear", None, 4),
]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 4))
    y = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.05 * rng.normal(size=1000)
    return X, y


def _nystrom_reference(model, X, y):
    """Predictions of the exact Nystrom solution, in float64 numpy:
    ``(K^T K + lambda n K_MM) a = K^T (y - mean)`` (least squares: for the polynomial and
    linear kernels K_MM is singular and only the predictions are unique); with an
    intercept, on kernel rows centred on their mean."""
    Xs = model.scaler_.transform(X)
    Z = model.centers_.astype(np.float64)
    K = model.kernel_(Xs, Z)
    mu = K.mean(axis=0) if model.fit_intercept else np.zeros(K.shape[1])
    Kc = K - mu
    A = Kc.T @ Kc + model.penalty * len(X) * model.kernel_(Z, Z)
    a = np.linalg.lstsq(A, Kc.T @ (y - y.mean()), rcond=1e-13)[0]
    return Kc @ a + y.mean()


@pytest.mark.parametrize("kernel,params,centers", KERNELS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_strategies_agree_with_the_numpy_reference(data, kernel, params, centers, dtype):
    X, y = data
    common = dict(kernel=kernel, kernel_params=params, penalty=1e-3, n_centers=centers, max_iter=50,
                  tol=1e-10, random_state=0, dtype=dtype)
    scale = np.abs(y).max()
    tol = 1e-6 if dtype == "float64" else 2e-4
    ref = None
    for strategy in STRATEGIES:
        model = FalkonRegressor(strategy=strategy, **common).fit(X, y)
        assert model.strategy_ == strategy
        if ref is None:
            ref = _nystrom_reference(model, X, y)
        np.testing.assert_allclose(model.predict(X), ref, rtol=0, atol=tol * scale, err_msg=strategy)
    direct = NystromRegressor(**{k: v for k, v in common.items() if k not in ("max_iter", "tol")}).fit(X, y)
    assert direct.strategy_ == "gram"
    np.testing.assert_allclose(direct.predict(X), ref, rtol=0, atol=tol * scale)


def test_gram_strategy_converges_where_explicit_normal_equations_would_not():
    """All points as centers, small penalty: K_MM is ill-conditioned. The preconditioned Gram keeps
    CG converging to tol like recomputing the products does."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=400)
    kw = dict(sigma=1.5, penalty=1e-4, n_centers=400, max_iter=60, tol=1e-9, standardize=False, random_state=0)
    gram = FalkonRegressor(strategy="gram", **kw).fit(X, y)
    rec = FalkonRegressor(strategy="recompute", **kw).fit(X, y)
    assert gram.converged_ and rec.converged_
    np.testing.assert_allclose(gram.predict(X), rec.predict(X), atol=1e-6)


def test_passes_per_strategy(data):
    X, y = data
    kw = dict(n_centers=40, max_iter=5, tol=1e-14, random_state=0)
    rec = FalkonRegressor(strategy="recompute", **kw).fit(X, y)
    assert rec.n_data_passes_ >= 1 + 1 + 5  # statistics, rhs, one per iteration
    for strategy in ("cache", "gram"):
        model = FalkonRegressor(strategy=strategy, **kw).fit(X, y)
        assert model.n_data_passes_ == 2, strategy  # statistics + one pass, whatever the iterations
        assert model.n_iter_ == rec.n_iter_


def test_cost_model_choices():
    budget = Budget(cores=2, memory_bytes=16 * 2**30, n_workers=2)
    # Small M, many iterations: one Gram pass beats re-reading the kernel 21 times.
    assert choose_strategy(Problem(n=10**6, d=20, n_centers=200, iterations=20, itemsize=4), budget)[0] == "gram"
    # Many features: kernel entries are expensive, reading them back from memory is not.
    assert choose_strategy(Problem(n=10**5, d=100, n_centers=2000, iterations=20, itemsize=4), budget)[0] == "cache"
    # Large M: the M^2 GEMM per row costs more than the iterations.
    assert choose_strategy(Problem(n=10**5, d=20, n_centers=5000, iterations=20, itemsize=4), budget)[0] != "gram"
    # n = 1e7, M = 2000: the cache would need 80 GB; stream and recompute.
    name, costs = choose_strategy(Problem(n=10**7, d=20, n_centers=2000, iterations=20, itemsize=4), budget)
    assert name == "recompute" and not costs["cache"].feasible
    assert "MiB" in costs["cache"].reason
    # M = 20 000: Gram partials of 3 GB per task do not fit a worker.
    costs = estimate(Problem(n=10**6, d=20, n_centers=20_000, iterations=20), budget)
    assert not costs["gram"].feasible
    assert costs["cache"].memory_bytes == 10**6 * 20_000 * 8
    assert costs["cache"].feasible == (costs["cache"].memory_bytes <= CACHE_MEMORY_FRACTION * budget.memory_bytes)


def test_expected_iterations():
    assert expected_iterations(20) == 20
    assert expected_iterations(20, 1e-7) == 20  # tol would need ~73: max_iter binds
    assert expected_iterations(50, 1e-3) == 31  # 0.8 ** 31 < 1e-3
    assert expected_iterations(5, 0.5) == 4


def test_persist_only_small_data_read_many_times():
    budget = Budget(cores=2, memory_bytes=8 * 2**30, n_workers=2)
    assert should_persist("recompute", 100 * 2**20, budget, in_memory=False)
    assert not should_persist("recompute", 2 * 2**30, budget, in_memory=False)  # stream it
    assert not should_persist("gram", 100 * 2**20, budget, in_memory=False)  # read once anyway
    assert not should_persist("recompute", 100 * 2**20, budget, in_memory=True)


def test_plan_and_block_balancing():
    X = da.zeros((100_000, 5), chunks=(100_000, 5))
    Y = da.zeros((100_000, 1), chunks=(100_000, 1))
    res = Resources(slots=2, cores=2, memory_bytes=8 * 2**30, n_workers=0, thread_budget=1)
    plan = plan_strategy("recompute", X, n_centers=100, n_targets=1, iterations=10, resources=res)
    assert plan.strategy == "recompute" and plan.persist
    assert "recompute" in plan.describe()
    Xb, Yb = balance_blocks(X, Y, slots=2)
    assert len(Xb.chunks[0]) == 4 and Xb.chunks[0] == Yb.chunks[0]
    assert balance_blocks(X[:5000], Y[:5000], slots=2)[0].chunks == X[:5000].chunks  # too small to split


def test_zarr_fit_persisted_equals_in_memory(data, tmp_path):
    X, y = data
    write_zarr(X, y, tmp_path / "d.zarr", chunk_rows=1000)  # one block: balancing splits it
    kw = dict(n_centers=50, max_iter=20, tol=1e-12, penalty=1e-3, random_state=0, strategy="recompute")
    from_zarr = FalkonRegressor(**kw).fit(tmp_path / "d.zarr")
    in_memory = FalkonRegressor(**kw).fit(X, y)
    np.testing.assert_allclose(from_zarr.coef_, in_memory.coef_, rtol=1e-8, atol=1e-10)
    assert from_zarr.n_data_passes_ == in_memory.n_data_passes_ + 1  # + reading the store into memory


def test_invalid_strategies():
    X = np.random.default_rng(0).normal(size=(100, 2))
    y = X[:, 0]
    with pytest.raises(ValueError, match="strategy must be one of 'auto', 'cache', 'gram', 'recompute'; got 'fast'"):
        FalkonRegressor(n_centers=10, strategy="fast").fit(X, y)
    with pytest.raises(ValueError, match="strategy must be 'auto' or 'gram'"):
        NystromRegressor(n_centers=10, strategy="cache").fit(X, y)
    assert check_model_config({"estimator": "falkon", "strategy": "cache"})["strategy"] == "cache"


def test_strategies_on_a_cluster(data, cluster2, tmp_path):
    """Kernel blocks kept on two worker processes; the Gram pass tree-summed across them."""
    X, y = data
    write_zarr(X, y, tmp_path / "d.zarr", chunk_rows=300)
    # 6 iterations, each a round trip to the workers: every strategy's kept blocks and tree sums are used
    # from the first; the strategies differ in round-off only, which fewer iterations amplify less.
    kw = dict(n_centers=50, max_iter=6, tol=1e-12, penalty=1e-3, random_state=0)
    with cluster2.as_current():
        coefs = {s: FalkonRegressor(strategy=s, **kw).fit(tmp_path / "d.zarr").coef_ for s in STRATEGIES}
    for s in ("cache", "gram"):
        np.testing.assert_allclose(coefs[s], coefs["recompute"], rtol=1e-5,
                                   atol=1e-7 * np.abs(coefs["recompute"]).max())
    assert not [key for key in cluster2.who_has() if "kernel_block" in str(key)]  # the cache was released


def test_blocks_kept_on_a_cluster_are_spread_over_its_workers(cluster2):
    """Persisted row blocks and kept results land round robin on the task slots, so that
    the passes on them keep every worker busy (left to the scheduler: 6 and 2 of 8)."""
    import collections

    import dask.array as da
    from dask import delayed
    from distributed import futures_of

    from daskkrr.parallel.backends import DistributedBackend

    backend = DistributedBackend(cluster2)
    X = da.random.default_rng(0).normal(size=(8 * 100, 3), chunks=(100, 3))
    y = X[:, 0] * 2.0
    held_X, held_y = backend.persist([X, y])
    np.testing.assert_array_equal(held_X.compute(scheduler=cluster2.get), X.compute())
    np.testing.assert_array_equal(held_y.compute(scheduler=cluster2.get), y.compute())
    assert held_X.chunks == X.chunks and held_y.chunks == y.chunks

    def where(futures):
        return collections.Counter(next(iter(w)) for w in cluster2.who_has(futures).values())

    X_at, y_at = where(futures_of(held_X)), where(futures_of(held_y))
    assert sorted(X_at.values()) == [4, 4] and X_at == y_at  # block i of X and of y side by side
    kept = backend.keep([delayed(np.ones)(i + 1) for i in range(6)])
    assert sorted(where(kept).values()) == [3, 3]
    backend.release(kept)
    cluster2.cancel(futures_of(held_X) + futures_of(held_y))


def test_cache_takes_a_larger_share_where_recomputing_costs_many_times_more():
    """Fashion-MNIST's shape (n = 60 000, d = 784, M = 10 000, float64) on a 24 GB machine: 4.5 GiB
    of kernel blocks, more than 1/8 of the memory, and recomputing them costs 17 times the cache
    (a d = 784 entry is 1568 flops, its read back 8 bytes). Under the plain 1/8 rule the model took
    recompute and a 4 M-row sketch (437 s expected against 85 s; 1562 s measured)."""
    budget = Budget(cores=2, memory_bytes=22 * 2**30)
    wide = Problem(n=60_000, d=784, n_centers=10_000, n_targets=11, iterations=42, in_memory=True)
    costs = estimate(wide, budget)
    assert CACHE_MEMORY_FRACTION * budget.memory_bytes < costs["cache"].memory_bytes
    assert costs["recompute"].seconds >= CACHE_LARGE_SAVING * costs["cache"].seconds
    assert choose_strategy(wide, budget)[0] == "cache"
    rows, _ = choose_sketch_rows(wide, budget, max_iter=50, tol=1e-4)
    assert rows == 0  # with cached blocks an iteration is cheap: FALKON's own preconditioner wins
    # The same 4.5 GiB at d = 20 (recompute about 1.3 times the cache): the 1/8 rule stands.
    narrow = dataclasses.replace(wide, n=60_000 * 10_000 // 2000, n_centers=2000, d=20)
    assert estimate(narrow, budget)["cache"].memory_bytes == costs["cache"].memory_bytes
    assert not estimate(narrow, budget)["cache"].feasible
    # Never more than CACHE_LARGE_MEMORY_FRACTION: M = 20 000 in float64 (9 GiB of blocks) recomputes.
    assert not estimate(dataclasses.replace(wide, n_centers=20_000), budget)["cache"].feasible


def test_fit_caches_wide_rows_in_a_quarter_of_memory(monkeypatch):
    """End to end, at small size: 2000 rows of 784 features, M = 1500, float64, the memory made
    128 MiB, so the 22.9 MiB of kernel blocks exceed 1/8 of it (16 MiB) and fit in 1/4 (32 MiB);
    the Gram partials (163 MiB) do not. The fit keeps the blocks and builds FALKON's own preconditioner."""
    from daskkrr.parallel import resources

    monkeypatch.setattr(resources, "_available_memory", lambda: 128 * 2**20)
    rng = np.random.default_rng(0)
    X = rng.random((2000, 784))
    y = np.sin(X[:, :4].sum(axis=1))
    model = FalkonRegressor(n_centers=1500, max_iter=20, random_state=0).fit(X, y)  # 20 iterations: ratio 11
    assert model.strategy_ == "cache"
    assert model.preconditioner_rows_ == 0
    assert model.n_data_passes_ == 2  # statistics + the one pass that fills the cache
