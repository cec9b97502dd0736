"""The command line on generated data (no shared files needed)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from sklearn.exceptions import ConvergenceWarning

from daskkrr.cli import _HelpFormatter, _parser, cli_message, main, run_figures
from daskkrr.data import write_classification_zarr
from daskkrr.models.registry import ESTIMATORS, UNSUPERVISED
from daskkrr.models.schema import config_specs, union_specs

#: Estimator parameters: their flags' help is listed per estimator (``--estimator NAME --help``).
_ESTIMATOR_PARAMS = set(union_specs({**ESTIMATORS, **UNSUPERVISED}))


def test_generate_fit_predict_with_running_cluster(tmp_path, cluster2, capsys):
    store = tmp_path / "train.zarr"
    address = cluster2.scheduler.address
    # on the running cluster too: without --scheduler, generate would start (and close) a cluster of its own
    assert main(["generate", str(store), "--n", "3000", "--d", "4", "--chunk-rows", "500", "--scheduler", address]) == 0
    model = tmp_path / "m"
    assert main(["fit", "--data", str(store), "--out", str(model), "--centers", "100", "--sigma", "2.0",
                 "--scheduler", address]) == 0
    out = tmp_path / "p.zarr"
    assert main(["predict", "--model", str(model), "--data", str(store), "--out", str(out),
                 "--scheduler", address]) == 0
    pred = zarr.open_group(str(out), mode="r")["y_pred"][:]
    y = zarr.open_group(str(store), mode="r")["y"][:]
    assert pred.shape == (3000,) and 1 - np.mean((pred - y) ** 2) / np.var(y) > 0.8
    capsys.readouterr()
    assert main(["score", "--model", str(model), "--data", str(store), "--scheduler", address]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["model"] == "FalkonRegressor" and metrics["n"] == 3000
    np.testing.assert_allclose(metrics["r2"], 1 - np.mean((pred - y) ** 2) / np.var(y), rtol=1e-9)
    np.testing.assert_allclose(metrics["rmse"], np.sqrt(np.mean((pred - y) ** 2)), rtol=1e-9)
    np.testing.assert_allclose(metrics["mae"], np.mean(np.abs(pred - y)), rtol=1e-9)
    assert main(["predict", "--model", str(model), "--data", str(store), "--out", str(tmp_path / "d.zarr"),
                 "--output", "decision"]) == 2
    assert "--output decision is for classifiers" in capsys.readouterr().err


def test_classifier_predict_outputs_and_score(tmp_path, cluster2, capsys):
    store, model = tmp_path / "c.zarr", tmp_path / "m"
    address = cluster2.scheduler.address
    # The store written here (`generate` on the cluster is checked above), and 3 CG iterations: what is checked is
    # how predict writes each output and score's accuracy of that model, not the solution.
    write_classification_zarr(store, 2000, 3, n_classes=3, chunk_rows=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # 3 iterations: the CLI warns that CG did not converge
        assert main(["fit", "--data", str(store), "--out", str(model), "--estimator", "classifier",
                     "--n-centers", "60", "--max-iter", "3", "--random-state", "0", "--scheduler", address,
                     "-q"]) == 0
    labels_out, decision_out = tmp_path / "labels.zarr", tmp_path / "decision.zarr"
    assert main(["predict", "--model", str(model), "--data", str(store), "--out", str(labels_out),
                 "--scheduler", address]) == 0  # --output label is the default
    assert main(["predict", "--model", str(model), "--data", str(store), "--out", str(decision_out),
                 "--output", "decision", "--scheduler", address]) == 0
    labels = zarr.open_group(str(labels_out), mode="r")["y_pred"][:]
    decision = zarr.open_group(str(decision_out), mode="r")["decision"][:]
    assert decision.shape == (2000, 3) and decision.dtype.kind == "f"
    np.testing.assert_array_equal(np.argmax(decision, axis=1), labels)  # classes are 0, 1, 2
    capsys.readouterr()
    assert main(["score", "--model", str(model), "--data", str(store), "--scheduler", address]) == 0
    metrics = json.loads(capsys.readouterr().out)
    y = zarr.open_group(str(store), mode="r")["y"][:]
    assert metrics == {"model": "FalkonClassifier", "n": 2000, "accuracy": float(np.mean(labels == y))}
    assert main(["predict", "--model", str(model), "--data", str(store), "--out", str(tmp_path / "p.zarr"),
                 "--output", "proba"]) == 2
    err = capsys.readouterr().err
    assert "--output proba: FalkonClassifier has no class probabilities; use --output label or --output decision" in err
    assert not (tmp_path / "p.zarr").exists()


def _parsers() -> list[argparse.ArgumentParser]:
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [parser, *subs.choices.values()]


def test_no_abbreviations_and_every_option_shows_help_and_default():
    for parser in _parsers():
        assert parser.allow_abbrev is False, parser.prog
        formatter = _HelpFormatter(parser.prog)
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS and action.dest in _ESTIMATOR_PARAMS:
                continue  # an estimator parameter: test_help_lists_one_estimators_parameters checks its help
            assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"
            if action.option_strings and not action.required:
                assert "default" in formatter._get_help_string(action), f"{parser.prog} {action.option_strings}"


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, set[str]]:
    """``daskkrr ARGV --help``'s text and the long options it lists (lines that start with one)."""
    assert main([*argv, "--help"]) == 0
    text = capsys.readouterr().out
    listed = {flag.rstrip(",") for line in text.splitlines() if line.lstrip().startswith("--")
              for flag in line.split() if flag.startswith("--")}
    return text, listed


@pytest.mark.parametrize("command", ["fit", "tune"])
def test_help_lists_one_estimators_parameters(command, capsys):
    short, listed = _help([command], capsys)
    assert "--estimator NAME --help" in " ".join(short.split())
    assert not listed & {"--" + name.replace("_", "-") for name in _ESTIMATOR_PARAMS}  # none without --estimator
    for name, cls in ESTIMATORS.items():
        text, listed = _help([command, "--estimator", name], capsys)
        own = {spec.flag for spec in config_specs(cls).values()}
        others = {"--" + p.replace("_", "-") for p in union_specs(ESTIMATORS)} - own
        assert own <= listed and not others & listed, name
        assert text.count("(default: ") >= len(own), name  # every parameter with its default
        assert len(text.splitlines()) < len(short.splitlines()) + 6 * len(own), name  # a few lines each (usage too)
    assert len(short.splitlines()) < 90  # was 268 (fit) and 310 (tune) lines with every estimator's parameters


@pytest.mark.parametrize("command, kind", [("embed", "kpca"), ("cluster", "kmeans")])
def test_unsupervised_help_lists_its_parameters_and_no_config(command, kind, capsys):
    text, listed = _help([command], capsys)
    assert {spec.flag for spec in config_specs(UNSUPERVISED[kind]).values()} <= listed
    assert "--config" not in text  # these commands take no config file


def test_misspelt_flag_names_the_closest_one(capsys):
    assert main(["fit", "--data", "d.zarr", "--out", "m", "--centrs", "50"]) == 2
    err = capsys.readouterr().err
    assert err == ("daskkrr: error: unrecognized arguments: --centrs 50 (did you mean --centers?); "
                   "see 'daskkrr fit --help'\n")
    assert main(["cluster", "--data", "d.zarr", "--out", "l", "--n-cluster", "3"]) == 2
    assert "(did you mean --n-clusters?); see 'daskkrr cluster --help'" in capsys.readouterr().err
    assert main(["fit", "--data", "d.zarr", "--out", "m", "--zzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err  # nothing close: no guess


def test_exit_codes_are_the_documented_ones(tmp_path, capsys):
    """README, install guide and configuration reference state the convention the code follows."""
    root = Path(__file__).resolve().parents[1]
    sentence = "exits with status 2, any other error with status 1"
    for doc in ("README.md", "docs/guide/install.rst"):
        assert sentence in " ".join((root / doc).read_text().split()), doc
    reference = " ".join((root / "docs/guide/configuration.rst").read_text().split())
    assert "* - 2 - a usage error" in reference and "* - 1 - any other error" in reference
    assert main(["fit", "--data", "d.zarr", "--out", "m", "--bogus"]) == 2  # a wrong command line
    assert main(["fit", "--data", "d.zarr"]) == 2  # --out missing
    assert main(["score", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "d.zarr")]) == 1  # no model
    assert capsys.readouterr().err.count("daskkrr: error: ") == 3


def test_warnings_print_as_one_line_without_source(monkeypatch, tmp_path, capsys):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # restored after the test
    assert main(["score", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "d.zarr")]) == 1
    capsys.readouterr()
    text = warnings.formatwarning(ConvergenceWarning("CG stopped at relative residual 0.04 > tol=0.0001"),
                                  ConvergenceWarning, "/site-packages/daskkrr/pipeline/stages.py", 281,
                                  "warn_not_converged(result)")
    assert text == "daskkrr: warning: CG stopped at relative residual 0.04 > tol=0.0001\n"  # no file, line, code


def test_run_summary_says_what_a_run_without_scores_did():
    assert run_figures({"metrics": {"rmse": 0.5, "r2": 0.25, "fit_seconds": 1.0}}) == "rmse 0.5, r2 0.25"
    # an online workflow's first run: nothing to score the rows with yet (it printed "(prequential: )")
    assert run_figures({"evaluation": "prequential", "metrics": {"fit_seconds": 1.0, "n_new_rows": 500}}) == \
        "no earlier model to score with; learnt 500 rows"


@pytest.mark.parametrize("flag, dest", [("-v", "verbose"), ("--verbose", "verbose"), ("-q", "quiet"),
                                        ("--quiet", "quiet")])
def test_verbosity_flags_work_before_and_after_the_command(flag, dest):
    fit = ["fit", "--data", "s.zarr", "--out", "m"]
    for argv in ([flag, *fit], [*fit, flag], [flag, "score", "--model", "m", "--data", "s"],
                 ["run", "w.toml", flag]):
        args = _parser().parse_args(argv)
        assert getattr(args, dest) is True, argv
        other = "quiet" if dest == "verbose" else "verbose"
        assert getattr(args, other) is False, argv
    args = _parser().parse_args(fit)
    assert args.verbose is False and args.quiet is False


def test_messages_name_flags():
    assert cli_message("m already exists; pass overwrite=True to replace it") == \
        "m already exists; pass --overwrite to replace it"
    assert cli_message("ck holds a checkpoint; pass resume=True (daskkrr fit --resume) to continue it") == \
        "ck holds a checkpoint; pass --resume to continue it"
    assert cli_message("n_centers=5000 is larger than 2000; use n_centers <= 2000") == \
        "--n-centers=5000 is larger than 2000; use --n-centers <= 2000"
    assert cli_message("n=9 is above max_samples=5. Use FalkonRegressor (or raise max_samples if memory allows)") == \
        "n=9 is above --max-samples=5. Use FalkonRegressor (or raise --max-samples if memory allows)"
    assert cli_message("Use X, or pass force=True (or set DASKKRR_FORCE_EXACT=1) to run it anyway") == \
        "Use X, or set DASKKRR_FORCE_EXACT=1 to run it anyway"


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


def test_max_samples_is_refused_before_a_cluster_starts(tmp_path, capsys, monkeypatch):
    """n above --max-samples is known from the store's shape: refused without starting (or connecting to)
    a cluster, in the fit's own words; "auto" switches to the PCG solver there instead."""
    import daskkrr.parallel
    from daskkrr.data import write_zarr

    started = []
    monkeypatch.setattr(daskkrr.parallel, "cluster_client", lambda *a, **k: started.append(a) or pytest.fail(
        "a cluster was started before the arguments were checked"))
    store = write_zarr(np.ones((20, 2)), np.ones(20), tmp_path / "s.zarr")
    out = tmp_path / "m"
    for flags in (["--solver", "direct"], ["--compute-std"]):
        assert main(["fit", "--data", str(store), "--out", str(out), "--estimator", "exact", *flags,
                     "--max-samples", "10"]) == 1
        assert "n=20 is above --max-samples=10. Use FalkonRegressor" in capsys.readouterr().err
    assert not started and not out.exists()


@pytest.mark.slow  # the installed command's quickstart in a new process: 17 s
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
