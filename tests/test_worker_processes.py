"""What a worker process imports to run a fit's tasks, and how the clusters daskkrr starts end.

Every worker process pays its imports in CPU seconds (the test run starts many clusters; every
``daskkrr fit`` starts one), and a closed worker's interpreter used to spend seconds tearing its
modules down while the nanny waited (:mod:`daskkrr.parallel.worker_exit`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

#: Packages no block task needs: the table converters' (pandas, pyarrow), xarray sources', and the
#: estimators' (scikit-learn); and daskkrr's modules that bring them in or are not task code.
HEAVY = ("pandas", "pyarrow", "xarray", "sklearn")
NOT_TASK_MODULES = ("daskkrr.data.tables", "daskkrr.data.parquet", "daskkrr.data.synthetic",
                    "daskkrr.data.sparse_store", "daskkrr.data.writing", "daskkrr.data.scaling", "daskkrr.models")


def _modules() -> list[str]:
    return sorted(sys.modules)


def _import_dask_array() -> list[str]:
    """What the worker imports for any dask array task (``dask.array.chunk.getitem``, ``finalize``)."""
    import dask.array  # noqa: F401
    import zarr  # noqa: F401  # a Zarr store's blocks are read through zarr's own classes

    return sorted(sys.modules)


def _new_heavy(before: list[str], after: list[str]) -> list[str]:
    """Heavy packages and non-task daskkrr modules in ``after`` but not in ``before``."""
    new = set(after) - set(before)
    return sorted(m for m in new if m in HEAVY or m.startswith(NOT_TASK_MODULES))


def test_a_falkon_fits_and_predicts_tasks_import_no_pandas_xarray_or_sklearn(tmp_path):
    """A fresh worker runs a FALKON fit from a dask array, then from a Zarr store, then predict. Whatever
    ``import dask.array`` brings on its own (dask 2026.8 imports xarray, hence pandas and pyarrow,
    when xarray is installed) is imported first and allowed; the tasks may add none of them,
    nor scikit-learn, nor daskkrr's table, synthetic, writing or estimator modules."""
    import dask.array as da
    from distributed import Client, LocalCluster

    from daskkrr import FalkonRegressor, open_dataset
    from daskkrr.data import write_zarr

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=600)
    store = tmp_path / "d.zarr"
    write_zarr(X, y, store, chunk_rows=200)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, memory_limit="1GiB") as cluster, \
            Client(cluster, set_as_default=False) as client, client.as_current():
        baseline = next(iter(client.run(_import_dask_array).values()))
        assert not _new_heavy(baseline, baseline)  # the check itself: nothing is new against itself
        model = FalkonRegressor(n_centers=20, max_iter=2, tol=0.5, random_state=0)  # the tasks, not the solution
        model.fit(da.from_array(X, chunks=200), da.from_array(y, chunks=200))
        after_array = next(iter(client.run(_modules).values()))
        Xz, yz = open_dataset(store)
        model.fit(Xz, yz)
        after_store = next(iter(client.run(_modules).values()))
        predicted = np.asarray(model.predict(Xz))
        after_predict = next(iter(client.run(_modules).values()))
    assert any(m.startswith("daskkrr.kernels") for m in after_array)  # the tasks ran on this worker
    assert "daskkrr.data.loading" in after_store  # and read the store's blocks there
    assert _new_heavy(baseline, after_array) == [], "a dask array fit's tasks"
    assert _new_heavy(baseline, after_store) == [], "a Zarr store fit's tasks"
    assert _new_heavy(baseline, after_predict) == [], "predict's tasks"
    assert predicted.shape == (600,) and "daskkrr.data.predict_rows" in after_predict  # predicted on the worker


def test_with_fast_exit_keeps_the_configured_preloads():
    from daskkrr.parallel.worker_exit import PRELOAD, with_fast_exit

    assert with_fast_exit([], []) == {"preload": [PRELOAD], "preload_argv": [[]]}
    # one argument list shared by the configured preloads becomes one each; ours takes none
    assert with_fast_exit(["a", "b"], ["--x"]) == {"preload": ["a", "b", PRELOAD],
                                                   "preload_argv": [["--x"], ["--x"], []]}
    assert with_fast_exit(["a"], [["--y"]]) == {"preload": ["a", PRELOAD], "preload_argv": [["--y"], []]}
    # a single preload given as a string
    assert with_fast_exit("my.preload", []) == {"preload": ["my.preload", PRELOAD], "preload_argv": [[], []]}
    # already configured (as the test run does): not twice
    assert with_fast_exit([PRELOAD], []) == {"preload": [PRELOAD], "preload_argv": [[]]}


_CLUSTER_SCRIPT = """
import sys, weakref
from daskkrr.parallel import cluster_client

class Marker:
    pass

def mark(path):
    # Runs at the worker's interpreter clean-up, which the fast exit skips; the print, buffered in
    # the worker's stdout (a pipe), must still arrive (multiprocessing flushes the standard streams
    # when the process function returns, and the fast exit flushes them again).
    sys.daskkrr_marker = Marker()
    weakref.finalize(sys.daskkrr_marker, lambda: open(path, "w").write("finalised"))
    print("worker line before close", end="")
    print()
    return 1

with cluster_client(n_workers=1) as client:
    assert client.run(mark, sys.argv[1])
print("client done")
"""


def test_the_clusters_daskkrr_starts_end_their_workers_without_finalising(tmp_path):
    """A local cluster of :func:`daskkrr.parallel.cluster_client` (the CLI's) in a new process, without
    the test run's preload: its worker skips the interpreter's clean-up (a finaliser registered in it
    does not run), its buffered output still arrives, the nanny does not wait 4 s and kill it, and the
    process's exit status and output are as before."""
    marker = tmp_path / "finalised"
    env = {k: v for k, v in os.environ.items() if k != "DASK_DISTRIBUTED__WORKER__PRELOAD"}
    env.pop("PYTHONUNBUFFERED", None)  # the worker's stdout stays block-buffered: the flush is what is checked
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CLUSTER_SCRIPT), str(marker)],
                          capture_output=True, text=True, timeout=240, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("worker line before close") == 1 and proc.stdout.endswith("client done\n"), proc.stdout
    assert "still alive" not in proc.stderr, proc.stderr
    assert not marker.exists(), "the worker's interpreter finalised: the fast exit did not act"


@pytest.mark.parametrize("name", ["MainProcess", "SomeOtherProcess"])
def test_a_worker_outside_a_nanny_process_exits_as_usual(name, monkeypatch):
    """In the calling process (``processes=False``) or any process a nanny did not start, the
    preload registers nothing: that process's exit (and a test run's status) stays its own."""
    import atexit
    import multiprocessing

    from daskkrr.parallel import worker_exit

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(multiprocessing.current_process(), "name", name)
    worker_exit.dask_setup(object())
    assert registered == []
    monkeypatch.setattr(multiprocessing.current_process(), "name", worker_exit.NANNY_PROCESS)
    worker_exit.dask_setup(object())
    assert registered == [worker_exit._end_once_closed]
