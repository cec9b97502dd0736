"""The command line on generated data (no shared files needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import zarr

from daskkrr.cli import main


def test_generate_fit_predict_with_running_cluster(tmp_path, cluster2):
    store = tmp_path / "train.zarr"
    assert main(["generate", str(store), "--n", "3000", "--d", "4", "--chunk-rows", "500"]) == 0
    model = tmp_path / "m"
    address = cluster2.scheduler.address
    assert main(["fit", "--data", str(store), "--out", str(model), "--centers", "100", "--sigma", "2.0",
                 "--scheduler", address]) == 0
    out = tmp_path / "p.zarr"
    assert main(["predict", "--model", str(model), "--data", str(store), "--out", str(out),
                 "--scheduler", address]) == 0
    pred = zarr.open_group(str(out), mode="r")["y_pred"][:]
    y = zarr.open_group(str(store), mode="r")["y"][:]
    assert pred.shape == (3000,) and 1 - np.mean((pred - y) ** 2) / np.var(y) > 0.8


def test_errors_are_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["fit", "--data", str(tmp_path / "missing.zarr"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("daskkrr: error:") and err.count("\n") == 1
    assert not out.exists()
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nsigmaa = 1.0\n")
    assert main(["fit", "--data", "x.zarr", "--out", str(out), "--config", str(bad)]) == 1
    assert "unknown key 'sigmaa'" in capsys.readouterr().err
    assert not out.exists()


def test_console_script_quickstart_runs():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "daskkrr.cli", "quickstart", "--n", "20000", "--centers", "200",
         "--max-iter", "8", "--workers", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Dask dashboard: http://127.0.0.1:" in proc.stdout
    assert "test RMSE" in proc.stdout
    ratio = float(proc.stdout.rsplit("ratio ", 1)[1].split(")")[0])
    assert ratio < 0.6  # far better than predicting the mean
