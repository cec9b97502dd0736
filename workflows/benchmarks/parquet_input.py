"""A Parquet folder: converted to Zarr then fitted, against fitted directly (time and peak memory).

The benchmark writes a Parquet folder of ``n`` rows (d = 10 float64 features and a
target, ``sin`` of the first feature plus noise 0.1; parts of ``n / 4`` rows, row groups
of ``--row-group`` rows) under ``--data-dir`` once, then measures, each step in a fresh
process (peak memory = the sum of the RSS peaks of the process tree, client, scheduler
and workers included):

- route ``zarr``: ``convert_table`` of the folder into a Zarr store (chunks = row groups),
  then ``FalkonRegressor`` fitted from the store: ``convert_s``, ``fit_s``,
  ``total_s`` (both), ``peak_mb`` (the larger of the two steps);
- route ``parquet``: the same estimator fitted from the folder opened as a dask
  DataFrame (``daskkrr.data.parquet.parquet_training_data``, as ``daskkrr fit --data
  x.parquet`` does): ``fit_s`` = ``total_s``, ``peak_mb``.

Both fits: ``n_centers=--centers`` (500), ``max_iter=10``, ``tol=1e-3``, ``random_state=0``, on a
local cluster of one single-threaded worker per core; ``train_rmse`` is each model's RMSE on
its first 50 000 rows (the two agree to the solver's tolerance).

``python workflows/benchmarks/parquet_input.py --quick`` runs n = 2e5; the full run is
the issue's n = 1e7.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

D = 10
PARTS = 4


def table_for(data_dir: Path, n: int, row_group: int) -> Path:
    """The Parquet folder of ``n`` rows (written once, part by part: memory holds one part)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = data_dir / f"parquet_n{n}_d{D}_rg{row_group}"
    if path.exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = -(-n // PARTS)
    for part, start in enumerate(range(0, n, rows)):
        X = rng.normal(size=(min(rows, n - start), D))
        frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(D)])
        frame["y"] = np.sin(X[:, 0]) + 0.1 * rng.normal(size=len(X))
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp / f"part.{part}.parquet",
                       row_group_size=row_group)
    tmp.rename(path)
    return path


def child(args) -> dict:
    if args.step == "convert":
        from daskkrr.data import convert_table

        t = time.perf_counter()
        convert_table(args.table, args.store, target="y", chunk_rows=args.row_group, overwrite=True)
        return {"convert_s": time.perf_counter() - t}
    import numpy as np
    from distributed import Client, LocalCluster

    from daskkrr import FalkonRegressor
    from daskkrr.data import open_dataset
    from daskkrr.data.parquet import parquet_training_data
    from daskkrr.parallel.client import local_cluster_kwargs

    model = FalkonRegressor(n_centers=args.centers, max_iter=10, tol=1e-3, random_state=0)
    with LocalCluster(**local_cluster_kwargs()) as cluster, Client(cluster) as client, client.as_current():
        if args.step == "fit-zarr":
            X, y = open_dataset(args.store)
        else:
            X, y, _ = parquet_training_data(args.table, "y")
        t = time.perf_counter()
        model.fit(X, y)
        fit_s = time.perf_counter() - t
        Xs, ys = open_dataset(args.store)  # both models scored on the same rows (the convert step ran first)
        rows = min(50_000, int(Xs.shape[0]))
        pred = np.asarray(model.predict(Xs[:rows]).compute())
        rmse = float(np.sqrt(np.mean((pred - np.asarray(ys[:rows])) ** 2)))
    return {"fit_s": fit_s, "n_iter": model.n_iter_, "passes": model.n_data_passes_, "train_rmse": rmse}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 2e5")
    ap.add_argument("--n", type=float, default=None, help="rows (default 1e7, or 2e5 with --quick)")
    ap.add_argument("--row-group", type=int, default=None, help="rows per row group (default n / 40)")
    ap.add_argument("--centers", type=int, default=500)
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--step", help=argparse.SUPPRESS)
    ap.add_argument("--table", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(child(args))
        return []
    n = int(args.n or (2e5 if args.quick else 1e7))
    row_group = args.row_group or max(1, n // 40)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    table = table_for(data_dir, n, row_group)
    store = data_dir / f"{table.name}.zarr"
    common = ["--table", str(table), "--store", str(store), "--row-group", str(row_group),
              "--centers", str(args.centers)]
    steps = {step: run_child([__file__, "--child", "--step", step, *common], timeout=args.timeout)
             for step in ("convert", "fit-zarr", "fit-parquet")}
    for step, res in steps.items():
        if "error" in res:
            raise RuntimeError(f"step {step} failed: {res['error']}")
    conv, fz, fp = steps["convert"], steps["fit-zarr"], steps["fit-parquet"]
    rows = [
        dict(n=n, route="zarr", convert_s=conv["convert_s"], fit_s=fz["fit_s"],
             total_s=conv["convert_s"] + fz["fit_s"], peak_mb=max(conv["peak_mb"], fz["peak_mb"]),
             convert_peak_mb=conv["peak_mb"], fit_peak_mb=fz["peak_mb"], n_iter=fz["n_iter"],
             passes=fz["passes"], train_rmse=fz["train_rmse"]),
        dict(n=n, route="parquet", convert_s=0.0, fit_s=fp["fit_s"], total_s=fp["fit_s"], peak_mb=fp["peak_mb"],
             convert_peak_mb=0.0, fit_peak_mb=fp["peak_mb"], n_iter=fp["n_iter"], passes=fp["passes"],
             train_rmse=fp["train_rmse"]),
    ]
    print_table(rows, ["n", "route", "convert_s", "fit_s", "total_s", "peak_mb", "n_iter", "train_rmse"],
                title="Parquet folder: convert + fit from Zarr against fit from Parquet")
    write_results(rows, args.out, f"parquet_input_n{n}",
                  {"machine": machine(), "d": D, "row_group": row_group, "centers": args.centers})
    return rows


if __name__ == "__main__":
    main()
