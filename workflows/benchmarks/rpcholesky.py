"""Test R^2 at equal M for RPCholesky, uniform and BLESS centers on two real sets, and RPCholesky's time per center.

Data: ``574_house_16H`` and ``1203_BNG_pwLinear`` from ``../shared/data`` (skipped with a
message when absent). For each seed the rows are split at random (80% train, 20% test;
``--n-train`` caps the training rows), and the same :class:`~daskkrr.NystromRegressor`
(standardised features, Gaussian kernel, direct M x M solve, so only the centers differ)
is fitted on centers from each sampler. The table gives mean and standard deviation of the
test R^2 over the seeds, and the seconds each sampler took to choose its centers (per center).

Run ``python workflows/benchmarks/rpcholesky.py --quick`` for a short run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from daskkrr import NystromRegressor  # noqa: E402

SHARED_DATA = REPO.parent / "shared" / "data"
#: Data set -> (Gaussian kernel width on the standardised features, penalty lambda).
SETS = {"574_house_16H": (4.0, 1e-6), "1203_BNG_pwLinear": (3.0, 1e-6)}
SAMPLERS = ("uniform", "bless", "rpcholesky")
RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> tuple[np.ndarray, np.ndarray] | None:
    import pandas as pd

    path = SHARED_DATA / f"{name}.tsv.gz"
    if not path.exists():
        print(f"skipping {name}: {path} is absent (the shared data sets live beside the checkout)")
        return None
    df = pd.read_csv(path, sep="\t")
    return df.drop(columns="target").to_numpy(float), df["target"].to_numpy(float)


def one_fit(X, y, Xte, yte, sampler: str, m: int, sigma: float, penalty: float, seed: int) -> dict:
    t0 = time.perf_counter()
    model = NystromRegressor(kernel="gaussian", sigma=sigma, penalty=penalty, n_centers=m, sampler=sampler,
                             random_state=seed).fit(X, y)
    seconds = time.perf_counter() - t0
    select = float(model.sampler_info_.get("seconds", np.nan))
    return {"sampler": sampler, "seed": seed, "M": model.n_centers_, "r2": float(model.score(Xte, yte)),
            "fit_seconds": seconds, "select_seconds": select, "select_seconds_per_center": select / model.n_centers_}


def run(name: str, m: int, seeds: int, n_train: int | None) -> list[dict]:
    data = load(name)
    if data is None:
        return []
    X, y = data
    sigma, penalty = SETS[name]
    rows = []
    for seed in range(seeds):
        perm = np.random.default_rng(seed).permutation(len(y))
        cut = int(0.8 * len(y))
        train, test = perm[:cut], perm[cut:]
        if n_train is not None:
            train = train[:n_train]
        for sampler in SAMPLERS:
            r = one_fit(X[train], y[train], X[test], y[test], sampler, m, sigma, penalty, seed)
            r.update(data=name, n_train=int(train.size))
            print(json.dumps(r), flush=True)
            rows.append(r)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["data"] for r in rows):
        for sampler in SAMPLERS:
            sel = [r for r in rows if r["data"] == name and r["sampler"] == sampler]
            r2 = np.array([r["r2"] for r in sel])
            per = np.array([r["select_seconds_per_center"] for r in sel])  # NaN: the sampler does not time itself
            out.append({"data": name, "sampler": sampler, "M": sel[0]["M"], "n_train": sel[0]["n_train"],
                        "seeds": len(sel), "r2_mean": float(r2.mean()), "r2_std": float(r2.std(ddof=1)) if len(sel) > 1
                        else 0.0, "select_ms_per_center": 1e3 * float(np.median(per))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--centers", type=int, default=1000, help="M, the same for every sampler")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--n-train", type=int, default=None, help="cap on training rows (default: 80%% of the set)")
    parser.add_argument("--quick", action="store_true", help="M=200, 2 seeds, 5000 training rows")
    parser.add_argument("--out", default=str(RESULTS / "rpcholesky"), help="prefix of the .json/.csv written")
    args = parser.parse_args()
    if args.quick:
        args.centers, args.seeds, args.n_train = 200, 2, 5000
    rows = [r for name in SETS for r in run(name, args.centers, args.seeds, args.n_train)]
    if not rows:
        return
    table = summary(rows)
    for t in table:
        print(f"{t['data']:>18} {t['sampler']:>10} M={t['M']} n={t['n_train']} R2 {t['r2_mean']:.4f} "
              f"+- {t['r2_std']:.4f} ({t['seeds']} seeds)  select {t['select_ms_per_center']:.2f} ms/center "
              "(nan: not timed by the sampler)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "runs": rows, "summary": table}, indent=1))
    import csv

    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)


if __name__ == "__main__":
    main()
