"""An unconverged CG is visible: a ConvergenceWarning, the CLI summary, the progress bar, the dashboard."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from daskkrr import FalkonRegressor, NystromRegressor
from daskkrr import events as ev
from daskkrr.cli import convergence_note, main
from daskkrr.dashboard.render import render_fragment
from daskkrr.data import write_regression_zarr
from daskkrr.pipeline.stages import FAR_RESIDUAL
from daskkrr.progress import FitProgress, ProgressBar
from daskkrr.progress.tracker import FitTracker


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 4))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=1500)


def test_a_cg_stopped_above_tol_warns_with_residual_tol_max_iter_and_advice(data):
    X, y = data
    with pytest.warns(ConvergenceWarning) as record:
        model = FalkonRegressor(n_centers=100, max_iter=2, tol=1e-7, random_state=0).fit(X, y)
    assert not model.converged_
    message = str(record[0].message)
    residual = float(np.max(model.residuals_[-1]))
    assert f"relative residual {residual:.3g} > tol=1e-07" in message
    assert "max_iter=2" in message and "raise max_iter" in message
    assert residual > FAR_RESIDUAL and "may be far from the Nystrom solution" in message


@pytest.mark.parametrize(("n_iter", "stagnated", "says"), [
    (5, False, "max_iter=5 iterations were not enough"),
    (3, True, "the residual stopped falling after 3 iterations"),
    (3, False, "round-off made the system look indefinite (p^T A p <= 0)"),
])
def test_the_warning_names_why_cg_stopped(n_iter, stagnated, says):
    """Each way a CG ends above tol gets its own reason: blaming max_iter for a solve that
    stopped before it (a column stopped where p^T A p <= 0) sends the user the wrong way."""
    from types import SimpleNamespace

    from daskkrr.pipeline.stages import warn_not_converged

    result = SimpleNamespace(residuals=np.array([[1.0], [2e-3]]), stagnated=stagnated, n_iter=n_iter)
    with pytest.warns(ConvergenceWarning) as record:
        warn_not_converged(result, tol=1e-3, max_iter=5, dtype="float32")
    assert says in str(record[0].message)
    assert ("raise max_iter" in str(record[0].message)) == (n_iter == 5 and not stagnated)


def test_a_cg_stopped_close_to_tol_calls_its_model_usable(data):
    X, y = data
    with pytest.warns(ConvergenceWarning) as record:
        model = FalkonRegressor(n_centers=100, max_iter=20, tol=1e-12, random_state=0).fit(X, y)
    assert not model.converged_ and np.max(model.residuals_[-1]) <= FAR_RESIDUAL
    assert "is usable but not the exact Nystrom solution" in str(record[0].message)


def test_converged_fits_do_not_warn(data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = FalkonRegressor(n_centers=100, max_iter=100, tol=1e-4, random_state=0).fit(X, y)
        NystromRegressor(n_centers=100, random_state=0).fit(X, y)  # a direct solve always converges
    assert model.converged_ and np.max(model.residuals_[-1]) <= 1e-4


def test_the_cli_summary_says_whether_cg_converged(data, tmp_path, capsys, cluster2):
    X, y = data
    done = FalkonRegressor(n_centers=100, max_iter=100, tol=1e-4).fit(X, y)
    assert convergence_note(done) == "converged"
    with pytest.warns(ConvergenceWarning):
        short = FalkonRegressor(n_centers=100, max_iter=2, tol=1e-7).fit(X, y)
    note = convergence_note(short)
    assert note.startswith("NOT converged: residual ") and "> tol 1e-07" in note and "--max-iter" in note

    # The store is written here (threads): `generate` would start and close a local cluster of its own.
    store = write_regression_zarr(tmp_path / "train.zarr", 2000, 4, chunk_rows=500)
    with pytest.warns(ConvergenceWarning):
        assert main(["fit", "--data", str(store), "--out", str(tmp_path / "m"), "--centers", "80",
                     "--max-iter", "2", "--scheduler", cluster2.scheduler.address, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(2 CG iterations, NOT converged: residual " in out and "> tol " in out


def _finished(converged: bool, stream: io.StringIO, **kwargs) -> FitTracker:
    bar = ProgressBar(stream=stream, min_line_interval=0.0, **kwargs)
    tracker = FitTracker(FitProgress(fit_id="f", estimator="FalkonRegressor", max_iter=20), [bar])
    tracker.begin(1000, 4, 3)
    tracker.phase("cg", "gram_matvec_task")
    tracker.cg_iteration(20, 3e-5)
    tracker.on_event(ev.FitDone(20, converged, 1.0))
    return tracker


def test_the_progress_bar_says_not_converged():
    out = io.StringIO()
    tracker = _finished(False, out)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("done (not converged)") and "CG 20/20 res 3.00e-05" in last
    html = ProgressBar(mode="notebook").html(tracker.state)
    assert "done (not converged)" in html and "#d80" in html and "#2a7" not in html

    out = io.StringIO()
    tracker = _finished(True, out)
    assert out.getvalue().splitlines()[-1].split("[")[0].strip() == "done"
    assert "#2a7" in ProgressBar(mode="notebook").html(tracker.state)


def test_the_dashboard_does_not_show_an_unconverged_fit_green():
    record = FitProgress(fit_id="a", estimator="FalkonRegressor", phase="done", status="done", converged=False,
                         cg=[[1, 0.5], [20, 3e-5]], max_iter=20).to_dict()
    html = render_fragment({"a": record}, {}, None)
    badge = html.split('id="daskkrr-status"', 1)[1].split("</span>", 1)[0]
    assert "done (not converged)" in badge and "#d80" in badge and "#2a7" not in badge
    assert "a</a> FalkonRegressor - done (not converged)" in html
    converged = render_fragment({"a": {**record, "converged": True}}, {}, None)
    badge = converged.split('id="daskkrr-status"', 1)[1].split("</span>", 1)[0]
    assert "#2a7" in badge and badge.endswith(">done")
