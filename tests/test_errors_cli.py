"""The command line at the boundary: one-line errors (exit 2 for usage, 1 otherwise), nothing
written, no existing output replaced without --overwrite, and messages in the CLI's words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from daskkrr import FalkonRegressor
from daskkrr.cli import main
from daskkrr.data import write_array_zarr, write_zarr


def _error(capsys) -> str:
    """The one error line (progress lines may precede it on stderr)."""
    lines = capsys.readouterr().err.splitlines()
    errors = [ln for ln in lines if ln.startswith("daskkrr: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


def _no_output(path: Path) -> None:
    assert not path.exists(), f"{path} was written"
    assert not list(path.parent.glob(f".{path.name}.*")), "a temporary sibling was left behind"


@pytest.fixture
def table(tmp_path):
    lines = ["f1,f2,target"] + [f"{i * 0.01:.2f},{(i * 7) % 11},{np.sin(i * 0.01):.5f}" for i in range(400)]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_nan_through_the_cli(tmp_path, table, cluster2, capsys):
    lines = table.read_text().splitlines()
    lines[1 + 321] = "3.21,,0.5"  # an empty cell becomes NaN in the store
    table.write_text("\n".join(lines) + "\n")
    store, model = tmp_path / "t.zarr", tmp_path / "model"
    assert main(["convert", str(table), str(store), "--target", "target", "--chunk-rows", "100"]) == 0
    capsys.readouterr()
    code = main(["fit", "--data", str(store), "--out", str(model), "--centers", "10",
                 "--scheduler", cluster2.scheduler.address, "--checkpoint", str(tmp_path / "ck")])
    assert code == 1
    assert "X has NaN or inf in rows 300-399 (block 3, first at row 321); clean or impute" in _error(capsys)
    _no_output(model)
    _no_output(tmp_path / "ck")


@pytest.mark.parametrize(
    "argv, match",
    [
        (["fit", "--data", "{tmp}/missing.zarr", "--out", "{tmp}/m"], "no Zarr store at"),
        (["fit", "--data", "{tmp}/t.csv", "--out", "{tmp}/m"], "tables must be converted first"),
        (["fit", "--data", "{store}", "--out", "{tmp}/m", "--kernel", "rbff"], "unknown kernel 'rbff'"),
        (["fit", "--data", "{store}", "--out", "{tmp}/m", "--config", "{tmp}/bad.toml"], "unknown key 'sigmaa'"),
        (["fit", "--data", "{store}", "--out", "{tmp}/m", "--checkpoint", "{tmp}/old"],
         "already holds a checkpoint of an earlier fit; pass --resume to continue it"),
        # Refused from the store's shape before the command connects to any cluster, like the other cases
        # (test_cli.py::test_max_samples_is_refused_before_a_cluster_starts); the fit refuses it too.
        (["fit", "--data", "{store}", "--out", "{tmp}/m", "--estimator", "exact", "--solver", "direct",
          "--max-samples", "10", "--scheduler", "{scheduler}"],
         "n=20 is above --max-samples=10. Use FalkonRegressor"),
        (["predict", "--model", "{tmp}/nomodel", "--data", "{store}", "--out", "{tmp}/p.zarr"],
         "is not a daskkrr model directory"),
        (["convert", "{tmp}/missing.csv", "{tmp}/c.zarr", "--target", "y"], "no table at"),
        (["convert", "{tmp}/t.csv", "{tmp}/c.zarr", "--target", "nope"], "target column 'nope' not found"),
    ],
)
def test_cli_errors_write_nothing(tmp_path, table, capsys, request, argv, match):
    if "{scheduler}" in argv:
        argv = [a.replace("{scheduler}", request.getfixturevalue("cluster2").scheduler.address) for a in argv]
    _check_error(tmp_path, capsys, argv, match, code=1)


USAGE_ERRORS = [
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--penalty", "0"],
     "--penalty 0.0: penalty must be a float in the range (0.0, inf)"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--sigma", "-1"],
     "--sigma -1.0: sigma must be a float in the range (0.0, inf), an array-like or None"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--centers", "0"],
     "--n-centers 0: n_centers must be an int in the range [1, inf)"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--resume"], "--resume needs --checkpoint DIR"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--estimator", "nystrom", "--checkpoint", "{tmp}/ck"],
     "--checkpoint is supported by the falkon, classifier, logistic and exact estimators, not by NystromRegressor"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--checkpoint", "{tmp}/ck", "--checkpoint-every", "0"],
     "argument --checkpoint-every: expected an integer >= 1; got '0'"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--cent", "300"], "unrecognized arguments: --cent 300"),
    (["fit", "--data", "{store}", "--out", "{tmp}/m", "--estimator", "exact", "--n-centers", "5"],
     "--n-centers does not apply to estimator 'exact'"),
    (["fit", "--data", "{store}"], "the following arguments are required: --out"),
    (["-v", "fit", "--data", "{store}", "--out", "{tmp}/m", "-q"], "-v/--verbose and -q/--quiet exclude each other"),
    (["predict", "--model", "{tmp}/m", "--data", "{store}", "--out", "{tmp}/p.zarr", "--output", "probs"],
     "argument --output: invalid choice: 'probs'"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
    (["convert", "{tmp}/t.csv", "{tmp}/c.zarr", "--target", "target", "--chunk-rows", "0"],
     "argument --chunk-rows: expected an integer >= 1; got '0'"),
]


@pytest.mark.parametrize("argv, match", USAGE_ERRORS)
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, argv, match):
    """argparse's errors and the commands' checks of their flags follow one convention."""
    _check_error(tmp_path, capsys, argv, match, code=2)


def _check_error(tmp_path, capsys, argv, match, code):
    store = write_zarr(np.ones((20, 2)), np.ones(20), tmp_path / "s.zarr")
    (tmp_path / "bad.toml").write_text("[model]\nsigmaa = 1.0\n")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "checkpoint.npz").write_bytes(b"an earlier fit's state")
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.format(tmp=tmp_path, store=store) for a in argv]
    assert main(argv) == code
    line = _error(capsys)
    assert match in line
    if code == 2:
        assert line.endswith("--help'"), line  # names where to look
    # nothing new on disk: no output, no temporary, no checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_existing_outputs_need_overwrite(tmp_path, table, cluster2, capsys):
    address = cluster2.scheduler.address
    store, model, pred = tmp_path / "t.zarr", tmp_path / "model", tmp_path / "p.zarr"
    assert main(["convert", str(table), str(store), "--target", "target", "--chunk-rows", "100"]) == 0
    # The model and the predictions to protect are made in this process: the refusals below are what is
    # checked, and a fit and a predict through the cluster were most of the test's time.
    fitted = FalkonRegressor(n_centers=20, random_state=0).fit(str(store))
    fitted.save(model)
    write_array_zarr(fitted.predict(str(store)), pred, name="y_pred")
    capsys.readouterr()
    stamps = {p: sorted((q.relative_to(p), q.stat().st_mtime_ns) for q in p.rglob("*"))
              for p in (store, model, pred)}
    for argv in (
        ["convert", str(table), str(store), "--target", "target"],
        ["generate", str(store), "--n", "100", "--d", "2"],
        ["fit", "--data", str(store), "--out", str(model), "--centers", "20", "--scheduler", address],
        ["predict", "--model", str(model), "--data", str(store), "--out", str(pred), "--scheduler", address],
    ):
        assert main(argv) == 1
        assert "already exists; pass --overwrite to replace it" in _error(capsys)
    for path, stamp in stamps.items():  # untouched
        assert sorted((q.relative_to(path), q.stat().st_mtime_ns) for q in path.rglob("*")) == stamp
    assert main(["generate", str(store), "--n", "300", "--d", "2", "--overwrite", "--scheduler", address]) == 0
    assert zarr.open_group(str(store), mode="r")["X"].shape == (300, 2)
    assert not list(tmp_path.glob(".*"))  # no temporaries, no moved-aside old versions


def test_an_error_raised_while_unwinding_an_interruption_is_reported_as_the_interruption():
    """A signal landing inside a library's ``with lock:`` can turn into "release unlocked lock";
    the command was still interrupted, and exits with the signal's code."""
    from daskkrr.cli import _interruption
    from daskkrr.signals import Interrupted

    try:
        try:
            raise Interrupted(15)
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock")  # noqa: B904 - the implicit context is the point
    except RuntimeError as exc:
        found = _interruption(exc)
    assert isinstance(found, Interrupted) and found.signum == 15
    assert _interruption(ValueError("plain failure")) is None
