"""What ``compute_std=True`` costs at fit and ``return_std=True`` at predict, and how calibrated it is.

Data: a PMLB regression set from ``../shared/data`` (``--dataset``, default
564_fried: 40 768 rows, d = 10), split 75/25 with a fixed seed, at most
``--max-rows`` rows; without the folder, ``daskkrr.data.make_regression`` rows.

Each row of the table is one estimator and one setting, fitted in a fresh process
(``--repeats`` times; medians), with ``compute_std=False`` (the baseline, measured in
the same run) and ``compute_std=True``:

- ``falkon-auto``: ``FalkonRegressor`` with the strategy the cost model picks;
- ``falkon-recompute``: the out-of-core strategy, where the std needs one extra
  pass over the data for ``K_MN K_NM``;
- ``nystrom``: ``NystromRegressor`` (the direct solve already makes that pass).

Columns: fit time and peak memory (sum of the per-process RSS peaks) with and without
``compute_std``, their ratio, predict time on the test rows without and with
``return_std``, the test R^2, and the coverage of the 95% intervals for new
observations (``mean +- 1.96 sqrt(std^2 + noise_variance)``) on the test rows,
with the noise variance estimated from the training residuals (``noise_variance_``).

Run ``python workflows/benchmarks/predictive_std.py --quick`` (10 000 rows, M = 300);
the full run takes 40 000 rows and M = 1000 (a few minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import SHARED_DATA, emit, machine, print_table, run_child, write_results  # noqa: E402

METHODS = {
    "falkon-auto": ("falkon", {}),
    "falkon-recompute": ("falkon", {"strategy": "recompute"}),
    "nystrom": ("nystrom", {}),
}
COLUMNS = ("method", "n_train", "M", "strategy", "fit_s", "fit_std_s", "fit_ratio", "peak_mb", "peak_std_mb",
           "predict_s", "predict_std_s", "r2", "coverage95")


def load_split(dataset: str, max_rows: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``X_train, X_test, y_train, y_test``: a PMLB set (75/25), or synthetic rows without it."""
    path = SHARED_DATA / f"{dataset}.tsv.gz"
    if path.is_file():
        import pandas as pd

        frame = pd.read_csv(path, sep="\t")
        X = frame.drop(columns="target").to_numpy(np.float64)
        y = frame["target"].to_numpy(np.float64)
    else:
        from daskkrr.data.synthetic import make_regression

        print(f"{path} is absent: synthetic rows instead", flush=True)
        X, y = (np.asarray(a) for a in make_regression(max_rows, 10, random_state=seed))
    rows = np.random.default_rng(seed).permutation(len(y))[:max_rows]
    cut = int(0.75 * len(rows))
    return X[rows[:cut]], X[rows[cut:]], y[rows[:cut]], y[rows[cut:]]


def child(args: argparse.Namespace) -> None:
    """One fit (and predict) in this fresh process; prints the result line."""
    from daskkrr import FalkonRegressor, NystromRegressor

    Xtr, Xte, ytr, yte = load_split(args.dataset, args.max_rows)
    kind, extra = METHODS[args.child]
    cls = FalkonRegressor if kind == "falkon" else NystromRegressor
    model = cls(n_centers=args.centers, penalty=args.penalty, random_state=0, compute_std=args.compute_std,
                **extra)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = model.predict(Xte)
    predict_s = time.perf_counter() - t0
    result: dict[str, Any] = {"fit_s": fit_s, "predict_s": predict_s, "strategy": model.strategy_, "n_train": len(ytr),
                              "r2": float(1 - np.sum((yte - pred) ** 2) / np.sum((yte - yte.mean()) ** 2))}
    if args.compute_std:
        t0 = time.perf_counter()
        mean, std = model.predict(Xte, return_std=True)
        result["predict_std_s"] = time.perf_counter() - t0
        half = 1.96 * np.sqrt(std**2 + model.noise_variance_[0])
        result["coverage95"] = float(np.mean(np.abs(yte - mean) <= half))
    emit(result)


def measure(method: str, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for compute_std in (False, True):  # interleaved: a drift in the machine's load hits both alike
            argv = [__file__, "--child", method, "--dataset", args.dataset, "--max-rows", str(args.max_rows),
                    "--centers", str(args.centers), "--penalty", str(args.penalty)]
            res = run_child(argv + (["--compute-std"] if compute_std else []), timeout=args.timeout)
            if "error" in res:
                raise RuntimeError(f"{method} (compute_std={compute_std}) failed: {res['error']}")
            runs[compute_std].append(res)

    def med(flag: bool, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[flag]))

    return {
        "method": method, "n_train": runs[False][0]["n_train"], "M": args.centers,
        "strategy": runs[True][0]["strategy"],
        "fit_s": med(False, "fit_s"), "fit_std_s": med(True, "fit_s"),
        "fit_ratio": med(True, "fit_s") / med(False, "fit_s"),
        "peak_mb": med(False, "peak_mb"), "peak_std_mb": med(True, "peak_mb"),
        "predict_s": med(False, "predict_s"), "predict_std_s": med(True, "predict_std_s"),
        "r2": med(False, "r2"), "coverage95": med(True, "coverage95"),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 000 rows, M = 300")
    ap.add_argument("--dataset", default="564_fried")
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--centers", type=int, default=None)
    ap.add_argument("--penalty", type=float, default=1e-6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default=None, help="results folder (default: results/ next to this file)")
    ap.add_argument("--child", choices=sorted(METHODS), help=argparse.SUPPRESS)
    ap.add_argument("--compute-std", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.max_rows is None:
        args.max_rows = 10_000 if args.quick else 40_000
    if args.centers is None:
        args.centers = 300 if args.quick else 1000
    if args.child:
        child(args)
        return []
    rows = [measure(method, args) for method in METHODS]
    print_table(rows, COLUMNS, title=f"predictive std cost, {args.dataset}, {'quick' if args.quick else 'full'}")
    meta = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k != "child"}}
    name = "predictive_std" if args.penalty == 1e-6 else f"predictive_std_penalty{args.penalty:g}"
    write_results(rows, args.out, name, meta)
    print(json.dumps(meta["machine"]), flush=True)
    return rows


if __name__ == "__main__":
    main()
