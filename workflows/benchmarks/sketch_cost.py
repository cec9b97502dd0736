"""What the preconditioner's row sketch costs, and whether ``preconditioner_rows="auto"`` weighs it right.

Issue 17: at n = 1e5, M = 5000, d = 20 (float32, penalty 1e-6, 20 iterations) the
float64 sketch of ``4 M`` rows took 10.2 s of a 16.5 s fit, and FALKON's own
preconditioner reached the same test error in 7.2 s. The new default builds the
sketch Gram in float32 (for a float32 fit) and chooses the sketch size by expected
time to the tolerance (:mod:`daskkrr.parallel.preconditioner_cost`).

Data: ``X`` standard normal (d = 20, float32), ``y = sin(x_1 + x_2 + x_3) + 0.1 noise``,
``n`` training and 20 000 test rows, written once to a Zarr store under
``--data-dir``. Gaussian kernel, sigma = sqrt(20) (the default on standardised
features), penalty 1e-6, uniform centers (``random_state=0``), Dask's threaded
scheduler, the strategy the cost model picks.

Methods, each fit in a fresh process, the rounds interleaved, medians of ``--repeats``:

- ``old-default``: the previous default, ``4 M`` sketch rows (``max(4, min(16, sqrt(n / M) / 2)) M``)
  with the sketch Gram in float64 from blocks of 256 rows (the library patched
  back to that behaviour in the child);
- ``sketch-float32``: the same number of rows, sketch Gram in float32 (the new code);
- ``auto``: the new default, ``preconditioner_rows="auto"``;
- ``falkon-own``: ``preconditioner_rows=None``.

Cases: ``issue`` (n = 1e5, M = ``--centers`` (5000), ``max_iter=20``, ``tol=--tol``) and
``to-tol`` (n = 1e5, M = 2000, ``tol=1e-4``, ``max_iter=100``: CG stops at the
tolerance, where a sketch should pay). ``--quick``: n = 2e4, M = 1000 and 500.

Each child first fits a tiny model (the numba engine's loading, or compiling, is
issue 17's cold start, measured apart; ``--cold`` times the first fit instead).

Columns: fit time, the preconditioner stage's time, CG iterations, test RMSE,
peak memory of the process, the sketch rows and precision used, and the cost
model's expected seconds for the chosen sketch; ratios against ``old-default``
of the same case (the machine is shared: compare ratios, not seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
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
METHODS = ("old-default", "sketch-float32", "auto", "falkon-own")


def old_rows(n: int, M: int) -> int:
    """The previous ``preconditioner_rows="auto"``: ``r M`` rows, ``r = sqrt(n / M) / 2`` within [4, 16]."""
    return int(min(n, min(16, max(4, round(0.5 * math.sqrt(n / M)))) * M))


# --------------------------------------------------------------------------- child
def child(args: argparse.Namespace) -> dict:
    import dask.array as da
    import zarr

    import daskkrr.pipeline.stages as stages
    import daskkrr.solvers.sketch as sketch
    from daskkrr import FalkonRegressor
    from daskkrr.events import StageDone, subscribe

    if args.warm:  # load (or compile) the numba engine outside the timed fit: issue 17's cold start is apart
        rng = np.random.default_rng(1)
        Xw = rng.standard_normal((3000, D)).astype(np.float32)
        for strategy in ("cache", "recompute", "gram"):
            FalkonRegressor(n_centers=50, dtype="float32", max_iter=2, preconditioner_rows=200,
                            strategy=strategy).fit(Xw, Xw[:, 0])
    g = zarr.open_group(args.store, mode="r")
    n = args.n_train
    X, y = da.from_zarr(g["X"]), da.from_zarr(g["y"])
    rows: int | str | None = "auto"
    if args.child in ("old-default", "sketch-float32"):
        rows = old_rows(n, args.centers)
    elif args.child == "falkon-own":
        rows = None
    if args.child == "old-default":  # the previous code: float64 sketch Gram, 256-row blocks
        stages.sketch_precision = lambda dtype: "float64"
        sketch.SKETCH_BLOCK_ROWS = 256
    stage_s: dict[str, float] = {}

    def on_event(event: object) -> None:
        if isinstance(event, StageDone):
            stage_s[event.stage] = stage_s.get(event.stage, 0.0) + event.seconds

    model = FalkonRegressor(n_centers=args.centers, penalty=PENALTY, dtype="float32", max_iter=args.max_iter,
                            tol=args.tol, random_state=0, preconditioner_rows=rows)
    with subscribe(on_event):
        t = time.perf_counter()
        model.fit(X[:n], y[:n])
        fit_s = time.perf_counter() - t
    pred = np.asarray(model.predict(X[n:]).compute())
    yt = np.asarray(g["y"][n:])
    chosen = {c["rows"]: c for c in model.preconditioner_costs_}.get(model.preconditioner_rows_, {})
    return dict(fit_s=fit_s, preconditioner_s=stage_s.get("preconditioner", float("nan")),
                solve_s=stage_s.get("solve", float("nan")), operator_s=stage_s.get("operator", float("nan")),
                rmse=float(np.sqrt(np.mean((pred - yt) ** 2))), n_iter=int(model.n_iter_),
                converged=bool(model.converged_), strategy=model.strategy_, sketch_rows=model.preconditioner_rows_,
                sketch_dtype=model.preconditioner_dtype_, expected_s=chosen.get("seconds"),
                expected_iterations=chosen.get("iterations"),
                costs=[(c["rows"], c["iterations"], round(c["seconds"], 2)) for c in model.preconditioner_costs_])


# --------------------------------------------------------------------------- parent
def run_case(name: str, n: int, M: int, max_iter: int, tol: float, args: argparse.Namespace) -> list[dict]:
    store = sine_store(Path(args.data_dir), "sketch_cost", n, N_TEST, D)
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for _ in range(args.repeats):  # interleaved rounds: a busy spell hits every method alike
        for method in METHODS:
            argv = [__file__, "--child", method, "--store", str(store), "--n-train", str(n), "--centers", str(M),
                    "--max-iter", str(max_iter), "--tol", str(tol)] + ([] if args.warm else ["--cold"])
            res = run_child(argv, timeout=args.timeout)
            if "error" in res:
                print(f"{name} {method}: failed: {res['error'][-600:]}", flush=True)
                continue
            runs[method].append(res)
            print(json.dumps({"case": name, "method": method,
                              **{k: v for k, v in res.items() if k != "peak_per_process_mb"}}, default=float),
                  flush=True)
    rows = []
    for method, rs in runs.items():
        if not rs:
            rows.append({"case": name, "n": n, "M": M, "max_iter": max_iter, "tol": tol, "method": method,
                         "error": "every run failed"})
            continue
        med = {k: statistics.median(r[k] for r in rs) for k in ("fit_s", "preconditioner_s", "solve_s", "rmse",
                                                                "peak_mb")}
        last = rs[-1]
        rows.append({"case": name, "n": n, "M": M, "max_iter": max_iter, "tol": tol, "method": method, **med,
                     "fit_s_all": [round(r["fit_s"], 2) for r in rs], "n_iter": last["n_iter"],
                     "sketch_rows": last["sketch_rows"], "sketch_dtype": last["sketch_dtype"],
                     "strategy": last["strategy"], "expected_s": last["expected_s"], "costs": last["costs"]})
    base = next((r for r in rows if r["method"] == "old-default" and "fit_s" in r), None)
    for r in rows:
        if base and "fit_s" in r:
            r["time_vs_old"] = r["fit_s"] / base["fit_s"]
            r["rmse_vs_old"] = r["rmse"] / base["rmse"]
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 2e4, M = 1000 and 500")
    ap.add_argument("--centers", type=int, default=5000, help="M of the issue case")
    ap.add_argument("--tol", type=float, default=1e-4, help="tol of the issue case (max_iter=20)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="issue,to-tol")
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cold", dest="warm", action="store_false",
                    help="time the first fit of each process (with the numba engine's loading)")
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--n-train", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--max-iter", type=int, default=20, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(child(args))
        return []
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    n = 20_000 if args.quick else 100_000
    cases = {"issue": (n, 1000 if args.quick else args.centers, 20, args.tol),
             "to-tol": (n, 500 if args.quick else 2000, 100, 1e-4)}
    rows: list[dict] = []
    for name in [c for c in args.cases.split(",") if c]:
        rows += run_case(name, *cases[name], args)
    info = machine()
    title = (f"preconditioner sketch cost, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB; "
             f"d = {D}, float32, penalty {PENALTY:g}; medians of {args.repeats}; "
             f"{'warm' if args.warm else 'cold'} processes")
    print_table(rows, ["case", "n", "M", "max_iter", "tol", "method", "fit_s", "time_vs_old", "preconditioner_s",
                       "solve_s", "n_iter", "rmse", "rmse_vs_old", "peak_mb", "sketch_rows", "sketch_dtype",
                       "strategy", "expected_s"], title)
    write_results(rows, args.out, "sketch_cost_quick" if args.quick else "sketch_cost",
                  {"machine": info, "args": vars(args)})
    return rows


if __name__ == "__main__":
    main()
