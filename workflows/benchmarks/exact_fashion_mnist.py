"""Exact KRR on Fashion-MNIST (random-feature PCG) next to FALKON's Nystrom approximation.

The question is the paper's (Avron, Clarkson and Woodruff): does solving the
exact kernel ridge problem beat the Nystrom approximation's test error, and at
what cost in time? On the training rows (all 60 000 by default; ``--n`` or
``--quick`` subsample them), 784 pixels scaled to [0, 1] and standardised,
Gaussian kernel with ``sigma = sqrt(784)``, ``penalty`` the same for all:

- ``exact``: ``ExactKernelRidge(solver="pcg")`` on +-1 one-vs-all targets (the
  paper's RLSC), ``tol = 1e-3`` (the paper's classification tolerance), s chosen
  adaptively (or ``--s``), kernel tiles kept in float32 if the cost model finds
  room, else recomputed;
- ``falkon_M``: ``FalkonClassifier(n_centers=M)`` for each ``--centers`` M
  (5000 and 10000 at full size; scaled down with the rows in ``--quick``), with
  its defaults, or with ``--dtype``, ``--strategy``, ``--preconditioner-rows``,
  ``--route``, ``--memory-budget-gb``, ``--falkon-max-iter`` and ``--falkon-tol`` set (the many-centers runs: M = 20 000
  in float32, FALKON's own preconditioner, kernel blocks cached, tiled factors).
  ``--no-exact`` leaves the exact row out (13.6 GB: too much for a shared machine).

Each fit runs in a fresh process; the table gives the fit seconds (and, for
FALKON, the seconds of each stage of the fit), the peak memory of all processes,
the iterations, the load average before and after, and the accuracy on the
10 000 test images. ``--quick`` (n = 5000, M = 400 and 800) takes a few minutes on two
cores. The full run needs about 8 GB for the float32 tiles (n = 60 000) plus
the FALKON fits; expect of the order of an hour on two cores.
Results go to ``results/exact_fashion_mnist{,_quick}.{json,csv}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from exact_pcg_table4 import fashion_mnist, rlsc_targets  # noqa: E402
from fit_tools import SHARED_DATA, emit, machine, print_table, run_child, write_results  # noqa: E402

COLUMNS = ("method", "n_train", "M_or_s", "n_iter", "converged", "fit_s", "peak_mb", "test_accuracy", "load_1min")
#: Stages of a FALKON fit whose seconds are recorded (see :class:`daskkrr.events.StageDone`).
STAGES = ("statistics", "centers", "preconditioner", "operator", "solve")


def child(spec: dict[str, Any]) -> None:
    from sklearn.exceptions import ConvergenceWarning

    from daskkrr import ExactKernelRidge, FalkonClassifier
    from daskkrr.events import StageDone, subscribe

    X, y = fashion_mnist(train=True)
    rows = np.random.default_rng(0).permutation(len(y))[: spec["n"]]
    # a float32 fit gets float32 rows: the float64 copy would only take memory (the pixels are k / 255 either way)
    Xtr, ytr = X[rows].astype(spec.get("falkon", {}).get("dtype", "float64")), y[rows]
    del X
    Xte, yte = fashion_mnist(train=False)
    classes = np.unique(ytr)
    stages: dict[str, float] = {}
    load_before = os.getloadavg()[0]
    t0, cpu0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(), subscribe(lambda e: stages.update({e.stage: round(e.seconds, 2)})
                                              if isinstance(e, StageDone) else None):
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)
        if spec["method"] == "exact":
            model = ExactKernelRidge(solver="pcg", penalty=spec["penalty"], tol=1e-3, max_iter=spec["max_iter"],
                                     n_features=spec["s"] or "auto", random_state=0)
            model.fit(Xtr, rlsc_targets(ytr, classes))
            size = int(model.n_features_)
        else:
            model = FalkonClassifier(n_centers=spec["M"], penalty=spec["penalty"], random_state=0,
                                     **spec.get("falkon", {}))
            model.fit(Xtr, ytr)
            size = int(spec["M"])
    fit_s, fit_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0  # CPU: all threads of this process
    if spec["method"] == "exact":
        pred = classes[np.argmax(np.asarray(model.predict(Xte)), axis=1)]
    else:
        pred = np.asarray(model.predict(Xte))
    emit({"n_train": len(ytr), "M_or_s": size, "n_iter": int(model.n_iter_), "converged": bool(model.converged_),
          "fit_s": fit_s, "fit_cpu_s": round(fit_cpu_s, 1), "test_accuracy": float(np.mean(pred == yte)),
          "kernel_tiles": getattr(model, "kernel_tiles_", None), "load_1min": round(os.getloadavg()[0], 2),
          "load_1min_before": round(load_before, 2), **falkon_record(model, stages)})


def falkon_record(model: Any, stages: dict[str, float]) -> dict[str, Any]:
    """What a FALKON fit chose (strategy, sketch rows, factor route) and each stage's seconds."""
    if not hasattr(model, "strategy_"):
        return {}
    route = getattr(model, "preconditioner_route_", {}) or {}
    return {"strategy": model.strategy_, "preconditioner_rows": int(model.preconditioner_rows_),
            "preconditioner_dtype": model.preconditioner_dtype_, "route": route.get("route", "dense"),
            "route_storage": route.get("storage", "client"),
            **{f"{stage}_s": stages.get(stage) for stage in STAGES}}


def falkon_options(args: argparse.Namespace) -> dict[str, Any]:
    """The FalkonClassifier parameters set on the command line (none: its defaults)."""
    options: dict[str, Any] = {}
    if args.dtype:
        options["dtype"] = args.dtype
    if args.strategy:
        options["strategy"] = args.strategy
    if args.preconditioner_rows:
        options["preconditioner_rows"] = None if args.preconditioner_rows == "none" else (
            args.preconditioner_rows if args.preconditioner_rows == "auto" else int(args.preconditioner_rows))
    if args.route:
        options["preconditioner_route"] = args.route
    if args.memory_budget_gb:
        options["memory_budget"] = int(args.memory_budget_gb * 2**30)
    if args.chunks:
        options["chunks"] = args.chunks
    if args.falkon_max_iter:
        options["max_iter"] = args.falkon_max_iter
    if args.falkon_tol:
        options["tol"] = args.falkon_tol
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 5000 training rows, M = 400 and 800")
    parser.add_argument("--n", type=int, default=60000)
    parser.add_argument("--centers", type=int, nargs="*", default=[5000, 10000])
    parser.add_argument("--s", type=int, default=0, help="PCG features (0: adaptive)")
    parser.add_argument("--penalty", type=float, default=1e-6)
    parser.add_argument("--max-iter", type=int, default=1000, help="exact KRR's PCG iterations")
    parser.add_argument("--no-exact", action="store_true", help="leave exact KRR out (FALKON rows only)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default=None, help="FALKON's dtype")
    parser.add_argument("--strategy", choices=("auto", "recompute", "cache", "gram"), default=None)
    parser.add_argument("--preconditioner-rows", default=None, help="'auto', 'none' (FALKON's own) or an int")
    parser.add_argument("--route", choices=("auto", "dense", "tiled"), default=None, help="preconditioner_route")
    parser.add_argument("--memory-budget-gb", type=float, default=None, help="memory_budget in GiB")
    parser.add_argument("--chunks", type=int, default=None, help="FALKON's rows per block (bounds a block's kernel)")
    parser.add_argument("--falkon-max-iter", type=int, default=None, help="FALKON's CG iterations (default: its own)")
    parser.add_argument("--falkon-tol", type=float, default=None,
                        help="FALKON's CG tolerance (default: its own, 1e-4; exact KRR's is 1e-3)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if not (SHARED_DATA / "fashion-mnist").exists():
        print(f"skipping: {SHARED_DATA / 'fashion-mnist'} is absent", flush=True)
        return
    n = 5000 if args.quick else args.n
    centers = [400, 800] if args.quick else args.centers
    specs = [] if args.no_exact else [{"method": "exact", "n": n, "s": args.s, "penalty": args.penalty,
                                        "max_iter": args.max_iter}]
    options = falkon_options(args)
    specs += [{"method": f"falkon_{M}", "n": n, "M": M, "penalty": args.penalty, "falkon": options} for M in centers]
    rows = []
    for spec in specs:
        runs = [run_child([__file__, "--child", json.dumps(spec)], timeout=6 * 3600) for _ in range(args.repeats)]
        if "error" in runs[0]:
            print(f"{spec['method']} failed: {runs[0]['error']}", flush=True)
            continue
        row = dict(runs[0], method=spec["method"])
        for key in ("fit_s", "peak_mb"):
            row[key] = round(statistics.median(r[key] for r in runs), 2)
        rows.append(row)
        print(f"{row['method']}: {row['fit_s']} s, {row['peak_mb']} MB, accuracy {row['test_accuracy']:.4f}",
              flush=True)
    print_table(rows, COLUMNS, title=f"Fashion-MNIST, n = {n} training rows, 10 000 test images")
    write_results(rows, args.out, "exact_fashion_mnist" + ("_quick" if args.quick else ""),
                  {"machine": machine(), "n": n, "centers": centers, "penalty": args.penalty,
                   "repeats": args.repeats, "falkon_options": options, "exact": not args.no_exact})


if __name__ == "__main__":
    main()
