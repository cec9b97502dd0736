"""Speed of OnlineKernelRidge: per-batch update time vs dictionary size; a stream vs refitting after every batch.

Part 1. One stream per ridge ``lam`` (a smaller ``lam`` keeps more landmarks):
the seconds of each ``partial_fit`` batch against the dictionary size it ended with.

Part 2. A stream of ``n`` rows (1e6 full, 5e4 quick) in batches of ``b`` (10 000
full, 5 000 quick), learnt by ``partial_fit``, against refitting from scratch on
all rows seen after every batch: daskkrr ``FalkonRegressor`` and, when
``$FALKON_PYTHON`` (default ``../falkon-venv/bin/python`` from the repository
root) has FALKON, FALKON's CPU build (``keops_active="no"``). The refit after
batch ``k`` costs about ``k`` times the first, so fitting after all ``n/b``
batches is expensive: it is *measured* after a few batches (``--refit-at``,
default the first, the middle and the last) and the total over every batch is
*extrapolated* by the trapezoidal rule over those points (linear in ``k``
between them) -- the table says which figures are measured and which
extrapolated. The refits use ``M`` = the online model's final number of centers
and the same objective (``penalty = lam / n_seen``, FALKON's normalisation).

Each measurement runs in a fresh process (:func:`fit_tools.run_child`),
repeated ``--repeats`` times (median), with the peak memory of its process tree.

Usage::

    python workflows/benchmarks/online_speed.py [--quick] [--repeats R] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
D, SIGMA, LAM = 8, 3.0, 30.0


def stream(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The synthetic stream (numpy only: the FALKON child regenerates the same rows)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=n)
    return X, y


def _emit(result: dict) -> None:
    print("BENCH-RESULT " + json.dumps(result, default=float), flush=True)


# ------------------------------------------------------------------ children
def child_online(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from daskkrr.models.online import OnlineKernelRidge

    X, y = stream(args.n)
    Xt, yt = stream(20000, seed=99)
    # --lam is the sampler's fixed ridge and the regression's ridge after the whole stream (penalty * n)
    model = OnlineKernelRidge(sigma=SIGMA, penalty=args.lam / args.n, gamma=args.lam, standardize=False,
                              batch_size=args.batch, random_state=0)
    per_batch = []
    t0 = time.perf_counter()
    for start in range(0, args.n, args.batch):
        t = time.perf_counter()
        model.partial_fit(X[start:start + args.batch], y[start:start + args.batch])
        per_batch.append((model.n_landmarks_, time.perf_counter() - t))
    total = time.perf_counter() - t0
    rmse = float(np.sqrt(np.mean((model.predict(Xt) - yt) ** 2)))
    _emit({"total_s": total, "per_batch": per_batch, "centers": int(model.centers_.shape[0]),
           "landmarks": int(model.n_landmarks_), "test_rmse": rmse})


def child_refit(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from daskkrr import FalkonRegressor

    X, y = stream(args.n)
    Xt, yt = stream(20000, seed=99)
    rows = args.rows
    t = time.perf_counter()
    model = FalkonRegressor(sigma=SIGMA, penalty=args.lam / rows, n_centers=args.centers, standardize=False,
                            fit_intercept=False, random_state=0).fit(X[:rows], y[:rows])
    seconds = time.perf_counter() - t
    rmse = float(np.sqrt(np.mean((model.predict(Xt) - yt) ** 2)))
    _emit({"seconds": seconds, "test_rmse": rmse, "n_iter": int(model.n_iter_)})


def child_falkon(args: argparse.Namespace) -> None:
    import falkon
    import torch

    X, y = stream(args.n)
    Xt, yt = stream(20000, seed=99)
    rows = args.rows
    opts = falkon.FalkonOptions(keops_active="no", use_cpu=True)
    t = time.perf_counter()
    model = falkon.Falkon(kernel=falkon.kernels.GaussianKernel(sigma=SIGMA, opt=opts), penalty=args.lam / rows,
                          M=args.centers, maxiter=20, seed=0, options=opts)
    model.fit(torch.from_numpy(X[:rows]), torch.from_numpy(y[:rows, None]))
    seconds = time.perf_counter() - t
    pred = model.predict(torch.from_numpy(Xt)).numpy()[:, 0]
    _emit({"seconds": seconds, "test_rmse": float(np.sqrt(np.mean((pred - yt) ** 2)))})


def falkon_python() -> str | None:
    path = os.environ.get("FALKON_PYTHON", str(REPO.parent / "falkon-venv" / "bin" / "python"))
    return path if Path(path).is_file() else None


# -------------------------------------------------------------------- parent
def _median(results: list[dict], key: str) -> float | None:
    vals = [r[key] for r in results if key in r]
    return float(np.median(vals)) if vals else None


def _run(argv: list[str], repeats: int, python: str | None = None) -> list[dict]:
    from fit_tools import run_child

    return [run_child(argv, python=python) for _ in range(repeats)]


def _trapezoid(ks: list[int], secs: list[float], n_batches: int) -> float:
    """Total over batches 1..n_batches of a cost measured at ``ks`` (linear between, flat beyond)."""
    grid = np.arange(1, n_batches + 1)
    return float(np.interp(grid, ks, secs).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--refit-at", default=None, help="batches after which to measure the refit, e.g. 1,50,100")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--centers", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lam", type=float, default=LAM,
                        help=f"ridge of the part-2 stream and its refits (default {LAM}; larger keeps fewer landmarks)")
    args = parser.parse_args()
    if args.child:
        {"online": child_online, "refit": child_refit, "falkon": child_falkon}[args.child](args)
        return

    sys.path.insert(0, str(HERE))
    from fit_tools import machine, print_table, write_results

    n, batch = (50_000, 5_000) if args.quick else (1_000_000, 10_000)
    n_batches = n // batch
    me = [str(Path(__file__).resolve())]

    # Part 1: per-batch time vs dictionary size.
    size_rows = []
    sizes_n, sizes_batch = (20_000, 2_000) if args.quick else (100_000, batch)
    for lam in (100.0, 30.0, 10.0):
        res = _run([*me, "--child", "online", "--n", str(sizes_n), "--batch", str(sizes_batch), "--lam",
                    str(lam)], 1)[0]
        for k, (m, s) in enumerate(res.get("per_batch", [])):
            size_rows.append({"part": "per-batch", "lam": lam, "batch_index": k + 1,
                              "rows_seen": (k + 1) * sizes_batch,
                              "landmarks": m, "seconds": round(s, 4)})
        if "error" in res:
            print(res["error"])
    print_table([r for r in size_rows if r["batch_index"] in (1, 2, 3) or r["rows_seen"] == sizes_n],
                ["lam", "batch_index", "rows_seen", "landmarks", "seconds"],
                title=f"Per-batch update time vs dictionary size (batches of {sizes_batch}, d={D})")

    # Part 2: the whole stream vs refitting after every batch.
    online = _run([*me, "--child", "online", "--n", str(n), "--batch", str(batch), "--lam", str(args.lam)],
                  args.repeats)
    centers = int(online[0].get("centers", 500))
    ks = ([int(k) for k in args.refit_at.split(",")] if args.refit_at
          else sorted({1, n_batches // 2, n_batches}))
    rows = [{"part": "stream", "method": "online partial_fit", "batches": n_batches, "rows": n,
             "total_s": _median(online, "total_s"), "measured": "all batches", "centers": centers,
             "test_rmse": _median(online, "test_rmse"), "peak_mb": _median(online, "peak_mb")}]
    methods = [("daskkrr FalkonRegressor refit", None, "refit")]
    fpy = falkon_python()
    skipped = None
    if fpy is not None:
        import subprocess

        ok = subprocess.run([fpy, "-c", "import falkon"], capture_output=True).returncode == 0
        if ok:
            methods.append(("FALKON (CPU) refit", fpy, "falkon"))
        else:
            skipped = f"FALKON: {fpy} cannot import falkon"
    else:
        skipped = "FALKON: no interpreter at $FALKON_PYTHON / ../falkon-venv/bin/python"
    for label, python, child in methods:
        secs, rmses, peaks = [], [], []
        for k in ks:
            res = _run([*me, "--child", child, "--n", str(n), "--rows", str(k * batch), "--centers", str(centers),
                        "--lam", str(args.lam)], args.repeats, python)
            if any("error" in r for r in res):
                print(f"{label} after batch {k} failed:\n{res[0].get('error')}")
            secs.append(_median(res, "seconds") or float("nan"))
            rmses.append(_median(res, "test_rmse"))
            peaks.append(_median(res, "peak_mb"))
            rows.append({"part": "refit-point", "method": label, "batches": k, "rows": k * batch,
                         "total_s": secs[-1], "measured": "measured", "centers": centers,
                         "test_rmse": rmses[-1], "peak_mb": peaks[-1]})
        ok = [(k, sec) for k, sec in zip(ks, secs) if np.isfinite(sec)]
        if not ok:
            continue
        # A refit that failed (FALKON runs out of memory at 1e6 rows on 24 GB) leaves the
        # cost flat after the last one that ran: the total is then a lower bound.
        total = _trapezoid([k for k, _ in ok], [sec for _, sec in ok], n_batches)
        how = (f"extrapolated from batches {ks}" if len(ok) == len(ks) else
               f"lower bound: extrapolated from batches {[k for k, _ in ok]}, flat after (failed at "
               f"{[k for k, sec in zip(ks, secs) if not np.isfinite(sec)]})")
        rows.append({"part": "stream", "method": label, "batches": n_batches, "rows": n, "total_s": round(total, 2),
                     "measured": how, "centers": centers, "test_rmse": next((r for r in rmses[::-1] if r), None),
                     "peak_mb": max(p for p in peaks if p is not None)})
    online_total = rows[0]["total_s"]
    for r in rows:
        if r["part"] == "stream" and r["total_s"]:
            r["ratio_to_online"] = round(r["total_s"] / online_total, 1)
    print_table(rows, ["part", "method", "batches", "rows", "total_s", "ratio_to_online", "measured", "centers",
                       "test_rmse", "peak_mb"],
                title=f"Stream of {n} rows in batches of {batch} (lam={args.lam}): online vs refit after each batch")
    if skipped:
        print("skipped:", skipped)
    meta = {"machine": machine(), "quick": args.quick, "n": n, "batch": batch, "d": D, "sigma": SIGMA,
            "lam": args.lam, "repeats": args.repeats, "refit_measured_at": ks, "skipped": skipped}
    write_results([*size_rows, *rows], args.out, "online_speed", meta)


if __name__ == "__main__":
    main()
