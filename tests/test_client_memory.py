"""The client's memory budget for the dense preconditioner factors: the host's free memory less what
the workers on the same host may still claim up to their limits (a LocalCluster's workers share the
client's RAM), with an equal share for the client where their limits overcommit the host."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import daskkrr.parallel.resources as resources
from daskkrr.parallel.resources import Resources, client_budget, client_memory_budget
from daskkrr.parallel.strategies import plan_factor_route

GiB = 2**30


@pytest.mark.parametrize(
    ("available", "local_workers", "expected"),
    [
        (8 * GiB, [], 8 * GiB),  # no worker on this host: all of it
        (8 * GiB, [(3 * GiB, GiB // 2), (3 * GiB, GiB // 2)], 3 * GiB),  # 8 - 2 x 2.5 GiB of headroom
        (8 * GiB, [(2 * GiB, 3 * GiB)], 8 * GiB),  # a worker above its limit claims no more
        (8 * GiB, [(0, GiB)], 8 * GiB),  # no limit (0): no headroom to count
        (8 * GiB, [(8 * GiB, GiB // 4)] * 3, 2 * GiB),  # limits overcommit the host: an equal share of 4
    ],
)
def test_the_client_does_not_count_what_local_workers_may_claim(available, local_workers, expected):
    assert client_budget(available, local_workers) == expected


def _fake_cluster(monkeypatch, workers):
    monkeypatch.setattr(resources, "_available_memory", lambda: 8 * GiB)
    monkeypatch.setattr(resources, "cluster_workers", lambda client: workers)
    return SimpleNamespace(client=object())


def test_only_workers_on_this_host_count(monkeypatch):
    executor = _fake_cluster(monkeypatch, {
        "tcp://127.0.0.1:1": {"host": "127.0.0.1", "memory_limit": 3 * GiB, "metrics": {"memory": GiB // 2}},
        "tcp://127.0.0.1:2": {"host": "127.0.0.1", "memory_limit": 3 * GiB, "metrics": {"memory": GiB // 2}},
        # another machine's worker takes none of this host's memory (".invalid" never resolves to a host)
        "tcp://far.invalid:1": {"host": "far.invalid", "memory_limit": 64 * GiB, "metrics": {"memory": 0}},
    })
    assert client_memory_budget(executor.client) == 3 * GiB
    assert client_memory_budget(None) == 8 * GiB  # the threaded scheduler: no workers apart from this process


def test_the_dense_route_leaves_the_local_workers_their_memory(monkeypatch):
    """M = 10 000 float64 dense factors need 2.24 GiB: within half of the host's 8 GiB free, but not
    within half of the 3 GiB the two local workers leave (their limits, 2.5 GiB each unused)."""
    executor = _fake_cluster(monkeypatch, {
        f"tcp://127.0.0.1:{i}": {"host": "127.0.0.1", "memory_limit": 3 * GiB, "metrics": {"memory": GiB // 2}}
        for i in (1, 2)})
    res = Resources(slots=2, cores=2, memory_bytes=6 * GiB, n_workers=2, thread_budget=1)
    plan = plan_factor_route(10_000, "float64", executor=executor, resources=res)
    assert plan.route == "tiled" and plan.client_bytes == 3 * GiB
    assert plan_factor_route(5_000, "float64", executor=executor, resources=res).route == "dense"  # 0.56 GiB
