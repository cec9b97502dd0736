"""Ordinary inputs under a distributed client (issue 37, items 3 and 5): numpy training data
scattered once in one block per worker slot, and dask arrays of unknown row counts refused."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.events import BLOCK_PREFIX

# CG run to 1e-10 (10 iterations here), so the two fits differ by summation order only.
CONVERGED = dict(n_centers=60, penalty=1e-2, tol=1e-10, max_iter=40, random_state=11)


def _data(n: int = 12_000, d: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(n, d))
    return X, np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.normal(size=n)


def _large_graphs(caught: list[warnings.WarningMessage]) -> list[str]:
    """distributed's "Sending large graph" warnings among ``caught`` (recorded, not raised: an
    exception raised inside ``Client.compute`` could be taken for a failed pass and retried)."""
    return [str(w.message).split("\n")[0] for w in caught if "large graph" in str(w.message)]


@pytest.mark.slow  # about 20 s with the cluster's first fit (worker imports) on a shared 2-core host
def test_numpy_fit_under_a_client_scatters_one_block_per_worker(cluster2):
    from distributed import get_task_stream

    X, y = _data()  # 0.77 MB of X: over the 0.5 MB threshold set below if it travelled inside a graph
    with cluster2.as_current(), dask.config.set({"distributed.admin.large-graph-warning-threshold": "500kB"}):
        with warnings.catch_warnings(record=True) as caught, get_task_stream(cluster2) as stream:
            warnings.simplefilter("always")
            on_cluster = FalkonRegressor(**CONVERGED).fit(X, y)
    assert not _large_graphs(caught)
    workers = {t["worker"] for t in stream.data if str(t["key"]).strip("('").startswith(BLOCK_PREFIX)}
    assert workers == set(cluster2.scheduler_info()["workers"]), workers
    in_memory = FalkonRegressor(**CONVERGED).fit(X, y)  # threads, one 64 MiB block
    assert on_cluster.converged_ and in_memory.converged_
    np.testing.assert_array_equal(on_cluster.center_indices_, in_memory.center_indices_)
    rel = np.linalg.norm(on_cluster.coef_ - in_memory.coef_) / np.linalg.norm(in_memory.coef_)
    assert rel <= 1e-7, rel  # tol=1e-10 on both: they agree to about the CG tolerance x the condition number


def test_scattered_blocks_are_sized_for_the_slots(cluster2):
    from daskkrr.data.inputs import load_training_data

    X, y = _data(n=1001)
    with cluster2.as_current():
        Xd, yd = load_training_data(X, y, None)
        explicit, _ = load_training_data(X, y, 300)
        np.testing.assert_array_equal(Xd.compute(), X)
        np.testing.assert_array_equal(yd.compute(), y)
    assert Xd.chunks[0] == (501, 500) and yd.chunks[0] == Xd.chunks[0]  # two single-thread workers
    assert explicit.chunks[0] == (300, 300, 300, 101)  # chunks= wins
    # the graph names the scattered blocks; the data is not in it
    assert sum(getattr(v, "nbytes", 0) for v in dict(Xd.__dask_graph__()).values()) == 0


@pytest.mark.parametrize("where", ["fit", "predict"])
def test_unknown_chunk_sizes_are_refused_with_the_fix(where):
    X, y = _data(n=400, d=3)
    Xd, yd = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
    keep = Xd[:, 0] > 0
    model = FalkonRegressor(n_centers=20, random_state=0)
    with pytest.raises(ValueError, match=r"unknown chunk sizes.*X\.compute_chunk_sizes\(\)"):
        if where == "fit":
            model.fit(Xd[keep], yd[keep])
        else:
            model.fit(X, y).predict(Xd[keep])
    # what the message says to do works
    Xk, yk = Xd[keep].compute_chunk_sizes(), yd[keep].compute_chunk_sizes()
    assert model.fit(Xk, yk).predict(Xk).shape == (int((X[:, 0] > 0).sum()),)


@pytest.mark.slow  # two batches of a few hundred landmarks on the cluster: about 15 s on a shared 2-core host
def test_online_batches_send_the_dictionary_by_scatter_not_inside_graphs(cluster2):
    from daskkrr import OnlineKernelRidge

    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 3))
    y = np.sin(X[:, 0]) + 0.05 * rng.normal(size=1500)
    Xd, yd = da.from_array(X, chunks=250), da.from_array(y, chunks=250)  # 3 blocks per batch
    # gamma: the sampler's ridge (the old convention's penalty 1.0); penalty: its normalised ridge over 1500 rows
    params = dict(gamma=1.0, penalty=1.0 / 1500, c=4.0, batch_size=750, random_state=0)
    # After the first batch the dictionary has about 300 landmarks: its two m x m factors are
    # about 0.7 MB each, so a batch graph carrying them in its 3 block tasks would be over 2 MB.
    with cluster2.as_current(), dask.config.set({"distributed.admin.large-graph-warning-threshold": "500kB"}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            on_cluster = OnlineKernelRidge(**params).fit(Xd, yd)
    assert not _large_graphs(caught)
    assert on_cluster.n_landmarks_ > 250
    local = OnlineKernelRidge(**params).fit(Xd, yd)
    np.testing.assert_array_equal(on_cluster.center_indices_, local.center_indices_)
    # the same blocks through the same functions: only BLAS's summation order may differ,
    # a few ulps amplified by the basis factor's conditioning
    np.testing.assert_allclose(on_cluster.predict(X), local.predict(X), rtol=1e-8, atol=1e-8)
