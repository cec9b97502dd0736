"""The nightly online example's fit on a local cluster: its time and the sizes of its task graphs.

Issue 37, item 3: ``workflows/examples/nightly_online.toml`` (``OnlineKernelRidge`` with
``penalty=1``, ``c=4``, ``batch_size=10000`` on a store of 50 000 x 8 rows) shipped graphs
of 155, 322, 497 and 667 MiB, one per batch: the dictionary and its two Cholesky factors
(``m x m``, growing with the stream) were arguments of every block task. They are now
scattered to the workers once per batch (:meth:`daskkrr.models.online._Source.batch`).

This script writes such a store (``daskkrr generate``'s data and chunks), fits
``OnlineKernelRidge`` on it on daskkrr's default local cluster (one single-threaded
worker process per core), and prints the fit's time, the dictionary's
size and every graph distributed reported over ``--threshold`` ("Sending large graph"
warnings, caught here with the threshold lowered). Run
``python workflows/benchmarks/online_cluster_graphs.py --n 50000``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import warnings
from pathlib import Path

PARAMS = dict(kernel="gaussian", penalty=1.0, c=4.0, batch_size=10_000, random_state=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--chunk-rows", type=int, default=None,
                        help="rows per store chunk (default: about 64 MiB, as daskkrr generate)")
    parser.add_argument("--batch-size", type=int, default=PARAMS["batch_size"])
    parser.add_argument("--threshold", default="1MB", help="report graphs larger than this")
    args = parser.parse_args()

    import dask
    from distributed import Client, LocalCluster

    from daskkrr import OnlineKernelRidge
    from daskkrr.data import write_regression_zarr
    from daskkrr.parallel.client import local_cluster_kwargs

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "growing.zarr"
        write_regression_zarr(store, args.n, args.d, chunk_rows=args.chunk_rows, random_state=0)
        with LocalCluster(**local_cluster_kwargs()) as cluster, Client(cluster) as client:
            client.run(lambda: __import__("daskkrr.models"))  # workers' imports, not the fit's time
            with dask.config.set({"distributed.admin.large-graph-warning-threshold": args.threshold}), \
                    warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t0 = time.perf_counter()
                model = OnlineKernelRidge(**{**PARAMS, "batch_size": args.batch_size}).fit(store)
                seconds = time.perf_counter() - t0
            workers = len(client.scheduler_info()["workers"])
    sizes = [m.group(1) for w in caught if (m := re.search(r"large graph of size ([\d.]+ \w+)", str(w.message)))]
    print(f"OnlineKernelRidge({PARAMS}, batch_size={args.batch_size}) on {args.n} x {args.d} rows, {workers} workers")
    print(f"  fit: {seconds:.1f} s, {model.n_landmarks_} landmarks")
    print(f"  graphs over {args.threshold}: {len(sizes)} ({', '.join(sizes) or 'none'})")


if __name__ == "__main__":
    main()
