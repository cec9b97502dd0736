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


def _threads_seen(state, block, block_id, first_row):
    """A fold step that records the engine and BLAS threads it runs with."""
    from threadpoolctl import threadpool_info

    from daskkrr.kernels.thread_rule import current_engine_threads

    blas = max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")
    return [*(state or []), (current_engine_threads(), blas)]


def _blas_threads_now(block):
    import numpy as np
    from threadpoolctl import threadpool_info

    return np.array([max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")])


#: Run in a fresh process whose BLAS may use every core (this run's sets ``OPENBLAS_NUM_THREADS=1`` before numpy
#: loads, which OpenBLAS cannot raise later).
_FOLD_THREADS_SCRIPT = """
import json, os, sys
import dask.array as da, numpy as np
sys.path.insert(0, sys.argv[1])
from test_resources import _threads_seen, _blas_threads_now
from daskkrr.parallel.executor import Executor
X = da.from_array(np.zeros((40, 2)), chunks=(10, 2))
out = {"fold": Executor().passes(X).fold(_threads_seen, None, name="threads"),
       "map": [int(m[0]) for m in Executor().passes(X).map(_blas_threads_now, name="mapped")]}
os.environ["DASKKRR_ENGINE_THREADS"] = "1"
out["capped"] = Executor().passes(X).fold(_threads_seen, None, name="threads")
print(json.dumps(out))
"""


@pytest.mark.skipif(available_cores() < 2, reason="needs a host with at least 2 cores")
def test_a_folds_steps_take_every_core_on_the_threaded_scheduler():
    """A fold (SQUEAK's pass) is a chain: one step runs at a time, so each takes every core (engine and BLAS),
    where a map's block tasks share them (one BLAS thread each); ``$DASKKRR_ENGINE_THREADS`` caps both."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "DASKKRR_ENGINE_THREADS")}
    done = subprocess.run([sys.executable, "-c", _FOLD_THREADS_SCRIPT, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    cores = available_cores()
    assert seen["fold"] == [[cores, cores]] * 4
    assert seen["map"] == [1] * 4
    assert seen["capped"] == [[1, 1]] * 4


def test_a_folds_steps_keep_the_task_budget_on_a_cluster(cluster2):
    import dask.array as da
    import numpy as np

    from daskkrr.parallel.executor import Executor

    X = da.from_array(np.zeros((40, 2)), chunks=(10, 2))
    seen = Executor(cluster2).passes(X).fold(_threads_seen, None, name="threads")
    assert [engine for engine, _ in seen] == [1] * 4
