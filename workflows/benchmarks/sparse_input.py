"""Sparse input (issue 40): a FALKON fit on CSR rows against the same fit on the densified rows.

The data are tf-idf-like rows made here (density 1%, exponential term weights, unit L2
norm; the target a linear function of the rows plus noise). Each fit runs in a fresh
process, ``--repeats`` times (medians reported), after an untimed warm-up fit on 200
rows of the same kind (numba compiles the dense engine once per process):

- ``sparse``: ``FalkonRegressor().fit(X_csr, y)``, the kernel blocks from sparse dot products;
- ``dense``: ``FalkonRegressor().fit(X_csr.toarray(), y)``, the input densified by the user.

Columns: fit time, peak memory of the process (the input is built inside it, so the
dense row includes the ``n x d`` array the user would have to hold), CG iterations,
``input_mb`` (the bytes of the input as passed) and ``max_diff``, the largest difference of
the sparse fit's test predictions from the dense one's (the same model to round-off).

Run ``python -m workflows.benchmarks run sparse_input --quick`` (n = 5 000, d = 5 000, about a
minute on two cores) or without ``--quick`` (n = 50 000, d = 20 000: the dense input is
8 GB; give the machine the memory). Results go to ``results/sparse_input{_quick}.{json,csv}``.
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

VARIANTS = ("dense", "sparse")
COLUMNS = ("variant", "n", "d", "density", "input_mb", "fit_s", "peak_mb", "n_iter", "max_diff")


def make_data(n: int, d: int, density: float, seed: int = 0) -> tuple[Any, np.ndarray, Any]:
    """tf-idf-like CSR rows (unit L2 norm), their target, and 500 test rows."""
    import scipy.sparse as sp
    from sklearn.preprocessing import normalize

    rng = np.random.default_rng(seed)
    X = sp.random(n + 500, d, density=density, format="csr", random_state=seed)
    X.data = rng.exponential(size=X.nnz)
    X = sp.csr_matrix(normalize(X))
    y = np.asarray(X @ rng.standard_normal(d)).ravel() + 0.01 * rng.standard_normal(n + 500)
    return X[:n], y[:n], X[n:]


def child(args: argparse.Namespace) -> None:
    """One fit in this (fresh) process; prints its figures and the first test predictions."""
    from daskkrr import FalkonRegressor

    X, y, X_test = make_data(args.n, args.d, args.density)
    params = dict(n_centers=args.centers, penalty=1e-4, tol=1e-8, max_iter=100, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Xw, yw, _ = make_data(200, args.d, args.density, seed=1)  # warm-up, untimed
        FalkonRegressor(n_centers=20, max_iter=3, random_state=0).fit(Xw if args.variant == "sparse" else
                                                                       Xw.toarray(), yw)
        if args.variant == "dense":
            X, X_test = X.toarray(), X_test.toarray()
        input_mb = (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes if args.variant == "sparse"
                    else X.nbytes) / 2**20
        t0 = time.perf_counter()
        model = FalkonRegressor(**params).fit(X, y)
        seconds = time.perf_counter() - t0
    pred = model.predict(X_test)
    emit({"fit_s": seconds, "n_iter": int(model.n_iter_), "input_mb": input_mb, "pred": pred[:200].tolist()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (n = 5 000, d = 5 000)")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--d", type=int, default=None)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--centers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None, help="results directory (default: results/ beside this file)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="sparse", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.n = args.n or (5_000 if args.quick else 50_000)
    args.d = args.d or (5_000 if args.quick else 20_000)
    args.centers = args.centers or (300 if args.quick else 1000)
    args.repeats = args.repeats or (3 if args.quick else 3)
    if args.child:
        child(args)
        return
    runs: dict[str, list[dict[str, Any]]] = {}
    for variant in VARIANTS:
        argv = [__file__, "--child", "--variant", variant, "--n", str(args.n), "--d", str(args.d),
                "--density", str(args.density), "--centers", str(args.centers)]
        runs[variant] = [run_child(argv) for _ in range(args.repeats)]
        failed = [r["error"] for r in runs[variant] if "error" in r]
        if failed:
            raise RuntimeError(f"{variant} failed: {failed[0]}")
    reference = np.asarray(runs["dense"][0]["pred"])
    rows = []
    for variant in VARIANTS:
        res = runs[variant]
        rows.append({
            "variant": variant, "n": args.n, "d": args.d, "density": args.density,
            "input_mb": round(res[0]["input_mb"], 1),
            "fit_s": round(median(r["fit_s"] for r in res), 3),
            "peak_mb": round(median(r["peak_mb"] for r in res), 1),
            "n_iter": res[0]["n_iter"],
            "max_diff": None if variant == "dense" else float(np.max(np.abs(np.asarray(res[0]["pred"]) - reference))),
        })
    meta = {"machine": machine(), "quick": args.quick, "n": args.n, "d": args.d, "density": args.density,
            "centers": args.centers, "repeats": args.repeats, "penalty": 1e-4, "tol": 1e-8}
    title = (f"sparse vs densified input: n={args.n}, d={args.d}, density={args.density}, M={args.centers}, "
             f"medians of {args.repeats} fits, each in a fresh process")
    print_table(rows, COLUMNS, title)
    write_results(rows, args.out, "sparse_input" + ("_quick" if args.quick else ""), meta)
    print(json.dumps(meta["machine"]))


if __name__ == "__main__":
    main()
