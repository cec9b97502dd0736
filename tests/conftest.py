"""Shared fixtures: small seeded data, the shared real data sets, local clusters."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

# Block tasks run BLAS inside dask threads/workers: one BLAS thread each keeps the
# 2-core CI machine from oversubscription. The variables reach worker processes;
# numpy may already be loaded here (by plugins), so limit this process directly too.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from distributed import Client

_BLAS_ONE_THREAD = threadpool_limits(limits=1, user_api="blas")

#: A worker preload that ends a closed worker's process without finalising Python (seconds per cluster
#: closed or worker restarted; see the module). The clusters daskkrr starts itself (the CLI's) add it on
#: their own; the tests' own clusters get it from this process's Dask config (pytest_configure), and
#: through the environment so do any other clusters in subprocesses.
_WORKER_FAST_EXIT = "daskkrr.parallel.worker_exit"
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PRELOAD", repr([_WORKER_FAST_EXIT]))

#: The run's clusters idle between tests (``cluster2`` lives from its first test to the end of the run), and
#: an idle cluster still works: each worker's statistical profiler samples its threads every 10 ms, and every
#: server, the scheduler in this process among them, checks its event loop every 20 ms. No test reads the
#: profiles or needs a finer check. Off and at 200 ms, an idle 2-worker cluster took 0.034 of a core instead
#: of 0.10 (its workers 0.015 instead of 0.058, this process 0.019 instead of 0.043; 30 s measured).
#: Through the environment, so clusters in subprocesses are quiet too; a value set outside the run is kept.
_QUIET_CLUSTERS = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "200ms"}


def _dask_env(key: str) -> str:
    """The environment variable of a Dask config key."""
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


for _key, _value in _QUIET_CLUSTERS.items():
    os.environ.setdefault(_dask_env(_key), str(_value))


#: Most test processes ``-n auto`` starts (``addopts`` in pyproject.toml): each starts its own session
#: clusters and seed pool, and the tests' own threads and worker processes already fill a few cores.
MAX_TEST_PROCESSES = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process per core, at most :data:`MAX_TEST_PROCESSES`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_TEST_PROCESSES, cores))


def pytest_configure(config: pytest.Config) -> None:
    """Compile the fused engine into numba's cache first (once per checkout and numba version), and
    give the run's clusters the worker preload :mod:`daskkrr.parallel.worker_exit` and the quiet settings
    of :data:`_QUIET_CLUSTERS`.

    Without the compile, ``engine="auto"`` would run the BLAS engine until a background compile
    finished, so which engine a test sees would depend on timing.
    """
    import dask

    from daskkrr.kernels import warmup
    from daskkrr.utils.optional import numba_installed

    preload = list(dask.config.get("distributed.worker.preload", []))
    if _WORKER_FAST_EXIT not in preload:  # dask was imported (by a plugin) before the environment was set
        dask.config.set({"distributed.worker.preload": [*preload, _WORKER_FAST_EXIT]})
    for key, value in _QUIET_CLUSTERS.items():
        if os.environ[_dask_env(key)] == str(value):  # ours (not set outside the run): this process's clusters too
            dask.config.set({key: value})
    if numba_installed():
        warmup.warm_up()

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_file(name: str) -> Path:
    """Path of a file in ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is absent: the shared data sets live beside the checkout in CI only")
    return path


@pytest.fixture
def regression_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1200, 4))
    y = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.05 * rng.normal(size=1200)
    return X, y


@contextlib.contextmanager
def _two_worker_client() -> Iterator[Client]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, memory_limit="2GiB") as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield client


@pytest.fixture(scope="session")
def cluster2() -> Iterator[Client]:
    """A LocalCluster with two single-threaded worker processes, shared by the whole run.

    Shared because each new cluster costs its start and, in the first fit, the workers'
    imports of daskkrr and the engine (several seconds each on 2 cores). Tests that harm
    their cluster (kill a worker) take :func:`own_cluster2` instead.
    """
    with _two_worker_client() as client:
        yield client


@pytest.fixture(scope="module")
def own_cluster2() -> Iterator[Client]:
    """Like :func:`cluster2`, but the module's own: for tests that kill or reconfigure its workers."""
    with _two_worker_client() as client:
        yield client


def _one_thread_per_pool_process() -> None:
    """Start of a :func:`seed_pool` process: one engine thread and one BLAS thread.

    The two processes already fill the two cores. Each runs its seeds on its main thread, where the
    fused engine would otherwise split every block over all cores (daskkrr.kernels.thread_rule):
    four threads on two cores. The environment's BLAS limit reaches a spawned process only when the
    run set it (``setdefault`` above), so it is set here too.
    """
    import atexit

    from daskkrr.parallel.worker_exit import end_process

    os.environ["DASKKRR_ENGINE_THREADS"] = "1"
    threadpool_limits(limits=1, user_api="blas")
    # At the end of the run, end without finalising Python (daskkrr/parallel/worker_exit.py says why): the
    # pool's shutdown waits for it. Its tasks' results went back through the pool; nothing else is kept.
    atexit.register(end_process)


@pytest.fixture(scope="session")
def seed_pool() -> Iterator[Executor]:
    """Two fresh processes for the statistical tests' loops over independent seeds.

    The run's own process computes on one core (one BLAS thread, above); a loop over 30 or 40
    seeds split between two processes keeps both cores of the 2-core CI machine busy. Spawned,
    not forked: the run's process holds Dask threads and cluster connections that a fork would
    copy mid-use. They import numpy and daskkrr once and serve the whole run; what they run must
    be a module-level function (pickled by name) of independent arguments.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_one_thread_per_pool_process) as pool:
        yield pool
