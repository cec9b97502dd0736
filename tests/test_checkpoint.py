"""Checkpoints: exact continuation of the CG, refusal of another fit's checkpoint, atomic
saves, and a fit whose client process is killed (SIGKILL) and then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import daskkrr
from daskkrr import FalkonClassifier, FalkonRegressor
from daskkrr.checkpoint import CHECKPOINT_FILE, FORMAT_VERSION, CheckpointError, FitCheckpoint
from daskkrr.data import write_zarr
from daskkrr.solvers import CGState, conjugate_gradient

PARAMS = dict(n_centers=150, penalty=1e-4, tol=1e-12, max_iter=30, random_state=0, chunks=500)


class Stop(Exception):
    """Stands in for a crash right after a checkpoint was saved."""


def _stop_after(monkeypatch, iteration: int) -> None:
    save_cg = FitCheckpoint.save_cg

    def save_then_crash(self, state):
        save_cg(self, state)
        if state.iteration >= iteration:
            raise Stop(state.iteration)

    monkeypatch.setattr(FitCheckpoint, "save_cg", save_then_crash)


def _meta(ckpt: Path) -> dict:
    with np.load(ckpt / CHECKPOINT_FILE, allow_pickle=False) as npz:
        return json.loads(str(npz["meta"]))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 4))
    return X, np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=3000)


@pytest.fixture(scope="module")
def reference(data):
    return FalkonRegressor(**PARAMS).fit(*data)


# ---------------------------------------------------------------- the CG alone


def test_cg_continues_bit_for_bit_from_a_saved_state():
    rng = np.random.default_rng(1)
    Q, _ = np.linalg.qr(rng.normal(size=(80, 80)))
    A = (Q * np.geomspace(1, 1e4, 80)) @ Q.T
    B = rng.normal(size=(80, 2))
    full = conjugate_gradient(lambda P: A @ P, B, tol=1e-12, max_iter=200)
    saved: list[CGState] = []

    def keep_and_crash(state: CGState) -> None:
        saved.append(CGState.from_arrays(state.to_arrays()))  # through the file format
        if state.iteration == 21:
            raise Stop

    with pytest.raises(Stop):
        conjugate_gradient(lambda P: A @ P, B, tol=1e-12, max_iter=200, on_state=keep_and_crash, state_every=7)
    assert [s.iteration for s in saved] == [7, 14, 21]
    resumed = conjugate_gradient(lambda P: A @ P, B, tol=1e-12, max_iter=200, state=saved[-1])
    assert resumed.n_iter == full.n_iter and resumed.n_matvec == full.n_matvec
    np.testing.assert_array_equal(resumed.x, full.x)
    np.testing.assert_array_equal(resumed.residuals, full.residuals)
    with pytest.raises(ValueError, match="saved for a different right-hand side"):
        conjugate_gradient(lambda P: A @ P, B + 1, state=saved[-1])
    with pytest.raises(ValueError, match=r"right-hand side of shape \(80, 2\).*\(80, 1\)"):
        conjugate_gradient(lambda P: A @ P, B[:, 0], state=saved[-1])


# ---------------------------------------------------------------- fits


def test_resumed_fit_equals_the_uninterrupted_fit(data, reference, tmp_path, monkeypatch):
    ckpt = tmp_path / "ck"
    _stop_after(monkeypatch, 8)
    with pytest.raises(Stop):
        FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, checkpoint_every=4)
    monkeypatch.undo()
    meta = _meta(ckpt)
    assert meta["stage"] == "cg" and meta["iteration"] == 8
    assert sorted(p.name for p in ckpt.iterdir()) == [CHECKPOINT_FILE]  # no temporaries

    sampled = []
    from daskkrr.sampling import UniformSampler

    monkeypatch.setattr(UniformSampler, "select", lambda *a, **k: sampled.append(1))
    resumed = FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, resume=True)
    assert not sampled, "the centers come from the checkpoint"
    assert resumed.n_iter_ == reference.n_iter_
    np.testing.assert_array_equal(resumed.center_indices_, reference.center_indices_)
    np.testing.assert_array_equal(resumed.coef_, reference.coef_)
    np.testing.assert_array_equal(resumed.residuals_, reference.residuals_)
    # a finished checkpoint resumes to the same model at once
    again = FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, resume=True)
    np.testing.assert_array_equal(again.coef_, reference.coef_)


def test_resume_with_more_iterations_continues(data, tmp_path):
    ckpt = tmp_path / "ck"
    short = FalkonRegressor(**{**PARAMS, "max_iter": 10}).fit(*data, checkpoint=ckpt, checkpoint_every=3)
    assert short.n_iter_ == 10 and _meta(ckpt)["iteration"] == 10
    longer = FalkonRegressor(**{**PARAMS, "max_iter": 20}).fit(*data, checkpoint=ckpt, resume=True)
    direct = FalkonRegressor(**{**PARAMS, "max_iter": 20}).fit(*data)
    assert longer.n_iter_ == 20
    np.testing.assert_array_equal(longer.coef_, direct.coef_)


def test_multiclass_classifier_resumes(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(1500, 2))
    y = np.digitize(np.hypot(X[:, 0], X[:, 1]), [0.8, 1.5])
    params = dict(n_centers=100, penalty=1e-4, tol=1e-12, max_iter=25, random_state=1)
    full = FalkonClassifier(**params).fit(X, y)
    _stop_after(monkeypatch, 6)
    with pytest.raises(Stop):
        FalkonClassifier(**params).fit(X, y, checkpoint=tmp_path / "ck", checkpoint_every=3)
    monkeypatch.undo()
    resumed = FalkonClassifier(**params).fit(X, y, checkpoint=tmp_path / "ck", resume=True)
    np.testing.assert_array_equal(resumed.coef_, full.coef_)
    np.testing.assert_array_equal(resumed.classes_, full.classes_)


def test_resume_without_a_checkpoint_starts_afresh(data, reference, tmp_path):
    model = FalkonRegressor(**PARAMS).fit(*data, checkpoint=tmp_path / "new", resume=True)
    np.testing.assert_array_equal(model.coef_, reference.coef_)
    assert _meta(tmp_path / "new")["iteration"] == reference.n_iter_


# ---------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def saved_checkpoint(data, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("saved") / "ck"
    FalkonRegressor(**{**PARAMS, "max_iter": 4}).fit(*data, checkpoint=ckpt, checkpoint_every=2)
    return ckpt


def _copy(src: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, tmp_path / "ck"))


def test_existing_checkpoint_needs_resume(data, saved_checkpoint, tmp_path):
    ckpt = _copy(saved_checkpoint, tmp_path)
    before = (ckpt / CHECKPOINT_FILE).read_bytes()
    match = r"already holds a checkpoint .*pass resume=True \(daskkrr fit --resume\)"
    with pytest.raises(FileExistsError, match=match):
        FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt)
    assert (ckpt / CHECKPOINT_FILE).read_bytes() == before


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda X, y, p: (X, y, {**p, "penalty": 1e-3}), r"params.penalty \(checkpoint 0.0001, now 0.001\)"),
        (lambda X, y, p: (X, y, {**p, "kernel": "laplacian"}), r"params.kernel \(checkpoint 'gaussian', now "
                                                               r"'laplacian'\)"),
        (lambda X, y, p: (X[:-1], y[:-1], p), r"row block 5 holds rows 2500-2999 in the checkpoint but rows "
                                              r"2500-2998 now: the data now have 2999 rows, the checkpoint's 3000"),
        (lambda X, y, p: (X, y, {**p, "chunks": 600}), r"params.chunks \(checkpoint 500, now 600\); row block 0 "
                                                       r"holds rows 0-499 .* but rows 0-599 now: the row chunking"),
        (lambda X, y, p: (X, np.where(np.arange(3000) == 2999, 5.0, y), p), r"row block 5 \(rows 2500-2999\) "
                                                                            "differs in y"),
        (lambda X, y, p: (X * np.where(np.arange(3000) == 10, 2.0, 1.0)[:, None], y, p),
         r"row block 0 \(rows 0-499\) differs in X"),
    ],
    ids=["penalty", "kernel", "rows", "chunks", "target-values", "feature-values"],
)
def test_checkpoint_of_another_fit_is_refused(data, saved_checkpoint, tmp_path, change, match):
    ckpt = _copy(saved_checkpoint, tmp_path)
    before = (ckpt / CHECKPOINT_FILE).read_bytes()
    X, y, params = change(*data, dict(PARAMS))
    with pytest.raises(CheckpointError, match=rf"checkpoint .*ck belongs to a different fit: .*{match}.*"
                                              r"Resume with the same data and parameters, or delete"):
        FalkonRegressor(**params).fit(X, y, checkpoint=ckpt, resume=True)
    assert (ckpt / CHECKPOINT_FILE).read_bytes() == before  # left as it was


def test_max_iter_and_tol_may_change(data, saved_checkpoint, tmp_path):
    ckpt = _copy(saved_checkpoint, tmp_path)
    FalkonRegressor(**{**PARAMS, "max_iter": 6, "tol": 1e-10}).fit(*data, checkpoint=ckpt, resume=True)
    assert _meta(ckpt)["iteration"] == 6


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda a: a.update(meta=np.array(json.dumps({**json.loads(str(a["meta"])), "format_version": 7}))),
         f"has format version 7, but this daskkrr reads version {FORMAT_VERSION}"),
        (lambda a: a.update(meta=np.array("{}")), "is not a daskkrr checkpoint"),
        (lambda a: a.update(cg_x=np.zeros(3)), r"is damaged \(CG state: x has shape"),
        (lambda a: a.pop("cg_history"), r"is damaged \(CG state lacks \['history'\]"),
        (lambda a: a.update(centers=np.array([None, "os.system"], dtype=object)), "cannot be read"),
    ],
    ids=["version", "format", "shape", "missing", "pickle"],
)
def test_damaged_checkpoint_is_refused(data, saved_checkpoint, tmp_path, edit, match):
    ckpt = _copy(saved_checkpoint, tmp_path)
    with np.load(ckpt / CHECKPOINT_FILE, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    edit(arrays)
    np.savez(ckpt / CHECKPOINT_FILE, **arrays)  # an object array is written with pickle
    with pytest.raises(CheckpointError, match=rf"{match}.*delete .*ck to start the fit over"):
        FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, resume=True)


def test_checkpoint_file_that_is_not_npz(data, saved_checkpoint, tmp_path):
    ckpt = _copy(saved_checkpoint, tmp_path)
    (ckpt / CHECKPOINT_FILE).write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="cannot be read"):
        FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, resume=True)


def test_failed_save_keeps_the_previous_checkpoint(data, tmp_path, monkeypatch):
    ckpt = tmp_path / "ck"
    real_savez, calls = np.savez, []

    def savez_fails_on_cg_iteration_4(file, **arrays):
        if "cg_iteration" in arrays and int(arrays["cg_iteration"]) == 4:
            file.write(b"partial")
            raise OSError("disk full")
        calls.append(1)
        return real_savez(file, **arrays)

    monkeypatch.setattr(np, "savez", savez_fails_on_cg_iteration_4)
    with pytest.raises(OSError, match="disk full"):
        FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, checkpoint_every=2)
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.iterdir()) == [CHECKPOINT_FILE]  # the temporary is gone
    assert _meta(ckpt)["iteration"] == 2  # the last good one, whole


def test_interruption_inside_the_temporary_files_creation_leaves_nothing(data, tmp_path, monkeypatch):
    """A signal can land after open() created the temporary file but before it returned (what
    tempfile.mkstemp could not clean up): the writer knows the name beforehand and removes it."""
    import daskkrr.checkpoint as checkpoint_module

    ckpt = tmp_path / "ck"
    real_open, seen = os.open, []

    def open_then_interrupted(path, flags, *args):
        fd = real_open(path, flags, *args)
        if Path(path).name.startswith(".checkpoint.npz.tmp-"):
            seen.append(path)
            if len(seen) == 3:  # the third write
                os.close(fd)
                raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(checkpoint_module.os, "open", open_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        FalkonRegressor(**PARAMS).fit(*data, checkpoint=ckpt, checkpoint_every=1)
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.iterdir()) == [CHECKPOINT_FILE]


# ---------------------------------------------------------------- the client process dies


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(20_000, 5))
    y = np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=20_000)
    return write_zarr(X, y, tmp_path_factory.mktemp("client") / "train.zarr", chunk_rows=2500)


CLI_FIT = ["--centers", "300", "--penalty", "1e-3", "--sigma", "2.0", "--tol", "1e-11", "--max-iter", "60",
           "--seed", "4"]
#: FALKON's own preconditioner: 32 CG iterations instead of 17 with the row sketch, so that the
#: signals below land mid-CG even when the machine is slow to notice the checkpoint.
CLI_CONFIG = '[model]\npreconditioner_rows = "none"\n'


def _daskkrr(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "daskkrr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_iteration(ckpt: Path, proc: subprocess.Popen, iteration: int, timeout: float = 180.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        if (ckpt / CHECKPOINT_FILE).exists():
            meta = _meta(ckpt)
            if meta.get("iteration", -1) >= iteration:
                return meta["iteration"]
        if proc.poll() is not None:
            raise AssertionError(f"the fit ended (code {proc.returncode}) before iteration {iteration}: "
                                 f"{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for a checkpoint")
        time.sleep(0.02)


def _descendants(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _assert_gone(processes, timeout: float = 30.0) -> None:
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"processes outlived the killed client: {alive}"


@pytest.fixture(scope="module")
def uninterrupted(store):
    """The same fit, never interrupted, in this process (threaded scheduler)."""
    return FalkonRegressor(n_centers=300, penalty=1e-3, sigma=2.0, tol=1e-11, max_iter=60, random_state=4,
                           preconditioner_rows=None).fit(store)


@pytest.mark.slow  # three CLI fits in new processes: 33 s
def test_client_terminated_killed_and_resumed(store, uninterrupted, cluster2, tmp_path, capsys):
    """A fit on its own local cluster gets SIGTERM (clean exit), is resumed and then gets
    SIGKILL (no clean-up at all), and is resumed again: the model equals the fit that was
    never interrupted, and no worker process outlives its client."""
    from daskkrr.cli import main

    assert uninterrupted.converged_
    ckpt, out, config = tmp_path / "ck", tmp_path / "model", tmp_path / "model.toml"
    config.write_text(CLI_CONFIG)
    fit = ["fit", "--data", str(store), "--out", str(out), *CLI_FIT, "--config", str(config), "--checkpoint", str(ckpt)]

    # 1. SIGTERM mid-CG: exit 128 + 15, local cluster closed, no model, checkpoint whole
    proc = _daskkrr(*fit, "--checkpoint-every", "1", "--workers", "1")
    _wait_for_iteration(ckpt, proc, 2)
    workers = _descendants(proc.pid)
    assert workers, "the command should run its own local cluster"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "daskkrr: interrupted (received SIGTERM)" in err
    _assert_gone(workers)
    assert not out.exists() and not list(tmp_path.glob(".model.*"))
    assert sorted(p.name for p in ckpt.iterdir()) == [CHECKPOINT_FILE]
    first = _meta(ckpt)["iteration"]
    assert 2 <= first < uninterrupted.n_iter_

    # 2. resumed, then SIGKILL mid-CG: the client dies without any clean-up
    proc = _daskkrr(*fit, "--checkpoint-every", "1", "--workers", "1", "--resume")
    _wait_for_iteration(ckpt, proc, first + 2)
    workers = _descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    _assert_gone(workers)  # the local cluster's processes went down with their client
    assert not out.exists()
    second = _meta(ckpt)["iteration"]
    assert first + 2 <= second < uninterrupted.n_iter_, "killed after the fit had finished"

    # 3. resumed to the end (here on an already running cluster)
    assert main([*fit, "--resume", "--scheduler", cluster2.scheduler.address]) == 0, capsys.readouterr().err
    model = daskkrr.load(out)
    assert model.converged_
    np.testing.assert_array_equal(model.center_indices_, uninterrupted.center_indices_)
    rel = np.linalg.norm(model.coef_ - uninterrupted.coef_) / np.linalg.norm(uninterrupted.coef_)
    # Three processes and two schedulers did parts of this fit: equal up to round-off (which
    # may also move the last CG iteration across the tolerance, hence +-1 iteration). Bound: both
    # solutions have relative residuals <= tol = 1e-11, so they differ by <= 2 * kappa * tol with
    # kappa the preconditioned system's condition (FALKON's preconditioner at penalty 1e-3: far below
    # 50): <= 1e-9 on any CPU; the summation order adds only about blocks * eps = 2e-15 per product.
    assert abs(model.n_iter_ - uninterrupted.n_iter_) <= 1, (model.n_iter_, uninterrupted.n_iter_)
    assert rel <= 1e-9, rel
