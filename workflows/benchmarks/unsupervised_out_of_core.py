"""Out of core: Nystrom kernel PCA and kernel k-means of an n x 20 Zarr store, n = 1e6 and 1e7.

The store is generated chunk by chunk (8 Gaussian blobs in 20 dimensions, float32,
100 000 rows per chunk), never held whole. Each fit runs in a fresh process on a
local cluster of two single-threaded worker processes (4 GiB limit each), reading
the store; the table has its wall time and the peak memory of all processes
(client, scheduler, workers, nannies: the sum of each one's peak RSS). k-means runs
with ``strategy="recompute"``: the kernel rows are never kept, so the memory should
not grow with n (target: the peak at 1e7 within 1.5x of the peak at 1e6).

    python workflows/benchmarks/unsupervised_out_of_core.py [--quick]   # quick: 1e5 and 1e6
    python workflows/benchmarks/unsupervised_out_of_core.py --sizes 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_tools import REPO, emit, machine, print_table, run_child, write_results  # noqa: E402

sys.path.insert(0, str(REPO))

D = 20
CLUSTERS = 8
CHUNK_ROWS = 100_000


def _blob_block(block_id: tuple[int, int], rows: int) -> Any:
    import numpy as np

    rng = np.random.default_rng([7, block_id[0]])
    centers = np.random.default_rng(0).normal(scale=3.0, size=(CLUSTERS, D))
    labels = rng.integers(CLUSTERS, size=rows)
    return (centers[labels] + rng.normal(size=(rows, D))).astype(np.float32)


def generate(path: Path, n: int) -> None:
    """Write the n x 20 store block by block (one delayed block per chunk), atomically."""
    import dask
    import dask.array as da
    import numpy as np

    from daskkrr import write_zarr

    sizes = [CHUNK_ROWS] * (n // CHUNK_ROWS) + ([n % CHUNK_ROWS] if n % CHUNK_ROWS else [])
    blocks = [da.from_delayed(dask.delayed(_blob_block)((i, 0), r), shape=(r, D), dtype=np.float32)
              for i, r in enumerate(sizes)]
    write_zarr(da.concatenate(blocks, axis=0), None, path, chunk_rows=CHUNK_ROWS)


def child(store: str, task: str, n_centers: int) -> None:
    from distributed import Client, LocalCluster

    from daskkrr import NystromKernelKMeans, NystromKernelPCA

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="4GiB", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster):
        t0 = time.perf_counter()
        if task == "kpca":
            model = NystromKernelPCA(n_components=10, n_centers=n_centers, random_state=0).fit(store)
            extra = {"explained_top10": float(model.explained_variance_ratio_.sum()), "passes": model.n_data_passes_}
        else:
            model = NystromKernelKMeans(n_clusters=CLUSTERS, n_centers=n_centers, max_iter=30, strategy="recompute",
                                        random_state=0).fit(store)
            extra = {"iterations": model.n_iter_, "passes": model.n_data_passes_,
                     "inertia_per_row": model.inertia_ / model.labels_.shape[0]}
        emit({"fit_s": round(time.perf_counter() - t0, 2), **extra})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e5 and 1e6")
    parser.add_argument("--sizes", type=int, nargs="*", default=None)
    parser.add_argument("--centers", type=int, default=100)
    parser.add_argument("--workdir", default=None, help="where the stores go (default: a temporary directory)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("STORE", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.centers)
        return
    sizes = args.sizes or ([100_000, 1_000_000] if args.quick else [1_000_000, 10_000_000])
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for n in sizes:
            store = Path(tmp) / f"blobs-{n}.zarr"
            t0 = time.perf_counter()
            generate(store, n)
            print(f"generated {store} ({n} x {D}) in {time.perf_counter() - t0:.1f}s", flush=True)
            for task in ("kpca", "kmeans"):
                res = run_child([str(Path(__file__).resolve()), "--centers", str(args.centers), "--child",
                                 str(store), task], timeout=3000)
                row = {"n": n, "task": task, "M": args.centers, **{k: v for k, v in res.items()
                                                                     if k != "peak_per_process_mb"}}
                rows.append(row)
                print(json.dumps(row), flush=True)
            import shutil

            shutil.rmtree(store)
    for task in ("kpca", "kmeans"):
        done = [r for r in rows if r["task"] == task and "peak_mb" in r and "error" not in r]
        if len(done) >= 2:
            done[-1]["peak_ratio_vs_smaller"] = round(done[-1]["peak_mb"] / done[-2]["peak_mb"], 3)
    print_table(rows, ["n", "task", "M", "fit_s", "wall_s", "peak_mb", "peak_ratio_vs_smaller", "n_processes",
                       "passes", "iterations", "error"],
                title=f"Out-of-core fits of an n x {D} Zarr store (2 worker processes, 4 GiB each)")
    write_results(rows, args.out, "unsupervised_out_of_core", {"machine": machine(), "quick": args.quick,
                                                               "sizes": sizes, "centers": args.centers})


if __name__ == "__main__":
    main()
