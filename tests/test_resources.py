"""What the cost model is told about the cluster: cores, slots and each task's engine threads,
including a ``$DASKKRR_ENGINE_THREADS`` cap set on the workers (issue 17, item 5)."""

from __future__ import annotations

import pytest

from daskkrr.parallel.resources import _host_share, cluster_resources
from daskkrr.utils.threads import available_cores


@pytest.mark.parametrize(
    ("host_cores", "host_threads", "cap", "expected"),
    [
        (2, 2, None, (1, 2)),  # one single-threaded worker per core
        (2, 1, None, (2, 2)),  # the spare core goes to the engine
        (2, 1, 1, (1, 1)),  # ... unless the workers cap it: one core idles
        (16, 4, 2, (2, 8)),
        (16, 4, 8, (4, 16)),  # a cap above the rule changes nothing
        (2, 4, 1, (1, 2)),  # oversubscribed: the host's cores, no more
    ],
)
def test_a_hosts_engine_threads_and_busy_cores(host_cores, host_threads, cap, expected):
    assert _host_share(host_cores, host_threads, cap) == expected


def test_the_threaded_scheduler_honours_the_cap_of_this_process(monkeypatch):
    import dask

    monkeypatch.delenv("DASKKRR_ENGINE_THREADS", raising=False)
    with dask.config.set(num_workers=1):
        free = cluster_resources(None)
        monkeypatch.setenv("DASKKRR_ENGINE_THREADS", "1")
        capped = cluster_resources(None)
    assert (free.slots, free.cores, free.thread_budget) == (1, available_cores(), available_cores())
    assert (capped.slots, capped.cores, capped.thread_budget) == (1, 1, 1)


@pytest.mark.slow  # starts two clusters of its own: 6 s
@pytest.mark.skipif(available_cores() < 2, reason="needs a host with at least 2 cores")
def test_a_cap_set_on_the_workers_reaches_the_client():
    """One single-threaded worker on a 2-core host: the engine takes both cores, unless the
    worker's environment caps it at one; the client sees the cap (it used to count two)."""
    from distributed import Client, LocalCluster

    seen = {}
    for cap in ("", "1"):
        env = {"DASKKRR_ENGINE_THREADS": cap} if cap else {}
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None, memory_limit="1GiB", env=env) as cluster:
            with Client(cluster, set_as_default=False) as client:
                seen[cap] = cluster_resources(client)
    cores = available_cores()
    assert (seen[""].cores, seen[""].thread_budget) == (cores, cores)
    assert (seen["1"].cores, seen["1"].thread_budget) == (1, 1)
    assert seen["1"].slots == seen[""].slots == 1
