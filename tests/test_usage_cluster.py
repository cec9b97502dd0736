"""Cluster submission: `daskkrr fit/predict --scheduler` against `dask scheduler` + 2 `dask worker` processes.

The same fit on a local cluster started by the command line gives the same model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

import daskkrr
from daskkrr.data import write_regression_zarr

FIT_ARGS = ["--centers", "120", "--sigma", "2.0", "--penalty", "1e-5", "--max-iter", "8", "--seed", "0"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DASK_LOGGING__DISTRIBUTED": "error"}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    """Workers first (they close cleanly while their scheduler is up), then the scheduler."""
    for group in (procs[1:], procs[:1]):
        for p in group:
            if p.poll() is None:
                p.terminate()
        for p in group:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.fixture
def loopback_cluster(tmp_path):
    """`dask scheduler` and two single-threaded `dask worker` processes on 127.0.0.1."""
    from distributed import Client

    sched_file = tmp_path / "scheduler.json"
    dask_cli = [sys.executable, "-m", "dask"]
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        log = open(tmp_path / "scheduler.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            [*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
             "--scheduler-file", str(sched_file)],
            stdout=log, stderr=subprocess.STDOUT, env=_env(),
        ))
        deadline = time.monotonic() + 60
        while not (sched_file.is_file() and sched_file.stat().st_size):
            if procs[0].poll() is not None or time.monotonic() > deadline:
                pytest.fail("dask scheduler did not start: " + (tmp_path / "scheduler.log").read_text()[-2000:])
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for i in range(2):
            log = open(tmp_path / f"worker{i}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [*dask_cli, "worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--no-dashboard",
                 "--no-nanny", "--memory-limit", "2GiB", "--name", f"w{i}"],
                stdout=log, stderr=subprocess.STDOUT, env=_env(),
            ))
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=90)
            assert len(client.scheduler_info()["workers"]) == 2
            yield address, client
    finally:
        _stop(procs)
        for log in logs:
            log.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "daskkrr.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env or _env())
    assert proc.returncode == 0, f"daskkrr {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow  # starts `dask scheduler`/`dask worker` commands: 35 s
def test_fit_and_predict_on_a_running_cluster_match_a_local_cluster(loopback_cluster, tmp_path):
    address, client = loopback_cluster
    store = tmp_path / "train.zarr"
    write_regression_zarr(store, 6000, 4, chunk_rows=1000, random_state=0)

    remote = tmp_path / "model-remote"
    fit = _cli("fit", "--scheduler", address, "--data", str(store), "--out", str(remote), *FIT_ARGS)
    assert "fitted FalkonRegressor with 120 centers" in fit.stdout
    # progress went to stderr: phases, CG iterations, the dashboard page of *that* scheduler
    assert "CG 8/8" in fit.stderr and fit.stderr.rstrip().splitlines()[-1].startswith("done")
    dashboard = client.dashboard_link.rsplit("/status", 1)[0]
    assert f"progress on the dashboard: {dashboard}/daskkrr" in fit.stderr
    # the fit ran on these workers: it published its record to this scheduler
    fits = client.get_metadata(["daskkrr", "fits"])
    (record,) = fits.values()
    assert record["status"] == "done" and record["n_rows"] == 6000 and record["cg_iteration"] == 8
    # the scheduler plugin counted the fit's block tasks as the workers finished them
    counts = client.get_metadata(["daskkrr", "blocks"])[record["fit_id"]]
    assert sum(counts.values()) >= record["n_blocks"]

    # predict finds the scheduler through $DASK_SCHEDULER_ADDRESS
    preds = tmp_path / "pred-remote.zarr"
    _cli("predict", "--model", str(remote), "--data", str(store), "--out", str(preds),
         env={**_env(), "DASK_SCHEDULER_ADDRESS": address})

    local = tmp_path / "model-local"
    _cli("fit", "--workers", "2", "--data", str(store), "--out", str(local), "--no-progress", *FIT_ARGS)

    a, b = daskkrr.load(remote), daskkrr.load(local)
    np.testing.assert_array_equal(a.centers_, b.centers_)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-8, atol=1e-10 * np.abs(b.coef_).max())
    assert a.n_iter_ == b.n_iter_ == 8
    X = zarr.open_group(str(store), mode="r")["X"][:]
    y_pred = zarr.open_group(str(preds), mode="r")["y_pred"][:]
    np.testing.assert_allclose(y_pred, b.predict(X), rtol=1e-7, atol=1e-9)
    y = zarr.open_group(str(store), mode="r")["y"][:]
    assert 1 - np.mean((y_pred - y) ** 2) / np.var(y) > 0.8


@pytest.mark.slow  # the CLI starts and stops a cluster of its own: 6 s
def test_cli_without_a_scheduler_closes_the_cluster_it_started(tmp_path, monkeypatch):
    """No --scheduler and no $DASK_SCHEDULER_ADDRESS: a local cluster is started, used and closed."""
    import psutil
    from distributed import LocalCluster

    from daskkrr.cli import main

    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    started: list[int] = []
    original = LocalCluster.__init__

    def spy(self, *args, **kwargs):
        started.append(kwargs.get("n_workers"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(LocalCluster, "__init__", spy)
    def workers() -> set[int]:  # our child processes, less multiprocessing's resource tracker
        pids = set()
        for c in psutil.Process().children(recursive=True):
            try:
                if c.is_running() and "resource_tracker" not in " ".join(c.cmdline()):
                    pids.add(c.pid)
            except psutil.Error:  # it ended while we looked
                pass
        return pids

    before = workers()
    store = tmp_path / "small.zarr"
    assert main(["generate", str(store), "--n", "2000", "--d", "3", "--chunk-rows", "500", "--workers", "1"]) == 0
    assert started == [1] and (store / "zarr.json").is_file()
    deadline = time.monotonic() + 10
    while workers() - before:
        assert time.monotonic() < deadline, "the local cluster's worker processes outlived the command"
        time.sleep(0.2)
