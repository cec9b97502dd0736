"""Estimators hold no client and run where Dask's current context says (issue 11).

Each test that needs a cluster opens and closes its own client (the default client while
it runs) to the run's shared two-worker LocalCluster, so no test sees another's client.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import threading
import time
from numbers import Number

import numpy as np
import pytest

from daskkrr import FalkonRegressor


@contextlib.contextmanager
def two_workers(cluster2):
    """A new client of the two-process cluster, the default client while the block runs."""
    from distributed import Client

    with Client(cluster2.scheduler.address) as client:
        yield client


def _data(n: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] + 0.05 * rng.normal(size=n)
    return X, y


def _plain(value) -> bool:
    """A value with no live state: what get_params may hold."""
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return value is None or isinstance(value, (str, bool, Number))


def test_clone_and_get_params_with_a_client_active(cluster2):
    from distributed import Client
    from sklearn.base import clone

    with two_workers(cluster2) as client:
        assert Client.current() is client
        model = FalkonRegressor(n_centers=30, max_iter=5, random_state=0)
        params = model.get_params()
        assert "client" not in params
        assert all(_plain(v) for v in params.values()), params
        copy = clone(model)
        assert copy.get_params() == params
        pickle.dumps(copy)  # nothing of the session inside
        with pytest.raises(TypeError, match="client"):
            FalkonRegressor(client=client)
        X, y = _data(300)
        fitted = copy.fit(X, y)
        assert "client" not in fitted.get_params()
        clone(fitted)


def test_dask_config_scheduler_wins_over_the_active_client(cluster2):
    """``with dask.config.set(scheduler="synchronous")``: every task runs in this thread."""
    import dask
    from dask.callbacks import Callback

    ran_in: list[int] = []

    class Where(Callback):
        def _pretask(self, key, dsk, state):
            ran_in.append(threading.get_ident())

    X, y = _data(400)
    with two_workers(cluster2) as client:
        before = dict(client.processing())
        with dask.config.set(scheduler="synchronous"), Where():
            model = FalkonRegressor(n_centers=40, max_iter=5, random_state=0).fit(X, y)
        assert dict(client.processing()) == before
    assert ran_in, "no task went through a local scheduler: the fit ran on the cluster"
    assert set(ran_in) == {threading.get_ident()}, "tasks ran in other threads: not the synchronous scheduler"
    local = FalkonRegressor(n_centers=40, max_iter=5, random_state=0).fit(X, y)
    np.testing.assert_allclose(model.coef_, local.coef_, rtol=1e-10, atol=1e-12)


@pytest.mark.timeout(180)
def test_grid_search_under_joblib_dask_backend_finishes(cluster2):
    """6 fits + the refit, each inside a Dask task on two single-thread workers: before,
    every worker thread held a fit waiting on passes that could not start."""
    import joblib
    from distributed import get_task_stream
    from sklearn.model_selection import GridSearchCV

    X, y = _data(500)
    grid = {"sigma": [0.5, 1.0]}

    def search():
        return GridSearchCV(FalkonRegressor(n_centers=50, random_state=0), grid, cv=3, n_jobs=-1)

    sequential = GridSearchCV(FalkonRegressor(n_centers=50, random_state=0), grid, cv=3, n_jobs=1).fit(X, y)
    with two_workers(cluster2) as client:
        on_cluster = search()
        t0 = time.perf_counter()
        with joblib.parallel_backend("dask"), get_task_stream(client) as stream:
            on_cluster.fit(X, y)
        seconds = time.perf_counter() - t0
    assert seconds < 60, f"the search took {seconds:.1f}s"
    assert stream.data, "no task ran on the cluster during the search"
    assert on_cluster.best_params_ == sequential.best_params_
    np.testing.assert_allclose(on_cluster.cv_results_["mean_test_score"],
                               sequential.cv_results_["mean_test_score"], rtol=1e-8)


@pytest.mark.timeout(180)
def test_fit_inside_dask_delayed_returns(cluster2):
    import dask
    from distributed import get_worker, worker_client

    from daskkrr.parallel import backend_for

    X, y = _data(400)

    def fit_in_task(X, y):
        get_worker()  # we are in a worker task
        model = FalkonRegressor(n_centers=40, max_iter=8, random_state=0).fit(X, y)
        return model.coef_

    def backends_in_task():
        plain = type(backend_for()).__name__
        with worker_client():  # the thread secedes: the fit may use the cluster
            seceded = type(backend_for()).__name__
        return plain, seceded

    with two_workers(cluster2) as client:
        coef = dask.delayed(fit_in_task)(X, y).compute()
        where = client.submit(backends_in_task, pure=False).result(timeout=60)
    local = FalkonRegressor(n_centers=40, max_iter=8, random_state=0).fit(X, y)
    np.testing.assert_allclose(coef, local.coef_, rtol=1e-10, atol=1e-12)
    assert where == ("ThreadedBackend", "DistributedBackend")


def test_a_saved_model_with_a_client_key_loads(tmp_path):
    """Models saved while ``client`` was a parameter recorded it as null."""
    import daskkrr
    from daskkrr.models.persistence import METADATA_FILE

    X, y = _data(200)
    model = FalkonRegressor(n_centers=20, max_iter=5, random_state=0).fit(X, y)
    path = model.save(tmp_path / "model")
    meta_path = path / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    meta["params"]["client"] = None
    meta_path.write_text(json.dumps(meta))
    again = daskkrr.load(path)
    assert "client" not in again.get_params()
    np.testing.assert_allclose(again.predict(X), model.predict(X), rtol=1e-12)
