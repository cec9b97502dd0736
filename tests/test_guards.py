"""Resource guards: the n^2 methods (exact leverage scores, exact KRR) refuse, before any
pass over the data, what would not fit, and say how much they would need and what to use."""

from __future__ import annotations

import time

import numpy as np
import pytest

import daskkrr.parallel.guards as guards
from daskkrr import ExactKernelRidge, FalkonRegressor
from daskkrr.data import write_zarr
from daskkrr.events import PassStarted, subscribe
from daskkrr.parallel import Executor
from daskkrr.parallel.guards import FORCE_ENV, ResourceGuardError, quadratic_cost
from daskkrr.sampling.exact import ExactRLSSampler


@pytest.fixture(scope="module")
def big():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50_000, 5))
    return X, X[:, 0] + 0.1 * rng.normal(size=50_000)


@pytest.mark.parametrize("make, alternative", [
    (lambda: FalkonRegressor(sampler="rls", n_centers=100), "sampler='squeak' or 'bless'"),
    (lambda: ExactKernelRidge(solver="direct"), "FalkonRegressor"),
])
def test_n_squared_methods_are_refused_at_once_with_the_estimate(big, make, alternative):
    X, y = big
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        make().fit(X, y)
    assert time.perf_counter() - t0 < 1.0
    message = str(info.value)
    assert "n=50000" in message and " GB of memory" in message and "roughly" in message
    assert alternative in message


def _tiny_memory(monkeypatch, nbytes=10**6):
    monkeypatch.setattr(guards, "memory_limits", lambda executor=None: {"this machine": nbytes})


def test_memory_guard_refuses_before_any_pass_over_a_store(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 4))
    store = write_zarr(X, X[:, 0], tmp_path / "train.zarr", chunk_rows=500)
    _tiny_memory(monkeypatch)
    passes = []
    with subscribe(lambda e: passes.append(e) if isinstance(e, PassStarted) else None):
        with pytest.raises(ResourceGuardError, match=r"this machine 0\.001 GB") as info:
            FalkonRegressor(sampler="rls", n_centers=50).fit(store)
        assert "force=True" in str(info.value) and FORCE_ENV in str(info.value)
        with pytest.raises(ResourceGuardError, match="FalkonRegressor"):
            ExactKernelRidge(solver="direct").fit(store)
    assert passes == []  # refused from the store's metadata


def test_force_runs_anyway(monkeypatch):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(400, 3))
    y = np.sin(X[:, 0])
    _tiny_memory(monkeypatch)
    with pytest.raises(ResourceGuardError):
        FalkonRegressor(sampler="rls", n_centers=40, random_state=0).fit(X, y)
    model = FalkonRegressor(sampler=ExactRLSSampler(force=True), n_centers=40, random_state=0).fit(X, y)
    assert model.centers_.shape == (40, 3)
    monkeypatch.setenv(FORCE_ENV, "1")
    assert FalkonRegressor(sampler="rls", n_centers=40, random_state=0).fit(X, y).score(X, y) > 0.9
    assert ExactKernelRidge().fit(X, y).score(X, y) > 0.9


def test_sampler_checks_when_called_directly(monkeypatch):
    _tiny_memory(monkeypatch)
    X = np.random.default_rng(3).normal(size=(600, 2))
    with pytest.raises(ResourceGuardError, match="ExactRLSSampler"):
        ExactRLSSampler().select(X, lambda a, b: a @ b.T, n_centers=10, penalty=1e-3, random_state=0)
    with pytest.raises(ValueError, match=r"max_rows=500.*ExactRLSSampler\(max_rows=N\)"):
        ExactRLSSampler(max_rows=500, force=True).check_resources(600, 2)


def test_workers_memory_counts(cluster2, monkeypatch):
    """Two workers of 2 GiB: 8.6 GB of exact-RLS matrices do not fit, whatever this machine has."""
    import daskkrr.parallel.resources as resources

    monkeypatch.setattr(resources, "_available_memory", lambda: 10**15)
    with pytest.raises(ResourceGuardError, match=r"the workers 4\.29 GB") as info:
        ExactRLSSampler().check_resources(15_000, 5, Executor(cluster2))
    assert "this machine" not in str(info.value)
    ExactRLSSampler().check_resources(5_000, 5, Executor(cluster2))  # 1 GB fits


def test_this_machine_counts_what_local_workers_may_still_claim(cluster2, monkeypatch):
    """The matrices are formed in this (client) process, beside two local 2 GiB workers that may
    still grow to their limits: of 6 GiB free the client may take at most 6 GiB less their
    headroom, floored at an equal share, 2 GiB (daskkrr.parallel.resources.client_budget), so
    3 GB of exact-RLS matrices are refused, though they fit the free memory and the workers."""
    import daskkrr.parallel.resources as resources

    monkeypatch.setattr(resources, "_available_memory", lambda: 6 * 2**30)
    sampler, n = ExactRLSSampler(), 9_000
    nbytes = quadratic_cost("ExactRLSSampler", n, 5, matrices=sampler.MATRICES, cubic=sampler.CUBIC_FLOPS).memory_bytes
    assert 2.5e9 < nbytes < 4e9
    where = r"this process \(of 6\.44 GB free, less the local workers' headroom\) [0-3]\.\d+ GB"
    with pytest.raises(ResourceGuardError, match=where) as info:
        sampler.check_resources(n, 5, Executor(cluster2))
    assert "the workers" not in str(info.value)


def test_estimate_matches_the_measured_run():
    """sampler="rls" at n = 18 000 on the 2-core development machine: 546 s and 13 GB."""
    cost = quadratic_cost("ExactRLSSampler", 18_000, 16, matrices=ExactRLSSampler.MATRICES,
                          cubic=ExactRLSSampler.CUBIC_FLOPS, cores=2)
    assert 12e9 < cost.memory_bytes < 14e9
    assert 546 / 2 < cost.seconds < 546 * 2
    assert "13 GB" in cost.describe() and "min" in cost.describe()
