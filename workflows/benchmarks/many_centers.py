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
  the tiles to Zarr.

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

from fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

N_TEST = 20_000
D = 20
PENALTY = 1e-6
METHODS = ("dense", "tiled-memory", "tiled-zarr")
#: memory_budget of the tiled-zarr method: far below any tiles, so they are spilled.
SPILL_BUDGET = 64 * 2**20


def store_path(data_dir: Path, n: int) -> Path:
    """Zarr store of ``n + N_TEST`` rows (train first), written once."""
    from daskkrr.data import write_zarr

    path = data_dir / f"many_centers_n{n}_d{D}.zarr"
    if not path.exists():
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n + N_TEST, D)).astype(np.float32)
        y = np.sin(X[:, :3].sum(axis=1)) + 0.1 * rng.standard_normal(n + N_TEST)
        write_zarr(X, y, path, chunk_rows=min(n + N_TEST, 250_000))
    return path


def method_params(method: str) -> dict:
    """The estimator parameters of a method."""
    if method == "dense":
        return {"preconditioner_route": "dense"}
    if method == "tiled-memory":
        return {"preconditioner_route": "tiled"}
    return {"memory_budget": SPILL_BUDGET}


# --------------------------------------------------------------------------- child
def child(args: argparse.Namespace) -> dict:
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
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=24 * 3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--n-train", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.centers = int(args.centers)
        emit(child(args))
        return []
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    n = 50_000 if args.quick else 1_000_000
    sizes = [int(m) for m in args.centers.split(",")] if args.centers else (
        [2000, 6000] if args.quick else [10_000, 20_000, 50_000])
    store = store_path(Path(args.data_dir), n)
    rows: list[dict] = []
    for M in sizes:
        for method in [m for m in args.methods.split(",") if m]:
            if method == "dense" and M > args.dense_max:
                continue
            argv_child = [__file__, "--child", method, "--store", str(store), "--n-train", str(n), "--centers",
                          str(M), "--max-iter", str(args.max_iter)]
            res = run_child(argv_child, timeout=args.timeout)
            row = {"n": n, "M": M, "method": method}
            if "error" in res:
                print(f"M={M} {method}: failed: {res['error'][-600:]}", flush=True)
                rows.append({**row, "error": res["error"][-600:]})
                continue
            per_process = res.pop("peak_per_process_mb", {})
            row.update(res, max_process_mb=max(per_process.values(), default=float("nan")))
            rows.append(row)
            print(json.dumps(row, default=float), flush=True)
    info = machine()
    title = (f"many centers, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB; d = {D}, float32, "
             f"penalty {PENALTY:g}, tol 1e-4, max_iter {args.max_iter}; one run each")
    print_table(rows, ["n", "M", "method", "fit_s", "centers_s", "preconditioner_s", "operator_s", "solve_s",
                       "n_iter", "rmse", "peak_mb", "max_process_mb", "route", "storage", "strategy"], title)
    write_results(rows, args.out, "many_centers_quick" if args.quick else "many_centers",
                  {"machine": info, "args": vars(args)})
    return rows


if __name__ == "__main__":
    main()
