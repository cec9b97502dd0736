"""A fit from numpy arrays under a distributed client against the same fit from a Zarr store.

Issue 37, item 3: numpy input under a ``Client`` used to become one block embedded in
every pass's task graph ("Sending large graph" warnings, one worker doing the work).
It is now split into one block per task slot and scattered to the workers once
(:func:`daskkrr.data.inputs.load_training_data`). This script measures both inputs on
daskkrr's default local cluster (one single-threaded worker process per core):

- ``numpy``: ``FalkonRegressor().fit(X, y)`` with ``X``, ``y`` in memory;
- ``zarr``: ``FalkonRegressor().fit(path)`` with the same rows written to a Zarr store.

Each fit runs in a fresh process that starts its cluster, warms the workers with a
small fit (imports, the engine), then times the measured fit; reported are the median
over ``--repeats`` processes, the ratio numpy / zarr, and the "large graph" warnings
distributed emitted during the measured fits. Run
``python -m workflows.benchmarks run numpy_on_cluster`` (``--quick``: n = 20 000, one
fit each); the table goes to ``results/`` through ``fit_tools.write_results``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import machine, write_results  # noqa: E402

PARAMS = dict(n_centers=500, random_state=0, max_iter=20)


def make_data(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    return X, np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.normal(size=n)


def child(kind: str, n: int, d: int, store: str) -> dict:
    """One measured fit in this process, on a fresh local cluster."""
    from distributed import Client, LocalCluster

    from daskkrr import FalkonRegressor
    from daskkrr.parallel.client import local_cluster_kwargs

    X, y = make_data(n, d)
    with LocalCluster(**local_cluster_kwargs()) as cluster, Client(cluster) as client:
        FalkonRegressor(n_centers=20, random_state=0).fit(X[:2000], y[:2000])  # warm the workers
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            model = FalkonRegressor(**PARAMS).fit(*((X, y) if kind == "numpy" else (store,)))
            seconds = time.perf_counter() - t0
        large = sum("large graph" in str(w.message) for w in caught)
        workers = len(client.scheduler_info()["workers"])
    return {"kind": kind, "seconds": seconds, "large_graph_warnings": large, "workers": workers,
            "n_iter": int(model.n_iter_), "strategy": model.strategy_, "sketch_rows": int(model.preconditioner_rows_),
            "passes": int(model.n_data_passes_)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 20 000, one fit per input")
    parser.add_argument("--n", type=int, default=None, help="rows (default 200 000)")
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=None, help="fits per input (default 3)")
    parser.add_argument("--out", default=None, help="results folder (default: results/ beside this file)")
    parser.add_argument("--child", choices=["numpy", "zarr"], help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.n = args.n or (20_000 if args.quick else 200_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.child:
        print(json.dumps(child(args.child, args.n, args.d, args.store)))
        return
    from daskkrr.data import write_zarr

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "train.zarr"
        write_zarr(*make_data(args.n, args.d), store)
        runs: dict[str, list[dict]] = {"numpy": [], "zarr": []}
        for _ in range(args.repeats):
            for kind in runs:  # interleaved, so that a slow spell of a shared host hits both
                out = subprocess.run([sys.executable, __file__, "--child", kind, "--n", str(args.n), "--d",
                                      str(args.d), "--store", str(store)], capture_output=True, text=True,
                                     check=True)
                runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
                r = runs[kind][-1]
                print(f"  {kind}: {r['seconds']:.2f} s ({r['strategy']}, {r['sketch_rows']} sketch rows, "
                      f"{r['passes']} passes, {r['n_iter']} CG iterations)", flush=True)
    med = {kind: statistics.median(r["seconds"] for r in rs) for kind, rs in runs.items()}
    print(f"FalkonRegressor({PARAMS}) on {args.n} x {args.d}, {runs['numpy'][0]['workers']} workers, "
          f"median of {args.repeats} fits, each in a fresh process")
    for kind, rs in runs.items():
        times = ", ".join(f"{r['seconds']:.2f}" for r in rs)
        warned = sum(r["large_graph_warnings"] for r in rs)
        print(f"  {kind:6s} {med[kind]:7.2f} s   (fits: {times}; large-graph warnings: {warned})")
    print(f"  ratio numpy / zarr: {med['numpy'] / med['zarr']:.2f}")
    rows = [{"input": kind, "n": args.n, "d": args.d, "seconds": med[kind], "fits_s": [r["seconds"] for r in rs],
             "large_graph_warnings": sum(r["large_graph_warnings"] for r in rs), "workers": rs[0]["workers"]}
            for kind, rs in runs.items()]
    write_results(rows, args.out, "numpy_on_cluster" + ("_quick" if args.quick else ""),
                  {"machine": machine(), "args": vars(args), "params": PARAMS})


if __name__ == "__main__":
    main()
