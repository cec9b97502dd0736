"""daskkrr FALKON vs scikit-learn Nystroem + Ridge (same centers) and KernelRidge.

Data:

- synthetic: ``daskkrr.data.make_regression`` (d = 20, float32, a smooth target of
  five features plus noise 0.1), n = 1e4, 1e5, 1e6 training rows and 20 000 test
  rows, written once to Zarr stores under ``--data-dir``;
- three real sets from ``../shared/data`` (537_houses, 564_fried,
  1201_BNG_breastTumor; TSV gzip with a ``target`` column), split 80/20 with a
  fixed seed; skipped with a message when the folder is absent.

Methods, all with a Gaussian kernel of the same sigma (``sqrt(d)`` on
standardised features, daskkrr's default) and the same ridge penalty
(``penalty = 1e-6`` in daskkrr's normalisation, ``alpha = penalty * n`` in
scikit-learn's):

- ``daskkrr``: ``FalkonRegressor(n_centers=M, dtype="float32", max_iter=50, tol=1e-3)``
  with its defaults otherwise (an unpenalised intercept, as ``Ridge`` fits; the
  row-sketch preconditioner of ``4-16 M`` sampled rows), CG run until the
  preconditioned residual is below 1e-3 so that the test error is that of the
  Nystrom solution scikit-learn computes exactly; fitted from the Zarr store
  with the strategy the cost model picks (``strategy`` column), on Dask's
  threaded scheduler (the Python API's default, one process; ``--scheduler
  cluster`` for a ``LocalCluster`` of 2 single-threaded worker processes);
- ``daskkrr-recompute``: the same with ``strategy="recompute"`` (kernel blocks
  recomputed every iteration, nothing of size n x M kept: the out-of-core mode);
- ``daskkrr-falkon-pc``: the same with FALKON's own preconditioner
  (``preconditioner_rows=None``), to show what the sketch saves;
- ``sklearn-nystroem``: ``StandardScaler -> Nystroem(n_components=M) -> Ridge``
  on the same rows loaded into memory (float32, as stored), with Nystroem given
  the very center rows daskkrr picks (uniform, ``random_state=0``), so that both
  solve the same problem and the error ratio measures the solver, not the luck
  of the draw; the speed and memory ratios are taken against this row;
- ``sklearn-nystroem-own``: the same with Nystroem drawing its own centers, to
  show how much the test error moves with the draw of ``M`` centers;
- ``sklearn-krr``: ``KernelRidge`` where n <= ``--krr-max``.

Each method runs in a fresh process; the peak memory is the sum of the peak RSS
of every process of its tree (client, scheduler, nannies, workers), sampled
every 50 ms. Test error is the RMSE on the held-out rows, also relative to the
standard deviation of the test targets.

Run ``python workflows/benchmarks/fit_vs_sklearn.py --quick`` (n = 1e4, 1e5 and
the real sets); the full run adds n = 1e6.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import SHARED_DATA, emit, machine, print_table, run_child, write_results  # noqa: E402

REAL_SETS = ("537_houses.tsv.gz", "564_fried.tsv.gz", "1201_BNG_breastTumor.tsv.gz")
N_TEST = 20_000
PENALTY = 1e-6
D = 20


# --------------------------------------------------------------------------- data (parent)
def synthetic_store(data_dir: Path, n: int) -> Path:
    """Zarr store with n + N_TEST rows (train first); reused when present."""
    from daskkrr.data.synthetic import write_regression_zarr

    path = data_dir / f"synthetic_n{n}_d{D}.zarr"
    if not path.exists():
        t = time.perf_counter()
        rows = min(250_000, n + N_TEST)
        write_regression_zarr(path, n + N_TEST, D, chunk_rows=rows, dtype="float32", random_state=0)
        print(f"wrote {path} in {time.perf_counter() - t:.1f}s", flush=True)
    return path


def real_store(data_dir: Path, name: str) -> tuple[Path, int] | None:
    """Zarr store of a shared TSV set, rows permuted (train = first 80%); None when absent."""
    src = SHARED_DATA / name
    if not src.is_file():
        print(f"skipping {name}: {src} is absent (the shared data sets live beside the checkout)", flush=True)
        return None
    import pandas as pd

    from daskkrr.data import write_zarr

    path = data_dir / (name.split(".")[0] + ".zarr")
    df = pd.read_csv(src, sep="\t")
    n_train = int(0.8 * len(df))
    if not path.exists():
        X = df.drop(columns="target").to_numpy(np.float32)
        y = df["target"].to_numpy(np.float64)
        perm = np.random.default_rng(0).permutation(len(df))
        write_zarr(X[perm], y[perm], path, chunk_rows=max(n_train // 4, 1))
    return path, n_train


# --------------------------------------------------------------------------- children
def _load(path: str, n_train: int):
    import zarr

    g = zarr.open_group(path, mode="r")
    return g["X"], g["y"], n_train


def child_daskkrr(args) -> dict:
    import dask.array as da

    from daskkrr import FalkonRegressor
    from daskkrr.parallel.client import local_cluster_kwargs

    Xz, yz, n = _load(args.store, args.n_train)
    X = da.from_zarr(Xz)
    y = da.from_zarr(yz)

    def run():  # on Dask's current client, if any
        model = FalkonRegressor(n_centers=args.centers, penalty=PENALTY, dtype="float32", max_iter=args.max_iter,
                                tol=args.tol, random_state=0, strategy=args.strategy,
                                preconditioner_rows=None if args.child == "daskkrr-falkon-pc" else "auto")
        t = time.perf_counter()
        model.fit(X[:n], y[:n])
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        pred = np.asarray(model.predict(X[n:]).compute())
        predict_s = time.perf_counter() - t
        return model, fit_s, predict_s, pred

    if args.scheduler == "cluster":
        from distributed import Client, LocalCluster

        with LocalCluster(**local_cluster_kwargs()) as cluster, Client(cluster) as client:
            with client.as_current():
                model, fit_s, predict_s, pred = run()
    else:
        model, fit_s, predict_s, pred = run()
    yt = np.asarray(yz[n:])
    return dict(fit_s=fit_s, predict_s=predict_s, rmse=_rmse(pred, yt), rel_rmse=_rmse(pred, yt) / yt.std(),
                strategy=model.strategy_, n_iter=model.n_iter_, passes=model.n_data_passes_,
                sketch_rows=model.preconditioner_rows_)


def child_sklearn_nystroem(args) -> dict:
    """StandardScaler -> Nystroem -> Ridge, timed step by step.

    ``--centers-from daskkrr`` gives Nystroem the rows daskkrr's uniform sampler
    picks with ``random_state=0`` (fitting Nystroem on exactly ``M`` rows uses all
    of them), so both solve the same problem; ``own`` lets Nystroem draw its own.
    """
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    Xz, yz, n = _load(args.store, args.n_train)
    X = np.asarray(Xz[:])
    y = np.asarray(yz[:])
    d = X.shape[1]
    gamma = 1.0 / (2.0 * d)  # sigma = sqrt(d)
    t = time.perf_counter()
    scaler = StandardScaler().fit(X[:n])
    features = Nystroem(kernel="rbf", gamma=gamma, n_components=args.centers, random_state=0)
    if args.centers_from == "daskkrr":
        idx = np.sort(np.random.default_rng(0).choice(n, size=args.centers, replace=False))
        features.fit(scaler.transform(X[idx]))
    else:
        features.fit(scaler.transform(X[:n]))
    ridge = Ridge(alpha=PENALTY * n).fit(features.transform(scaler.transform(X[:n])), y[:n])
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    pred = ridge.predict(features.transform(scaler.transform(X[n:])))
    predict_s = time.perf_counter() - t
    yt = y[n:]
    return dict(fit_s=fit_s, predict_s=predict_s, rmse=_rmse(pred, yt), rel_rmse=_rmse(pred, yt) / yt.std())


def child_sklearn_krr(args) -> dict:
    import contextlib

    from sklearn.kernel_ridge import KernelRidge
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    Xz, yz, n = _load(args.store, args.n_train)
    X = np.asarray(Xz[:], dtype=np.float64)
    y = np.asarray(yz[:], dtype=np.float64)
    scaler = StandardScaler().fit(X[:n])
    ym = y[:n].mean()
    d = X.shape[1]
    model = KernelRidge(alpha=PENALTY * n, kernel="rbf", gamma=1.0 / (2.0 * d))
    # scipy's bundled OpenBLAS segfaults in a multithreaded Cholesky of size >= 16 000 on the
    # development machine (see DESIGN.md): factor single-threaded there.
    limit = threadpool_limits(1, user_api="blas") if n >= 16_000 else contextlib.nullcontext()
    t = time.perf_counter()
    with limit:
        model.fit(scaler.transform(X[:n]), y[:n] - ym)
    fit_s = time.perf_counter() - t
    t = time.perf_counter()
    pred = model.predict(scaler.transform(X[n:])) + ym
    predict_s = time.perf_counter() - t
    yt = y[n:]
    return dict(fit_s=fit_s, predict_s=predict_s, rmse=_rmse(pred, yt), rel_rmse=_rmse(pred, yt) / yt.std())


def _rmse(pred, y) -> float:
    return float(np.sqrt(np.mean((np.asarray(pred).reshape(-1) - np.asarray(y).reshape(-1)) ** 2)))


CHILDREN = {"daskkrr": child_daskkrr, "daskkrr-recompute": child_daskkrr, "daskkrr-falkon-pc": child_daskkrr,
            "sklearn-nystroem": child_sklearn_nystroem, "sklearn-nystroem-own": child_sklearn_nystroem,
            "sklearn-krr": child_sklearn_krr}


# --------------------------------------------------------------------------- parent
def run_case(data: str, store: Path, n_train: int, centers: int, args) -> list[dict]:
    rows = []
    methods = ["daskkrr", "daskkrr-recompute", "daskkrr-falkon-pc", "sklearn-nystroem", "sklearn-nystroem-own"]
    methods += ["sklearn-krr"] if n_train <= args.krr_max else []
    for method in methods:
        strategy = "recompute" if method == "daskkrr-recompute" else args.strategy
        argv = [__file__, "--child", method, "--store", str(store), "--n-train", str(n_train),
                "--centers", str(centers), "--scheduler", args.scheduler, "--max-iter", str(args.max_iter),
                "--tol", str(args.tol), "--strategy", strategy,
                "--centers-from", "own" if method == "sklearn-nystroem-own" else "daskkrr"]
        res = run_child(argv, timeout=args.timeout)
        row = {"data": data, "n": n_train, "M": centers if method != "sklearn-krr" else n_train,
               "method": method, **res}
        if "error" in row:
            print(f"{data} {method}: failed: {row['error'][-400:]}", flush=True)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "peak_per_process_mb"}, default=float), flush=True)
    sk = {r["method"]: r for r in rows}.get("sklearn-nystroem", {})
    for r in rows:
        if r["method"].startswith("daskkrr") and "fit_s" in r and "fit_s" in sk:
            r["fit_speedup_vs_nystroem"] = sk["fit_s"] / r["fit_s"]
            r["memory_ratio_vs_nystroem"] = r["peak_mb"] / sk["peak_mb"]
            r["rmse_ratio_vs_nystroem"] = r["rmse"] / sk["rmse"]
    return rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 1e4, 1e5 and the real sets")
    ap.add_argument("--sizes", default=None, help="comma list of synthetic training sizes")
    ap.add_argument("--centers", default=None,
                    help="comma list n:M (default 10000:1000,100000:2000,1000000:1000; the real sets use 2000)")
    ap.add_argument("--real", default=",".join(REAL_SETS), help="comma list of shared data files ('' for none)")
    ap.add_argument("--scheduler", choices=("cluster", "threads"), default="threads")
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--max-iter", type=int, default=50)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--krr-max", type=int, default=20_000, help="largest n for KernelRidge")
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    # child mode
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--n-train", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--centers-from", choices=("daskkrr", "own"), default="daskkrr", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.centers = int(args.centers)
        emit(CHILDREN[args.child](args))
        return []

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(float(s)) for s in (args.sizes or ("1e4,1e5" if args.quick else "1e4,1e5,1e6")).split(",")]
    centers = {10_000: 1000, 100_000: 2000, 1_000_000: 1000}
    if args.centers:
        centers.update({int(float(a)): int(b) for a, b in (p.split(":") for p in args.centers.split(","))})
    rows: list[dict] = []
    for n in sizes:
        rows += run_case("synthetic", synthetic_store(data_dir, n), n, centers.get(n, 2000), args)
    for name in [s for s in args.real.split(",") if s]:
        found = real_store(data_dir, name)
        if found:
            store, n_train = found
            rows += run_case(name.split(".")[0], store, n_train, min(2000, n_train), args)
    info = machine()
    title = (f"daskkrr FALKON vs scikit-learn, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB; "
             f"daskkrr on {args.scheduler}")
    print_table(rows, ["data", "n", "M", "method", "fit_s", "predict_s", "rmse", "rel_rmse", "peak_mb",
                       "n_processes", "fit_speedup_vs_nystroem", "memory_ratio_vs_nystroem",
                       "rmse_ratio_vs_nystroem", "strategy", "n_iter", "sketch_rows"], title)
    write_results(rows, args.out, "fit_vs_sklearn", {"machine": info, "args": vars(args)})
    return rows


if __name__ == "__main__":
    main()
