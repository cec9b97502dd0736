"""The paper's Table 4 (and Table 2), in kind: PCG with random features vs Nystrom features vs plain CG.

Avron, Clarkson and Woodruff, "Faster kernel ridge regression using sketching and
preconditioning": exact KRR ``(K + lambda I) c = y`` by CG, preconditioned with
``Z Z^T + lambda_p I`` built from s random features. Table 4 compares the
iterations and time with plain CG, to the same tolerance (1e-3 for classification,
1e-5 for regression, the paper's); Table 2 compares ``lambda_p = 10 lambda`` with
``lambda_p = lambda``.

For each data set (``adult`` and Fashion-MNIST as regularised least-squares
classification: +-1 one-vs-all targets, ``537_houses`` and ``1203_BNG_pwLinear``
as regression; ``--n`` rows drawn at random, 80/20 split, standardised features,
Gaussian kernel with ``sigma = sqrt(d)``, ``penalty = --penalty``, i.e.
``lambda = penalty * n_train``) this fits ``ExactKernelRidge(solver="pcg")`` with

- ``rf``: random Fourier features, s = ``--s``, ``lambda_p = 10 lambda`` (the default);
- ``rf_lp1``: the same with ``lambda_p = lambda`` (Algorithm 1 as written);
- ``rf_auto``: s chosen by the adaptive doubling (Section 5, see
  :mod:`daskkrr.pipeline.exact_pcg`);
- ``rf_srht``: two levels (Algorithm 2): ``2 s`` random features, an SRHT down to s;
- ``nystrom``: s uniformly sampled Nystrom centers as the features;
- ``cg``: no preconditioner;

each in a fresh process (``--repeats`` times, medians), with ``max_iter = 1000``
(the paper's Table 4 limit). The table: iterations, whether ``tol`` was reached,
fit seconds, peak memory of all processes, test score (accuracy or R^2), and
``cg_ratio`` = plain CG's iterations / this row's.

``python workflows/benchmarks/exact_pcg_table4.py --quick`` (n = 2000) takes a few
minutes on two cores; the default n = 8000 takes longer (plain CG dominates).
Results go to ``results/exact_pcg_table4{,_quick}.{json,csv}``.
"""

from __future__ import annotations

import argparse
import gzip
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

DATASETS = {"adult": "classification", "537_houses": "regression", "1203_BNG_pwLinear": "regression",
            "fashion_mnist": "classification"}
METHODS = ("cg", "rf", "rf_lp1", "rf_auto", "rf_srht", "nystrom")
COLUMNS = ("dataset", "n_train", "d", "method", "s", "lambda_p/lambda", "tol", "n_iter", "converged", "cg_ratio",
           "fit_s", "peak_mb", "score")


def idx_file(path: Path) -> np.ndarray:
    """An IDX array (Fashion-MNIST's format)."""
    raw = gzip.open(path).read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * k: 8 + 4 * k], "big") for k in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist(train: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST images (flattened, scaled to [0, 1]) and labels."""
    part = "train" if train else "t10k"
    folder = SHARED_DATA / "fashion-mnist"
    X = idx_file(folder / f"{part}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float64) / 255.0
    y = idx_file(folder / f"{part}-labels-idx1-ubyte.gz").astype(np.int64)
    return X, y


def load(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``X_train, X_test, y_train, y_test`` of ``n`` rows drawn at random (80/20)."""
    if name == "fashion_mnist":
        X, y = fashion_mnist()
    else:
        import pandas as pd

        frame = pd.read_csv(SHARED_DATA / f"{name}.tsv.gz", sep="\t")
        X = frame.drop(columns="target").to_numpy(np.float64)
        y = frame["target"].to_numpy(np.float64)
    rows = np.random.default_rng(seed).permutation(len(y))[:n]
    cut = int(0.8 * len(rows))
    return X[rows[:cut]], X[rows[cut:]], y[rows[:cut]], y[rows[cut:]]


def rlsc_targets(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """+-1 one-vs-all codes (one column for two classes), as the paper's RLSC."""
    if len(classes) == 2:
        return np.where(y == classes[1], 1.0, -1.0)
    return np.where(y[:, None] == classes[None, :], 1.0, -1.0)


def method_params(method: str, s: int) -> dict[str, Any]:
    return {
        "cg": dict(preconditioner=None),
        "rf": dict(n_features=s),
        "rf_lp1": dict(n_features=s, preconditioner_penalty=1.0),
        "rf_auto": dict(n_features="auto"),
        "rf_srht": dict(n_features=2 * s, srht_features=s),
        "nystrom": dict(preconditioner="nystrom", n_features=s),
    }[method]


def child(spec: dict[str, Any]) -> None:
    """One fit (in its own process); prints the result line."""
    from sklearn.exceptions import ConvergenceWarning

    from daskkrr import ExactKernelRidge

    name, task = spec["dataset"], DATASETS[spec["dataset"]]
    Xtr, Xte, ytr, yte = load(name, spec["n"])
    tol = 1e-3 if task == "classification" else 1e-5
    classes = np.unique(ytr)
    target = rlsc_targets(ytr, classes) if task == "classification" else ytr
    params = dict(solver="pcg", penalty=spec["penalty"], tol=tol, max_iter=spec["max_iter"], random_state=0,
                  **method_params(spec["method"], spec["s"]))
    model = ExactKernelRidge(**params)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the table says it (converged)
        warnings.simplefilter("ignore", UserWarning)
        model.fit(Xtr, target)
    fit_s = time.perf_counter() - t0
    pred = model.predict(Xte)
    if task == "classification":
        labels = classes[(pred > 0).astype(int)] if len(classes) == 2 else classes[np.argmax(pred, axis=1)]
        score = float(np.mean(labels == yte))
    else:
        score = float(1 - np.sum((yte - pred) ** 2) / np.sum((yte - yte.mean()) ** 2))
    emit({"n_iter": int(model.n_iter_), "converged": bool(model.converged_), "fit_s": fit_s, "score": score,
          "s": int(model.n_features_), "tol": tol, "n_train": len(ytr), "d": Xtr.shape[1],
          "lambda_p/lambda": float(params.get("preconditioner_penalty", 10.0)) if spec["method"] != "cg" else None,
          "kernel_tiles": model.kernel_tiles_, "adaptive_trace": model.adaptive_trace_})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 2000 rows per data set, one repeat")
    parser.add_argument("--n", type=int, default=8000, help="rows drawn from each data set (80%% train)")
    parser.add_argument("--s", type=int, default=None, help="features (default: n_train / 4)")
    parser.add_argument("--penalty", type=float, default=1e-6, help="lambda / n_train")
    parser.add_argument("--max-iter", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS))
    parser.add_argument("--methods", nargs="*", default=list(METHODS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    n = 2000 if args.quick else args.n
    s = args.s or max(50, int(0.8 * n) // 4)
    rows: list[dict[str, Any]] = []
    for name in args.datasets:
        missing = (SHARED_DATA / "fashion-mnist") if name == "fashion_mnist" else SHARED_DATA / f"{name}.tsv.gz"
        if not missing.exists():
            print(f"skipping {name}: {missing} is absent", flush=True)
            continue
        cg_iters = None
        for method in args.methods:
            spec = {"dataset": name, "n": n, "method": method, "s": s, "penalty": args.penalty,
                    "max_iter": args.max_iter}
            runs = [run_child([__file__, "--child", json.dumps(spec)]) for _ in range(args.repeats)]
            if "error" in runs[0]:
                print(f"{name} {method} failed: {runs[0]['error']}", flush=True)
                continue
            row = dict(runs[0], dataset=name, method=method)
            for key in ("fit_s", "peak_mb"):
                row[key] = round(statistics.median(r[key] for r in runs), 2)
            if method == "cg":
                cg_iters = row["n_iter"]
            row["cg_ratio"] = round(cg_iters / max(1, row["n_iter"]), 2) if cg_iters else None
            rows.append(row)
            print(f"{name} {method}: {row['n_iter']} iterations, {row['fit_s']} s, score {row['score']:.4f}",
                  flush=True)
    print_table(rows, COLUMNS, title=f"exact KRR by PCG, n = {n} rows per set (80% train)")
    write_results(rows, args.out, "exact_pcg_table4" + ("_quick" if args.quick else ""),
                  {"machine": machine(), "n": n, "s": s, "penalty": args.penalty, "max_iter": args.max_iter,
                   "repeats": args.repeats})


if __name__ == "__main__":
    main()
