"""Parquet ``--data`` for every command that takes a table: the columns read (one pass counts the row groups
and refuses missing values by column and rows), the refusals before a cluster starts, ``--sample-weight`` as
a column, and ``score``/``embed``/``cluster`` from Parquet against the Zarr route."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

from daskkrr.cli import main
from daskkrr.data.parquet import parquet_columns
from daskkrr.models.loading import load_model

GROUP = 40  # rows per row group


def _table(n: int = 230, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    df["label"] = rng.integers(0, 3, n)  # an integer column: a target that stays integer
    df["y"] = np.sin(df["a"]) + df["b"] * df["c"] + 0.05 * rng.normal(size=n)
    df["w"] = rng.uniform(0.2, 3.0, n)
    return df


def _write(df: pd.DataFrame, path: Path) -> Path:
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=GROUP)
    return path


def _folder(df: pd.DataFrame, root: Path) -> Path:
    """Two part files (100 and 130 rows): row groups of 40, 40, 20, then 40, 40, 40, 10."""
    root.mkdir()
    _write(df.iloc[:100], root / "part.0.parquet")
    _write(df.iloc[100:], root / "part.1.parquet")
    return root


def test_the_columns_are_read_as_row_groups_with_their_names(tmp_path):
    df = _table()
    X, y, w = parquet_columns(_folder(df, tmp_path / "t"), "label", ["c", "a"], "w").arrays()
    assert X.data.chunks[0] == (40, 40, 20, 40, 40, 40, 10)  # one block per row group, across the files
    assert list(X.coords["feature"].values) == ["c", "a"]  # a model's feature_names_in_
    # Copied values, not computed ones: equal bit for bit.
    np.testing.assert_array_equal(X.data.compute(), df[["c", "a"]].to_numpy())
    assert y.dtype == np.int64  # class labels stay integers
    np.testing.assert_array_equal(y.compute(), df["label"].to_numpy())
    np.testing.assert_array_equal(w.compute(), df["w"].to_numpy())
    X, y, w = parquet_columns(tmp_path / "t").arrays()  # no target: every column is a feature
    assert y is None and w is None and list(X.coords["feature"].values) == list(df.columns)


@pytest.mark.parametrize("column", ["b", "y", "w"])
def test_a_missing_value_is_refused_naming_its_column_and_rows(tmp_path, column):
    df = _table()
    df.loc[163, column] = np.nan  # in the second file, its second row group: rows 140-179 of the table
    columns = parquet_columns(_folder(df, tmp_path / "t"), "y", ["a", "b"], "w")
    with pytest.raises(ValueError, match=rf"column '{column}' of .* has a missing value \(null or NaN\) in rows "
                                         rf"140-179 \(first at row 163, rows counted from 0\)"):
        columns.arrays()


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail a command that starts (or connects to) a cluster: its refusals are to come before."""
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started before the command line was refused")

    monkeypatch.setattr("daskkrr.parallel.cluster_client", refuse)


def test_every_command_refuses_bad_columns_before_starting(tmp_path, capsys, no_cluster):
    source = str(_write(_table().assign(city="x"), tmp_path / "t.parquet"))
    store = tmp_path / "s.zarr"
    zarr.open_group(str(store), mode="w")
    commands = {  # score loads its model first: its column checks are fit's and predict's (test_parquet.py)
        "embed": ["embed", "--data", source, "--out", str(tmp_path / "o.zarr")],
        "cluster": ["cluster", "--data", source, "--out", str(tmp_path / "o.zarr")],
        "tune": ["tune", "--data", source, "--target", "y", "--out", str(tmp_path / "o")],
    }
    for name, argv in commands.items():
        assert main(argv) == 1, name
        err = capsys.readouterr().err
        assert "feature column 'city'" in err and "--categorical onehot" in err, (name, err)
        assert main([*argv, "--features", "a,nope"]) == 1, name
        assert "no feature column 'nope'" in capsys.readouterr().err, name
    assert main(commands["tune"][:3] + ["--out", str(tmp_path / "o"), "--features", "a,b"]) == 2
    assert "name its target column with --target" in capsys.readouterr().err
    # A Zarr store's columns are its arrays: the table flags are refused there.
    for argv in (["embed", "--data", str(store), "--out", str(tmp_path / "o.zarr"), "--target", "y"],
                 ["cluster", "--data", str(store), "--out", str(tmp_path / "o.zarr"), "--features", "a"],
                 ["tune", "--data", str(store), "--out", str(tmp_path / "o"), "--features", "a"]):
        assert main(argv) == 2, argv
        assert "columns of a Parquet --data" in capsys.readouterr().err, argv
    assert main(["cluster", "--data", source, "--out", str(tmp_path / "o.zarr"), "--target", "y"]) == 2
    assert "unrecognized arguments: --target" in capsys.readouterr().err
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "o").exists()


_FIT = ["--centers", "40", "--sigma", "1.5", "--penalty", "1e-3", "--seed", "0", "--max-iter", "100",
        "--tol", "1e-10", "--no-progress"]


@pytest.mark.slow  # three fits on a cluster: 210 s on 2 cores at load 20
def test_sample_weight_column_gives_the_model_of_the_store_weight_array(tmp_path, cluster2):
    address = ["--scheduler", cluster2.scheduler.address]
    df = _table(n=600, seed=3)
    table = _write(df[["a", "b", "c", "y", "w"]], tmp_path / "t.parquet")
    store = tmp_path / "t.zarr"
    assert main(["convert", str(_write(df[["a", "b", "c", "y"]], tmp_path / "xy.parquet")), str(store),
                 "--target", "y", "--chunk-rows", str(GROUP)]) == 0  # chunks = row groups: the same blocks
    zarr.open_group(str(store), mode="a").create_array("w", data=df["w"].to_numpy(), chunks=(GROUP,))
    runs = {"store": ["--data", str(store), "--sample-weight", "w"],
            "table": ["--data", str(table), "--target", "y", "--sample-weight", "w"],
            "unweighted": ["--data", str(table), "--target", "y", "--features", "a,b,c"]}
    for name, data in runs.items():
        assert main(["fit", *data, "--out", str(tmp_path / name), *_FIT, *address]) == 0, name
        assert main(["predict", "--model", str(tmp_path / name), "--data", str(store), "--out",
                     str(tmp_path / f"{name}.zarr"), *address]) == 0, name
    pred = {name: zarr.open_group(str(tmp_path / f"{name}.zarr"), mode="r")["y_pred"][:] for name in runs}
    # As in test_parquet.py's fit from Parquet against the Zarr route: the same values in the same blocks, the
    # statistics summed in another order (last bit of the means), so CG may stop an iteration apart; each
    # solution is within about tol * kappa of the exact one (kappa of FALKON's preconditioned system, O(1-10)):
    # 100 * tol * max|y| bounds their difference.
    bound = 100 * 1e-10 * np.abs(df["y"]).max()
    np.testing.assert_allclose(pred["table"], pred["store"], rtol=0, atol=bound)
    # Weights between 0.2 and 3 change the model far beyond that bound: the column was not dropped.
    assert np.abs(pred["unweighted"] - pred["table"]).max() > 1e4 * bound


@pytest.mark.slow  # two unsupervised fits, scorings on a cluster: 110 s on 2 cores at load 20
def test_score_embed_and_cluster_from_parquet_match_the_zarr_route(tmp_path, cluster2, capsys):
    address = ["--scheduler", cluster2.scheduler.address]
    df = _table(n=400, seed=4)[["a", "b", "c", "y"]]
    table = _write(df, tmp_path / "t.parquet")
    store = tmp_path / "t.zarr"
    assert main(["convert", str(table), str(store), "--target", "y", "--chunk-rows", str(GROUP)]) == 0
    assert main(["fit", "--data", str(table), "--target", "y", "--out", str(tmp_path / "m"), *_FIT, *address]) == 0
    capsys.readouterr()
    scores = []
    for data in (["--data", str(store)], ["--data", str(table), "--target", "y"],
                 ["--data", str(table), "--target", "y", "--features", "a,b,c"]):
        assert main(["score", "--model", str(tmp_path / "m"), *data, *address]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    # One model, the same rows in the same blocks: only the BLAS's summation order may differ between the
    # two inputs' predictions (M * eps * sum|coef| each), far below the 1e-9 relative allowed here.
    for key in ("r2", "rmse", "mae"):
        assert scores[1][key] == pytest.approx(scores[0][key], rel=1e-9) == scores[2][key], key
    assert scores[1]["n"] == len(df) and scores[1]["r2"] > 0.9
    assert main(["score", "--model", str(tmp_path / "m"), "--data", str(table), "--target", "y", "--features",
                 "b,a,c", *address]) == 2  # the model's columns are taken by name, in its order
    assert "the model was fitted on the columns ['a', 'b', 'c']" in capsys.readouterr().err

    unsup = ["--n-centers", "60", "--sigma", "2", "--random-state", "0", "--no-progress", *address]
    assert main(["embed", "--data", str(table), "--target", "y", "--out", str(tmp_path / "e.zarr"),
                 "--save-model", str(tmp_path / "kpca"), "--n-components", "2", *unsup]) == 0
    assert main(["embed", "--model", str(tmp_path / "kpca"), "--data", str(store), "--out",
                 str(tmp_path / "e2.zarr"), *address]) == 0
    fitted, again = (zarr.open_group(str(tmp_path / name), mode="r") for name in ("e.zarr", "e2.zarr"))
    np.testing.assert_array_equal(fitted["y"][:], df["y"].to_numpy())  # --target written as the output's y
    # The same model on the same values: a component is kernel values (at most 1) times the coefficients,
    # summed in an order that may differ with the blocks' memory layout: M * eps * sum|coef| bounds it.
    coef = load_model(tmp_path / "kpca").coef_
    np.testing.assert_allclose(fitted["X"][:], again["X"][:], rtol=0,
                               atol=coef.shape[0] * np.finfo(float).eps * np.abs(coef).sum(axis=0).max())
    assert main(["cluster", "--data", str(table), "--features", "a,b,c", "--out", str(tmp_path / "c.zarr"),
                 "--save-model", str(tmp_path / "km"), "--n-clusters", "3", *unsup]) == 0
    assert main(["cluster", "--model", str(tmp_path / "km"), "--data", str(store), "--out",
                 str(tmp_path / "c2.zarr"), *address]) == 0
    labels = [zarr.open_group(str(tmp_path / name), mode="r")["labels"][:] for name in ("c.zarr", "c2.zarr")]
    np.testing.assert_array_equal(labels[0], labels[1])
    assert len(np.unique(labels[0])) == 3


def _workflow(tmp_path: Path, data: str) -> dict:
    from daskkrr.utils.toml_file import read_toml
    from daskkrr.workflow.spec import resolve

    (tmp_path / "w.toml").write_text(f"[data]\n{data}\n[model]\nn_centers = 20\n")
    return resolve(read_toml(tmp_path / "w.toml"), base_dir=tmp_path)


def test_a_workflow_table_may_be_a_parquet_folder_converted_once_into_its_cache(tmp_path):
    from daskkrr.workflow.data import resolve_store
    from daskkrr.workflow.spec import WorkflowError

    df = _table()[["a", "b", "y"]].assign(city=np.array(["x", "z"])[np.arange(230) % 2])
    _folder(df, tmp_path / "t")
    config = _workflow(tmp_path, 'table = "t"\ntarget = "y"\ncategorical = "onehot"')
    store = resolve_store(config["data"], config["workflow"]["runs_dir"])
    group = zarr.open_group(str(store), mode="r")
    assert group.attrs["feature_names"] == ["a", "b", "city=x", "city=z"]
    np.testing.assert_array_equal(group["X"][:, 2], (df["city"] == "x").to_numpy(dtype=float))
    made = store.stat().st_mtime_ns
    assert resolve_store(config["data"], config["workflow"]["runs_dir"]) == store  # cached: not converted again
    assert store.stat().st_mtime_ns == made
    _write(df.iloc[100:].assign(a=0.0), tmp_path / "t" / "part.1.parquet")  # a part file changed
    store = resolve_store(config["data"], config["workflow"]["runs_dir"])
    assert (zarr.open_group(str(store), mode="r")["X"][100:, 0] == 0).all()  # converted again
    with pytest.raises(ValueError, match=r"column 'city' of .* is categorical.*onehot"):
        refused = _workflow(tmp_path, 'table = "t"\ntarget = "y"\ncache = "other.zarr"')
        resolve_store(refused["data"], refused["workflow"]["runs_dir"])
    with pytest.raises(WorkflowError, match=r"categorical must be one of \['refuse', 'onehot'\]"):
        _workflow(tmp_path, 'table = "t"\ntarget = "y"\ncategorical = "yes"')
    with pytest.raises(WorkflowError, match="categorical only applies to table sources"):
        _workflow(tmp_path, 'store = "t.zarr"\ncategorical = "onehot"')
