"""SQUEAK publishes its dictionary's growth from inside a block task (issue 37, item 8).

A one-block pass is one task: before this, nothing was reported until it ended. The
records travel in-process on the threaded scheduler and as worker events from a
``distributed`` worker process; publishing must not change the dictionary.
"""

from __future__ import annotations

import time
import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from daskkrr import FalkonRegressor
from daskkrr.events import EventBus, PassDone, SamplingProgress
from daskkrr.kernels import make_kernel
from daskkrr.parallel.executor import Executor
from daskkrr.progress import report
from daskkrr.sampling import SqueakSampler

N_ROWS = 2400


@pytest.fixture(scope="module")
def one_block():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_ROWS, 3))
    return da.from_array(X, chunks=(N_ROWS, 3)), make_kernel("gaussian", sigma=1.0)


def _recording_executor(client=None) -> tuple[Executor, list]:
    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    return Executor(client, events=bus), seen


def _sampler(interval) -> SqueakSampler:
    # batch_min=64: the 2 400 rows are processed in tens of batches (batch = max(64, entries))
    return SqueakSampler(gamma=1.0, qbar=8, random_state=5, batch_min=64, progress_interval=interval)


def _check_records(seen: list, *, at_least: int) -> list[SamplingProgress]:
    """The sampling records arrived in order, part-way through the pass, before its end."""
    records = [e for e in seen if isinstance(e, SamplingProgress)]
    assert len(records) >= at_least, [type(e).__name__ for e in seen]
    rows = [r.rows_seen for r in records]
    assert rows == sorted(set(rows)) and 0 < rows[0] and rows[-1] <= N_ROWS
    assert rows[0] < N_ROWS // 2  # published while the one block was still being processed
    assert all(r.name == "squeak" and 0 < r.unique <= r.dictionary_size for r in records)
    done = [i for i, e in enumerate(seen) if isinstance(e, PassDone) and e.name == "squeak"]
    assert done and max(i for i, e in enumerate(seen) if isinstance(e, SamplingProgress)) < done[0]
    return records


def _same_dictionary(a, b) -> None:
    """Bit-identical: the records only read the dictionary, never the random stream."""
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.centers, b.centers)


def test_one_block_pass_publishes_its_dictionary_on_threads(one_block):
    X, kernel = one_block
    executor, seen = _recording_executor()
    published = _sampler(0).select(X, kernel, executor=executor)
    records = _check_records(seen, at_least=5)
    assert len(records) == published.info["batches"] - 1 or len(records) == published.info["batches"]
    # The last record is the dictionary the history recorded at the block's end (or its pending rows' batch).
    history = published.info["history"]
    assert records[-1].rows_seen <= history[-1]["rows_seen"]

    quiet = _sampler(None).select(X, kernel, executor=_recording_executor()[0])
    _same_dictionary(published, quiet)
    _same_dictionary(published, _sampler(0).select(X, kernel))  # no bus: nothing listens, nothing sent


def test_records_are_rate_limited(one_block):
    X, kernel = one_block
    executor, seen = _recording_executor()
    interval = 0.05
    t0 = time.monotonic()
    _sampler(interval).select(X, kernel, executor=executor)
    wall = time.monotonic() - t0
    records = [e for e in seen if isinstance(e, SamplingProgress)]
    # At most one record per interval of the task's run (the first one interval after its start).
    assert len(records) <= wall / interval
    executor, seen = _recording_executor()
    _sampler(3600.0).select(X, kernel, executor=executor)  # a task shorter than the interval sends nothing
    assert not [e for e in seen if isinstance(e, SamplingProgress)]


def test_one_block_pass_publishes_from_a_worker_process(one_block, cluster2):
    X, kernel = one_block
    executor, seen = _recording_executor(cluster2)
    published = _sampler(0).select(X, kernel, executor=executor)
    _check_records(seen, at_least=5)  # sent by Worker.log_event, routed by the client's topic handler
    _same_dictionary(published, _sampler(None).select(X, kernel))  # as on threads, without records


def _fit_with_watch(X, client=None) -> list[tuple[int, int | None, int]]:
    """A one-block SQUEAK fit; per "sampling" record: rows of the pass, dictionary size, chart points."""
    y = da.sin(X[:, 0])
    seen: list = []

    def watch(progress, event):
        if event == "sampling":
            seen.append((progress.live_rows, progress.dictionary_size, len(progress.dictionary)))

    model = FalkonRegressor(n_centers=80, sampler=_sampler(0), max_iter=1, tol=0.5, random_state=0)
    with report(bar=False, callback=watch), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # one CG step: the fit is not the point here
        if client is None:
            model.fit(X, y)
        else:
            with client.as_current():
                model.fit(X, y)
    assert len(seen) >= 5
    rows = [r for r, _, _ in seen]
    assert rows == sorted(rows) and 0 < rows[0] < N_ROWS // 2  # the pass advances inside its one block
    assert [n for _, _, n in seen] == list(range(1, len(seen) + 1))  # one chart point per record
    return seen


def test_fit_record_shows_the_growth_on_threads(one_block):
    X, _ = one_block
    _fit_with_watch(X)


@pytest.mark.slow  # a whole fit on a cluster of two worker processes (tens of seconds on a loaded host)
def test_fit_record_and_scheduler_metadata_show_the_growth(one_block, cluster2):
    X, _ = one_block
    seen = _fit_with_watch(X, cluster2)
    fits = cluster2.get_metadata(["daskkrr", "fits"])
    record = max(fits.values(), key=lambda r: r["updated"])
    assert record["status"] == "done" and record["sampler"] == "squeak"
    # The published chart keeps the live points and the block's history point at its end.
    assert len(record["dictionary"]) >= len(seen) and record["dictionary"][-1][0] == N_ROWS
