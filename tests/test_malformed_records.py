"""Malformed data from outside names itself and breaks nothing else: a NaN class label names its row,
and a malformed progress record (which any client of the scheduler can publish) is skipped by the
dashboard page instead of making it fail for everyone."""

from __future__ import annotations

import urllib.request

import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonClassifier, LogisticFalkonClassifier
from daskkrr.dashboard import install
from daskkrr.dashboard.render import render_fragment
from daskkrr.progress import FitProgress


@pytest.fixture(scope="module")
def Xy():
    X = np.random.default_rng(0).normal(size=(90, 2))
    return X, (X[:, 0] > 0).astype(np.float64)


@pytest.mark.parametrize("cls", [FalkonClassifier, LogisticFalkonClassifier])
def test_a_nan_label_names_its_row(Xy, cls):
    X, y = Xy
    y = y.copy()
    y[[37, 61]] = np.nan
    with pytest.raises(ValueError, match=r"missing label \(NaN or None\) in row 37 and 1 more row"):
        cls(n_centers=10).fit(X, y)


def test_a_nan_label_in_a_dask_target_names_its_row(Xy):
    X, y = Xy
    y = y.copy()
    y[61] = np.nan  # in the third block of 30 rows: the row number is global, not within the block
    with pytest.raises(ValueError, match=r"missing label \(NaN or None\) in row 61;"):
        FalkonClassifier(n_centers=10).fit(da.from_array(X, chunks=(30, 2)), da.from_array(y, chunks=30))


def test_a_none_text_label_names_its_row(Xy):
    X, _ = Xy
    y = np.array(["a", "b", "c"] * 30, dtype=object)
    y[12] = None
    with pytest.raises(ValueError, match=r"missing label \(NaN or None\) in row 12;"):
        FalkonClassifier(n_centers=10).fit(X, y)


def _good_record(fit_id: str, updated: float) -> dict:
    return FitProgress(fit_id=fit_id, estimator="FalkonRegressor", phase="cg", n_rows=100, n_blocks=2,
                       cg=[[1, 0.5]], updated=updated).to_dict()


MALFORMED = {
    "no-id": {"status": "running", "updated": 1e12},  # no fit_id: FitProgress cannot be built
    "text": "not a record",
    "bad-types": {**_good_record("bad-types", 1e12), "n_rows": "many", "cg": "x"},
    "odd-time": {**_good_record("odd-time", 0.0), "updated": "tomorrow"},
}


def test_malformed_records_are_skipped_by_the_page():
    fits = {"good": _good_record("good", 5.0), **MALFORMED}
    html = render_fragment(fits, {}, None)
    assert 'data-fit="good"' in html and 'id="daskkrr-phase">cg<' in html
    html = render_fragment(fits, {}, "no-id")  # asked for by name: still skipped
    assert 'data-fit="good"' in html
    # A record whose only fault is a non-numeric time is shown (sorting by time treats it as 0).
    assert 'data-fit="odd-time"' in render_fragment(MALFORMED, {}, None)
    unusable = {k: v for k, v in MALFORMED.items() if k != "odd-time"}
    assert "No daskkrr fit" in render_fragment(unusable, {}, None)


def test_a_published_malformed_record_does_not_break_the_served_page():
    from distributed import Client, LocalCluster

    # The page is served by the scheduler, which runs in this process either way: an in-process
    # worker spares a worker process's start and imports.
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", memory_limit="1GiB") as cluster, Client(cluster) as client:
        url = install(client)
        assert url is not None
        for fit_id, record in {"good": _good_record("good", 5.0), **MALFORMED}.items():
            client.set_metadata(["daskkrr", "fits", fit_id], record)
        for route in ("", "/fragment", "/state.json"):
            with urllib.request.urlopen(url + route, timeout=10) as resp:  # an HTTP 500 raises HTTPError
                assert resp.status == 200
                body = resp.read().decode()
            if route != "/state.json":
                assert 'data-fit="good"' in body
