"""A full disk (a size-limited tmpfs) during convert, fit (checkpoint and model), predict, embed,
cluster and save: a DiskFullError naming the output and "no space left", no temporary left
behind (also while parallel workers still write), earlier outputs intact."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

from daskkrr import FalkonRegressor, NystromKernelKMeans, NystromKernelPCA
from daskkrr.cli import main
from daskkrr.data import convert_table, write_array_zarr, write_zarr
from daskkrr.utils.atomic import DiskFullError


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")):
        digest.update(str(item.relative_to(path)).encode())
        if item.is_file():
            digest.update(item.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def disk(tmp_path):
    """A 1 MiB tmpfs holding an earlier output, ``earlier.zarr``; its digest as ``disk.earlier``."""
    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a size-limited tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        write_zarr(np.arange(20.0).reshape(10, 2), np.arange(10.0), path / "earlier.zarr")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path, leave: int = 0) -> None:
    """Leave about ``leave`` free bytes on the file system of ``path`` (none by default)."""
    with open(path / "ballast", "wb", buffering=0) as fh:  # unbuffered: a failed write fails here, not on close
        try:
            fh.write(b"\0" * max(shutil.disk_usage(path).free - leave, 0))
            while not leave:
                fh.write(b"\0" * 4096)
        except OSError:
            pass


def _assert_refused(info: pytest.ExceptionInfo, out: Path, earlier: str) -> None:
    message = str(info.value)
    assert str(out) in message and "no space left on device" in message, message
    _assert_nothing_left(out, earlier)


def _assert_nothing_left(out: Path, earlier: str) -> None:
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temporaries left behind: {leftovers}"
    assert not out.exists() or out.name == "earlier.zarr"
    assert _digest(out.parent / "earlier.zarr") == earlier, "an earlier output changed"


@pytest.fixture(scope="module")
def client():
    """Two in-process workers with two threads each: several chunks are written at once."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as c:
        yield c


def test_convert_on_a_full_disk(disk, tmp_path, capsys):
    table = tmp_path / "big.csv"
    np.savetxt(table, np.random.default_rng(0).normal(size=(30_000, 4)), delimiter=",", header="a,b,c,y",
               comments="", fmt="%.8f")
    earlier = _digest(disk / "earlier.zarr")
    _fill(disk, leave=64 * 1024)  # 30 chunk files of at least a 4 KiB page each: more than is left
    with pytest.raises(DiskFullError) as info:
        convert_table(table, disk / "out.zarr", target="y", chunk_rows=1000)
    _assert_refused(info, disk / "out.zarr", earlier)
    # The command line: one line naming the output, exit 1; replacing the earlier output keeps it.
    assert main(["convert", str(table), str(disk / "earlier.zarr"), "--target", "y", "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"daskkrr: error: {disk / 'earlier.zarr'}: no space left on device"), err
    _assert_nothing_left(disk / "earlier.zarr", earlier)


def _slow(block: np.ndarray) -> np.ndarray:
    """A block that takes 0.2 s: when the first chunk write fails, others are still to be written
    for that long, past the 0.1 s in which the clean-up would otherwise see the temporary gone."""
    time.sleep(0.2)
    return block


@pytest.mark.parametrize("what", ["predict", "embed", "cluster"])
def test_parallel_write_on_a_full_disk(what, disk, client):
    """Predictions, an embedding and labels written by 4 threads on 2 workers, 100 chunk files of at
    least a 4 KiB page each on a disk with 64 KiB free: every try fails and leaves nothing, though
    other chunks are still being written when the first one fails."""
    earlier = _digest(disk / "earlier.zarr")
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3))
    models = {"predict": FalkonRegressor(n_centers=20, random_state=0).fit(X, X[:, 0]),
              "embed": NystromKernelPCA(n_components=3, n_centers=20, random_state=0).fit(X),
              "cluster": NystromKernelKMeans(n_clusters=3, n_centers=20, random_state=0).fit(X)}
    _fill(disk, leave=64 * 1024)
    out = disk / f"{what}.zarr"
    with client.as_current():
        for attempt in range(3):
            rows = da.random.RandomState(attempt).normal(size=(200_000, 3), chunks=(2000, 3)).map_blocks(_slow)
            with pytest.raises(DiskFullError) as info:
                if what == "predict":
                    write_array_zarr(models[what].predict(rows), out, name="y_pred")
                elif what == "embed":
                    write_zarr(models[what].transform(rows), None, out)
                else:
                    write_array_zarr(models[what].predict(rows), out, name="labels")
            _assert_refused(info, out, earlier)


def test_model_save_and_checkpoint_on_a_full_disk(disk):
    earlier = _digest(disk / "earlier.zarr")
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 4))
    model = FalkonRegressor(n_centers=50, random_state=0).fit(X, X[:, 0])
    _fill(disk)
    with pytest.raises(DiskFullError) as info:
        model.save(disk / "model")
    _assert_refused(info, disk / "model", earlier)
    with pytest.raises(DiskFullError) as info:
        FalkonRegressor(n_centers=50, random_state=0).fit(X, X[:, 0], checkpoint=disk / "ck")
    assert "checkpoint.npz: no space left on device" in str(info.value)
    assert [p.name for p in (disk / "ck").iterdir()] == [], "a temporary checkpoint was left"
    (disk / "ballast").unlink()
    assert shutil.disk_usage(disk).free > 0
