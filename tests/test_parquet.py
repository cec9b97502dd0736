"""Parquet tables: converted to Zarr (a file, a folder of parts, fsspec URLs), categorical columns one-hot
or refused, missing values refused, memory bounded by a chunk; ``fit``/``predict --data x.parquet`` directly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

from daskkrr import load
from daskkrr.cli import main
from daskkrr.data import convert_table
from daskkrr.data.parquet import is_parquet
from daskkrr.utils.output_paths import OutputPathError

ROWS, GROUP, CHUNK = 230, 40, 50  # row groups of 40 rows, store chunks of 50: the two never line up


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(ROWS, 3)), columns=["a", "b", "c"])
    df.insert(1, "count", rng.integers(0, 9, ROWS))  # an integer column between float ones
    df["y"] = np.sin(df["a"]) + df["b"] * df["c"]
    return df


def _write(df: pd.DataFrame, where: Path | str, fs: fsspec.AbstractFileSystem | None = None) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    if fs is None:
        pq.write_table(table, where, row_group_size=GROUP)
    else:
        with fs.open(str(where), "wb") as fh:
            pq.write_table(table, fh, row_group_size=GROUP)


def _store(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    group = zarr.open_group(str(path), mode="r")
    return group["X"][:], group["y"][:], dict(group.attrs)


def _folder(df: pd.DataFrame, root: Path) -> Path:
    """Three part files of unequal sizes; their names sort in row order."""
    root.mkdir()
    for i, (start, stop) in enumerate([(0, 100), (100, 130), (130, ROWS)]):
        _write(df.iloc[start:stop], root / f"part.{i}.parquet")
    return root


def test_a_file_a_folder_and_urls_convert_to_the_table(tmp_path, frame):
    features = ["a", "count", "b", "c"]
    expected_X, expected_y = frame[features].to_numpy(dtype=np.float64), frame["y"].to_numpy()
    _write(frame, tmp_path / "t.parquet")
    memory = fsspec.filesystem("memory")
    _write(frame, "/daskkrr-test/t.parquet", memory)
    try:
        sources = {
            "file": tmp_path / "t.parquet",
            "folder": _folder(frame, tmp_path / "parts"),
            "file URL": (tmp_path / "t.parquet").as_uri(),
            "memory URL": "memory://daskkrr-test/t.parquet",
        }
        for name, source in sources.items():
            out = tmp_path / f"{name.replace(' ', '_')}.zarr"
            summary = convert_table(source, out, target="y", chunk_rows=CHUNK)
            X, y, attrs = _store(out)
            # float64 and int64 values are copied, not computed: equal bit for bit
            np.testing.assert_array_equal(X, expected_X, err_msg=name)
            np.testing.assert_array_equal(y, expected_y, err_msg=name)
            assert attrs["feature_names"] == features and attrs["categories"] == {}, name
            assert summary["rows"] == ROWS and summary["columns"] == features, name
            assert zarr.open_group(str(out), mode="r")["X"].chunks == (CHUNK, 4), name
    finally:
        memory.rm("/daskkrr-test", recursive=True)


def test_what_is_taken_for_parquet(tmp_path, frame):
    _write(frame, tmp_path / "no_suffix")  # found by its magic bytes
    (tmp_path / "t.csv").write_text("a,y\n1,2\n")
    zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    assert is_parquet(tmp_path / "no_suffix") and is_parquet(tmp_path / "absent.parquet")
    assert not is_parquet(tmp_path / "t.csv") and not is_parquet(tmp_path / "s.zarr")
    assert not is_parquet(tmp_path / "absent.csv") and not is_parquet(np.ones(3))


def test_categorical_columns_are_refused_by_default_naming_the_column_and_the_fix(tmp_path, frame, capsys):
    source = tmp_path / "t.parquet"
    _write(frame.assign(city=["x"] * ROWS), source)
    with pytest.raises(ValueError, match=r"column 'city' of .* is categorical.*categorical='onehot'"):
        convert_table(source, tmp_path / "o.zarr", target="y")
    assert main(["convert", str(source), str(tmp_path / "o.zarr"), "--target", "y"]) == 1
    assert "--categorical onehot" in capsys.readouterr().err
    assert not (tmp_path / "o.zarr").exists()


def test_categorical_columns_one_hot_in_place_in_sorted_order(tmp_path, frame, capsys):
    city = np.array(["paris", "oslo", "lima"])[np.arange(ROWS) % 3]
    city[-1] = "bern"  # only in the last row group: the categories are read from the whole table first
    size = pd.Categorical(np.array(["S", "M", "L", "XL"])[np.arange(ROWS) % 4])  # a Parquet dictionary column
    table = frame.assign(city=city, size=size)[["a", "city", "count", "b", "size", "c", "y"]]
    _write(table, tmp_path / "t.parquet")
    assert pa.types.is_dictionary(pq.read_schema(tmp_path / "t.parquet").field("size").type)
    out = tmp_path / "o.zarr"
    assert main(["convert", str(tmp_path / "t.parquet"), str(out), "--target", "y", "--categorical", "onehot",
                 "--chunk-rows", str(CHUNK)]) == 0
    assert "city, size one-hot encoded" in capsys.readouterr().out
    X, y, attrs = _store(out)
    cities, sizes = ["bern", "lima", "oslo", "paris"], ["L", "M", "S", "XL"]
    assert attrs["categories"] == {"city": cities, "size": sizes}
    names = ["a", *(f"city={c}" for c in cities), "count", "b", *(f"size={s}" for s in sizes), "c"]
    assert attrs["feature_names"] == names
    expected = pd.concat([table[["a"]], pd.get_dummies(table["city"], prefix="city", prefix_sep="=")[names[1:5]],
                          table[["count", "b"]], pd.get_dummies(table["size"].astype(str), prefix="size",
                                                                prefix_sep="=")[names[7:11]], table[["c"]]], axis=1)
    np.testing.assert_array_equal(X, expected.to_numpy(dtype=np.float64))
    np.testing.assert_array_equal(y, table["y"].to_numpy())


def test_a_column_of_too_many_categories_is_refused(tmp_path, frame):
    _write(frame.assign(id=[f"row{i}" for i in range(ROWS)]), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"column 'id' of .* has more than 100 distinct values"):
        convert_table(tmp_path / "t.parquet", tmp_path / "o.zarr", target="y", categorical="onehot",
                      max_categories=100)


@pytest.mark.parametrize("column", ["count", "b", "y", "city"])
def test_a_missing_value_is_refused_naming_the_column_and_rows(tmp_path, frame, column):
    table = frame.assign(city=np.array(["x", "z"])[np.arange(ROWS) % 2]).astype({"count": "Int64", "city": object})
    table.loc[123, column] = None  # a Parquet null, in chunk 100-149
    _write(table, tmp_path / "t.parquet")
    assert pq.read_table(tmp_path / "t.parquet").column(column).null_count == 1
    with pytest.raises(ValueError, match=rf"column '{column}' of .* has a missing value \(null or NaN\) in rows "
                                         rf"100-149 \(first at row 123"):
        convert_table(tmp_path / "t.parquet", tmp_path / "o.zarr", target="y", chunk_rows=CHUNK,
                      categorical="onehot")
    assert not (tmp_path / "o.zarr").exists()


def test_a_categorical_target_is_refused(tmp_path, frame):
    _write(frame.assign(y=np.where(frame["y"] > 0, "up", "down")), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="target column 'y' of .* is not numeric"):
        convert_table(tmp_path / "t.parquet", tmp_path / "o.zarr", target="y", categorical="onehot")


def test_an_output_over_the_input_is_refused_before_reading(tmp_path, frame, monkeypatch):
    parts = _folder(frame, tmp_path / "parts")

    def no_read(*args, **kwargs):
        raise AssertionError("the table was opened before the output path was checked")

    monkeypatch.setattr("daskkrr.data.tables.open_parquet", no_read)
    for source, out in [(parts, parts / "o.zarr"), (parts, parts), (parts.as_uri(), parts / "o.zarr"),
                        (parts / "part.0.parquet", parts)]:
        with pytest.raises(OutputPathError, match="would destroy an input"):
            convert_table(source, out, target="y", overwrite=True)
    assert sorted(p.name for p in parts.iterdir()) == [f"part.{i}.parquet" for i in range(3)]


#: Converts argv[1] after a small warm-up conversion (imports, caches), then prints the peak of Python's
#: allocations (numpy's included) and of Arrow's memory pool during the big one.
_PEAK = """
import sys, tracemalloc
import pyarrow as pa
from daskkrr.data import convert_table
convert_table(sys.argv[2], sys.argv[3] + "-warm", target="y")
tracemalloc.start()
convert_table(sys.argv[1], sys.argv[3], target="y", chunk_rows=int(sys.argv[4]))
print(tracemalloc.get_traced_memory()[1], pa.default_memory_pool().max_memory())
"""


def test_peak_memory_is_bounded_by_a_chunk_not_the_table(tmp_path):
    # few row groups: tracemalloc slows every step of a chunk; 50 columns (not 100: the same peaks in chunks, the
    # conversion half as long)
    rows, group, columns = 48_000, 4_000, 50
    rng = np.random.default_rng(1)
    big = pd.DataFrame(rng.normal(size=(rows, columns)), columns=[f"x{i}" for i in range(columns - 1)] + ["y"])
    pq.write_table(pa.Table.from_pandas(big, preserve_index=False), tmp_path / "big.parquet", row_group_size=group)
    pq.write_table(pa.Table.from_pandas(big.iloc[:10], preserve_index=False), tmp_path / "small.parquet")
    table_bytes = big.memory_usage(index=False).sum()  # 19.2 MB; a chunk (one row group) is 1.6 MB
    del big
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path / "big.parquet"), str(tmp_path / "small.parquet"),
                           str(tmp_path / "o.zarr"), str(group)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    python_peak, arrow_peak = map(int, done.stdout.split())
    # Reading the table whole would hold all of it (and more) at once. One chunk at a time holds a few
    # chunks' worth, the same for a table twice as long (measured: Python 2.1 chunks, the float64 block and
    # the compressed chunk; Arrow 4.3 chunks, the pages, the decoded row group and the pandas block made
    # from it): half the table is six chunks.
    assert python_peak < table_bytes / 2, (python_peak, table_bytes)
    assert arrow_peak < table_bytes / 2, (arrow_peak, table_bytes)
    assert _store(tmp_path / "o.zarr")[0].shape == (rows, columns - 1)


@pytest.mark.slow  # two fits and four predictions on a cluster: 20-30 s on 2 idle cores
def test_fit_and_predict_from_parquet_give_the_model_of_the_zarr_route(tmp_path, frame, cluster2, capsys):
    address = cluster2.scheduler.address
    rng = np.random.default_rng(2)
    big = pd.DataFrame(rng.normal(size=(2000, 3)), columns=["a", "b", "c"])
    big["y"] = np.sin(2 * big["a"]) + big["b"] * big["c"] + 0.05 * rng.normal(size=2000)
    pq.write_table(pa.Table.from_pandas(big, preserve_index=False), tmp_path / "t.parquet", row_group_size=500)
    # tol 1e-10: the two fits are to agree to the solver's tolerance (see below), so it is set tight.
    flags = ["--centers", "80", "--sigma", "1.5", "--penalty", "1e-3", "--seed", "0", "--max-iter", "100",
             "--tol", "1e-10", "--no-progress", "--scheduler", address]
    store = tmp_path / "t.zarr"
    assert main(["convert", str(tmp_path / "t.parquet"), str(store), "--target", "y", "--chunk-rows", "500"]) == 0
    assert main(["fit", "--data", str(store), "--out", str(tmp_path / "mz"), *flags]) == 0
    assert main(["fit", "--data", str(tmp_path / "t.parquet"), "--target", "y", "--out", str(tmp_path / "mp"),
                 *flags]) == 0
    for model in ("mz", "mp"):
        for data in (store, tmp_path / "t.parquet"):
            out = tmp_path / f"{model}-{data.suffix[1:]}.zarr"
            assert main(["predict", "--model", str(tmp_path / model), "--data", str(data), "--out", str(out),
                         "--scheduler", address]) == 0
    pred = {name: zarr.open_group(str(tmp_path / f"{name}.zarr"), mode="r")["y_pred"][:]
            for name in ("mz-zarr", "mz-parquet", "mp-zarr", "mp-parquet")}
    # Both routes give the fit the same float64 values in the same row blocks (row groups of 500 = chunks of
    # 500) and the same seed, hence the same centers and plan; but the statistics pass adds up the DataFrame's
    # blocks in another order, so the standardising means differ in the last bit (1e-17), and CG, stopping at
    # the first iterate whose relative residual is below tol, may stop one iteration apart. Each solution is
    # then within about tol * kappa of the exact one, kappa the condition number of FALKON's preconditioned
    # system (O(1-10): it converges in ~12 iterations): 100 * tol * max|y| bounds their difference with a
    # margin (measured: 2.4e-10 for max|y| ~ 3, and 3e-4 with the default tol 1e-4, as the bound says).
    scale = np.abs(big["y"]).max()
    np.testing.assert_allclose(pred["mp-parquet"], pred["mz-zarr"], rtol=0, atol=100 * 1e-10 * scale)
    # One model, the same rows from either input: the kernel rows times the same coefficients, in blocks
    # whose memory layout may differ, so only the BLAS summation order: M * eps * sum|coef| per prediction.
    for model, a, b in (("mz", "mz-parquet", "mz-zarr"), ("mp", "mp-zarr", "mp-parquet")):
        coef = load(tmp_path / model).coef_
        np.testing.assert_allclose(pred[a], pred[b], rtol=0, atol=coef.shape[0] * np.finfo(float).eps
                                   * np.abs(coef).sum())
    assert np.corrcoef(pred["mp-parquet"], big["y"])[0, 1] > 0.9  # and it learnt something
    assert main(["fit", "--data", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "m3"), *flags]) == 2
    assert "name its target column with --target" in capsys.readouterr().err


def test_fit_from_parquet_refuses_what_it_cannot_take_before_starting(tmp_path, frame, capsys):
    source = tmp_path / "t.parquet"
    _write(frame.assign(city="x"), source)
    out = str(tmp_path / "m")
    assert main(["fit", "--data", str(source), "--target", "y", "--out", out]) == 1
    err = capsys.readouterr().err
    assert "feature column 'city'" in err and "--categorical onehot" in err
    assert main(["fit", "--data", str(source), "--target", "y", "--features", "a,nope", "--out", out]) == 1
    assert "no feature column 'nope'" in capsys.readouterr().err
    zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    assert main(["fit", "--data", str(tmp_path / "s.zarr"), "--target", "y", "--out", out]) == 2
    assert "--target and --features name the columns of a Parquet --data" in capsys.readouterr().err
    assert not Path(out).exists()
