"""Determinism: one random_state gives the same centers and coefficients whatever the
number of workers (1, 2, 4 processes) and however the rows are chunked."""

from __future__ import annotations

import numpy as np
import pytest

from daskkrr import FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.data import write_zarr

# A converged, well-conditioned solve: with an unconverged CG (or a K_MM so ill-conditioned
# that the CG stagnates), summation-order round-off would be amplified far above 1e-8.
CONVERGED = dict(n_centers=100, sigma=1.0, penalty=1e-2, tol=1e-11, max_iter=80, random_state=21)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(8)
    X = rng.normal(size=(8000, 4))
    y = np.cos(X[:, 0]) + 0.5 * X[:, 1] * X[:, 3] + 0.05 * rng.normal(size=8000)
    store = write_zarr(X, y, tmp_path_factory.mktemp("det") / "train.zarr", chunk_rows=1000)
    return store, X, y


@pytest.fixture
def scaled_cluster():
    """A LocalCluster of single-threaded worker processes, scaled up to 2 and 4 workers (the test's own:
    it is only scaled up, so that it has exactly the workers asked for)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, memory_limit="2GiB") as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield cluster, client


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


#: Agreement of coefficients fitted with the products summed in another order (other workers, other
#: chunks), relative to their norm. Two CG solutions whose relative residuals are both <= tol = 1e-11
#: differ by at most 2 * kappa * tol, kappa the condition of the FALKON-preconditioned system (close to
#: 1 with the preconditioner's sketch, and far below 500 at penalty 1e-2): <= 1e-8. The summation order
#: itself perturbs each product by about (blocks + log2(rows)) * eps = 4e-15, far below tol. The bound
#: holds for any CPU's kernels; it does not depend on which round-off a machine makes.
AGREEMENT = 1e-8


def _assert_same_models(fits: dict[int, FalkonRegressor], X: np.ndarray, y: np.ndarray) -> None:
    """Every cluster fit chose the threaded fit's centers and is within AGREEMENT of it and of the
    fit on the fewest workers (whose standardised centers it equals bit for bit)."""
    threads = FalkonRegressor(**CONVERGED).fit(X, y)
    assert threads.converged_
    first = fits[min(fits)]
    for n_workers, model in fits.items():
        assert model.converged_, n_workers
        np.testing.assert_array_equal(model.center_indices_, threads.center_indices_)
        np.testing.assert_array_equal(model.centers_, first.centers_)
        assert _relative(model.coef_, threads.coef_) <= AGREEMENT, n_workers
        assert _relative(model.coef_, first.coef_) <= AGREEMENT, n_workers


def test_same_model_on_2_workers_as_in_threads(data, cluster2):
    """The default run's case, on the run's shared two-worker cluster (no cluster of its own to start)."""
    store, X, y = data
    assert len(cluster2.scheduler_info()["workers"]) == 2
    with cluster2.as_current():
        fits = {2: FalkonRegressor(**CONVERGED).fit(store)}
    _assert_same_models(fits, X, y)


# A cluster of its own scaled 1 -> 2 -> 4 worker processes on 2 cores costs the workers' start and
# imports (the 2-worker case runs by default above): slow.
@pytest.mark.slow
def test_same_model_on_1_2_and_4_workers(data, scaled_cluster):
    store, X, y = data
    cluster, client = scaled_cluster
    fits = {}
    for n_workers in (1, 2, 4):
        cluster.scale(n_workers)
        client.wait_for_workers(n_workers, timeout=120)  # scaling up only: exactly n_workers
        assert len(client.scheduler_info()["workers"]) == n_workers
        with client.as_current():
            fits[n_workers] = FalkonRegressor(**CONVERGED).fit(store)
    _assert_same_models(fits, X, y)


@pytest.mark.parametrize("estimator", [FalkonRegressor, NystromRegressor])
def test_same_model_for_any_chunking(data, estimator):
    _, X, y = data
    params = {k: v for k, v in CONVERGED.items() if estimator is FalkonRegressor or k not in ("tol", "max_iter")}
    fits = [estimator(chunks=chunks, **params).fit(X, y) for chunks in (8000, 1000, 777)]
    for model in fits[1:]:
        assert getattr(model, "converged_", True)
        np.testing.assert_array_equal(model.center_indices_, fits[0].center_indices_)
        assert _relative(model.coef_, fits[0].coef_) <= AGREEMENT
        # Means merged along another tree (Chan's update): each merge adds about eps * |mean| and
        # each block's pairwise sum about log2(rows) * eps * max|x| / rows, so <= 1e-12 relative for
        # means of order 1e-2 and entries below 5 (standard normal columns); atol for a mean near 0.
        np.testing.assert_allclose(model.scaler_.mean_, fits[0].scaler_.mean_, rtol=1e-12, atol=1e-15)


def test_repeated_fits_are_identical_and_seeds_matter(data):
    _, X, y = data
    a = FalkonRegressor(**CONVERGED).fit(X, y)
    b = FalkonRegressor(**CONVERGED).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)  # bit for bit in one process
    c = FalkonRegressor(**{**CONVERGED, "random_state": 22}).fit(X, y)
    assert not np.array_equal(c.center_indices_, a.center_indices_)


def test_classifier_is_deterministic_across_chunkings(data):
    _, X, _ = data
    labels = np.digitize(X[:, 0] + X[:, 1] ** 2, [0.0, 1.5])
    fits = [FalkonClassifier(chunks=chunks, **CONVERGED).fit(X, labels) for chunks in (8000, 900)]
    assert _relative(fits[1].coef_, fits[0].coef_) <= AGREEMENT
    np.testing.assert_array_equal(fits[1].predict(X), fits[0].predict(X))
