"""Time to accuracy: daskkrr FalkonRegressor against FALKON (CPU build), side by side in one run.

For each case (data, n, M, dtype) both libraries fit the same Nystrom KRR
problem (Gaussian kernel, the same sigma and penalty, no intercept, features as
given) under a sweep of stopping rules:

- iteration budgets (``--budgets``, CG tolerance too small to stop it), and
- tolerances (``--tols``, with ``max_iter = 100``): daskkrr's ``tol`` and
  FALKON's ``FalkonOptions(cg_tolerance=...)``.

Every (library, stopping rule) is fitted ``--repeats`` times, each in a fresh
process, the runs of the two libraries interleaved; the fit time is the median,
the test RMSE that of the first repeat (it is deterministic up to threading). The
target is ``1.01 x`` the best test RMSE either library reaches in the case, and a
library's **time to accuracy** is the smallest median fit time among its stopping
rules that reach the target. Peak memory is the sum of the peak RSS of every
process of the child's tree, at that stopping rule.

Data:

- ``synthetic``: ``x ~ N(0, I_d)``, d = 20, ``y = sin(x_1 + x_2 + x_3) + 0.3 e``,
  20 000 test rows; sigma = sqrt(d), penalty 1e-6 (as in issue 17);
- ``pwlinear``: ``1203_BNG_pwLinear`` from ``../shared/data`` (d = 10), standardised
  with the training rows' mean and deviation, 20% test; sigma = sqrt(d);
- ``fashion``: Fashion-MNIST (d = 784, pixels in [0, 1]) as one-vs-all least
  squares on +-1 codes of the 10 classes (RMSE of the code matrix; the test error
  rate is also reported); sigma = 5 (as the FALKON paper's MNIST runs).

FALKON runs in the interpreter of ``$FALKON_PYTHON`` (``falkon_cpu.py``) with
``keops_active="no"``; without it, its column is skipped with the reason.

Run ``python workflows/benchmarks/time_to_accuracy.py --quick`` (synthetic n = 2e4,
M = 500, float32, one repeat); the issue's grid is
``--n 100000,1000000 --centers 1000,5000,10000 --dtypes float32,float64`` plus
``--data pwlinear`` and ``--data fashion``. Writes ``results/time_to_accuracy*.{json,csv,png}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falkon_cpu import falkon_unavailable_reason, run_falkon  # noqa: E402
from fit_tools import SHARED_DATA, emit, machine, print_table, run_child, write_results  # noqa: E402

PENALTY = 1e-6
N_TEST = 20_000
#: A tolerance that never stops CG before its iteration budget.
NO_TOL = 1e-14
#: A library reaches the target when its test RMSE is at most this times the best.
TARGET = 1.01


# --------------------------------------------------------------------------- data
def make_data(data: str, n: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``X_train, y_train, X_test, y_test, sigma`` (y of the test rows: codes for fashion)."""
    if data == "synthetic":
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n + N_TEST, 20))
        y = np.sin(X[:, :3].sum(axis=1)) + 0.3 * rng.standard_normal(n + N_TEST)
        return X[:n].astype(dtype), y[:n].astype(dtype), X[n:].astype(dtype), y[n:], math.sqrt(20)
    if data == "pwlinear":
        import pandas as pd
        from sklearn.model_selection import train_test_split

        frame = pd.read_csv(SHARED_DATA / "1203_BNG_pwLinear.tsv.gz", sep="\t")
        y = frame.pop("target").to_numpy(np.float64)
        X = frame.to_numpy(np.float64)
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=seed)
        Xtr, ytr = Xtr[:n], ytr[:n]
        mu, sd = Xtr.mean(axis=0), Xtr.std(axis=0) + 1e-12
        return (((Xtr - mu) / sd).astype(dtype), ytr.astype(dtype), ((Xte - mu) / sd).astype(dtype), yte,
                math.sqrt(X.shape[1]))
    if data == "fashion":
        from exact_pcg_table4 import fashion_mnist, rlsc_targets

        X, y = fashion_mnist(train=True)
        Xte, yte = fashion_mnist(train=False)
        classes = np.unique(y)
        return (X[:n].astype(dtype), y[:n], Xte.astype(dtype), rlsc_targets(yte, classes), 5.0)
    raise ValueError(f"unknown data {data!r}")


def data_available(data: str) -> str | None:
    """None when the data can be loaded, else why not."""
    need = {"pwlinear": SHARED_DATA / "1203_BNG_pwLinear.tsv.gz", "fashion": SHARED_DATA / "fashion-mnist"}
    path = need.get(data)
    return None if path is None or path.exists() else f"{path} is absent"


# --------------------------------------------------------------------------- children
def child_daskkrr(spec: dict[str, Any]) -> dict[str, Any]:
    import warnings

    Xtr, ytr, Xte, yte, sigma = make_data(spec["data"], spec["n"], spec["dtype"])
    from daskkrr import FalkonClassifier, FalkonRegressor

    params = dict(n_centers=spec["M"], sigma=sigma, penalty=PENALTY, dtype=spec["dtype"], max_iter=spec["max_iter"],
                  tol=spec["tol"], standardize=False, fit_intercept=False, random_state=0)
    model = FalkonClassifier(**params) if spec["data"] == "fashion" else FalkonRegressor(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed budget "did not converge" by design
        t0 = time.perf_counter()
        model.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
    pred = np.asarray(model.decision_function(Xte) if spec["data"] == "fashion" else model.predict(Xte))
    out = _errors(pred, yte, spec["data"])
    out.update(fit_s=fit_s, n_iter=int(np.max(model.n_iter_)), strategy=model.strategy_,
               sketch_rows=int(getattr(model, "preconditioner_rows_", 0) or 0))
    return out


def run_falkon_case(spec: dict[str, Any]) -> dict[str, Any]:
    Xtr, ytr, Xte, yte, sigma = make_data(spec["data"], spec["n"], spec["dtype"])
    model = "falkon" if spec["data"] == "fashion" else "regression"
    res = run_falkon(Xtr, ytr, Xte, model=model, sigma=sigma, M=spec["M"], penalty=PENALTY,
                     maxiter=spec["max_iter"], tol=spec["tol"], dtype=spec["dtype"], seed=0,
                     timeout=spec.get("timeout", 3600.0))
    if "error" in res:
        return res
    out = _errors(np.asarray(res.pop("decision"), dtype=np.float64), yte, spec["data"])
    res.pop("classes", None)
    out.update({k: v for k, v in res.items() if k in ("fit_s", "peak_mb", "wall_s", "n_processes")})
    return out


def _errors(pred: np.ndarray, yte: np.ndarray, data: str) -> dict[str, float]:
    pred = pred.reshape(yte.shape)
    out = {"rmse": float(np.sqrt(np.mean((pred - yte) ** 2)))}
    if data == "fashion":
        out["error_rate"] = float(np.mean(pred.argmax(axis=1) != yte.argmax(axis=1)))
    return out


# --------------------------------------------------------------------------- parent
def stopping_rules(budgets: list[int], tols: list[float]) -> list[dict[str, Any]]:
    return ([{"rule": f"iter={b}", "max_iter": b, "tol": NO_TOL} for b in budgets]
            + [{"rule": f"tol={t:g}", "max_iter": 100, "tol": t} for t in tols])


def run_case(case: dict[str, Any], rules: list[dict[str, Any]], repeats: int, falkon_reason: str | None,
             timeout: float) -> list[dict[str, Any]]:
    """Every (library, rule) of one case, repeats interleaved; one row per (library, rule)."""
    libs = ["daskkrr"] + ([] if falkon_reason else ["falkon"])
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(repeats):
        for rule in rules:
            for lib in libs:
                spec = {**case, **rule, "timeout": timeout}
                if lib == "daskkrr":
                    res = run_child([__file__, "--child", json.dumps(spec)], timeout=timeout)
                else:
                    res = run_falkon_case(spec)
                runs.setdefault((lib, rule["rule"]), []).append(res)
                print(json.dumps({**case, "library": lib, "rule": rule["rule"],
                                  **{k: v for k, v in res.items() if k != "peak_per_process_mb"}},
                                 default=float), flush=True)
    rows = []
    for (lib, rule), rs in runs.items():
        ok = [r for r in rs if "rmse" in r]
        row = {**case, "library": lib, "rule": rule, "repeats": len(ok)}
        if ok:
            row.update(fit_s=float(np.median([r["fit_s"] for r in ok])), rmse=ok[0]["rmse"],
                       peak_mb=float(np.median([r["peak_mb"] for r in ok])),
                       **{k: ok[0][k] for k in ("error_rate", "n_iter", "strategy", "sketch_rows") if k in ok[0]})
        else:
            row["error"] = str(rs[0].get("error", "?"))[-300:]
        rows.append(row)
    return rows


def summarise(case: dict[str, Any], rows: list[dict[str, Any]], falkon_reason: str | None) -> dict[str, Any]:
    """Time to accuracy of each library in one case, and their ratio."""
    ok = [r for r in rows if "rmse" in r]
    best = min(r["rmse"] for r in ok)
    target = TARGET * best
    out: dict[str, Any] = {**case, "best_rmse": best, "target_rmse": target}
    for lib in ("daskkrr", "falkon"):
        reached = [r for r in ok if r["library"] == lib and r["rmse"] <= target]
        if reached:
            win = min(reached, key=lambda r: r["fit_s"])
            out.update({f"{lib}_tta_s": win["fit_s"], f"{lib}_rule": win["rule"], f"{lib}_rmse": win["rmse"],
                        f"{lib}_peak_mb": win["peak_mb"]})
        else:
            mine = [r for r in ok if r["library"] == lib]
            out[f"{lib}_rule"] = (falkon_reason if lib == "falkon" and falkon_reason
                                  else f"target not reached (best {min(r['rmse'] for r in mine):.4g})" if mine
                                  else "no run finished")
    if out.get("falkon_tta_s") and out.get("daskkrr_tta_s"):
        out["tta_ratio"] = out["daskkrr_tta_s"] / out["falkon_tta_s"]
        out["peak_ratio"] = out["daskkrr_peak_mb"] / out["falkon_peak_mb"]
    return out


def plot(rows: list[dict[str, Any]], cases: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is absent: no plot")
        return
    ncol = min(3, len(cases))
    nrow = math.ceil(len(cases) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.5 * ncol, 3.6 * nrow), squeeze=False)
    for ax, case in zip(axes.ravel(), cases):
        for lib, marker in (("daskkrr", "o"), ("falkon", "s")):
            pts = sorted((r["fit_s"], r["rmse"]) for r in rows
                         if r["library"] == lib and "rmse" in r and all(r[k] == case[k] for k in case))
            if pts:
                ax.plot(*zip(*pts), marker=marker, linestyle="", label=lib)
        ax.set_xscale("log")
        ax.set_xlabel("fit time (s)")
        ax.set_ylabel("test RMSE")
        ax.set_title(f"{case['data']} n={case['n']:.0e} M={case['M']} {case['dtype']}", fontsize=9)
        ax.legend(fontsize=8)
    for ax in axes.ravel()[len(cases):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="synthetic n = 2e4, M = 500, float32, one repeat")
    ap.add_argument("--data", default="synthetic", choices=("synthetic", "pwlinear", "fashion"))
    ap.add_argument("--n", default=None, help="comma list of training rows (default 100000)")
    ap.add_argument("--centers", default=None, help="comma list of M (default 1000,5000,10000)")
    ap.add_argument("--dtypes", default=None, help="comma list (default float32)")
    ap.add_argument("--budgets", default="3,5,8,12,20,30", help="CG iteration budgets")
    ap.add_argument("--tols", default="1e-2,1e-3,1e-4", help="CG tolerances (max_iter 100)")
    ap.add_argument("--repeats", type=int, default=None, help="fresh-process fits per rule (default 3)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--name", default=None, help="results file name (default time_to_accuracy[_quick])")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(child_daskkrr(json.loads(args.child)))
        return []
    ns = [int(float(v)) for v in (args.n or ("20000" if args.quick else "100000")).split(",")]
    centers = [int(v) for v in (args.centers or ("500" if args.quick else "1000,5000,10000")).split(",")]
    dtypes = (args.dtypes or "float32").split(",")
    repeats = args.repeats or (1 if args.quick else 3)
    rules = stopping_rules([int(v) for v in args.budgets.split(",") if v],
                           [float(v) for v in args.tols.split(",") if v])
    missing = data_available(args.data)
    if missing:
        print(f"skipping {args.data}: {missing}")
        return []
    falkon_reason = falkon_unavailable_reason()
    if falkon_reason:
        print(f"FALKON column skipped: {falkon_reason}")
    cases = [{"data": args.data, "n": n, "M": M, "dtype": dt} for n in ns for M in centers for dt in dtypes]
    all_rows: list[dict[str, Any]] = []
    summary = []
    for case in cases:
        rows = run_case(case, rules, repeats, falkon_reason, args.timeout)
        all_rows += rows
        if any("rmse" in r for r in rows):
            summary.append(summarise(case, rows, falkon_reason))
    info = machine()
    title = (f"time to test RMSE <= {TARGET} x best, {info['cores']} cores ({info['cpu']}), "
             f"load {info['load_average_1min']}, medians of {repeats} fresh-process fits")
    print_table(all_rows, ["data", "n", "M", "dtype", "library", "rule", "fit_s", "rmse", "error_rate", "n_iter",
                           "sketch_rows", "strategy", "peak_mb", "error"], "every run")
    print_table(summary, ["data", "n", "M", "dtype", "best_rmse", "daskkrr_tta_s", "daskkrr_rule", "falkon_tta_s",
                          "falkon_rule", "tta_ratio", "daskkrr_peak_mb", "falkon_peak_mb", "peak_ratio"], title)
    name = args.name or ("time_to_accuracy_quick" if args.quick else "time_to_accuracy")
    jpath, _ = write_results(summary, args.out, name, {"machine": info, "args": vars(args), "runs": all_rows})
    plot(all_rows, cases, jpath.with_suffix(".png"))
    return summary


if __name__ == "__main__":
    main()
