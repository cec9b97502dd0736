"""One Dask worker vs two: the same FALKON fit from Zarr on a LocalCluster.

Configurations (each in a fresh process, the same store, ``strategy="recompute"``
so that every iteration is a full pass of kernel computations):

- ``1 worker, 1 core``: one single-threaded worker whose engine is capped at one
  thread (``DASKKRR_ENGINE_THREADS=1``): the one-core baseline;
- ``1 worker, 2 engine threads``: one single-threaded worker; the host's spare
  core goes to the engine inside each task (the thread budget rule of
  :mod:`daskkrr.parallel.resources`);
- ``2 workers``: two single-threaded worker processes (daskkrr's default local
  cluster on 2 cores), each task on one engine thread.

Reported: fit time, its speed-up over the one-core baseline, and the sum of the
processes' peak RSS. Run ``python workflows/benchmarks/workers_scaling.py --quick``.
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
CONFIGS = {
    "1 worker, 1 core": dict(n_workers=1, cap="1"),
    "1 worker, 2 engine threads": dict(n_workers=1, cap=""),
    "2 workers": dict(n_workers=2, cap=""),
}


def child(args) -> dict:
    from distributed import Client, LocalCluster

    from daskkrr import FalkonRegressor

    env = {"DASKKRR_ENGINE_THREADS": args.cap} if args.cap else {}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, env=env) as cluster, Client(cluster) as client:
        model = FalkonRegressor(n_centers=args.centers, penalty=1e-6, dtype="float32", max_iter=args.max_iter,
                                random_state=0, strategy="recompute")  # on the default client
        t = time.perf_counter()
        model.fit(args.store)
        fit_s = time.perf_counter() - t
        budget = client.run(lambda: os.environ.get("DASKKRR_ENGINE_THREADS", ""))
    return dict(fit_s=fit_s, passes=model.n_data_passes_, n_iter=model.n_iter_, worker_cap=sorted(budget.values()))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 2e5, M = 1000")
    ap.add_argument("--n", type=int, default=None, help="rows (default 1e6; 2e5 with --quick)")
    ap.add_argument("--centers", type=int, default=None, help="default 2000; 1000 with --quick")
    ap.add_argument("--max-iter", type=int, default=10)
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cap", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(child(args))
        return []
    from daskkrr.data.synthetic import write_regression_zarr

    n = args.n or (200_000 if args.quick else 1_000_000)
    centers = args.centers or (1000 if args.quick else 2000)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    store = data_dir / f"workers_n{n}_d{D}.zarr"
    if not store.exists():
        write_regression_zarr(store, n, D, chunk_rows=max(n // 8, 1), dtype="float32", random_state=0)
    rows = []
    for name, cfg in CONFIGS.items():
        res = run_child([__file__, "--child", "--store", str(store), "--workers", str(cfg["n_workers"]),
                         "--cap", cfg["cap"], "--centers", str(centers), "--max-iter", str(args.max_iter)],
                        timeout=args.timeout)
        rows.append({"config": name, "n": n, "M": centers, **res})
        print({k: v for k, v in rows[-1].items() if k != "peak_per_process_mb"}, flush=True)
    base = rows[0].get("fit_s")
    for r in rows:
        if base and "fit_s" in r:
            r["speedup_vs_1_core"] = base / r["fit_s"]
    info = machine()
    title = (f"1 vs 2 Dask workers, n = {n}, d = {D}, M = {centers}, recompute, max_iter = {args.max_iter}; "
             f"{info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB")
    print_table(rows, ["config", "fit_s", "speedup_vs_1_core", "passes", "peak_mb", "n_processes"], title)
    write_results(rows, args.out, "workers_scaling", {"machine": info, "args": vars(args)})
    return rows


if __name__ == "__main__":
    main()
