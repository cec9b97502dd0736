"""FALKON from Zarr at n = 1e5, 1e6, 1e7 (d = 20, float32, M = 2000): time, memory, bytes read.

Each size is a synthetic regression store (``daskkrr.data.write_regression_zarr``,
written once under ``--data-dir``) fitted by ``FalkonRegressor(n_centers=2000,
dtype="float32", max_iter=--max-iter, tol=--tol)`` (defaults 20 and 1e-3: CG
stops at a preconditioned residual of 1e-3, as in ``fit_vs_sklearn.py``) on a ``LocalCluster`` of 2
single-threaded worker processes (``--scheduler threads`` for the threaded
scheduler), in a fresh process. Reported:

- ``fit_s``, the strategy the cost model chose, CG iterations, passes over the data;
- ``peak_mb``: sum of the peak RSS of every process (client, scheduler, nannies,
  workers), and the largest single process;
- ``read_mb``: bytes the processes read through ``read()`` system calls during the
  fit (``/proc/<pid>/io`` ``rchar``; page-cache hits included) and ``store_reads``,
  that over the store's size: small stores are read a few times and then held in
  worker memory (persisted), large ones are streamed on every pass;
- ``read_share``: the share of a streamed pass spent reading and decompressing the
  store, from timing a pass that only reads (``X.sum()``, warm, best of two)
  against the fit's mean pass (``fit_s / passes``).

Run ``python workflows/benchmarks/scaling_zarr.py --quick`` (1e5 and 1e6); the full
run adds 1e7 (about 10 minutes on the 2-core development machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

D = 20


def store_for(data_dir: Path, n: int, chunk_rows: int) -> Path:
    from daskkrr.data.synthetic import write_regression_zarr
    from daskkrr.data.writing import DEFAULT_COMPRESSORS

    codec = "-".join(type(c).__name__.replace("Codec", "").lower() for c in DEFAULT_COMPRESSORS) or "raw"
    path = data_dir / f"scaling_n{n}_d{D}_c{chunk_rows}_{codec}.zarr"
    if not path.exists():
        t = time.perf_counter()
        write_regression_zarr(path, n, D, chunk_rows=min(chunk_rows, n), dtype="float32", random_state=0)
        print(f"wrote {path} in {time.perf_counter() - t:.1f}s", flush=True)
    return path


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _rchar_tree() -> int:
    import psutil

    total = 0
    me = psutil.Process()
    for p in [me] + me.children(recursive=True):
        try:
            total += p.io_counters().read_chars
        except (psutil.Error, AttributeError):
            pass
    return total


def child(args) -> dict:
    import numpy as np

    from daskkrr import FalkonRegressor, open_dataset
    from daskkrr.parallel.client import local_cluster_kwargs

    path = args.store

    def run(client):
        X, y = open_dataset(path)
        kw = {} if client else {"scheduler": "threads"}
        read_pass_s = float("inf")
        for _ in range(2):  # the first also warms the workers up
            t = time.perf_counter()
            X.sum().compute(**kw)
            read_pass_s = min(read_pass_s, time.perf_counter() - t)
        model = FalkonRegressor(n_centers=args.centers, penalty=1e-6, dtype="float32", max_iter=args.max_iter,
                                tol=args.tol, random_state=0, strategy=args.strategy)
        r0 = _rchar_tree()
        t = time.perf_counter()
        model.fit(path)
        fit_s = time.perf_counter() - t
        read = _rchar_tree() - r0
        n_test = min(20_000, int(X.shape[0]))
        pred = np.asarray(model.predict(X[:n_test]).compute())
        train_rmse = float(np.sqrt(np.mean((pred - np.asarray(y[:n_test])) ** 2)))
        return dict(fit_s=fit_s, strategy=model.strategy_, n_iter=model.n_iter_, passes=model.n_data_passes_,
                    sketch_rows=model.preconditioner_rows_,
                    read_mb=read / 2**20, read_pass_s=read_pass_s, train_rmse=train_rmse,
                    read_share=read_pass_s / (fit_s / max(1, model.n_data_passes_)))

    if args.scheduler == "cluster":
        from distributed import Client, LocalCluster

        with LocalCluster(**local_cluster_kwargs()) as cluster, Client(cluster) as client, client.as_current():
            return run(client)  # the fit runs on the current client
    return run(None)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 1e5 and 1e6")
    ap.add_argument("--sizes", default=None)
    ap.add_argument("--centers", type=int, default=2000)
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--scheduler", choices=("cluster", "threads"), default="cluster")
    ap.add_argument("--chunk-rows", type=int, default=250_000)
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(child(args))
        return []
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(float(s)) for s in (args.sizes or ("1e5,1e6" if args.quick else "1e5,1e6,1e7")).split(",")]
    rows = []
    for n in sizes:
        store = store_for(data_dir, n, args.chunk_rows)
        argv_child = [__file__, "--child", "--store", str(store), "--centers", str(args.centers),
                      "--max-iter", str(args.max_iter), "--tol", str(args.tol), "--strategy", args.strategy,
                      "--scheduler", args.scheduler]
        res = run_child(argv_child, timeout=args.timeout)
        store_mb = _dir_bytes(store) / 2**20
        row = {"n": n, "d": D, "M": args.centers, "store_mb": store_mb, **res}
        if "passes" in row:
            row["store_reads"] = row["read_mb"] / store_mb
            row["max_process_mb"] = max(row["peak_per_process_mb"].values())
        rows.append(row)
        print({k: v for k, v in row.items() if k != "peak_per_process_mb"}, flush=True)
    base = next((r for r in rows if r["n"] == 1_000_000 and "fit_s" in r), None)
    for r in rows:
        if base and "fit_s" in r:
            r["time_per_row_vs_1e6"] = (r["fit_s"] / r["n"]) / (base["fit_s"] / base["n"])
            r["memory_vs_1e6"] = r["peak_mb"] / base["peak_mb"]
    info = machine()
    title = (f"FALKON from Zarr, d = {D}, float32, M = {args.centers}, max_iter = {args.max_iter}, tol = {args.tol}, "
             f"{args.scheduler}; {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB")
    print_table(rows, ["n", "fit_s", "strategy", "n_iter", "sketch_rows", "passes", "peak_mb", "max_process_mb",
                       "n_processes", "read_mb", "store_reads", "read_share", "time_per_row_vs_1e6", "memory_vs_1e6",
                       "train_rmse"], title)
    write_results(rows, args.out, "scaling_zarr", {"machine": info, "args": vars(args), "pid": os.getpid()})
    return rows


if __name__ == "__main__":
    main()
