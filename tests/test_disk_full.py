"""A full disk (a size-limited tmpfs) during convert, fit (checkpoint and model), predict, embed,
cluster and save: a DiskFullError naming the output and "no space left", no temporary left
behind (also while parallel workers still write), earlier outputs intact."""

from __future__ import annotations

import hashlib
import re
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


def _slow_rows(seed: int, n: int) -> da.Array:
    """``n`` random rows of 3 columns in blocks of 2000, each computed by :func:`_slow`. The dtype is
    given: else map_blocks infers it by calling ``_slow`` twice on empty blocks, 0.4 s of sleep each time."""
    return da.random.RandomState(seed).normal(size=(n, 3), chunks=(2000, 3)).map_blocks(_slow, dtype=np.float64)


# Labels go through write_array_zarr as predictions do (and the CLI's cluster command is checked below): slow.
@pytest.mark.parametrize("what", ["predict", "embed", pytest.param("cluster", marks=pytest.mark.slow)])
def test_parallel_write_on_a_full_disk(what, disk, client):
    """Predictions, an embedding and labels written by 4 threads on 2 workers, 100 chunk files of at
    least a 4 KiB page each on a disk with 64 KiB free: every try fails and leaves nothing, though
    other chunks are still being written when the first one fails."""
    earlier = _digest(disk / "earlier.zarr")
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3))
    model = {"predict": lambda: FalkonRegressor(n_centers=20, random_state=0).fit(X, X[:, 0]),  # the one written
             "embed": lambda: NystromKernelPCA(n_components=3, n_centers=20, random_state=0).fit(X),
             "cluster": lambda: NystromKernelKMeans(n_clusters=3, n_centers=20, random_state=0).fit(X)}[what]()
    _fill(disk, leave=64 * 1024)
    out = disk / f"{what}.zarr"
    with client.as_current():
        for attempt in range(3):
            rows = _slow_rows(attempt, 200_000)
            with pytest.raises(DiskFullError) as info:
                if what == "predict":
                    write_array_zarr(model.predict(rows), out, name="y_pred")
                elif what == "embed":
                    write_zarr(model.transform(rows), None, out)
                else:
                    write_array_zarr(model.predict(rows), out, name="labels")
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


def test_save_model_on_a_full_disk_keeps_the_earlier_model(disk):
    """``save_model`` and an unsupervised model's ``save``, new or replacing a model saved earlier
    (``overwrite=True``): DiskFullError, no temporary or ``.NAME.old-*`` left, the earlier model
    byte-identical and still loadable."""
    import daskkrr
    from daskkrr.models.persistence import save_model

    earlier = _digest(disk / "earlier.zarr")
    X = np.random.default_rng(4).normal(size=(300, 4))
    save_model(FalkonRegressor(n_centers=10, random_state=0).fit(X, X[:, 0]), disk / "model")
    saved = _digest(disk / "model")
    bigger = FalkonRegressor(n_centers=200, random_state=0).fit(X, X[:, 1])
    _fill(disk)
    with pytest.raises(DiskFullError, match="model: no space left on device"):
        save_model(bigger, disk / "model", overwrite=True)
    with pytest.raises(DiskFullError) as info:
        NystromKernelPCA(n_components=2, n_centers=50, random_state=0).fit(X).save(disk / "kpca")
    _assert_refused(info, disk / "kpca", earlier)
    assert _digest(disk / "model") == saved, "the earlier model changed"
    (disk / "ballast").unlink()
    assert daskkrr.load(disk / "model").centers_.shape == (10, 4)


def test_threaded_write_on_a_full_disk(disk):
    """Dask's threaded scheduler raises the first chunk's error while other threads still write
    (each block takes 0.2 s, twice the clean-up's 0.1 s of seeing the temporary gone): the write
    runs on a pool of its own that is shut down, running tasks awaited, before the temporary goes."""
    import dask

    earlier = _digest(disk / "earlier.zarr")
    _fill(disk, leave=64 * 1024)
    out = disk / "threads.zarr"
    with dask.config.set(scheduler="threads", num_workers=4):
        for attempt in range(3):
            rows = _slow_rows(attempt, 40_000)
            with pytest.raises(DiskFullError) as info:
                write_array_zarr(rows, out, name="y_pred")
            time.sleep(0.3)  # a writer the clean-up did not wait for would have made the temporary again by now
            _assert_refused(info, out, earlier)


# ---------------------------------------------------------------- every writing command of the CLI
@pytest.fixture(scope="module")
def cli_inputs(tmp_path_factory):
    """Inputs off the small disk: a store S (4000 rows in 20 blocks), a model M fitted on it, a workflow."""
    root = tmp_path_factory.mktemp("cli_inputs")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(4000, 3))
    write_zarr(X, X[:, 0] - X[:, 1], root / "S", chunk_rows=200)
    FalkonRegressor(n_centers=20, random_state=0).fit(X, X[:, 0] - X[:, 1]).save(root / "M")
    # Its data are generated into the runs directory's cache (480 kB): the disk fills during the run.
    (root / "wf.toml").write_text("[data]\ngenerate = {n = 20000, d = 3, chunk_rows = 1000}\n"
                                  "[model]\nn_centers = 20\nmax_iter = 5\n")
    return root


#: command -> its arguments (``{S}``, ``{M}``, ``{W}``: the inputs; ``{out}``: on the full disk).
WRITERS = {
    "generate": ["generate", "{out}", "--n", "4000", "--d", "3", "--chunk-rows", "200"],
    "fit": ["fit", "--data", "{S}", "--out", "{out}", "--centers", "20", "--max-iter", "5"],
    "predict": ["predict", "--model", "{M}", "--data", "{S}", "--out", "{out}"],
    "embed": ["embed", "--data", "{S}", "--out", "{out}", "--n-components", "2", "--centers", "20"],
    # Random centroids and one Lloyd pass: the labels' write is what finds the disk full (k-means|| seeding
    # and 5 Lloyd passes were 7 passes over S more, half of the command's time).
    "cluster": ["cluster", "--data", "{S}", "--out", "{out}", "--n-clusters", "3", "--centers", "20", "--n-init", "1",
                "--init", "random", "--max-iter", "1"],
    "tune": ["tune", "--data", "{S}", "--out", "{out}", "--centers", "20", "--max-iter", "5", "--budget-fits", "2",
             "--candidates", "4", "--no-penalty-path"],
    "run": ["run", "{W}", "--runs-dir", "{out}"],
}
#: Free bytes left on the disk. 32 KiB: room for a store's metadata (written here), not for its 20 or
#: more chunk files of at least a 4 KiB page each (written by the workers, which then fail); fit and tune
#: save a model of two files from here, so their disk is full to the last byte. A run's lock, status,
#: configuration and log take about 16 KiB; its 480 kB of generated data are written by the workers.
LEAVE = {"fit": 0, "tune": 0, "run": 64 * 1024}


@pytest.mark.parametrize("command", list(WRITERS))
def test_every_writing_command_on_a_full_disk(command, disk, cli_inputs, client, capsys):
    """Exit code 1 and one line naming the path on the full disk and its free space; nothing left
    on the disk but the earlier output (a run keeps its directory, marked failed), the inputs unchanged,
    and no worker's "Compute Failed" traceback logged for the chunks that found the disk full."""
    import logging

    earlier = _digest(disk / "earlier.zarr")
    inputs = _digest(cli_inputs)
    out = disk / "out"
    args = [a.format(S=cli_inputs / "S", M=cli_inputs / "M", W=cli_inputs / "wf.toml", out=out)
            for a in WRITERS[command]]
    records: list[logging.LogRecord] = []
    seen = logging.Handler(logging.ERROR)
    seen.emit = records.append  # type: ignore[method-assign]
    worker_log = logging.getLogger("distributed.worker")
    worker_log.addHandler(seen)
    _fill(disk, leave=LEAVE.get(command, 32 * 1024))
    try:
        code = main([*args, "--scheduler", client.scheduler.address, "-q"])
    finally:
        worker_log.removeHandler(seen)
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("daskkrr: error: "), err
    assert f"{disk}/" in err and "no space left on device" in err, err
    assert re.search(r"\d\.\d [KMGT]iB free there now", err), err
    assert not [r.getMessage()[:200] for r in records if str(r.msg).startswith("Compute Failed")]
    (disk / "ballast").unlink()
    left = sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if not p.is_relative_to(disk / "earlier.zarr"))
    if command == "run":  # the failed run's record, the lock file and the (empty) cache of the runs directory
        assert any(_run_record(disk, p) for p in left), left
        assert all(p in ("out", "out/.lock", "out/cache") or _run_record(disk, p) for p in left), left
    else:
        assert left == [], f"left on the disk: {left}"
    assert _digest(disk / "earlier.zarr") == earlier and _digest(cli_inputs) == inputs


def test_the_command_line_keeps_the_dask_config_of_its_process(tmp_path, monkeypatch):
    """Each ``main()`` call used to ``dask.config.refresh()``: the config was emptied for a moment, and
    the in-process workers of the ``client`` fixture, whose heartbeat read ``distributed.comm.retry.count``
    then, closed themselves (KeyError: 'comm'); the next test's computation waited for workers until
    pytest's timeout (the hang of this file under load). Now the one logging key is set in place, and
    settings of the calling process survive."""
    import dask

    monkeypatch.setenv("DASK_LOGGING__DISTRIBUTED", "error")  # restored after the test
    with dask.config.set({"daskkrr-test.marker": 1, "logging.distributed": "warning"}):  # restored on exit
        assert main(["convert", str(tmp_path / "absent.csv"), str(tmp_path / "out.zarr"), "--target", "y"]) == 1
        assert dask.config.get("daskkrr-test.marker", None) == 1, "main() dropped the process's dask config"
        assert dask.config.get("logging.distributed") == "error"


def _run_record(disk: Path, relative: str) -> bool:
    """Whether ``relative`` is a failed run's directory or one of its files (no temporary, no model)."""
    import json

    parts = Path(relative).parts
    if len(parts) < 2 or parts[0] != "out" or parts[1].startswith("."):
        return False
    status = json.loads((disk / "out" / parts[1] / "status.json").read_text()).get("status")
    return status == "failed" and (len(parts) == 2 or parts[2] in ("status.json", "config.json", "run.log", "FAILED"))


@pytest.mark.parametrize("n_bytes, shown", [(0, "0.0 KiB"), (50 * 2**10, "50.0 KiB"), (3 * 2**20 // 2, "1.5 MiB"),
                                            (5 * 2**30, "5.0 GiB"), (2**41, "2.0 TiB")])
def test_the_free_space_is_shown_in_a_unit_that_says_something(n_bytes, shown):
    from daskkrr.utils.atomic import _size

    assert _size(n_bytes) == shown
