"""How many CG iterations FALKON needs, and which ``tol`` the test score needs.

For each PMLB set in ``../shared/data`` (8 regression, 4 classification sets;
at most ``--max-rows`` rows drawn at random, split 80/20 with a fixed seed) this
fits ``FalkonRegressor`` / ``FalkonClassifier`` with the library defaults
(the row-sketch preconditioner, an intercept, standardised features) except
``n_centers`` (``--centers``, 1000), ``dtype="float32"``, a large ``max_iter``
and ``tol`` in 1e-3 ... 1e-7. Each row of the table is one set and one ``tol``:
the CG iterations run, whether CG reached ``tol``, and the test score (R^2 for
regression, accuracy for classification), plus how far that score is from the
score at the tightest ``tol`` (``score_gap``). The defaults of ``max_iter`` and
``tol`` are read off the table: the loosest ``tol`` at which the test score
stops changing, and enough iterations to reach it on every set.

Run ``python workflows/benchmarks/convergence_defaults.py`` (about 10-15 min on
two cores); the table goes to ``results/convergence_defaults.{json,csv}``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import SHARED_DATA, machine, print_table, write_results  # noqa: E402

REGRESSION = ("537_houses", "574_house_16H", "564_fried", "344_mv", "1201_BNG_breastTumor",
              "1203_BNG_pwLinear", "197_cpu_act", "201_pol")
CLASSIFICATION = ("adult", "magic", "connect_4", "sleep")
TOLS = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)
COLUMNS = ("dataset", "task", "n_train", "d", "tol", "n_iter", "converged", "residual", "score",
           "score_gap", "fit_s")


def load_split(name: str, max_rows: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``X_train, X_test, y_train, y_test`` of one PMLB set: at most ``max_rows`` rows, 80/20."""
    import pandas as pd

    frame = pd.read_csv(SHARED_DATA / f"{name}.tsv.gz", sep="\t")
    X = frame.drop(columns="target").to_numpy(np.float64)
    y = frame["target"].to_numpy(np.float64)
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(y))[:max_rows]
    cut = int(0.8 * len(rows))
    train, test = rows[:cut], rows[cut:]
    return X[train], X[test], y[train], y[test]


def measure(name: str, task: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One fit per ``tol`` on one set; the rows of the table for it."""
    from sklearn.exceptions import ConvergenceWarning

    from daskkrr import FalkonClassifier, FalkonRegressor

    Xtr, Xte, ytr, yte = load_split(name, args.max_rows)
    cls = FalkonRegressor if task == "regression" else FalkonClassifier
    rows = []
    for tol in TOLS:
        model = cls(n_centers=args.centers, dtype="float32", max_iter=args.max_iter, tol=tol, random_state=0)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # the table says it (converged)
            model.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        rows.append({
            "dataset": name, "task": task, "n_train": len(ytr), "d": Xtr.shape[1], "tol": tol,
            "n_iter": int(model.n_iter_), "converged": bool(model.converged_),
            "residual": float(np.max(model.residuals_[-1])), "score": float(model.score(Xte, yte)),
            "fit_s": round(fit_s, 2),
        })
        print(f"  {name} tol={tol:g}: {rows[-1]['n_iter']} iterations, score {rows[-1]['score']:.5f}",
              flush=True)
    best = rows[-1]["score"]
    for row in rows:
        row["score_gap"] = abs(row["score"] - best)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--centers", type=int, default=1000, help="Nystrom centers M (default: 1000)")
    parser.add_argument("--max-rows", type=int, default=100_000,
                        help="rows drawn from each set before the 80/20 split (default: 100000)")
    parser.add_argument("--max-iter", type=int, default=300, help="CG iteration cap (default: 300)")
    parser.add_argument("--sets", nargs="*", default=None, help="only these sets (default: all 12)")
    parser.add_argument("--out", default=None, help="results folder (default: results/ next to this file)")
    args = parser.parse_args(argv)
    if not SHARED_DATA.is_dir():
        sys.exit(f"no data folder at {SHARED_DATA}; the PMLB sets are needed")
    rows: list[dict[str, Any]] = []
    for task, names in (("regression", REGRESSION), ("classification", CLASSIFICATION)):
        for name in names:
            if args.sets is None or name in args.sets:
                rows.extend(measure(name, task, args))
    print_table(rows, COLUMNS, title="CG iterations and test score per tol (row-sketch preconditioner)")
    meta = {"machine": machine(), "centers": args.centers, "max_rows": args.max_rows, "max_iter": args.max_iter,
            "dtype": "float32", "split": "80/20, seed 0", "tols": list(TOLS),
            "score": "R^2 (regression), accuracy (classification); score_gap = |score - score at tol 1e-7|"}
    write_results(rows, args.out, "convergence_defaults", meta)


if __name__ == "__main__":
    main()
