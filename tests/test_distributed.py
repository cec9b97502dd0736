"""Fits on a real distributed.LocalCluster with worker processes, from Zarr stores."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import daskkrr
from daskkrr import FalkonRegressor
from daskkrr.data import write_array_zarr, write_regression_zarr, write_zarr

CONVERGED = dict(n_centers=120, penalty=1e-3, tol=1e-11, max_iter=80, random_state=11)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(6000, 5))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.3 * X[:, 2] + 0.05 * rng.normal(size=6000)
    path = tmp_path_factory.mktemp("zarr") / "train.zarr"
    write_zarr(X, y, path, chunk_rows=700)
    return path, X, y


def test_zarr_on_cluster_equals_numpy_fit(store, cluster2):
    path, X, y = store
    with cluster2.as_current():
        on_cluster = FalkonRegressor(**CONVERGED).fit(path)
    in_memory = FalkonRegressor(**CONVERGED).fit(X, y)
    assert on_cluster.converged_ and in_memory.converged_
    np.testing.assert_array_equal(on_cluster.center_indices_, in_memory.center_indices_)
    rel = np.linalg.norm(on_cluster.coef_ - in_memory.coef_) / np.linalg.norm(in_memory.coef_)
    assert rel <= 1e-8, rel


def test_lazy_predict_writes_zarr(store, cluster2, tmp_path):
    path, X, y = store
    with cluster2.as_current():
        model = FalkonRegressor(**CONVERGED).fit(path)
    lazy = model.predict(path)
    assert type(lazy).__name__ == "Array" and lazy.shape == (6000,)
    out = write_array_zarr(lazy, tmp_path / "pred.zarr", name="y_pred")
    written = zarr.open_group(str(out), mode="r")["y_pred"][:]
    np.testing.assert_allclose(written, model.predict(X), rtol=1e-10, atol=1e-10)


def test_nothing_of_size_n_reaches_the_client(store, cluster2, monkeypatch):
    from distributed import Client

    path, _, _ = store
    sizes: list[int] = []
    real_gather = Client.gather

    def spy(self, futures, *args, **kwargs):
        result = real_gather(self, futures, *args, **kwargs)
        for leaf in _leaves(result):
            sizes.append(int(getattr(leaf, "nbytes", 0)))
        return result

    monkeypatch.setattr(Client, "gather", spy)
    # strategy="recompute": one pass per CG iteration, all through the cluster ("auto" may pick
    # the two-pass gram strategy at this size).
    with cluster2.as_current():
        model = FalkonRegressor(n_centers=50, max_iter=5, random_state=0, strategy="recompute").fit(path)
    assert sizes, "the fit gathered nothing through the client: the spy is not wired"
    n = 6000
    assert max(sizes) < n * 8, f"a result of {max(sizes)} bytes (>= n floats) reached the client"
    assert model.n_data_passes_ >= 3


def _leaves(obj):
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)
    else:
        yield obj


@pytest.mark.slow
def test_out_of_core_fit_larger_than_worker_memory(tmp_path):
    """2 workers x 350 MB limit against 800 MB of training data."""
    from distributed import Client, LocalCluster

    n, d = 5_000_000, 20
    path = tmp_path / "big.zarr"
    write_regression_zarr(path, n, d, chunk_rows=125_000, random_state=0)
    data_bytes = n * d * 8
    limit = 350 * 2**20
    assert data_bytes > 2 * limit
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, memory_limit=limit) as cluster, Client(cluster):  # the default client
        model = FalkonRegressor(n_centers=40, penalty=1e-4, max_iter=3, tol=1e-12, random_state=0).fit(path)
        X, y = daskkrr.open_dataset(path)
        score = model.score(X[:200_000], y[:200_000])
    assert model.coef_.shape == (40,) and np.all(np.isfinite(model.coef_))
    assert model.n_iter_ == 3
    assert score > 0.3
