"""Many centers (issue 39): the dense preconditioner on the client against the tiled one.

The dense route holds ``3 x 8 M^2`` bytes of ``M x M`` matrices in the client process
(60 GB at M = 50 000); the tiled route (:mod:`daskkrr.parallel.tiled_falkon`) holds the
factors as ``2048 x 2048`` tiles on the workers or spilled to a Zarr store, and no process
holds an ``M x M`` matrix. This script fits the same data at several ``M`` on each route,
side by side.

Data: ``X`` standard normal (d = 20, float32), ``y = sin(x_1 + x_2 + x_3) + 0.1 noise``,
``n`` training and 20 000 test rows, written once to a Zarr store under ``--data-dir``.
Gaussian kernel, sigma = sqrt(20), penalty 1e-6, uniform centers (``random_state=0``),
``tol=1e-4``, ``max_iter=--max-iter``, Dask's threaded scheduler, the strategy the cost
model picks, ``preconditioner_rows=None`` on both routes (the tiled route builds FALKON's own
preconditioner, so the dense one does too: the comparison is of the factorisations).

Methods, each fit in a fresh process:

- ``dense``: ``preconditioner_route="dense"``;
- ``tiled-memory``: ``preconditioner_route="tiled"``, tiles in memory;
- ``tiled-zarr``: ``memory_budget`` of 64 MiB: the cost model takes the tiled route and spills
  the tiles to Zarr;
- ``workers``: a ``LocalCluster`` of ``--workers`` single-threaded worker processes, each with a
  ``memory_limit`` below one ``M x M`` float32 matrix (``--worker-memory``, default 90% of
  ``4 M^2`` bytes), ``preconditioner_route="tiled"``: the tiles live on the workers (or are
  spilled where the cost model says they do not fit) and no process holds an ``M x M`` matrix.
  Its coefficients and test predictions are compared with the ``dense`` fit of the same run
  (``coef_rel_diff``, ``pred_rel_diff``: relative 2-norm differences).

``solve_s`` is the CG phase, the figure the tiled route's speed is judged by: run the script
through ``python -m workflows.benchmarks run many_centers --repeat 3`` for medians of 3, the
methods interleaved on the (shared) machine.

Columns: fit time and the time of each stage (centers, preconditioner, operator, solve), CG
iterations, test RMSE, peak memory (sum of the per-process peaks) and the largest single
process, the route and its reason (``preconditioner_route_``).

Sizes: ``--quick`` n = 50 000, M = 2000 and 6000; the full size is the issue's, n = 1e6,
M = 10 000, 20 000 and 50 000 (the dense route is left out where its matrices exceed the
machine's memory, ``--dense-max``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, sine_store, write_results  # noqa: E402

N_TEST = 20_000
D = 20
PENALTY = 1e-6
METHODS = ("dense", "tiled-memory", "tiled-zarr", "workers")
#: memory_budget of the tiled-zarr method: far below any tiles, so they are spilled.
SPILL_BUDGET = 64 * 2**20


def method_params(method: str) -> dict:
    """The estimator parameters of a method."""
    if method == "dense":
        return {"preconditioner_route": "dense"}
    if method in ("tiled-memory", "workers"):
        return {"preconditioner_route": "tiled"}
    return {"memory_budget": SPILL_BUDGET}


def worker_memory(M: int, given: int | None) -> int:
    """Each worker's memory limit: ``given``, else 90% of one ``M x M`` float32 matrix."""
    return int(given) if given else int(0.9 * 4 * M * M)


# --------------------------------------------------------------------------- child
def child(args: argparse.Namespace) -> dict:
    if args.child != "workers":
        return fit_child(args)
    from distributed import Client, LocalCluster

    from daskkrr.parallel.client import local_cluster_kwargs

    limit = worker_memory(args.centers, args.worker_memory)
    with LocalCluster(**local_cluster_kwargs(args.workers, memory_limit=limit)) as cluster, Client(cluster) as client:
        with client.as_current():
            result = fit_child(args)
    return {**result, "workers": args.workers, "worker_memory_mb": limit / 2**20,
            "matrix_mb": 4 * args.centers**2 / 2**20}


def fit_child(args: argparse.Namespace) -> dict:
    import dask.array as da
    import zarr

    from daskkrr import FalkonRegressor
    from daskkrr.events import StageDone, subscribe

    g = zarr.open_group(args.store, mode="r")
    n = args.n_train
    X, y = da.from_zarr(g["X"]), da.from_zarr(g["y"])
    stage_s: dict[str, float] = {}

    def on_event(event: object) -> None:
        if isinstance(event, StageDone):
            stage_s[event.stage] = stage_s.get(event.stage, 0.0) + event.seconds

    model = FalkonRegressor(n_centers=args.centers, penalty=PENALTY, dtype="float32", max_iter=args.max_iter,
                            tol=1e-4, random_state=0, preconditioner_rows=None, **method_params(args.child))
    with subscribe(on_event):
        t = time.perf_counter()
        model.fit(X[:n], y[:n])
        fit_s = time.perf_counter() - t
    pred = np.asarray(model.predict(X[n:]).compute())
    yt = np.asarray(g["y"][n:])
    if args.save:  # for the comparison of the workers' fit with the dense one
        np.savez(args.save, coef=np.asarray(model.coef_), pred=pred)
    route = model.preconditioner_route_
    return dict(fit_s=fit_s, **{f"{k}_s": v for k, v in stage_s.items()},
                rmse=float(np.sqrt(np.mean((pred - yt) ** 2))), n_iter=int(model.n_iter_),
                strategy=model.strategy_, route=route["route"], storage=route["storage"], reason=route["reason"])


# --------------------------------------------------------------------------- parent
def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 50 000, M = 2000 and 6000")
    ap.add_argument("--centers", default=None, help="comma-separated M (default: by size)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--dense-max", type=int, default=30_000,
                    help="largest M fitted on the dense route (3 x 8 M^2 bytes in one process)")
    ap.add_argument("--workers", type=int, default=4, help="worker processes of the workers method")
    ap.add_argument("--worker-memory", type=int, default=None,
                    help="memory_limit of each worker in bytes (default: 90%% of one M x M float32 matrix)")
    ap.add_argument("--n-train-rows", type=int, default=None, help="training rows (default: by size)")
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=24 * 3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--n-train", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.centers = int(args.centers)
        emit(child(args))
        return []
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    n = args.n_train_rows or (50_000 if args.quick else 1_000_000)
    sizes = [int(m) for m in args.centers.split(",")] if args.centers else (
        [2000, 6000] if args.quick else [10_000, 20_000, 50_000])
    store = sine_store(Path(args.data_dir), "many_centers", n, N_TEST, D)
    rows: list[dict] = []
    for M in sizes:
        saved: dict[str, Path] = {}
        for method in [m for m in args.methods.split(",") if m]:
            if method == "dense" and M > args.dense_max:
                continue
            path = Path(args.data_dir) / f"many_centers_fit_{method}_M{M}.npz"
            row = {"n": n, "M": M, "method": method, **fit_once(args, method, store, n, M, path)}
            if "error" not in row:
                saved[method] = path
                if method != "dense" and "dense" in saved:
                    row.update(compare_fits(saved["dense"], path))
            rows.append(row)
            print(json.dumps(row, default=float), flush=True)
    info = machine()
    title = (f"many centers, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB; d = {D}, float32, "
             f"penalty {PENALTY:g}, tol 1e-4, max_iter {args.max_iter}; one run each")
    print_table(rows, ["n", "M", "method", "fit_s", "centers_s", "preconditioner_s", "operator_s", "solve_s",
                       "n_iter", "rmse", "peak_mb", "max_process_mb", "route", "storage", "strategy",
                       "coef_rel_diff", "pred_rel_diff"], title)
    write_results(rows, args.out, "many_centers_quick" if args.quick else "many_centers",
                  {"machine": info, "args": vars(args)})
    return rows


def fit_once(args: argparse.Namespace, method: str, store: Path, n: int, M: int, save: Path) -> dict:
    """One fit of ``method`` in a fresh process (its coefficients and predictions saved to ``save``)."""
    argv = [__file__, "--child", method, "--store", str(store), "--n-train", str(n), "--centers", str(M),
            "--max-iter", str(args.max_iter), "--workers", str(args.workers), "--save", str(save)]
    if args.worker_memory:
        argv += ["--worker-memory", str(args.worker_memory)]
    res = run_child(argv, timeout=args.timeout)
    if "error" in res:
        print(f"M={M} {method}: failed: {res['error'][-600:]}", flush=True)
        return {"error": res["error"][-600:]}
    per_process = res.pop("peak_per_process_mb", {})
    return {**res, "max_process_mb": max(per_process.values(), default=float("nan"))}


def compare_fits(reference: Path, other: Path) -> dict:
    """Relative 2-norm differences of the coefficients and test predictions of two saved fits."""
    a, b = np.load(reference), np.load(other)
    return {f"{k}_rel_diff": float(np.linalg.norm(b[k] - a[k]) / np.linalg.norm(a[k])) for k in ("coef", "pred")}


if __name__ == "__main__":
    main()
