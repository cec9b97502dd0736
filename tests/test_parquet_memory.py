"""A fit straight from Parquet holds on the client no more than the same fit from the Zarr store: its memory
does not grow with the table's rows beyond what the Zarr route's does (a task graph of one task per row group),
and in particular no vector of the rows (the target, the row counts' pass, a frame of the table)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from daskkrr import FalkonRegressor
from daskkrr.data import convert_table
from daskkrr.data.parquet import parquet_columns

#: Rows per row group (and per chunk of the store): fixed while the table grows.
GROUP = 10_000
#: Rows per row group of the one-process test: larger, so that a vector of the rows (what it must catch) dwarfs
#: the task graph's growth (one read task per row group) and tracemalloc's run-to-run noise.
PASS_GROUP = 40_000
#: Two table sizes, 10 and 40 row groups.
SMALL, BIG = 100_000, 400_000
D = 8


def _table(path: Path, rows: int, group: int = GROUP) -> Path:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(rows, D))
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(D)]).assign(y=np.sin(X[:, 0]))
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=group)
    return path


def _client_peak(route: str, table: Path) -> int:
    """Bytes Python allocated on this process (the client) at the fit's peak, from opening the data on."""
    model = FalkonRegressor(n_centers=10, max_iter=1, random_state=0)
    tracemalloc.start()
    try:
        if route == "parquet":
            X, y, _ = parquet_columns(table, "y").arrays()  # the CLI's fit --data t.parquet --target y
            model.fit(X, y)
        else:
            model.fit(str(table.with_suffix(".zarr")))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # five fits on a cluster under tracemalloc: 1-2 minutes on 2 idle cores, 10 under load 20
def test_a_direct_parquet_fit_holds_no_more_on_the_client_than_the_zarr_route(tmp_path, cluster2):
    tables = {rows: _table(tmp_path / f"t{rows}.parquet", rows) for rows in (SMALL, BIG)}
    for table in tables.values():
        convert_table(table, table.with_suffix(".zarr"), target="y", chunk_rows=GROUP)
    with cluster2.as_current():
        _client_peak("parquet", tables[SMALL])  # warm-up: imports, compiled kernels, dask's caches
        peaks = {(route, rows): _client_peak(route, table) for route in ("zarr", "parquet")
                 for rows, table in tables.items()}
    grew = {route: peaks[route, BIG] - peaks[route, SMALL] for route in ("zarr", "parquet")}
    # Both routes' peaks grow with the rows: the Zarr route's by 8-9 bytes a row (measured 2.5-2.7 MB; not
    # traced further: the same in both routes), Parquet's by 2.3 bytes a row more (measured 0.7 MB: 23 kB per
    # extra row group, its read task with the row group's metadata and the count and column-block tasks that
    # the store's chunks do not need). Holding the target on the client, or any column, adds at least a vector
    # of the rows (8 bytes a row, 2.4 MB here; measured 8 MB more with y computed to the client before the
    # fit): the allowance is half that vector, which the graph's 0.7 MB stays under and one column exceeds.
    vector = (BIG - SMALL) * 8
    assert grew["parquet"] <= grew["zarr"] + vector / 2, (peaks, grew)
    # And the peak itself is far below the table's values (the client reads no row group).
    assert peaks["parquet", BIG] < BIG * (D + 1) * 8 / 4, peaks


def _one_pass(table: Path) -> None:
    """Read the table's columns and make one pass over them (sums of the features and of the target) on this
    process, as one worker of the fit would."""
    with dask.config.set(scheduler="sync"):
        X, y, _ = parquet_columns(table, "y").arrays()
        dask.compute(X.data.sum(axis=0), y.sum())


def _pass_peak(table: Path) -> int:
    """Bytes Python allocated at the peak of :func:`_one_pass`."""
    tracemalloc.start()
    try:
        _one_pass(table)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_a_table_and_a_pass_over_it_hold_a_row_group_not_the_table(tmp_path):
    """The fast cousin of the test above, on one process: the row counts' pass and a pass over the columns
    hold a row group or two at a time, and what grows with the rows is the task graph only."""
    small, big = _table(tmp_path / "s.parquet", 4 * PASS_GROUP, PASS_GROUP), _table(tmp_path / "b.parquet",
                                                                                     16 * PASS_GROUP, PASS_GROUP)
    _one_pass(small)  # warm-up, untraced (tracing slows the imports): imports and dask's caches
    peaks = {rows: _pass_peak(table) for rows, table in ((4 * PASS_GROUP, small), (16 * PASS_GROUP, big))}
    group_bytes = PASS_GROUP * (D + 1) * 8  # a row group's values: 2.9 MB
    # What grows with the rows is the graph: 28 kB per row group (the read task with the row group's metadata,
    # the count and column-block tasks), 0.34 MB for the 12 more groups, and it measured 0.4-0.6 MB from run to
    # run. The target brought here would add 8 bytes a row, 3.84 MB on the big table (the table 72 bytes a row):
    # the growth may be half that vector; the peak three row groups' values (one group's block and its sum's
    # temporaries were measured).
    assert peaks[16 * PASS_GROUP] - peaks[4 * PASS_GROUP] < 12 * PASS_GROUP * 8 / 2, peaks
    assert peaks[16 * PASS_GROUP] < 3 * group_bytes, (peaks, group_bytes)
