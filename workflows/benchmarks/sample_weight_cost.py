"""What row weights cost: a weighted fit against the same data with the rows repeated.

Integer weights are the same problem as repeated rows (``tests/test_sample_weight.py``
checks it to 1e-8), so the baseline a user would otherwise run is the fit on the
repeated data. For each strategy (recompute, cache, gram) this fits, each in a
fresh process and ``--repeats`` times (medians reported):

- ``unweighted``: the n rows, no weights (what the weights add to);
- ``weighted``: the n rows with integer weights 1..3 (``sample_weight``);
- ``repeated``: the rows repeated by their weights (about 2 n rows), unweighted.

All three use the same centers (``sampler="uniform"`` picks rows of the original
data for the weighted and unweighted fits; the repeated fit is given the first
copies of the same rows) and a converged CG, so ``max_diff`` (largest difference of
the test predictions from the repeated fit's) shows they solve the same problem.
Columns: fit time (after an untimed warm-up fit on 500 rows, which compiles the
numba kernels), peak memory of all processes, CG iterations, test RMSE.

Run ``python workflows/benchmarks/sample_weight_cost.py --quick`` (about a minute)
or without ``--quick`` (n = 200 000, M = 1000; several minutes on two cores);
the table goes to ``results/sample_weight_cost{_quick}.{json,csv}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

STRATEGIES = ("recompute", "cache", "gram")
VARIANTS = ("unweighted", "weighted", "repeated")
COLUMNS = ("strategy", "variant", "n_rows", "fit_s", "peak_mb", "n_iter", "rmse", "max_diff")


def make_data(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=n)
    w = rng.integers(1, 4, size=n)
    X_test = rng.normal(size=(2000, d))
    y_test = np.sin(X_test[:, 0]) + 0.5 * X_test[:, 1] * X_test[:, 2]
    return X, y, w, X_test, y_test


def child(args: argparse.Namespace) -> None:
    """One fit in this (fresh) process; prints its figures and its test predictions' digest."""
    from daskkrr import FalkonRegressor
    from daskkrr.parallel.executor import gather_rows
    from daskkrr.sampling.base import CenterDictionary, CenterSampler

    class Rows(CenterSampler):
        name = "rows"

        def __init__(self, idx: np.ndarray):
            self.idx = idx

        def select(self, X, kernel, *, n_centers, penalty, random_state, executor=None, client=None):
            return CenterDictionary(gather_rows(X, self.idx, executor), self.idx, np.ones(len(self.idx)))

    X, y, w, X_test, y_test = make_data(args.n, args.d)
    centers = np.sort(np.random.default_rng(1).choice(args.n, size=args.centers, replace=False))
    fit_args: tuple[Any, ...] = (X, y)
    fit_kwargs: dict[str, Any] = {}
    if args.variant == "weighted":
        fit_kwargs["sample_weight"] = w
    elif args.variant == "repeated":
        fit_args = (np.repeat(X, w, axis=0), np.repeat(y, w))
        centers = (np.cumsum(w) - w)[centers]
    model = FalkonRegressor(n_centers=args.centers, penalty=1e-5, tol=1e-8, max_iter=200, strategy=args.strategy,
                            sampler=Rows(centers), random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Warm-up on 500 rows, untimed: numba compiles the kernels once per process.
        small = {k: v[:500] for k, v in fit_kwargs.items()}
        FalkonRegressor(n_centers=50, max_iter=3, strategy=args.strategy, random_state=0).fit(
            fit_args[0][:500], fit_args[1][:500], **small)
        t0 = time.perf_counter()
        model.fit(*fit_args, **fit_kwargs)
        seconds = time.perf_counter() - t0
    pred = model.predict(X_test)
    emit({"fit_s": seconds, "n_iter": int(model.n_iter_), "n_rows": int(fit_args[0].shape[0]),
          "rmse": float(np.sqrt(np.mean((pred - y_test) ** 2))), "pred": pred[:200].tolist()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (n = 20 000, M = 300)")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--centers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None, help="results directory (default: results/ beside this file)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="recompute", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="weighted", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.n = args.n or (20_000 if args.quick else 200_000)
    args.centers = args.centers or (300 if args.quick else 1000)
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.child:
        child(args)
        return
    rows = []
    for strategy in STRATEGIES:
        reference = None
        runs: dict[str, list[dict[str, Any]]] = {}
        for variant in ("repeated", "unweighted", "weighted"):
            argv = [__file__, "--child", "--strategy", strategy, "--variant", variant, "--n", str(args.n),
                    "--d", str(args.d), "--centers", str(args.centers)]
            runs[variant] = [run_child(argv) for _ in range(args.repeats)]
            failed = [r["error"] for r in runs[variant] if "error" in r]
            if failed:
                raise RuntimeError(f"{strategy}/{variant} failed: {failed[0]}")
        reference = np.asarray(runs["repeated"][0]["pred"])
        for variant in VARIANTS:
            res = runs[variant]
            pred = np.asarray(res[0]["pred"])
            rows.append({
                "strategy": strategy, "variant": variant, "n_rows": res[0]["n_rows"],
                "fit_s": round(median(r["fit_s"] for r in res), 3),
                "peak_mb": round(median(r["peak_mb"] for r in res), 1),
                "n_iter": res[0]["n_iter"], "rmse": round(res[0]["rmse"], 5),
                "max_diff": None if variant == "unweighted" else float(np.max(np.abs(pred - reference))),
            })
    meta = {"machine": machine(), "quick": args.quick, "n": args.n, "d": args.d, "centers": args.centers,
            "repeats": args.repeats, "penalty": 1e-5, "tol": 1e-8}
    title = (f"sample weights vs repeated rows: n={args.n}, d={args.d}, M={args.centers}, "
             f"medians of {args.repeats} fits, each in a fresh process")
    print_table(rows, COLUMNS, title)
    write_results(rows, args.out, "sample_weight_cost" + ("_quick" if args.quick else ""), meta)
    print(json.dumps(meta["machine"]))


if __name__ == "__main__":
    main()
