"""A Parquet folder: converted to Zarr then fitted, against fitted directly (time, peak memory, same model).

The benchmark writes a Parquet folder of ``n`` rows (``--d`` float64 features, 8 by
default, and a target, ``sin`` of the first feature plus noise 0.1; ``--parts`` part files,
row groups of ``--row-group`` rows) under ``--data-dir`` once, then runs the command line
as a user does, each step in a fresh process (peak memory = the sum of the RSS peaks of the
process tree: the command, and the scheduler and workers of the local cluster it starts,
one per core):

- ``convert``: ``daskkrr convert TABLE STORE --target y --chunk-rows ROW_GROUP``;
- ``fit-zarr``: ``daskkrr fit --data STORE``;
- ``fit-parquet``: ``daskkrr fit --data TABLE --target y`` (no Zarr copy);
- ``agree``: both models predict the store's first 50 000 rows (no cluster).

Rows: route ``zarr`` (``convert_s``, ``fit_s``, ``total_s`` = both, ``peak_mb`` the larger
of the two steps) and route ``parquet`` (``fit_s`` = ``total_s``, ``peak_mb``), with each
model's ``train_rmse`` on those rows and, on the ``parquet`` row, ``max_abs_diff`` (largest
difference of the two models' predictions) and ``max_abs_diff_rel`` (over max |y|), to be
read against the solver's ``tol``. ``table_mb`` is the size of the table's values in memory
(n x (d + 1) x 8 bytes) and ``row_group_mb`` that of one row group, the unit a bounded
memory is measured in.

Both fits: ``--centers`` (500), ``--max-iter 10 --tol 1e-3 --seed 0``. ``--quick`` runs
n = 2e5 (row groups of 5000); the full run is the issue's n = 1e7 (row groups of 1e5,
10 parts); ``--n`` runs another size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

#: Rows both models predict to compare them (the store's first rows).
AGREE_ROWS = 50_000
#: The fits' solver settings (also in the result's meta).
FIT_FLAGS = ["--max-iter", "10", "--tol", "1e-3", "--seed", "0"]


def table_for(data_dir: Path, n: int, d: int, parts: int, row_group: int) -> Path:
    """The Parquet folder of ``n`` rows (written once, part by part, each part by row groups: memory holds one
    row group)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = data_dir / f"parquet_n{n}_d{d}_p{parts}_rg{row_group}"
    if path.exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = -(-n // parts)
    for part, start in enumerate(range(0, n, rows)):
        stop = min(n, start + rows)
        writer = None
        for first in range(start, stop, row_group):
            X = rng.normal(size=(min(row_group, stop - first), d))
            frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(d)])
            frame["y"] = np.sin(X[:, 0]) + 0.1 * rng.normal(size=len(X))
            table = pa.Table.from_pandas(frame, preserve_index=False)
            writer = writer or pq.ParquetWriter(tmp / f"part.{part:03d}.parquet", table.schema)
            writer.write_table(table, row_group_size=row_group)
        if writer is not None:
            writer.close()
    tmp.rename(path)
    return path


def child(args) -> dict:
    if args.step == "agree":
        return _agreement(args)
    from daskkrr.cli import main

    common = ["--centers", str(args.centers), *FIT_FLAGS, "--no-progress", "--overwrite", "-q"]
    argv = {
        "convert": ["convert", args.table, args.store, "--target", "y", "--chunk-rows", str(args.row_group),
                    "--overwrite", "-q"],
        "fit-zarr": ["fit", "--data", args.store, "--out", args.model_zarr, *common],
        "fit-parquet": ["fit", "--data", args.table, "--target", "y", "--out", args.model_parquet, *common],
    }[args.step]
    t = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - t
    if code != 0:
        raise RuntimeError(f"daskkrr {' '.join(argv)} exited with {code}")
    return {"seconds": seconds}


def _agreement(args) -> dict:
    """Both models on the store's first rows: each one's RMSE, and how far apart their predictions are."""
    import numpy as np
    import zarr

    from daskkrr import load

    group = zarr.open_group(args.store, mode="r")
    rows = min(AGREE_ROWS, group["X"].shape[0])
    X, y = group["X"][:rows], group["y"][:rows]
    out: dict = {}
    pred = {}
    for name, path in (("zarr", args.model_zarr), ("parquet", args.model_parquet)):
        model = load(path)
        pred[name] = np.asarray(model.predict(X))
        out[f"{name}_rmse"] = float(np.sqrt(np.mean((pred[name] - y) ** 2)))
        out[f"{name}_n_iter"] = int(model.n_iter_)
    diff = float(np.abs(pred["parquet"] - pred["zarr"]).max())
    out.update(max_abs_diff=diff, max_abs_diff_rel=diff / float(np.abs(y).max()),
               bitwise_equal=bool(np.array_equal(pred["parquet"], pred["zarr"])))
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 2e5, row groups of 5000")
    ap.add_argument("--n", type=float, default=None, help="rows (default 1e7, or 2e5 with --quick)")
    ap.add_argument("--d", type=int, default=8, help="features")
    ap.add_argument("--parts", type=int, default=None, help="part files (default 10, or 4 with --quick)")
    ap.add_argument("--row-group", type=int, default=None,
                    help="rows per row group, and per chunk of the store (default 1e5, or 5000 with --quick)")
    ap.add_argument("--centers", type=int, default=500)
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--step", "--table", "--store", "--model-zarr", "--model-parquet"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.row_group = int(args.row_group)
        emit(child(args))
        return []
    n = int(args.n or (2e5 if args.quick else 1e7))
    row_group = args.row_group or (5000 if args.quick else 100_000)
    parts = args.parts or (4 if args.quick else 10)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    table = table_for(data_dir, n, args.d, parts, row_group)
    write_s = time.perf_counter() - t
    store = data_dir / f"{table.name}.zarr"
    common = ["--table", str(table), "--store", str(store), "--row-group", str(row_group),
              "--centers", str(args.centers), "--model-zarr", str(data_dir / f"{table.name}.model-zarr"),
              "--model-parquet", str(data_dir / f"{table.name}.model-parquet")]
    steps = {}
    for step in ("convert", "fit-zarr", "fit-parquet", "agree"):
        steps[step] = run_child([__file__, "--child", "--step", step, *common], timeout=args.timeout)
        if "error" in steps[step]:
            raise RuntimeError(f"step {step} failed: {steps[step]['error']}")
    conv, fz, fp, agree = steps["convert"], steps["fit-zarr"], steps["fit-parquet"], steps["agree"]
    table_mb = n * (args.d + 1) * 8 / 1e6
    sizes = dict(n=n, table_mb=round(table_mb, 1), row_group_mb=round(row_group * (args.d + 1) * 8 / 1e6, 2))
    rows = [
        dict(sizes, route="zarr", convert_s=conv["seconds"], fit_s=fz["seconds"],
             total_s=conv["seconds"] + fz["seconds"], peak_mb=max(conv["peak_mb"], fz["peak_mb"]),
             convert_peak_mb=conv["peak_mb"], fit_peak_mb=fz["peak_mb"], n_iter=agree["zarr_n_iter"],
             train_rmse=agree["zarr_rmse"]),
        dict(sizes, route="parquet", convert_s=0.0, fit_s=fp["seconds"], total_s=fp["seconds"],
             peak_mb=fp["peak_mb"], convert_peak_mb=0.0, fit_peak_mb=fp["peak_mb"], n_iter=agree["parquet_n_iter"],
             train_rmse=agree["parquet_rmse"], max_abs_diff=agree["max_abs_diff"],
             max_abs_diff_rel=agree["max_abs_diff_rel"], bitwise_equal=agree["bitwise_equal"]),
    ]
    print_table(rows, ["n", "route", "convert_s", "fit_s", "total_s", "peak_mb", "table_mb", "n_iter", "train_rmse"],
                title="Parquet folder: convert + fit from Zarr against fit from Parquet (daskkrr commands)")
    write_results(rows, args.out, f"parquet_input_n{n}",
                  {"machine": machine(), "d": args.d, "parts": parts, "row_group": row_group,
                   "centers": args.centers, "fit_flags": FIT_FLAGS, "write_table_s": round(write_s, 1),
                   "workers": "local cluster of the command: one per core",
                   # where each step's memory is: the command, the scheduler, each worker
                   "peak_per_process_mb": {step: steps[step]["peak_per_process_mb"] for step in steps}})
    return rows


if __name__ == "__main__":
    main()
