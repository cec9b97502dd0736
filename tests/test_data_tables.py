"""convert_table: streaming CSV/TSV (gzip) tables into daskkrr Zarr stores."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr

from daskkrr.data import convert_table, open_dataset, tables
from daskkrr.data.tables import infer_separator

SHARED_DATA = Path(__file__).parents[1].parent / "shared" / "data"
HOUSES = SHARED_DATA / "537_houses.tsv.gz"


@pytest.fixture
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame(
        {
            "a": rng.normal(size=23),
            "b": rng.integers(0, 9, size=23),
            "target": rng.normal(size=23),
            "c": rng.normal(size=23).round(3),
        }
    )


def _write_gzip_tsv(path: Path, frame: pd.DataFrame) -> Path:
    with gzip.open(path, "wt") as fh:
        frame.to_csv(fh, sep="\t", index=False)
    return path


def _assert_nothing_left(directory: Path, output: Path) -> None:
    assert not output.exists()
    assert not [p.name for p in directory.iterdir() if p.name.startswith(".")]


def test_convert_gzip_tsv(tmp_path, frame):
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    summary = convert_table(source, tmp_path / "t.zarr", target="target", chunk_rows=5)
    assert summary == {
        "rows": 23,
        "features": 3,
        "columns": ["a", "b", "c"],
        "target": "target",
        "path": str(tmp_path / "t.zarr"),
    }
    group = zarr.open_group(tmp_path / "t.zarr", mode="r")
    assert group.metadata.zarr_format == 3
    assert group.attrs["daskkrr_format"] == 1
    assert group.attrs["feature_names"] == ["a", "b", "c"]
    assert group["X"].chunks == (5, 3) and group["X"].dtype == np.float64
    X, y = open_dataset(tmp_path / "t.zarr")
    assert X.chunks[0] == (5, 5, 5, 5, 3) and y.chunks[0] == X.chunks[0]
    np.testing.assert_array_equal(X.compute(), frame[["a", "b", "c"]].to_numpy(float))
    np.testing.assert_array_equal(y.compute(), frame["target"].to_numpy())


def test_convert_reads_in_chunks(tmp_path, frame, monkeypatch):
    seen = []
    read_csv = pd.read_csv

    def spy(*args, **kwargs):
        seen.append(kwargs.get("chunksize"))
        return read_csv(*args, **kwargs)

    monkeypatch.setattr(tables.pd, "read_csv", spy)
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    convert_table(source, tmp_path / "t.zarr", target="target", chunk_rows=4)
    assert seen == [4]


def test_convert_csv_with_missing_values(tmp_path, frame):
    frame.loc[4, "a"] = np.nan
    frame.to_csv(tmp_path / "t.csv", index=False)
    summary = convert_table(tmp_path / "t.csv", tmp_path / "t.zarr", target="a")
    assert summary["columns"] == ["b", "target", "c"]
    _, y = open_dataset(tmp_path / "t.zarr")
    assert np.isnan(y.compute()[4])


@pytest.mark.parametrize(
    ("name", "sep"),
    [("t.tsv", "\t"), ("t.TSV.gz", "\t"), ("t.csv.gz", ","), ("t.tab", "\t"), ("t.csv", ",")],
)
def test_separator_from_extension(tmp_path, name, sep):
    assert infer_separator(tmp_path / name) == sep  # no need to open the file


def test_separator_sniffed(tmp_path, frame):
    frame.to_csv(tmp_path / "t.txt", sep=";", index=False)
    assert infer_separator(tmp_path / "t.txt") == ";"
    summary = convert_table(tmp_path / "t.txt", tmp_path / "t.zarr", target="target")
    assert summary["rows"] == 23 and summary["features"] == 3


def test_explicit_separator(tmp_path, frame):
    frame.to_csv(tmp_path / "t.data", sep="|", index=False)
    assert convert_table(tmp_path / "t.data", tmp_path / "t.zarr", "target", sep="|")["rows"] == 23


def test_missing_target_names_columns(tmp_path, frame):
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    message = (
        r"target column 'price' not found in .*t\.tsv\.gz; "
        r"its columns are \['a', 'b', 'target', 'c'\]"
    )
    with pytest.raises(KeyError, match=message):
        convert_table(source, tmp_path / "out.zarr", target="price")
    _assert_nothing_left(tmp_path, tmp_path / "out.zarr")


def test_non_numeric_column_is_named(tmp_path, frame):
    frame["city"] = "Paris"
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    message = r"column 'city' of .* is not numeric \(line 2 holds 'Paris'\)"
    with pytest.raises(ValueError, match=message):
        convert_table(source, tmp_path / "out.zarr", target="target")
    _assert_nothing_left(tmp_path, tmp_path / "out.zarr")


def test_failure_mid_stream_leaves_nothing(tmp_path, frame):
    frame["b"] = frame["b"].astype(object)
    frame.loc[17, "b"] = "oops"  # only the 4th chunk of 5 rows holds text
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    with pytest.raises(ValueError, match=r"column 'b' .* not numeric \(line 19 holds 'oops'\)"):
        convert_table(source, tmp_path / "out.zarr", target="target", chunk_rows=5)
    _assert_nothing_left(tmp_path, tmp_path / "out.zarr")


def test_exception_while_writing_leaves_nothing(tmp_path, frame, monkeypatch):
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    calls = []
    numeric_block = tables._numeric_block

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("simulated")
        return numeric_block(*args, **kwargs)

    monkeypatch.setattr(tables, "_numeric_block", flaky)
    with pytest.raises(MemoryError):
        convert_table(source, tmp_path / "out.zarr", target="target", chunk_rows=5)
    _assert_nothing_left(tmp_path, tmp_path / "out.zarr")


def test_unreadable_file(tmp_path):
    source = tmp_path / "t.tsv.gz"
    source.write_bytes(b"this is not gzip data at all")
    with pytest.raises(ValueError, match=r"cannot read .*t\.tsv\.gz as a table"):
        convert_table(source, tmp_path / "out.zarr", target="target")
    _assert_nothing_left(tmp_path, tmp_path / "out.zarr")


def test_header_only_and_target_only(tmp_path):
    (tmp_path / "h.csv").write_text("a,target\n")
    with pytest.raises(ValueError, match="no data rows"):
        convert_table(tmp_path / "h.csv", tmp_path / "out.zarr", target="target")
    (tmp_path / "t.csv").write_text("target\n1\n2\n")
    with pytest.raises(ValueError, match="only the target column 'target'; no features"):
        convert_table(tmp_path / "t.csv", tmp_path / "out.zarr", target="target")
    _assert_nothing_left(tmp_path, tmp_path / "out.zarr")


def test_missing_input_and_existing_output(tmp_path, frame):
    with pytest.raises(FileNotFoundError, match=r"no table at .*absent\.csv"):
        convert_table(tmp_path / "absent.csv", tmp_path / "out.zarr", target="target")
    source = _write_gzip_tsv(tmp_path / "t.tsv.gz", frame)
    convert_table(source, tmp_path / "out.zarr", target="target")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        convert_table(source, tmp_path / "out.zarr", target="target")
    summary = convert_table(source, tmp_path / "out.zarr", target="a", overwrite=True)
    assert summary["target"] == "a"
    assert zarr.open_group(tmp_path / "out.zarr", mode="r").attrs["target_name"] == "a"


@pytest.mark.skipif(not HOUSES.is_file(), reason=f"shared data set not available at {HOUSES}")
def test_convert_houses(tmp_path):
    before = HOUSES.stat().st_mtime_ns
    summary = convert_table(HOUSES, tmp_path / "houses.zarr", target="target", chunk_rows=5_000)
    assert summary["rows"] == 20_640 and summary["features"] == 8
    assert summary["columns"][0] == "median_income"
    X, y = open_dataset(tmp_path / "houses.zarr")
    assert X.shape == (20_640, 8) and X.chunks[0] == (5_000,) * 4 + (640,)
    expected = pd.read_csv(HOUSES, sep="\t")
    np.testing.assert_array_equal(X.compute(), expected.drop(columns="target").to_numpy())
    np.testing.assert_array_equal(y.compute(), expected["target"].to_numpy())
    assert HOUSES.stat().st_mtime_ns == before
