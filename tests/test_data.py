"""open_dataset and write_zarr: sources, chunking rules, validation, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

from daskkrr.data import (
    FORMAT_VERSION,
    CorruptStoreError,
    auto_chunk_rows,
    open_dataset,
    write_array_zarr,
    write_zarr,
    writing,
)


@pytest.fixture
def Xy():
    rng = np.random.default_rng(0)
    return rng.normal(size=(103, 4)), rng.normal(size=103)


def _raw_store(
    path: Path, X, y=None, zarr_format: int = 3, x_name: str = "X", y_name: str = "y"
) -> Path:
    """A plain zarr group (not written by daskkrr), columns split across chunks."""
    group = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    xa = group.create_array(x_name, shape=X.shape, chunks=(10, 2), dtype=X.dtype)
    xa[:] = X
    if y is not None:
        ya = group.create_array(y_name, shape=y.shape, chunks=(7,), dtype=y.dtype)
        ya[:] = y
    return path


def _assert_row_blocks(X, y=None):
    assert isinstance(X, da.Array)
    assert len(X.chunks[1]) == 1, "all columns of a row block must be in one chunk"
    if y is not None:
        assert isinstance(y, da.Array)
        assert y.chunks[0] == X.chunks[0]
        if y.ndim == 2:
            assert len(y.chunks[1]) == 1


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# --------------------------------------------------------------------------- sources


def test_numpy_source_round_trip(Xy):
    X, y = Xy
    Xd, yd = open_dataset(X, y=y, chunks=25)
    _assert_row_blocks(Xd, yd)
    assert Xd.chunks[0] == (25, 25, 25, 25, 3)
    np.testing.assert_array_equal(Xd.compute(), X)
    np.testing.assert_array_equal(yd.compute(), y)


def test_numpy_source_without_target(Xy):
    X, _ = Xy
    Xd, yd = open_dataset(X)
    assert yd is None
    assert Xd.chunks == ((103,), (4,))  # small array: one ~64 MiB block holds it all
    assert open_dataset(X, y=None)[1] is None


def test_numpy_default_chunks_are_about_64_mib():
    X = np.zeros((70_000, 128))  # 68 MiB, calloc'd: untouched pages cost nothing
    Xd, _ = open_dataset(X)
    assert Xd.chunks[0] == (65_536, 70_000 - 65_536)


def test_auto_chunk_rows():
    assert auto_chunk_rows(8, 8) == 2**20
    assert auto_chunk_rows(10**9, 8) == 1
    assert auto_chunk_rows(8, 8, n_rows=10) == 10
    assert auto_chunk_rows(8, 8, n_rows=0) == 1


def test_list_and_integer_sources_keep_dtype():
    Xd, yd = open_dataset([[1, 2], [3, 4], [5, 6]], y=[0, 1, 1])
    assert Xd.dtype == np.dtype(int) and yd.dtype == np.dtype(int)
    Xd, _ = open_dataset(np.ones((3, 2), dtype=bool))
    assert Xd.dtype == bool


def test_dask_source_keeps_row_chunks_and_merges_columns(Xy):
    X, y = Xy
    Xd, yd = open_dataset(da.from_array(X, chunks=(40, 1)), y=da.from_array(y, chunks=13))
    _assert_row_blocks(Xd, yd)
    assert Xd.chunks == ((40, 40, 23), (4,))
    np.testing.assert_array_equal(yd.compute(), y)
    Xd, yd = open_dataset(da.from_array(X, chunks=(40, 1)), y=y, chunks=50)
    assert Xd.chunks[0] == (50, 50, 3) and yd.chunks[0] == (50, 50, 3)


def test_two_dimensional_target(Xy):
    X, _ = Xy
    Y = np.arange(103 * 3, dtype=float).reshape(103, 3)
    Xd, Yd = open_dataset(X, y=da.from_array(Y, chunks=(30, 1)), chunks=20)
    _assert_row_blocks(Xd, Yd)
    np.testing.assert_array_equal(Yd.compute(), Y)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_path_round_trip(tmp_path, Xy, zarr_format):
    X, y = Xy
    path = _raw_store(tmp_path / "raw.zarr", X.astype("float32"), y, zarr_format=zarr_format)
    Xd, yd = open_dataset(path)
    _assert_row_blocks(Xd, yd)
    assert Xd.chunks[0] == (10,) * 10 + (3,)  # the store's row chunking
    assert Xd.dtype == np.float32
    np.testing.assert_array_equal(Xd.compute(), X.astype("float32"))
    np.testing.assert_array_equal(yd.compute(), y)
    Xd, yd = open_dataset(str(path), chunks=32)
    assert Xd.chunks[0] == (32, 32, 32, 7) and yd.chunks[0] == Xd.chunks[0]


def test_zarr_group_and_store_objects(tmp_path, Xy):
    X, y = Xy
    path = _raw_store(tmp_path / "raw.zarr", X, y)
    Xd, yd = open_dataset(zarr.open_group(path, mode="r"))
    np.testing.assert_array_equal(Xd.compute(), X)
    store = zarr.storage.MemoryStore()
    group = zarr.open_group(store, mode="w")
    group.create_array("X", shape=X.shape, chunks=(50, 4), dtype=X.dtype)[:] = X
    Xd, yd = open_dataset(store)
    assert yd is None
    np.testing.assert_array_equal(Xd.compute(), X)


def test_custom_names(tmp_path, Xy):
    X, y = Xy
    path = _raw_store(tmp_path / "raw.zarr", X, y, x_name="features", y_name="label")
    Xd, yd = open_dataset(path, x="features", y="label")
    np.testing.assert_array_equal(yd.compute(), y)
    Xd, yd = open_dataset(path, x="features", y=None)
    assert yd is None


def test_store_with_only_X_has_no_target(tmp_path, Xy):
    X, _ = Xy
    Xd, yd = open_dataset(_raw_store(tmp_path / "raw.zarr", X))
    assert yd is None and Xd.shape == X.shape


def test_lone_zarr_array_is_X(tmp_path, Xy):
    X, y = Xy
    array = zarr.create_array(tmp_path / "X.zarr", shape=X.shape, chunks=(20, 4), dtype=X.dtype)
    array[:] = X
    Xd, yd = open_dataset(tmp_path / "X.zarr", y=y)
    assert Xd.chunks[0][0] == 20
    np.testing.assert_array_equal(yd.compute(), y)


def test_opening_reads_no_chunk_data(tmp_path, Xy):
    X, y = Xy
    path = write_zarr(X, y, tmp_path / "d.zarr", chunk_rows=10)
    (path / "X" / "c" / "3" / "0").write_bytes(b"not a compressed chunk")
    Xd, _ = open_dataset(path)  # metadata only: the corrupt chunk is not touched
    np.testing.assert_array_equal(Xd[:30].compute(), X[:30])
    with pytest.raises(CorruptStoreError, match="rows 30-39 of array 'X' are damaged"):
        Xd.compute()


def test_xarray_dataset_and_dataarray(Xy):
    X, y = Xy
    ds = xr.Dataset({"X": (("sample", "feature"), X), "y": ("sample", y)})
    Xd, yd = open_dataset(ds, chunks=50)
    _assert_row_blocks(Xd, yd)
    np.testing.assert_array_equal(Xd.compute(), X)
    Xd, yd = open_dataset(ds.chunk({"sample": 30, "feature": 2}))
    assert Xd.chunks == ((30, 30, 30, 13), (4,))
    np.testing.assert_array_equal(yd.compute(), y)
    Xd, yd = open_dataset(ds["X"], y=ds["y"])
    np.testing.assert_array_equal(yd.compute(), y)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_xarray_store_with_cf_encoding_is_decoded(tmp_path, zarr_format):
    rng = np.random.default_rng(1)
    X = np.round(rng.uniform(-3, 3, size=(60, 3)), 2)
    X[5, 1] = np.nan
    y = rng.normal(size=60)
    ds = xr.Dataset({"X": (("n", "d"), X), "y": ("n", y)})
    ds["X"].encoding = {"scale_factor": 0.01, "dtype": "int16", "_FillValue": -32768}
    ds.chunk({"n": 20}).to_zarr(tmp_path / "xr.zarr", zarr_format=zarr_format, consolidated=False)
    raw = zarr.open_group(tmp_path / "xr.zarr", mode="r")["X"]
    assert raw.dtype == np.int16  # on disk: packed integers
    Xd, yd = open_dataset(tmp_path / "xr.zarr")
    _assert_row_blocks(Xd, yd)
    assert Xd.chunks[0] == (20, 20, 20)
    np.testing.assert_allclose(Xd.compute(), X, atol=1e-9)  # NaN decoded from _FillValue
    np.testing.assert_array_equal(yd.compute(), y)


def test_plain_xarray_store(tmp_path, Xy):
    X, y = Xy
    ds = xr.Dataset({"X": (("n", "d"), X), "y": ("n", y)})
    ds.to_zarr(tmp_path / "xr.zarr", consolidated=False)
    Xd, yd = open_dataset(tmp_path / "xr.zarr")
    np.testing.assert_array_equal(Xd.compute(), X)
    np.testing.assert_array_equal(yd.compute(), y)


# --------------------------------------------------------------------------- validation


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere.zarr"
    with pytest.raises(FileNotFoundError, match="nowhere.zarr.*does not exist"):
        open_dataset(missing)


def test_table_path_points_to_convert(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    with pytest.raises(FileNotFoundError, match="convert_table"):
        open_dataset(table)


def test_missing_feature_name_lists_arrays(tmp_path, Xy):
    X, y = Xy
    path = _raw_store(tmp_path / "raw.zarr", X, y, x_name="features")
    message = r"no feature array 'X' in Zarr store .*raw\.zarr.*\['features', 'y'\]"
    with pytest.raises(KeyError, match=message):
        open_dataset(path)


def test_missing_target_name_lists_arrays(tmp_path, Xy):
    X, y = Xy
    path = _raw_store(tmp_path / "raw.zarr", X, y, y_name="target")
    with pytest.raises(KeyError, match=r"no target array 'y'.*\['X', 'target'\].*y=None"):
        open_dataset(path)


def test_missing_dataset_variable():
    ds = xr.Dataset({"x": (("n", "d"), np.ones((3, 2)))})
    message = r"no feature array 'X' in the xarray Dataset.*did you mean x='x'"
    with pytest.raises(KeyError, match=message):
        open_dataset(ds)


@pytest.mark.parametrize(
    ("X", "error", "message"),
    [
        (np.ones(5), ValueError, r"X must be 2-D .*got 1-D with shape \(5,\).*reshape\(-1, 1\)"),
        (np.ones((2, 2, 2)), ValueError, r"X must be 2-D .*got 3-D"),
        (np.ones((0, 3)), ValueError, r"X has shape \(0, 3\); at least 1 row and 1 column"),
        (np.ones((3, 0)), ValueError, r"X has shape \(3, 0\)"),
        (
            np.array([["a", "b"]], dtype=object),
            TypeError,
            r"X has dtype object; expected bool, integer or float: encode",
        ),
        (np.array([["a", "b"]]), TypeError, r"X has dtype <U1"),
        (np.ones((2, 2), dtype=complex), TypeError, r"X has dtype complex128.*np.real"),
        (np.zeros((2, 2), dtype="datetime64[s]"), TypeError, r"X has dtype datetime64\[s\]"),
    ],
)
def test_invalid_features(X, error, message):
    with pytest.raises(error, match=message):
        open_dataset(X)


def test_invalid_dask_features_are_rejected_without_computing():
    X = da.ones((3, 4), chunks=2).astype(complex)
    with dask.config.set(scheduler=_fail_if_computed):
        with pytest.raises(TypeError, match="complex128"):
            open_dataset(X)


def _fail_if_computed(*args, **kwargs):
    raise AssertionError("validation must not compute anything")


def test_target_row_mismatch():
    with pytest.raises(ValueError, match="^y has 999 rows but X has 1000$"):
        open_dataset(np.ones((1000, 2)), y=np.ones(999))


@pytest.mark.parametrize(
    ("y", "error", "message"),
    [
        (np.ones((4, 2, 2)), ValueError, r"y must be 1-D .* or 2-D .*got 3-D"),
        (np.ones((4, 0)), ValueError, r"y has shape \(4, 0\)"),
        (np.array(["a", "b", "c", "d"]), TypeError, r"y has dtype <U1"),
        ("target", TypeError, r"y='target' is an array name, but the source is an array"),
    ],
)
def test_invalid_targets(y, error, message):
    with pytest.raises(error, match=message):
        open_dataset(np.ones((4, 2)), y=y)


def test_unknown_chunk_sizes():
    X = da.ones((10, 2), chunks=5)
    X = X[X[:, 0] > 0]
    with pytest.raises(ValueError, match=r"unknown chunk sizes.*compute_chunk_sizes\(\)"):
        open_dataset(X)


@pytest.mark.parametrize(
    ("chunks", "error"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_invalid_chunks(chunks, error):
    with pytest.raises(error, match="chunks must be"):
        open_dataset(np.ones((4, 2)), chunks=chunks)


# --------------------------------------------------------------------------- write_zarr


def test_write_zarr_numpy_round_trip(tmp_path, Xy):
    X, y = Xy
    path = write_zarr(X, y, tmp_path / "d.zarr", chunk_rows=25)
    assert path == tmp_path / "d.zarr"
    group = zarr.open_group(path, mode="r")
    assert group.metadata.zarr_format == 3
    assert dict(group.attrs) == {"daskkrr_format": FORMAT_VERSION}
    assert group["X"].chunks == (25, 4) and group["y"].chunks == (25,)
    Xd, yd = open_dataset(path)
    assert Xd.chunks[0] == (25, 25, 25, 25, 3)
    np.testing.assert_array_equal(Xd.compute(), X)
    np.testing.assert_array_equal(yd.compute(), y)


def test_write_zarr_dask_irregular_chunks_and_2d_target(tmp_path, Xy):
    X, _ = Xy
    Y = np.arange(206, dtype=np.int32).reshape(103, 2)
    Xd = da.from_array(X, chunks=((30, 50, 23), (1, 3)))
    path = write_zarr(Xd, da.from_array(Y, chunks=(40, 1)), tmp_path / "d.zarr")
    group = zarr.open_group(path, mode="r")
    assert group["X"].chunks == (50, 4) and group["y"].chunks == (50, 2)  # largest block
    assert group["y"].dtype == np.int32
    np.testing.assert_array_equal(group["X"][:], X)
    np.testing.assert_array_equal(group["y"][:], Y)


def test_write_zarr_without_target(tmp_path, Xy):
    X, _ = Xy
    path = write_zarr(X, None, tmp_path / "d.zarr", attrs={"note": "hi"})
    group = zarr.open_group(path, mode="r")
    assert sorted(group.array_keys()) == ["X"]
    assert group.attrs["note"] == "hi" and group.attrs["daskkrr_format"] == FORMAT_VERSION
    assert open_dataset(path)[1] is None


def test_write_zarr_streams_dask_blocks(tmp_path):
    """Each block is computed once and written straight to its own Zarr chunk."""
    calls = []

    def block(block_info=None):
        calls.append(block_info[None]["chunk-location"])
        return np.full(block_info[None]["chunk-shape"], float(len(calls)))

    X = da.map_blocks(block, chunks=((10,) * 5, (3,)), dtype=float)
    write_zarr(X, None, tmp_path / "d.zarr")
    assert len(calls) == 5
    assert zarr.open_group(tmp_path / "d.zarr")["X"].chunks == (10, 3)


def test_write_zarr_refuses_existing_path(tmp_path, Xy):
    X, y = Xy
    write_zarr(X, y, tmp_path / "d.zarr")
    with pytest.raises(FileExistsError, match=r"d\.zarr already exists; pass overwrite=True"):
        write_zarr(X, y, tmp_path / "d.zarr")
    write_zarr(X[:10], None, tmp_path / "d.zarr", overwrite=True)
    Xd, yd = open_dataset(tmp_path / "d.zarr")
    assert Xd.shape == (10, 4) and yd is None
    assert _leftovers(tmp_path) == []


def test_write_zarr_failure_mid_stream_leaves_nothing(tmp_path):
    def block(block_info=None):
        if block_info[None]["chunk-location"][0] == 3:
            raise RuntimeError("disk on fire")
        return np.ones(block_info[None]["chunk-shape"])

    X = da.map_blocks(block, chunks=((10,) * 5, (3,)), dtype=float)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_zarr(X, None, tmp_path / "d.zarr")
    assert not (tmp_path / "d.zarr").exists()
    assert list(tmp_path.iterdir()) == []


def test_write_zarr_failure_keeps_old_store(tmp_path, Xy, monkeypatch):
    X, y = Xy
    write_zarr(X, y, tmp_path / "d.zarr")

    def broken_store(*args, **kwargs):
        raise OSError("simulated failure while storing")

    monkeypatch.setattr(writing.da, "store", broken_store)
    with pytest.raises(OSError, match="simulated"):
        write_zarr(X[:5], None, tmp_path / "d.zarr", overwrite=True)
    assert _leftovers(tmp_path) == []
    np.testing.assert_array_equal(open_dataset(tmp_path / "d.zarr")[0].compute(), X)


def test_write_zarr_rejects_paths_and_names(tmp_path, Xy):
    X, y = Xy
    with pytest.raises(TypeError, match="open the source first"):
        write_zarr(str(tmp_path), y, tmp_path / "d.zarr")
    with pytest.raises(TypeError, match="y must be an array or None"):
        write_zarr(X, "y", tmp_path / "d.zarr")
    with pytest.raises(ValueError, match="y has 3 rows but X has 103"):
        write_zarr(X, y[:3], tmp_path / "d.zarr")
    assert list(tmp_path.iterdir()) == []


def test_write_array_zarr(tmp_path):
    pred = da.arange(25, chunks=7).astype(float)
    path = write_array_zarr(pred, tmp_path / "p.zarr", name="y_pred")
    group = zarr.open_group(path, mode="r")
    assert group["y_pred"].chunks == (7,)
    assert json.loads(json.dumps(dict(group.attrs))) == {"daskkrr_format": FORMAT_VERSION}
    np.testing.assert_array_equal(group["y_pred"][:], np.arange(25.0))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_array_zarr(pred, path, name="y_pred")
    with pytest.raises(ValueError, match="must be 1-D or 2-D"):
        write_array_zarr(np.ones((2, 2, 2)), tmp_path / "q.zarr")


def test_newer_store_format_is_refused(tmp_path, Xy):
    X, y = Xy
    path = write_zarr(X, y, tmp_path / "d.zarr")
    zarr.open_group(path, mode="r+").attrs["daskkrr_format"] = FORMAT_VERSION + 1
    with pytest.raises(ValueError, match=r"daskkrr_format 2, but this version .* upgrade daskkrr"):
        open_dataset(path)
