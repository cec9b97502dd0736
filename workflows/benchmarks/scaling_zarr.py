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

from fit_tools import PhaseClock, emit, machine, print_table, run_child, write_results  # noqa: E402

D = 20


def store_for(data_dir: Path, n: int, chunk_rows: int, test_rows: int) -> tuple[Path, float]:
    """The store of ``n`` training rows followed by ``test_rows`` held-out ones (same stream), and its write time."""
    from daskkrr.data.synthetic import write_regression_zarr
    from daskkrr.data.writing import DEFAULT_COMPRESSORS

    codec = "-".join(type(c).__name__.replace("Codec", "").lower() for c in DEFAULT_COMPRESSORS) or "raw"
    chunk = min(chunk_rows, n)  # n is a multiple of it in every size run here: the fit's rows end on a chunk
    path = data_dir / f"scaling_n{n}+{test_rows}_d{D}_c{chunk}_{codec}.zarr"
    write_s = float("nan")
    if not path.exists():
        t = time.perf_counter()
        write_regression_zarr(path, n + test_rows, D, chunk_rows=chunk, dtype="float32", random_state=0)
        write_s = time.perf_counter() - t
        print(f"wrote {path} in {write_s:.1f}s", flush=True)
    return path, write_s


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
    from daskkrr.events import subscribe
    from daskkrr.parallel.client import local_cluster_kwargs

    def run(client):
        X_all, y_all = open_dataset(args.store)
        n = int(X_all.shape[0]) - args.test_rows
        X, y = X_all[:n], y_all[:n]  # the last test_rows rows are held out
        kw = {} if client else {"scheduler": "threads"}
        read_pass_s = float("inf")
        for _ in range(2 if n < 50_000_000 else 1):  # the first also warms the workers up
            t = time.perf_counter()
            X.sum().compute(**kw)
            read_pass_s = min(read_pass_s, time.perf_counter() - t)
        model = FalkonRegressor(n_centers=args.centers, penalty=1e-6, dtype="float32", max_iter=args.max_iter,
                                tol=args.tol, random_state=0, strategy=args.strategy)
        clock = PhaseClock()
        r0 = _rchar_tree()
        t = time.perf_counter()
        with subscribe(clock):
            model.fit(X, y)
        fit_s = time.perf_counter() - t
        read = _rchar_tree() - r0
        t = time.perf_counter()
        pred = np.asarray(model.predict(X_all[n:]).compute())
        predict_s = time.perf_counter() - t
        y_test = np.asarray(y_all[n:])
        test_rmse = float(np.sqrt(np.mean((pred - y_test) ** 2)))
        return dict(fit_s=fit_s, strategy=model.strategy_, n_iter=model.n_iter_, passes=model.n_data_passes_,
                    sketch_rows=model.preconditioner_rows_, stage_s=clock.stages, pass_s=clock.passes,
                    read_mb=read / 2**20, read_pass_s=read_pass_s, test_rmse=test_rmse,
                    test_rmse_vs_noise=test_rmse / 0.1, predict_s=predict_s, n_test=len(y_test),
                    read_share=read_pass_s / (fit_s / max(1, model.n_data_passes_)))

    if args.scheduler == "cluster":
        from distributed import Client, LocalCluster

        with LocalCluster(**local_cluster_kwargs()) as cluster, Client(cluster) as client, client.as_current():
            return run(client)  # the fit runs on the current client
    return run(None)


def falkon_row(store: Path, test_rows: int, args) -> dict:
    """FALKON (CPU build, its own venv) on the same rows, loaded into memory: time, memory, test RMSE or error."""
    import numpy as np
    from falkon_cpu import falkon_python, falkon_unavailable_reason, run_falkon

    from daskkrr import open_dataset

    if falkon_python() is None:
        return {"error": falkon_unavailable_reason()}
    X_all, y_all = open_dataset(store)
    n = int(X_all.shape[0]) - test_rows
    t = time.perf_counter()
    X, y = np.asarray(X_all[:n]), np.asarray(y_all[:n])
    load_s = time.perf_counter() - t
    Xte, yte = np.asarray(X_all[n:]), np.asarray(y_all[n:])
    out = run_falkon(X, y, Xte, model="regression", sigma=float(np.sqrt(D)), M=args.centers, penalty=1e-6,
                     maxiter=args.max_iter, dtype="float32", timeout=args.falkon_timeout)
    row = {k: v for k, v in out.items() if k != "decision"}
    row["load_s"] = load_s
    if "decision" in out:
        row["test_rmse"] = float(np.sqrt(np.mean((np.asarray(out["decision"]).ravel() - yte) ** 2)))
    return row


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
    ap.add_argument("--test-rows", type=int, default=50_000, help="held-out rows after the training rows")
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--falkon", action="store_true",
                    help="also fit FALKON (CPU, in memory, FALKON_PYTHON's venv) on each size's rows")
    ap.add_argument("--falkon-timeout", type=float, default=1800)
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
        store, write_s = store_for(data_dir, n, args.chunk_rows, args.test_rows)
        argv_child = [__file__, "--child", "--store", str(store), "--test-rows", str(args.test_rows),
                      "--centers", str(args.centers),
                      "--max-iter", str(args.max_iter), "--tol", str(args.tol), "--strategy", args.strategy,
                      "--scheduler", args.scheduler]
        res = run_child(argv_child, timeout=args.timeout)
        store_mb = _dir_bytes(store) / 2**20
        row = {"n": n, "d": D, "M": args.centers, "store_mb": store_mb, "store_write_s": write_s, **res}
        if "passes" in row:
            row["store_reads"] = row["read_mb"] / store_mb
            row["max_process_mb"] = max(row["peak_per_process_mb"].values())
        rows.append(row)
        print({k: v for k, v in row.items() if k != "peak_per_process_mb"}, flush=True)
        if args.falkon:
            frow = {"n": n, "d": D, "M": args.centers, "library": "FALKON (CPU, in memory)",
                    **falkon_row(store, args.test_rows, args)}
            if "peak_per_process_mb" in frow:
                frow["max_process_mb"] = max(frow["peak_per_process_mb"].values())
            rows.append(frow)
            print({k: v for k, v in frow.items() if k != "peak_per_process_mb"}, flush=True)
    base = next((r for r in rows if r["n"] == 1_000_000 and "fit_s" in r and "library" not in r), None)
    for r in rows:
        if base and "fit_s" in r and "library" not in r:
            r["time_per_row_vs_1e6"] = (r["fit_s"] / r["n"]) / (base["fit_s"] / base["n"])
            r["memory_vs_1e6"] = r["peak_mb"] / base["peak_mb"]
    info = machine()
    title = (f"FALKON from Zarr, d = {D}, float32, M = {args.centers}, max_iter = {args.max_iter}, tol = {args.tol}, "
             f"{args.scheduler}; {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB")
    print_table(rows, ["n", "library", "fit_s", "strategy", "n_iter", "sketch_rows", "passes", "peak_mb",
                       "max_process_mb", "n_processes", "read_mb", "store_reads", "read_share",
                       "time_per_row_vs_1e6", "memory_vs_1e6", "test_rmse", "error"], title)
    for r in rows:
        if "stage_s" in r:
            print(f"n = {r['n']:.0e}: stages (s) {_rounded(r['stage_s'])}; passes (s) {_rounded(r['pass_s'])}")
    write_results(rows, args.out, "scaling_zarr", {"machine": info, "args": vars(args), "pid": os.getpid()})
    return rows


def _rounded(times: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in times.items()}


if __name__ == "__main__":
    main()
