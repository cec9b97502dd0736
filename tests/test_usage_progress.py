"""Progress of fits: the record, the bar (terminal, logs, notebook), log records, callbacks, plots."""

from __future__ import annotations

import io
import logging

import dask.array as da
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from daskkrr import FalkonRegressor, NystromRegressor
from daskkrr.progress import FitProgress, ProgressBar, report
from daskkrr.progress.tracker import FitTracker


@pytest.fixture(scope="module")
def small_dask_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 3))
    y = np.sin(X[:, 0]) + 0.1 * X[:, 1]
    return da.from_array(X, chunks=(500, 3)), da.from_array(y, chunks=500)


def test_record_figures_and_json_round_trip():
    p = FitProgress(fit_id="f", n_rows=1000, n_blocks=4, passes=2, blocks_done=8, blocks_in_pass=2,
                    pass_task="gram_matvec_task",
                    expected_passes=10, cg=[[1, 0.5], [2, 0.01]], dictionary=[[250, 10], [500, 18]], n_centers=15)
    assert p.blocks_read == 10 and p.rows_streamed == 2500
    assert p.cg_iteration == 2 and p.residual == 0.01 and p.dictionary_size == 18
    assert p.fraction == pytest.approx(0.25)
    d = p.to_dict()
    assert d["rows_streamed"] == 2500 and d["blocks_read"] == 10
    again = FitProgress.from_dict(d)
    assert again.to_dict()["rows_streamed"] == 2500
    # live counts from the scheduler: cumulative per task minus the blocks of finished passes
    p.task_base = {"gram_matvec_task": 8}
    assert p.apply_counts({"gram_matvec_task": 11}) and p.blocks_in_pass == 3
    assert p.apply_counts({"gram_matvec_task": 99}) and p.blocks_in_pass == 4  # clamped to the pass


def test_long_series_are_thinned_for_publishing():
    p = FitProgress(fit_id="f", cg=[[i, 1.0 / (i + 1)] for i in range(5000)])
    cg = p.to_dict(thin=True)["cg"]
    assert len(cg) <= 400 and cg[-1] == [4999, 1.0 / 5000]


@pytest.mark.parametrize("strategy, phases", [
    ("recompute", ["statistics", "sampling", "preconditioner", "rhs", "cg"]),
    ("cache", ["statistics", "sampling", "preconditioner", "cache", "rhs", "cg"]),
    ("gram", ["statistics", "sampling", "preconditioner", "gram", "cg"]),
])
def test_threaded_fit_reports_every_phase_pass_block_and_iteration(small_dask_data, strategy, phases):
    X, y = small_dask_data
    seen: list[tuple[str, str, int, int]] = []
    with report(bar=False, callback=lambda p, e: seen.append((e, p.phase, p.blocks_in_pass, p.passes))):
        model = FalkonRegressor(n_centers=100, max_iter=4, random_state=0, strategy=strategy).fit(X, y)
    events = [e for e, *_ in seen]
    assert [ph for e, ph, *_ in seen if e == "phase"] == phases
    assert events[0] == "begin" and events[-1] == "done"
    assert events.count("cg") == model.n_iter_
    blocks = [b for e, _, b, _ in seen if e == "blocks"]
    if strategy == "recompute":
        # the local-scheduler callback counts the blocks of a pass one by one
        assert max(blocks) >= 2 and seen[-1][3] == model.n_data_passes_


def test_direct_solver_and_failures_are_reported(small_dask_data):
    X, y = small_dask_data
    seen: list[tuple[str, str]] = []
    with report(bar=False, callback=lambda p, e: seen.append((e, p.phase))):
        NystromRegressor(n_centers=50, random_state=0).fit(X, y)
    assert ("phase", "gram") in seen and seen[-1][0] == "done"
    failed: list[FitProgress] = []
    with report(bar=False, callback=lambda p, e: failed.append(p) if e == "failed" else None):
        with pytest.raises(ValueError):
            FalkonRegressor(n_centers=10, random_state=0).fit(X, y[:-1])
    # the fit failed while opening the data: the record says so
    assert failed and failed[0].status == "failed" and "rows" in failed[0].error


def test_bar_in_a_terminal_redraws_one_line():
    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    bar = ProgressBar(stream=out, min_interval=0.0)
    t = FitTracker(FitProgress(fit_id="f", estimator="FalkonRegressor", max_iter=3), [bar])
    t.begin(1000, 4, 3)
    t.phase("cg", "gram_matvec_task")
    t.cg_iteration(1, np.array([0.25]))
    t.finish()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.count("\r") >= 3
    assert "CG 1/3 res 2.50e-01" in text and text.rstrip().split("\r")[-1].startswith("done")


def test_kmeans_steps_read_lloyd_and_shift_not_cg():
    from daskkrr import events as ev
    from daskkrr.dashboard.render import render_fragment

    out = io.StringIO()
    bar = ProgressBar(stream=out, min_line_interval=0.0)
    t = FitTracker(FitProgress(fit_id="k", estimator="NystromKernelKMeans", max_iter=50), [bar])
    t.begin(1000, 4, 3)
    t.on_event(ev.SolverStep(7, 0.125, solver="Lloyd"))  # what lloyd_solve emits
    text = out.getvalue()
    assert "Lloyd 7/50 shift 1.25e-01" in text and "CG" not in text  # it read "CG 7/50 res ..."
    page = render_fragment({"k": t.state.to_dict()}, {}, "k")  # the dashboard's page
    assert "Lloyd iteration" in page and "Lloyd center shift by iteration" in page and "CG" not in page


def test_bar_in_logs_prints_lines_and_nothing_before_the_data_are_open():
    out = io.StringIO()
    bar = ProgressBar(stream=out, min_line_interval=0.0)
    t = FitTracker(FitProgress(fit_id="f", estimator="FalkonRegressor", max_iter=20), [bar])
    t.phase("statistics")
    t.fail(FileNotFoundError("no store"))
    assert out.getvalue() == ""  # a fit that never opened its data prints nothing
    t = FitTracker(FitProgress(fit_id="g", estimator="FalkonRegressor", max_iter=20), [bar])
    t.begin(1000, 4, 3)
    t.phase("rhs", "rhs_task")
    t.block_done("rhs_task")
    t.pass_done()
    t.phase("cg", "gram_matvec_task")
    t.cg_iteration(1, 0.5)
    t.finish()
    lines = out.getvalue().splitlines()
    assert [ln.split()[0] for ln in lines] == ["rhs", "cg", "cg", "done"]
    assert "1,000 rows" in lines[1] and "res 5.00e-01" in lines[2]


def test_bar_html_for_notebooks():
    bar = ProgressBar(mode="notebook")
    p = FitProgress(fit_id="f", estimator="FalkonRegressor", n_rows=100, n_blocks=2, passes=1, expected_passes=4)
    html = bar.html(p)
    assert "<progress value='0.2500'" in html and "100 rows" in html


def test_verbose_shows_the_bar_and_logs_go_to_the_progress_logger(small_dask_data, capsys, caplog):
    X, y = small_dask_data
    with caplog.at_level(logging.INFO, logger="daskkrr.progress"), pytest.warns(ConvergenceWarning):
        FalkonRegressor(n_centers=50, max_iter=3, random_state=0, verbose=True).fit(X, y)
    err = capsys.readouterr().err
    assert "cg" in err and "CG 3/3" in err and err.splitlines()[-1].startswith("done (not converged)")
    messages = [r.getMessage() for r in caplog.records if r.name == "daskkrr.progress"]
    assert any("CG iteration 3/3" in m for m in messages)
    # report(bar=False) silences a verbose estimator
    with report(bar=False), pytest.warns(ConvergenceWarning):  # 2 iterations do not reach tol
        FalkonRegressor(n_centers=50, max_iter=2, random_state=0, verbose=True).fit(X, y)
    assert capsys.readouterr().err == ""


def test_report_rejects_a_non_callable_callback():
    with pytest.raises(TypeError, match="callable"):
        with report(callback=[1]):
            pass


def test_plot_helpers_draw_from_a_model_and_from_records(small_dask_data):
    matplotlib = pytest.importorskip("matplotlib", reason="plot helpers need matplotlib (extra 'plot')")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from daskkrr import plot

    X, y = small_dask_data
    model = FalkonRegressor(n_centers=50, max_iter=4, random_state=0).fit(X, y)
    ax = plot.cg_convergence(model)
    assert len(ax.lines[0].get_xdata()) == model.n_iter_ + 1
    ax = plot.dictionary_growth({"history": [{"rows_seen": 100, "dictionary_size": 5},
                                             {"rows_seen": 200, "dictionary_size": 8}]})
    assert list(ax.lines[0].get_ydata()) == [5, 8]
    ax = plot.dictionary_growth(FitProgress(fit_id="f", dictionary=[[10, 2], [20, 3]]))
    assert list(ax.lines[0].get_xdata()) == [10, 20]
    with pytest.raises(ValueError, match="sampler='squeak'"):
        plot.dictionary_growth(model)  # uniform centers: no history
    ax = plot.predicted_vs_true(y, model.predict(X), max_points=1000)
    assert len(ax.collections[0].get_offsets()) == 1000
    plt.close("all")


def test_subscribers_receive_the_typed_events_of_every_stage(small_dask_data):
    """The fit is a pipeline of named stages; a subscriber sees each stage, each pass with its
    blocks, the centers, every CG step and the end, in order, as plain dataclasses."""
    from daskkrr import events as ev

    X, y = small_dask_data
    seen: list[ev.Event] = []
    from sklearn.exceptions import ConvergenceWarning

    with ev.subscribe(seen.append), pytest.warns(ConvergenceWarning):
        model = FalkonRegressor(n_centers=100, max_iter=4, tol=1e-12, random_state=0,
                                strategy="recompute").fit(X, y)
    stages = [e.stage for e in seen if isinstance(e, ev.StageStarted)]
    assert stages == ["statistics", "centers", "preconditioner", "operator", "solve"]
    assert [e.stage for e in seen if isinstance(e, ev.StageDone)] == stages
    assert isinstance(seen[0], ev.FitStarted) and isinstance(seen[-1], ev.FitDone)
    assert seen[-1].n_iter == model.n_iter_ == 4 and seen[-1].converged is False
    passes = [e.name for e in seen if isinstance(e, ev.PassStarted)]
    assert passes[0] == "statistics" and "rhs" in passes and passes.count("matvec") >= 4
    n_blocks = next(e.n_blocks for e in seen if isinstance(e, ev.PassStarted) and e.name == "rhs")
    assert sum(isinstance(e, ev.BlockDone) and e.name == "rhs" for e in seen) == n_blocks
    chosen = [e for e in seen if isinstance(e, ev.CentersChosen)]
    assert len(chosen) == 1 and chosen[0].dictionary.size == 100 and not chosen[0].restored
    assert [e.iteration for e in seen if isinstance(e, ev.SolverStep)] == [1, 2, 3, 4]


def test_a_failing_subscriber_never_breaks_the_fit_but_a_critical_one_does():
    from daskkrr.events import EventBus, FitDone

    bus = EventBus()
    calls = []
    bus.subscribe(lambda e: 1 / 0)
    bus.subscribe(calls.append)
    bus.emit(FitDone(1, True, 0.1))
    assert len(calls) == 1
    bus.subscribe(lambda e: 1 / 0, critical=True)
    with pytest.raises(ZeroDivisionError):
        bus.emit(FitDone(1, True, 0.1))
