"""``daskkrr run``: the shipped example workflows end to end, failures, locking, re-runs, validation."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

import daskkrr
from daskkrr.cli import main
from daskkrr.data import write_regression_zarr
from daskkrr.workflow import (
    WorkflowError,
    WorkflowLockedError,
    WorkflowRunError,
    read_status,
    read_workflow,
    run_workflow,
)
from daskkrr.workflow.rundir import workflow_lock
from tests.conftest import SHARED_DATA

EXAMPLES = Path(__file__).resolve().parents[1] / "workflows" / "examples"

# Small settings for the examples (the files themselves are sized for real runs).
SMALL_MODEL = ["model.n_centers=80", "model.max_iter=5"]


@pytest.fixture(scope="module")
def growing_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "growing.zarr"
    write_regression_zarr(path, 3000, 4, chunk_rows=1000, random_state=0)
    return path


def _run_files(run_dir: Path) -> set[str]:
    return {p.name for p in run_dir.iterdir()}


def test_nightly_example_runs_twice_on_a_growing_store(cluster2, growing_store, tmp_path, capsys):
    """Two runs of one config, the second through ``daskkrr run`` on the running cluster (the command's
    exit code and success line were checked by a third run of this workflow, in a test of its own)."""
    runs = tmp_path / "runs"
    store = tmp_path / "growing.zarr"
    shutil.copytree(growing_store, store)
    overrides = [f"data.store={store}", "preprocess.chunk_rows=1000", *SMALL_MODEL]
    first = run_workflow(EXAMPLES / "nightly_retrain.toml", overrides=overrides, runs_dir=runs, client=cluster2)
    assert first.status == "succeeded"
    expected = {"status.json", "config.json", "run.log", "metrics.json", "model", "predictions.zarr"}
    assert expected <= _run_files(first.run_dir)
    metrics = json.loads((first.run_dir / "metrics.json").read_text())
    assert metrics["data"]["n_rows"] == 3000 and metrics["metrics"]["n_test"] == 300
    assert metrics["metrics"]["r2"] > 0.3 and metrics["refit"]["n_centers"] == 80
    config = json.loads((first.run_dir / "config.json").read_text())
    assert config["data"]["store"] == str(store) and config["model"]["n_centers"] == 80
    log = (first.run_dir / "run.log").read_text()
    assert "CG iteration" in log and "succeeded" in log
    pred = zarr.open_group(str(first.run_dir / "predictions.zarr"), mode="r")["y_pred"]
    assert pred.shape == (300,)
    model = daskkrr.load(first.run_dir / "model")
    assert model.centers_.shape == (80, 4)

    # the store grows; the same config runs again, from the command line on the running cluster,
    # into a new directory; the first is untouched
    shutil.rmtree(store)
    write_regression_zarr(store, 4000, 4, chunk_rows=1000, random_state=0)
    capsys.readouterr()
    code = main(["run", str(EXAMPLES / "nightly_retrain.toml"), "--runs-dir", str(runs),
                 *[a for o in overrides for a in ("--set", o)], "--no-progress",
                 "--scheduler", cluster2.scheduler.address])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("run ") and "succeeded" in out and "rmse" in out
    second = os.readlink(runs / "latest")
    assert second != first.run_id and read_status(first.run_dir)["status"] == "succeeded"
    metrics = json.loads((runs / second / "metrics.json").read_text())
    assert metrics["data"]["n_rows"] == 4000 and second in out


def test_benchmark_example_sweeps_and_records_every_variant(cluster2, tmp_path):
    result = run_workflow(
        EXAMPLES / "benchmark.toml",
        overrides=["data.generate={ n = 4000, d = 4, seed = 0, chunk_rows = 1000 }", "model.max_iter=4",
                   "sweep.n_centers=[40, 120]"],
        runs_dir=tmp_path / "runs", client=cluster2,
    )
    m = result.metrics
    assert [v["params"]["n_centers"] for v in m["variants"]] == [40, 120]
    assert all(0 < v["rmse"] and "fit_seconds" in v for v in m["variants"])
    best = min(m["variants"], key=lambda v: v["rmse"])
    assert m["best_params"] == best["params"] and m["metrics"]["rmse"] == best["rmse"]
    assert "model" not in _run_files(result.run_dir)  # the benchmark keeps figures only
    # the generated data are cached for the next run
    assert len(list((tmp_path / "runs" / "cache").glob("generated-*.zarr"))) == 1


def test_cross_validation_on_a_table(cluster2, tmp_path):
    table = SHARED_DATA / "537_houses.tsv.gz"
    # Two folds, not the example's three: the fold loop and its mean and std are the same; a fold is a cluster fit.
    overrides = ["preprocess.max_rows=3000", "preprocess.chunk_rows=1000", "evaluation.folds=2", *SMALL_MODEL]
    if not table.is_file():  # the example's own table is in ../shared/data; else a small stand-in
        table = tmp_path / "small.csv"
        rng = np.random.default_rng(0)
        X = rng.normal(size=(600, 3))
        rows = ["a,b,c,target"] + [f"{a},{b},{c},{np.sin(a) + b}" for a, b, c in X]
        table.write_text("\n".join(rows) + "\n")
        # 5 CG steps leave this stand-in's fit at residual ~0.3 (R2 ~0.28): let CG reach its tolerance
        overrides += [f"data.table={table}", "data.target=target", "model.max_iter=100"]
    result = run_workflow(EXAMPLES / "houses_cv.toml", overrides=overrides, runs_dir=tmp_path / "runs",
                          client=cluster2)
    m = result.metrics
    assert m["evaluation"] == "cv" and m["metrics"]["folds"] == 2
    assert m["metrics"]["r2"] > 0.3 and "r2_std" in m["metrics"]
    assert m["refit"] is not None and (result.run_dir / "model").is_dir()
    cached = list((tmp_path / "runs" / "cache").glob("*.zarr"))
    assert len(cached) == 1 and cached[0].with_name(cached[0].name + ".source.json").is_file()


def test_cli_run_failure_exits_nonzero_and_marks_the_directory(cluster2, tmp_path, capsys):
    runs = tmp_path / "runs"
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[data]\nstore = "{tmp_path / "missing.zarr"}"\n[model]\nn_centers = 10\n')
    code = main(["run", str(bad), "--runs-dir", str(runs), "--scheduler", cluster2.scheduler.address])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("daskkrr: error: run ") and "missing.zarr" in err
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir() and p.name != "cache"]
    status = read_status(run_dir)
    assert status["status"] == "failed" and "missing.zarr" in status["error"]
    assert (run_dir / "FAILED").is_file() and not (run_dir / "metrics.json").exists()
    assert not (runs / "latest").exists()
    # the Python API raises, and says where the failed run is
    with pytest.raises(WorkflowRunError) as info:
        run_workflow(bad, runs_dir=runs, client=cluster2)
    assert info.value.result.status == "failed" and info.value.result.run_dir.parent == runs


def test_a_second_run_of_the_same_workflow_waits_its_turn(tmp_path):
    runs = tmp_path / "runs"
    with workflow_lock(runs):
        with pytest.raises(WorkflowLockedError, match="in progress"):
            run_workflow({"data": {"generate": {"n": 100, "d": 2}}}, runs_dir=runs)
    assert [p.name for p in runs.iterdir()] == [".lock"]  # nothing was started


def test_a_run_left_running_by_a_dead_process_is_marked_failed(cluster2, growing_store, tmp_path):
    runs = tmp_path / "runs"
    dead = runs / "20200101T000000Z-dead00"
    dead.mkdir(parents=True)
    (dead / "status.json").write_text(json.dumps({"status": "running", "run_id": dead.name}))
    run_workflow({"data": {"store": str(growing_store)}, "model": {"n_centers": 20, "max_iter": 2},
                  "evaluation": {"method": "none"}}, runs_dir=runs, client=cluster2)
    assert read_status(dead)["status"] == "failed" and "interrupted" in read_status(dead)["error"]


@pytest.mark.parametrize(
    "change, message",
    [
        (["model.sigmaa=1.0"], "unknown key 'sigmaa'"),
        (["evaluation.method=loo"], "method must be"),
        (["evaluation.test_fraction=1.5"], "between 0 and 1"),
        (["outputs.predictions=true", "evaluation.method=cv"], "predictions needs"),
        (["sweep.n_centers=[]"], "non-empty list"),
        (["data.generate={ n = 100 }"], "generate needs d"),
        (["nonsense"], "table.key=value"),
        (["model.verbose=true"], "set by the run"),
    ],
)
def test_invalid_workflows_say_what_to_fix(change, message):
    with pytest.raises(WorkflowError, match=message):
        read_workflow(EXAMPLES / "nightly_retrain.toml", overrides=change)


def test_overrides_parse_toml_values_and_paths_resolve_against_the_file():
    config = read_workflow(EXAMPLES / "benchmark.toml",
                           overrides=["model.penalty=1e-4", "evaluation.metrics=['r2']", "workflow.name=bench2"])
    assert config["model"]["penalty"] == 1e-4 and config["evaluation"]["metrics"] == ["r2"]
    assert config["workflow"]["runs_dir"] == str((EXAMPLES / "../../runs/benchmark").resolve())
    nightly = read_workflow(EXAMPLES / "nightly_retrain.toml")
    assert nightly["data"]["store"] == str(EXAMPLES / "data" / "growing.zarr")
