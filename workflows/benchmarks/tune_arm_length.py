"""How smooth should the tuner's bandit be? BKBSearchCV's arm-kernel length against a grid search.

``BKBSearchCV`` models the holdout score over the unit cube of the log-parameters
with a Gaussian kernel of length ``bandit_params["sigma"]``. This workflow runs the
search with a budget of 20 fits for each ``--lengths`` value (and with a lower
``beta_scale``, to separate smoothness from exploration) next to ``GridSearchCV``
over the 5 x 4 grid of ``tune_pmlb.py`` (20 fits), on PMLB regression sets, 75/25
splits, ``--seeds`` seeds, ``--rows`` training rows, ``FalkonRegressor(n_centers=300)``.
It prints the test R^2 and the best holdout score of each, per seed and as medians
per set, and writes ``results/tune_arm_length.{json,csv}``. It measures search
quality, not time (all fits run in this process).

    python workflows/benchmarks/tune_arm_length.py [--quick]   # quick: one set, one seed
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import SHARED_DATA, machine, print_table, write_results  # noqa: E402
from tune_pmlb import load  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="537_houses, one seed, 2000 rows")
    ap.add_argument("--sets", default="537_houses,197_cpu_act,564_fried")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--lengths", default="0.25,0.5", help="arm-kernel lengths to compare")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sets = ["537_houses"] if args.quick else args.sets.split(",")
    seeds, rows_cap = (1, 2000) if args.quick else (args.seeds, args.rows)
    missing = [s for s in sets if not (SHARED_DATA / f"{s}.tsv.gz").is_file()]
    if missing:
        print(f"skipped (absent from {SHARED_DATA}): {missing}")
    sets = [s for s in sets if s not in missing]

    from sklearn.metrics import r2_score
    from sklearn.model_selection import GridSearchCV, ShuffleSplit

    from daskkrr import FalkonRegressor
    from daskkrr.tune import BKBSearchCV

    variants = {f"length {v}": {"sigma": float(v)} for v in args.lengths.split(",")}
    variants["length 0.25, beta_scale 0.05"] = {"sigma": 0.25, "beta_scale": 0.05}
    rows = []
    warnings.simplefilter("ignore")
    for name in sets:
        for seed in range(seeds):
            Xtr, Xte, ytr, yte = load(name, seed, rows_cap)
            d = Xtr.shape[1]
            base = FalkonRegressor(n_centers=300, random_state=seed)
            grid = {"sigma": [math.sqrt(d) * s for s in (0.25, 0.5, 1, 2, 4)],
                    "penalty": [1e-8, 1e-6, 1e-4, 1e-2]}
            g = GridSearchCV(base, grid, cv=ShuffleSplit(1, test_size=0.25, random_state=seed)).fit(Xtr, ytr)
            rows.append({"set": name, "seed": seed, "method": "grid-20", "test_r2": r2_score(yte, g.predict(Xte)),
                         "holdout": g.best_score_})
            for label, params in variants.items():
                m = BKBSearchCV(base, budget_fits=20, random_state=seed, bandit_params=params).fit(Xtr, ytr)
                rows.append({"set": name, "seed": seed, "method": f"tune-20, {label}",
                             "test_r2": r2_score(yte, m.predict(Xte)), "holdout": m.best_score_})
            print_table([r for r in rows if r["set"] == name and r["seed"] == seed],
                        ["set", "seed", "method", "test_r2", "holdout"])
    summary = []
    for name in sets:
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["set"] == name and r["method"] == method]
            grid = [r for r in rows if r["set"] == name and r["method"] == "grid-20"]
            summary.append({"set": name, "method": method, "seeds": len(mine),
                            "median_test_r2": float(np.median([r["test_r2"] for r in mine])),
                            "median_holdout": float(np.median([r["holdout"] for r in mine])),
                            "seeds_at_or_above_grid": sum(a["test_r2"] >= b["test_r2"] - 1e-4
                                                          for a, b in zip(mine, grid))})
    print_table(summary, ["set", "method", "seeds", "median_test_r2", "median_holdout", "seeds_at_or_above_grid"],
                title=f"BKBSearchCV arm-kernel length vs GridSearchCV (20 fits each, {rows_cap} training rows)")
    write_results([*rows, *summary], args.out, "tune_arm_length" + ("_quick" if args.quick else ""),
                  {"machine": machine(), "sets": sets, "seeds": seeds, "rows": rows_cap,
                   "lengths": args.lengths, "quick": args.quick})


if __name__ == "__main__":
    main()
