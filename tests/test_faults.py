"""Faults: a worker process killed in the middle of the CG, signals during writes, errors
in the middle of every writer. Outputs appear whole or not at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.checkpoint import FitCheckpoint
from daskkrr.data import convert_table, write_zarr
from daskkrr.signals import Interrupted, interrupt_on_signals

# FALKON's own preconditioner: a CG long enough for a kill to land in its middle (16 iterations to tol=1e-6; the
# disturbed and undisturbed fits do the same arithmetic, so they agree to round-off at any tol). strategy=
# "recompute": the data's blocks are held on the workers and every CG iteration is a pass over them there ("auto"
# takes the gram strategy at this size, whose CG runs in this process on an M x M matrix: the kill would hit an
# idle worker and nothing would be recomputed).
CONVERGED = dict(n_centers=200, penalty=1e-3, tol=1e-6, max_iter=80, random_state=3, preconditioner_rows=None,
                 strategy="recompute")


def _no_output(path: Path) -> None:
    assert not path.exists(), f"{path} exists"
    assert not list(path.parent.glob(f".{path.name}.*")), "a temporary sibling was left behind"


# ---------------------------------------------------------------- a worker dies mid-CG


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """4 blocks of 2500 rows, 2 held by each worker: the killed worker takes its blocks and running tasks with
    it, the kill landing between the CG's 4th and 6th iterations. Few blocks: each CG iteration is a pass of a
    task a block through the scheduler. (30 000 rows in 15 blocks: more work in each of the test's two fits for
    the same check.)"""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(10_000, 5))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.3 * X[:, 2] + 0.05 * rng.normal(size=10_000)
    return write_zarr(X, y, tmp_path_factory.mktemp("faults") / "train.zarr", chunk_rows=2500)


def test_fit_survives_a_killed_worker(store, own_cluster2, tmp_path, monkeypatch):
    """SIGKILL one of two worker processes during the CG: Dask recomputes what was lost (the
    nanny restarts the worker) and the fit ends with the coefficients of an undisturbed fit."""
    client = own_cluster2  # its own: a worker is killed
    with client.as_current():
        reference = FalkonRegressor(**CONVERGED).fit(store)
    assert reference.converged_ and reference.n_iter_ > 6

    victim: dict = {}
    killed = threading.Event()
    pids_before = client.run(os.getpid)
    save_cg = FitCheckpoint.save_cg

    def kill_a_worker() -> None:
        time.sleep(0.05)  # let the next pass start: the kill lands among running tasks
        address, pid = sorted(pids_before.items())[0]
        victim.update(address=address, pid=pid, at=time.perf_counter())
        os.kill(pid, signal.SIGKILL)
        killed.set()

    def save_and_kill(self, state):
        save_cg(self, state)
        if state.iteration == 4 and not victim:
            threading.Thread(target=kill_a_worker, daemon=True).start()
        elif state.iteration > 4:
            # Wait for the kill, whatever the thread's scheduling: without this a starved
            # thread (a loaded machine) could kill only after the fit had ended.
            assert killed.wait(timeout=60), "the killer thread did not run"

    monkeypatch.setattr(FitCheckpoint, "save_cg", save_and_kill)
    with client.as_current():
        model = FalkonRegressor(**CONVERGED).fit(store, checkpoint=tmp_path / "ck", checkpoint_every=2)
    finished = time.perf_counter()

    assert killed.is_set() and victim, "the worker was not killed"
    assert victim["at"] < finished, "the kill came after the fit"
    assert _dead(victim["pid"]), "the killed worker process is still running"
    # The nanny restarts it; the scheduler may not have noticed the death yet when a fast fit ends.
    deadline = time.monotonic() + 120
    while True:
        pids = client.run(os.getpid, on_error="ignore")
        if len(pids) == 2 and victim["pid"] not in pids.values():
            break
        assert time.monotonic() < deadline, f"no restarted worker after 120 s: {pids}"
        time.sleep(0.5)
    assert model.converged_ and model.n_iter_ == reference.n_iter_
    np.testing.assert_array_equal(model.center_indices_, reference.center_indices_)
    rel = np.linalg.norm(model.coef_ - reference.coef_) / np.linalg.norm(reference.coef_)
    assert rel <= 1e-12, rel


def _dead(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie not yet reaped by its parent counts as exited)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------- signals during writes


def _default_sigint() -> None:
    # A suite started in the background (`pytest &` from a script) ignores SIGINT, and a child
    # inherits that; Python then leaves Ctrl-C ignored. The command should see SIGINT as a user would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _daskkrr(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "daskkrr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_default_sigint)


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("csv") / "big.csv"
    np.savetxt(path, rng.normal(size=(80_000, 6)), delimiter=",", header="a,b,c,d,e,y", comments="", fmt="%.6f")
    return path


def test_a_signal_during_convert_leaves_nothing(tmp_path, big_csv):
    """SIGINT (Python's KeyboardInterrupt) and SIGTERM (daskkrr's handler), each sent once the hidden
    temporary store holds chunks: the command exits with 128 + n and leaves nothing. The two commands run
    side by side: each is mostly its imports, so together they take about the time of one on 2 cores."""
    runs = {}
    for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)):
        folder = tmp_path / signal.Signals(signum).name
        folder.mkdir()
        proc = _daskkrr("convert", str(big_csv), str(folder / "out.zarr"), "--target", "y", "--chunk-rows", "500")
        runs[signum] = (folder, code, proc)

    waiting = dict(runs)
    deadline = time.monotonic() + 120.0
    while waiting:  # signal each command as soon as it writes, as a lone command would be
        for signum, (folder, _, proc) in list(waiting.items()):
            if any(folder.glob(".out.zarr.tmp-*/X/c/*")):  # the hidden temporary store holds some chunks
                proc.send_signal(signum)
                del waiting[signum]
            elif proc.poll() is not None:
                raise AssertionError(f"the command ended (code {proc.returncode}) too early: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            for _, _, proc in runs.values():
                proc.kill()
            raise AssertionError(f"timed out waiting for {sorted(waiting)} to write")
        time.sleep(0.02)

    for signum, (folder, code, proc) in runs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, (signum, err)
        assert "daskkrr: interrupted" in err and "no partial output was left" in err, (signum, err)
        _no_output(folder / "out.zarr")


def test_signal_handler_is_scoped():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info:
        with interrupt_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted long before
    assert info.value.signum == signal.SIGTERM and "SIGTERM" in str(info.value)
    assert isinstance(info.value, KeyboardInterrupt)  # unwinds like Ctrl-C
    assert signal.getsignal(signal.SIGTERM) is before


# ---------------------------------------------------------------- errors in the middle of writers


def test_error_mid_convert_leaves_nothing(tmp_path, big_csv, monkeypatch):
    import daskkrr.data.tables as tables

    real, calls = tables._numeric_block, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(tables, "_numeric_block", failing)
    with pytest.raises(OSError, match="disk full"):
        convert_table(big_csv, tmp_path / "out.zarr", target="y", chunk_rows=1000)
    _no_output(tmp_path / "out.zarr")


def test_error_mid_model_save_keeps_the_old_model(tmp_path, monkeypatch):
    import daskkrr
    import daskkrr.models.persistence as persistence

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    old = FalkonRegressor(n_centers=10, random_state=0).fit(X, X[:, 0])
    path = old.save(tmp_path / "model")
    new = FalkonRegressor(n_centers=20, random_state=1).fit(X, X[:, 1])

    def broken_dumps(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(persistence, "dumps_strict", broken_dumps)  # after the arrays were written
    with pytest.raises(OSError, match="disk full"):
        new.save(path, overwrite=True)
    monkeypatch.undo()
    assert daskkrr.load(path).centers_.shape == (10, 2)  # the old model, whole
    assert not list(tmp_path.glob(".model.*"))
    with pytest.raises(OSError, match="disk full"):
        monkeypatch.setattr(persistence, "dumps_strict", broken_dumps)
        new.save(tmp_path / "fresh")
    _no_output(tmp_path / "fresh")
