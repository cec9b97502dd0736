"""The fast predictive variance (``std_method``) against the exact one and against ``predict`` (issue 40).

For each ``M`` one ``FalkonRegressor(compute_std=True, std_method="fast")`` fit (the default penalty and
kernel) on ``--train`` rows of a PMLB set from ``../shared/data`` (``--dataset``, default 564_fried, d = 10;
synthetic rows without it, see ``predictive_std.load_split``), then on ``--queries`` other rows:

- ``predict_s``, ``fast_s``, ``exact_s``: ``predict(X)``, ``predict(X, return_std=True)`` with the fast
  variance and with ``std_method="exact"`` (the same fitted model), best of ``--repeats``, in this process;
  ``fast_ratio`` and ``exact_ratio``: those over ``predict_s``;
- ``rank`` (the rank the fast variance needed to keep its bound within 5% of the mean variance),
  ``rank_cap`` (the largest rank ``std_method="auto"`` uses; above it "auto" keeps the exact variance)
  and ``auto`` (which one "auto" would use);
- ``bound_rel``: the stated mean error over rows like the training rows over their mean variance;
  ``mean_err_rel``: the measured mean error over the query rows over their mean exact variance;
  ``max_var_rel`` / ``max_std_rel``: the largest relative error of the variance / the std on a query row;
  ``min_err``: the smallest ``v_fast - v`` (>= 0 up to round-off: the fast variance is conservative).

``python workflows/benchmarks/fast_variance.py --quick`` (M = 300, 2 000 rows) takes under a minute;
the full run (M = 1000, 2000, 5000; 20 000 training and 20 000 query rows) takes tens of minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import machine, print_table, write_results  # noqa: E402
from predictive_std import load_split  # noqa: E402

COLUMNS = ("M", "n_train", "n_query", "predict_s", "fast_s", "exact_s", "fast_ratio", "exact_ratio", "rank",
           "rank_cap", "auto", "bound_rel", "mean_err_rel", "max_var_rel", "max_std_rel", "min_err", "fit_s")


def _best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The best of ``repeats`` timings of ``fn()`` and its last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def measure(M: int, data: tuple[np.ndarray, ...], repeats: int) -> dict[str, Any]:
    """The figures of one fit (see the module docstring)."""
    from daskkrr import FalkonRegressor
    from daskkrr.solvers.variance import fast_rank_cap

    Xtr, ytr, Xq = data
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "fast" past the rank cap warns; the row says so
        model = FalkonRegressor(n_centers=M, compute_std=True, std_method="fast", random_state=0).fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    low = model.posterior_.low_rank
    predict_s = _best_time(lambda: model.predict(Xq), repeats)[0]
    fast_s, (_, std_fast) = _best_time(lambda: model.predict(Xq, return_std=True), repeats)
    model.set_params(std_method="exact")
    exact_s, (_, std_exact) = _best_time(lambda: model.predict(Xq, return_std=True), repeats)
    s2 = float(model.posterior_.prior_variance[0])
    v_fast, v_exact = std_fast**2 / s2, std_exact**2 / s2
    err = v_fast - v_exact
    cap = fast_rank_cap(Xtr.shape[1])
    rank = -1 if low is None else low.rank  # -1: the fast factor was refused (round-off), exact used
    return {
        "M": M, "n_train": len(ytr), "n_query": len(Xq), "predict_s": predict_s, "fast_s": fast_s,
        "exact_s": exact_s, "fast_ratio": fast_s / predict_s, "exact_ratio": exact_s / predict_s,
        "rank": rank, "rank_cap": cap, "auto": "fast" if 0 <= rank <= cap else "exact",
        "bound_rel": float("nan") if low is None else low.bound / low.mean_variance,
        "mean_err_rel": float(np.mean(err) / np.mean(v_exact)),
        "max_var_rel": float(np.max(err / np.maximum(v_exact, np.finfo(float).tiny))),
        "max_std_rel": float(np.max(std_fast / np.maximum(std_exact, np.finfo(float).tiny) - 1)),
        "min_err": float(np.min(err)), "fit_s": fit_s,
    }


def split(dataset: str, n_train: int, n_query: int) -> tuple[np.ndarray, ...]:
    """``X_train, y_train, X_query``: disjoint rows of the set, shuffled with a fixed seed."""
    Xa, Xb, ya, yb = load_split(dataset, n_train + n_query)
    X, y = np.vstack([Xa, Xb]), np.concatenate([ya, yb])
    n_query = min(n_query, len(y) - n_train)
    return X[:n_train], y[:n_train], X[n_train : n_train + n_query]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="564_fried")
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--centers", default="1000,2000,5000", help="comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="M = 300, 2 000 training and 2 000 query rows")
    ap.add_argument("--out", default=None, help="results folder (default: results/ next to this file)")
    args = ap.parse_args(argv)
    if args.quick:
        args.train, args.queries, args.centers = 2000, 2000, "300"
    data = split(args.dataset, args.train, args.queries)
    rows = [measure(int(m), data, args.repeats) for m in args.centers.split(",")]
    print_table(rows, COLUMNS)
    write_results(rows, args.out, f"fast_variance_{args.dataset}",
                  {"machine": machine(), "dataset": args.dataset, "argv": sys.argv[1:]})
    return rows


if __name__ == "__main__":
    main()
