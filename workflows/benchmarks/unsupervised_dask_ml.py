"""Own Lloyd or dask-ml's KMeans? Both on the same Nystrom embedding of the same data.

dask-ml is not a dependency of daskkrr: install it beside this script only to
measure (``pip install --target /tmp/daskml --no-deps dask-ml multipledispatch
pyarrow`` and ``PYTHONPATH=/tmp/daskml``; dask-ml imports ``dask.dataframe``,
which needs pyarrow). Data: 4 Gaussian blobs, n x 20 (default n = 200 000) as a
dask array of 8 blocks, threaded scheduler. Rows:

- daskkrr's ``NystromKernelKMeans`` (the whole fit: statistics, centers,
  k-means||, Lloyd on the kernel rows, ``strategy="recompute"``);
- dask-ml's ``KMeans`` (k-means||) on the embedding ``k(X, Z) K_MM^{+1/2}`` of the
  same centers, lazily recomputed by each of its passes;
- the same on the embedding persisted in memory (n x M floats; the time to compute
  it is reported apart).

    PYTHONPATH=/tmp/daskml python workflows/benchmarks/unsupervised_dask_ml.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_tools import REPO, PeakMemory, machine, print_table, write_results  # noqa: E402

sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 50 000")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--centers", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import dask
    import dask.array as da
    from sklearn.metrics import adjusted_rand_score

    from daskkrr import NystromKernelKMeans
    from daskkrr.solvers.nystrom_embedding import embed_block

    n, d, k = args.n or (50_000 if args.quick else 200_000), 20, 4
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(n // k, d)) + 3 * c for c in range(k)])
    Xd = da.from_array(X, chunks=(-(-X.shape[0] // 8), -1))
    rows = []
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        ours = NystromKernelKMeans(n_clusters=k, n_centers=args.centers, random_state=0, strategy="recompute").fit(Xd)
        ours_labels = ours.labels_.compute()
    rows.append({"method": "daskkrr NystromKernelKMeans (own Lloyd)", "seconds": time.perf_counter() - t0,
                 "iterations": ours.n_iter_, "peak_mb": round(mem.total_mb, 1), "ari_vs_daskkrr": 1.0})
    Xs = ours.scaler_.transform(Xd)
    E = Xs.map_blocks(embed_block, ours.kernel_, ours.centers_, ours.basis_,
                      chunks=(Xs.chunks[0], (ours.basis_.shape[1],)), dtype=float)
    try:
        import dask_ml
        from dask_ml.cluster import KMeans
    except ImportError as exc:
        rows.append({"method": "dask-ml KMeans", "error": f"{type(exc).__name__}: {exc}"})
    else:
        with PeakMemory() as mem, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            km = KMeans(n_clusters=k, init="k-means||", random_state=0, max_iter=100, tol=1e-4).fit(E)
            secs = time.perf_counter() - t0
        rows.append({"method": f"dask-ml {dask_ml.__version__} KMeans, embedding recomputed", "seconds": secs,
                     "iterations": int(km.n_iter_), "peak_mb": round(mem.total_mb, 1),
                     "ari_vs_daskkrr": adjusted_rand_score(ours_labels, np.asarray(km.labels_))})
        with PeakMemory() as mem, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            Ep = E.persist()
            t_persist = time.perf_counter() - t0
            t0 = time.perf_counter()
            km = KMeans(n_clusters=k, init="k-means||", random_state=0, max_iter=100, tol=1e-4).fit(Ep)
            secs = time.perf_counter() - t0
        rows.append({"method": f"dask-ml {dask_ml.__version__} KMeans, embedding in memory", "seconds": secs,
                     "persist_seconds": t_persist, "iterations": int(km.n_iter_), "peak_mb": round(mem.total_mb, 1),
                     "ari_vs_daskkrr": adjusted_rand_score(ours_labels, np.asarray(km.labels_))})
    print_table(rows, ["method", "seconds", "persist_seconds", "iterations", "peak_mb", "ari_vs_daskkrr", "error"],
                title=f"k-means on the Nystrom embedding: n={n}, d={d}, k={k}, M={args.centers}, "
                      f"dask {dask.__version__}")
    write_results(rows, args.out, "unsupervised_dask_ml", {"machine": machine(), "n": n, "centers": args.centers,
                                                           "dask": dask.__version__})


if __name__ == "__main__":
    main()
