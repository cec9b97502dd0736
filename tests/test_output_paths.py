"""Output paths checked before any work: every slip that would destroy an input, or fail only at
the end, is refused before any data is read, and the inputs stay byte-identical."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.cli import main
from daskkrr.data import write_zarr
from daskkrr.utils.output_paths import OutputPathError, check_paths


def tree_digest(path: Path) -> str:
    """SHA-256 of every name and byte under ``path`` (a file or a folder), in a fixed order."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
    for item in files:
        digest.update(str(item.relative_to(path.parent)).encode())
        if item.is_file():
            digest.update(item.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A store S, a fitted model M, a CSV table and a workflow file, in one folder."""
    root = tmp_path_factory.mktemp("slips")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = X[:, 0] - X[:, 1]
    write_zarr(X, y, root / "S", chunk_rows=100)
    FalkonRegressor(n_centers=10, random_state=0).fit(X, y).save(root / "M")
    np.savetxt(root / "table.csv", np.c_[X, y], delimiter=",", header="a,b,c,y", comments="")
    (root / "wf.toml").write_text('[data]\nstore = "S"\n')
    os.symlink(root / "S", root / "link")
    os.symlink(root, root / "up")  # the folder itself: up/S is S
    return root


@pytest.fixture
def no_data_read(monkeypatch):
    """Make every way of reading data, starting a cluster or converting fail the test at once."""
    import daskkrr.config
    import daskkrr.data
    import daskkrr.models.loading
    import daskkrr.parallel
    import daskkrr.tune.outputs

    def forbidden(*args, **kwargs):
        raise AssertionError("data was read before the output paths were checked")

    for module, name in ((daskkrr.data, "open_dataset"), (daskkrr.data, "convert_table"),
                         (daskkrr.models.loading, "load_model"), (daskkrr.parallel, "cluster_client"),
                         (daskkrr.config, "read_config"), (daskkrr.tune.outputs, "read_training_data")):
        monkeypatch.setattr(module, name, forbidden)


# Each slip, run in the inputs' folder, and what the refusal must name.
SLIPS = {
    "predict over its data": (["predict", "--model", "M", "--data", "S", "--out", "S", "--overwrite"],
                              "--out S is --data S"),
    "predict over its model": (["predict", "--model", "M", "--data", "S", "--out", "M", "--overwrite"],
                               "--out M is --model M"),
    "predict through a link to its data": (["predict", "--model", "M", "--data", "S", "--out", "link",
                                            "--overwrite"], "--out link is --data S"),
    "fit into its checkpoint": (["fit", "--data", "S", "--out", "D", "--checkpoint", "D"],
                                "--out D is --checkpoint D"),
    "fit's checkpoint is its data": (["fit", "--data", "S", "--out", "D", "--checkpoint", "S"],
                                     "--checkpoint S is --data S"),
    "fit inside its data": (["fit", "--data", "S", "--out", "S/model"], "--out S/model is inside --data S"),
    "embed over the folder holding its data": (["embed", "--data", "S", "--out", ".", "--overwrite"],
                                               "--out . contains --data S"),
    "cluster saves over its data": (["cluster", "--data", "S", "--out", "L", "--save-model", "S", "--overwrite"],
                                    "--save-model S is --data S"),
    "convert over its table": (["convert", "table.csv", "table.csv", "--target", "y", "--overwrite"],
                               "output table.csv is input table.csv"),
    "tune's history over its data": (["tune", "--data", "S", "--out", "T", "--history", "S", "--overwrite"],
                                     "--history S is --data S"),
    "run directory inside its data": (["run", "wf.toml", "--runs-dir", "S/runs"],
                                      "[workflow] runs_dir"),
    "fit's model folder holds its checkpoint": (["fit", "--data", "S", "--out", "P", "--checkpoint", "P/ck"],
                                                "--out P contains --checkpoint P/ck"),
    "predict into its model's folder": (["predict", "--model", "M", "--data", "S", "--out", "M/pred"],
                                        "--out M/pred is inside --model M"),
    "predict over its data by a dotted path": (["predict", "--model", "M", "--data", "S", "--out", "x/../S",
                                                "--overwrite"], "--out x/../S is --data S"),
    "fit over its config file": (["fit", "--data", "S", "--config", "wf.toml", "--out", "wf.toml", "--overwrite"],
                                 "--out wf.toml is --config wf.toml"),
    "embed over its model": (["embed", "--data", "S", "--model", "M", "--out", "M", "--overwrite"],
                             "--out M is --model M"),
    "cluster through a link to the inputs' folder": (["cluster", "--data", "S", "--out", "up/S", "--overwrite"],
                                                     "--out up/S is --data S"),
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_slip_is_refused_before_any_data_is_read(slip, inputs, no_data_read, monkeypatch, capsys):
    argv, named = SLIPS[slip]
    monkeypatch.chdir(inputs)
    before = tree_digest(inputs)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("daskkrr: error: ") and named in err and "would destroy" in err, err
    assert "Traceback" not in err
    assert tree_digest(inputs) == before, "an input changed"
    assert not any((inputs / name).exists() for name in ("D", "T", "P", "L"))


def test_existing_output_still_needs_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        check_paths(inputs={"--data": tmp_path / "S"}, outputs={"--out": tmp_path / "out"})
    check_paths(inputs={"--data": tmp_path / "S"}, outputs={"--out": tmp_path / "out"}, overwrite=True)


def test_states_and_inputs_may_exist_and_inputs_may_overlap(tmp_path):
    """A checkpoint may exist (resume); two inputs may nest (a model saved inside a data folder)."""
    (tmp_path / "ck").mkdir()
    check_paths(inputs={"--data": tmp_path, "--model": tmp_path / "m"}, states={"--checkpoint": tmp_path.parent
                                                                                / "elsewhere-ck"})
    check_paths(states={"--checkpoint": tmp_path / "ck"})


def test_output_under_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        check_paths(outputs={"--out": tmp_path / "afile" / "model"})


# ---------------------------------------------------------------- read-only destinations


@pytest.fixture
def readonly_dir(tmp_path):
    """A read-only tmpfs: refused even for root (a chmod'ed folder is not, for root)."""
    path = tmp_path / "ro"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a read-only tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize("flag", ["--out", "--checkpoint"])
def test_readonly_output_is_refused_before_the_fit(flag, inputs, readonly_dir, no_data_read, monkeypatch, capsys):
    monkeypatch.chdir(inputs)
    where = {"--out": ["--out", str(readonly_dir / "model")],
             "--checkpoint": ["--out", str(readonly_dir.parent / "model"), "--checkpoint", str(readonly_dir / "ck")]}
    assert main(["fit", "--data", "S", *where[flag]]) == 1
    err = capsys.readouterr().err
    assert f"daskkrr: error: {flag} {readonly_dir}" in err and "read-only" in err, err
    assert not (readonly_dir.parent / "model").exists()


def test_python_save_and_checkpoint_refuse_a_readonly_place(readonly_dir, inputs):
    model = FalkonRegressor(n_centers=10, random_state=0)
    with pytest.raises(OutputPathError, match="checkpoint .* read-only"):
        model.fit(str(inputs / "S"), checkpoint=readonly_dir / "ck")
    assert not hasattr(model, "coef_")
    X = np.random.default_rng(1).normal(size=(50, 2))
    fitted = FalkonRegressor(n_centers=5, random_state=0).fit(X, X[:, 0])
    with pytest.raises(OutputPathError, match="read-only"):
        fitted.save(readonly_dir / "m")


def test_python_checkpoint_over_its_data_is_refused(inputs):
    before = tree_digest(inputs / "S")
    with pytest.raises(OutputPathError, match="checkpoint .* is X"):
        FalkonRegressor(n_centers=10).fit(str(inputs / "S"), checkpoint=inputs / "S", resume=True)
    with pytest.raises(OutputPathError, match="is inside X"):
        FalkonRegressor(n_centers=10).fit(str(inputs / "S"), checkpoint=inputs / "S" / "ck")
    assert tree_digest(inputs / "S") == before



@pytest.mark.parametrize("output, words", [("table.csv", "output_path .*table.csv is input_path .*table.csv"),
                                           (".", "output_path .* contains input_path .*table.csv"),
                                           ("link.csv", "output_path .*link.csv is input_path .*table.csv")])
def test_python_convert_table_refuses_an_output_over_its_table(output, words, tmp_path, monkeypatch):
    """As the command line does: with overwrite=True the store would otherwise replace the table (or
    the folder holding it); refused before the table is read, the folder byte-identical."""
    import daskkrr.data.tables
    from daskkrr.data import convert_table

    def forbidden(*args, **kwargs):
        raise AssertionError("the table was read before the output path was checked")

    monkeypatch.setattr(daskkrr.data.tables, "_stream_table", forbidden)
    folder = tmp_path / "tables"
    folder.mkdir()
    np.savetxt(folder / "table.csv", np.arange(12.0).reshape(4, 3), delimiter=",", header="a,b,y", comments="")
    os.symlink(folder / "table.csv", folder / "link.csv")
    before = tree_digest(folder)
    with pytest.raises(OutputPathError, match=words):
        convert_table(folder / "table.csv", folder / output, target="y", overwrite=True)
    assert tree_digest(folder) == before
