"""Bad files at the boundary: Zarr stores, CSV/TSV tables, TOML configs, model files.

Every error names the file, says what is wrong and how to fix it, and leaves no output
(neither the destination nor a hidden temporary sibling of it).
"""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import daskkrr
from daskkrr import FalkonRegressor, open_dataset
from daskkrr.config import ConfigError, read_config
from daskkrr.data import CorruptStoreError, convert_table, write_zarr
from daskkrr.models.persistence import ModelFormatError


def assert_nothing_written(dest: Path) -> None:
    assert not dest.exists(), f"{dest} was created"
    leftovers = list(dest.parent.glob(f".{dest.name}.*"))
    assert not leftovers, f"temporary files left behind: {leftovers}"


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    return write_zarr(X, X[:, 0] ** 2, tmp_path / "train.zarr", chunk_rows=50)


# ---------------------------------------------------------------- Zarr stores


def test_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no Zarr store at .*nowhere.zarr: the path does not exist"):
        FalkonRegressor(n_centers=5).fit(tmp_path / "nowhere.zarr", checkpoint=tmp_path / "ck")
    assert_nothing_written(tmp_path / "ck")


def test_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no Zarr group or array"):
        open_dataset(tmp_path / "empty")


def test_damaged_store_metadata(store, tmp_path):
    (store / "zarr.json").write_text("{ not json")
    with pytest.raises(CorruptStoreError, match=r"train.zarr cannot be read: its Zarr metadata is damaged.*"
                                                r"re-create the store"):
        FalkonRegressor(n_centers=5).fit(store, checkpoint=tmp_path / "ck")
    assert_nothing_written(tmp_path / "ck")


@pytest.mark.filterwarnings("ignore:Object at .* is not recognized:UserWarning")
def test_damaged_array_metadata(store):
    (store / "X" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array"}')
    with pytest.raises(CorruptStoreError, match="cannot be read: the metadata of array 'X' is damaged"):
        open_dataset(store)
    (store / "X" / "zarr.json").write_text("{ not json")
    with pytest.raises(CorruptStoreError, match="cannot be read: .*metadata .*damaged.*JSONDecodeError"):
        open_dataset(store)


def test_damaged_chunk_names_the_rows(store, tmp_path):
    chunk = sorted(glob.glob(str(store / "X" / "c" / "2" / "*")))[0]  # rows 100-149
    Path(chunk).write_bytes(b"garbage, not zstd")
    X, y = open_dataset(store)  # opening reads metadata only
    with pytest.raises(CorruptStoreError, match=r"rows 100-149 of array 'X' are damaged .*re-create the store"):
        FalkonRegressor(n_centers=5).fit(X, y, checkpoint=tmp_path / "ck")
    assert_nothing_written(tmp_path / "ck")


def test_store_without_the_feature_array(store):
    shutil.rmtree(store / "X")
    with pytest.raises(KeyError, match=r"no feature array 'X' .* it holds arrays \['y'\]"):
        open_dataset(store)


def test_store_of_a_newer_format(store):
    meta = json.loads((store / "zarr.json").read_text())
    meta["attributes"]["daskkrr_format"] = 99
    (store / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="daskkrr_format 99.*upgrade daskkrr"):
        open_dataset(store)


# ---------------------------------------------------------------- tables


@pytest.mark.parametrize(
    "name, content, error, match",
    [
        ("bad.csv.gz", b"this is not gzip", ValueError, r"cannot read .*bad.csv.gz as a table.*Not a gzipped file"),
        ("text.csv", b"a,b,y\n1,2,3\n4,x,6\n", ValueError,
         r"column 'b' of .*text.csv is not numeric \(line 3 holds 'x'\); drop it or encode it"),
        ("header.csv", b"a,b,y\n", ValueError, "has a header but no data rows"),
        ("empty.csv", b"", ValueError, "cannot read .*empty.csv as a table"),
        ("ragged.csv", b"a,b,y\n1,2,3\n1,2,3,4,5\n", ValueError, "cannot read .*ragged.csv.*Expected 3 fields"),
        ("notarget.csv", b"a,b,c\n1,2,3\n", KeyError, r"target column 'y' not found .*columns are \['a', 'b', 'c'\]"),
        ("onlytarget.csv", b"y\n1\n2\n", ValueError, "has only the target column 'y'; no features"),
    ],
)
def test_unreadable_tables(tmp_path, name, content, error, match):
    source = tmp_path / name
    source.write_bytes(content)
    out = tmp_path / "out.zarr"
    with pytest.raises(error, match=match):
        convert_table(source, out, target="y", chunk_rows=1)
    assert_nothing_written(out)


def test_missing_table(tmp_path):
    with pytest.raises(FileNotFoundError, match="no table at .*missing.csv: the file does not exist"):
        convert_table(tmp_path / "missing.csv", tmp_path / "out.zarr", target="y")
    assert_nothing_written(tmp_path / "out.zarr")


def test_missing_values_in_a_table_are_caught_by_fit(tmp_path):
    """An empty cell converts to NaN; the fit names the rows (the table stays the source of truth)."""
    lines = ["a,b,y"] + [f"{i},{i % 7},{i % 3}" for i in range(300)]
    lines[1 + 123] = "123,,0"
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    convert_table(tmp_path / "t.csv", tmp_path / "t.zarr", target="y", chunk_rows=100)
    with pytest.raises(ValueError, match=r"X has NaN or inf in rows 100-199 \(block 1, first at row 123\)"):
        FalkonRegressor(n_centers=5).fit(tmp_path / "t.zarr")


# ---------------------------------------------------------------- TOML configs


@pytest.mark.parametrize(
    "text, match",
    [
        ("[model]\nsigmaa = 1.0\n", r"unknown key 'sigmaa' for estimator 'falkon' \(did you mean 'sigma'\?\);"),
        ("[modle]\nsigma = 1.0\n", r"unknown table 'modle' \(did you mean 'model'\?\); accepted: \['model'\]"),
        ("[model]\nn_centers = 10.5\n", r"n_centers must be int; got 10.5 \(float\)"),
        ("[model]\nsigma = \"1.0\"\n", r"sigma must be int or float or list of numbers; got '1.0' \(str\)"),
        ("[model]\nsigma = true\n", r"sigma must be int or float or list of numbers; got True \(bool\)"),
        ("[model]\nstandardize = 1\n", r"standardize must be bool; got 1 \(int\)"),
        ("[model]\nestimator = \"svm\"\n", r"unknown estimator 'svm'; choose one of"),
        ("[model]\nmax_iter = 10\n[model]\n", r"is not valid TOML \(line 3, column 7\): Cannot declare"),
        ("[model\n", r"is not valid TOML \(line 1, column 7\)"),
        ("model = 3\n", "'model' must be a table"),
    ],
)
def test_bad_configs(tmp_path, text, match):
    path = tmp_path / "model.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        read_config(path)


def test_config_that_is_not_text_or_missing(tmp_path):
    binary = tmp_path / "model.toml"
    binary.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="is not a TOML file: it is not UTF-8 text"):
        read_config(binary)
    with pytest.raises(FileNotFoundError, match="config file .*absent.toml does not exist"):
        read_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        read_config(tmp_path)


# ---------------------------------------------------------------- model files


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3))
    path = tmp_path_factory.mktemp("model") / "m"
    FalkonRegressor(n_centers=20, random_state=0).fit(X, X[:, 0]).save(path)
    return path


def _copy(saved_model: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "m"
    shutil.copytree(saved_model, dest)
    return dest


def _edit_meta(path: Path, edit) -> None:
    meta = json.loads((path / "daskkrr-model.json").read_text())
    edit(meta)
    (path / "daskkrr-model.json").write_text(json.dumps(meta))


def test_model_of_another_format_version(saved_model, tmp_path):
    path = _copy(saved_model, tmp_path)
    _edit_meta(path, lambda m: m.update(format_version=2, library_version="9.9"))
    with pytest.raises(ModelFormatError, match=r"format_version: model format version 2; this daskkrr .* reads "
                                               r"version 1; re-fit the model or load it with .*9.9"):
        daskkrr.load(path)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.update(format="something-else"), "is not a daskkrr model file"),
        (lambda m: m.update(estimator="os.system"), r"unknown estimator 'os.system'; expected one of"),
        (lambda m: m.update(estimator=["list"]), "unknown estimator"),
        (lambda m: m["params"].update(evil="x"), r"unknown parameter\(s\) \['evil'\]"),
        (lambda m: m.update(kernel={"name": "nope"}), "json: kernel: unknown kernel 'nope'"),
        (lambda m: m["fitted"].update(n_features_in_=5), r"kernel: .* contradicts .* for 5 features"),
        (lambda m: m["fitted"].pop("n_features_in_"), "fitted.n_features_in_: is missing"),
    ],
)
def test_damaged_model_metadata(saved_model, tmp_path, edit, match):
    path = _copy(saved_model, tmp_path)
    _edit_meta(path, edit)
    with pytest.raises(ModelFormatError, match=match):
        daskkrr.load(path)


def test_model_json_and_arrays_damaged(saved_model, tmp_path):
    path = _copy(saved_model, tmp_path)
    (path / "daskkrr-model.json").write_text("{")
    with pytest.raises(ModelFormatError, match="is not valid JSON"):
        daskkrr.load(path)
    path = _copy(saved_model, tmp_path / "b")
    (path / "arrays.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ModelFormatError, match="arrays.npz cannot be read|is damaged"):
        daskkrr.load(path)
    path = _copy(saved_model, tmp_path / "c")
    (path / "arrays.npz").unlink()
    with pytest.raises(ModelFormatError, match="arrays.npz: file: cannot be read"):
        daskkrr.load(path)
    with pytest.raises(FileNotFoundError, match="is not a daskkrr model directory"):
        daskkrr.load(tmp_path / "nothing")
