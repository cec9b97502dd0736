"""One SQUEAK pass over a Zarr store: time, dictionary size vs d_eff, peak memory per process.

The data (n rows, d = 10 features, standard normal) are generated chunk by chunk
with numpy into a Zarr store in a temporary directory, so the array never exists
whole in memory. Then one SqueakSampler pass reads the store block by block.

d_eff(gamma) of the full data is estimated from a uniform pilot sample of s rows:
``d_eff_n(gamma) ~ d_eff_s(gamma s / n)`` (the pilot's kernel spectrum scaled by n/s),
which is accurate while d_eff is well below s.

Peak memory is ``ru_maxrss`` of each process (the client, and every worker when a
LocalCluster is used); the resident size before the pass is printed for reference.

    python workflows/benchmarks/sampling_squeak_pass.py --quick          # n = 100 000
    python workflows/benchmarks/sampling_squeak_pass.py                  # n = 1 000 000
    python workflows/benchmarks/sampling_squeak_pass.py --workers 2      # on a LocalCluster
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import dask.array as da  # noqa: E402
import zarr  # noqa: E402

from daskkrr.kernels import make_kernel  # noqa: E402
from daskkrr.sampling import SqueakSampler  # noqa: E402


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def write_store(path: str, n: int, d: int, chunk: int, seed: int) -> None:
    z = zarr.create_array(path, shape=(n, d), chunks=(chunk, d), dtype="f8")
    for k, start in enumerate(range(0, n, chunk)):
        rows = min(chunk, n - start)
        z[start:start + rows] = np.random.default_rng([seed, k]).normal(size=(rows, d))


def pilot_d_eff(X: da.Array, kernel, gamma: float, s: int, seed: int) -> float:
    n = X.shape[0]
    idx = np.sort(np.random.default_rng(seed).choice(n, size=min(s, n), replace=False))
    P = X[idx].compute()
    ev = np.maximum(np.linalg.eigvalsh(kernel(P, P)), 0.0)
    return float(np.sum(ev / (ev + gamma * len(idx) / n)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 100 000 instead of 1 000 000")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--chunk", type=int, default=None, help="rows per Zarr chunk")
    ap.add_argument("--gamma", type=float, default=None,
                    help="regularisation in kernel-matrix units (default 1e-3 * n: d_eff ~ 110)")
    ap.add_argument("--qbar", type=int, default=16)
    ap.add_argument("--eps", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=0,
                    help="0: threaded scheduler in this process; k: LocalCluster with k processes")
    ap.add_argument("--pilot", type=int, default=4000, help="pilot rows for the d_eff estimate")
    args = ap.parse_args(argv)
    n = args.n or (100_000 if args.quick else 1_000_000)
    chunk = args.chunk or (10_000 if n <= 200_000 else 50_000)
    gamma = args.gamma if args.gamma is not None else 1e-3 * n
    kernel = make_kernel("gaussian", sigma=float(np.sqrt(args.d)))

    from threadpoolctl import threadpool_limits

    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(1):
        path = os.path.join(tmp, "x.zarr")
        t = time.perf_counter()
        write_store(path, n, args.d, chunk, seed=0)
        print(f"wrote {n} x {args.d} float64 ({n * args.d * 8 / 2**20:.0f} MiB) to Zarr in "
              f"{time.perf_counter() - t:.1f}s, chunks of {chunk} rows")
        X = da.from_zarr(path)
        sampler = SqueakSampler(gamma=gamma, qbar=args.qbar, eps=args.eps)
        client = cluster = None
        if args.workers:
            from distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                   dashboard_address=":0", host="127.0.0.1")
            client = Client(cluster)
        try:
            rss_before = current_rss_mb()
            t = time.perf_counter()
            D = sampler.select(X, kernel, n_centers=None, penalty=None, random_state=0, client=client)
            elapsed = time.perf_counter() - t
            workers_peak = (client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
                            if client is not None else {})
        finally:
            if client is not None:
                client.close()
                cluster.close()
        peak_pass = peak_rss_mb()  # before the pilot below, whose n_pilot^2 matrices would dominate
        d_eff = pilot_d_eff(X, kernel, gamma, args.pilot, seed=1)
        print(f"gamma = {gamma:g}; pilot ({args.pilot} rows) estimate of d_eff(gamma) = {d_eff:.1f}")
        info = D.info
        print(f"\nSQUEAK pass: {elapsed:.1f}s for {info['rows_seen']} rows "
              f"({info['rows_seen'] / elapsed:,.0f} rows/s), {info['batches']} batches, "
              f"{info['n_blocks']} blocks in {info['segments']} segment(s)")
        print(f"dictionary: {info['unique']} unique centers, {info['dictionary_size']} copies "
              f"(qbar={args.qbar}, eps={args.eps})")
        print(f"d_eff: pilot {d_eff:.1f}, SQUEAK's own estimate {info['d_eff_estimate']:.1f}; "
              f"copies / (qbar d_eff) = {info['dictionary_size'] / (args.qbar * d_eff):.2f} "
              f"(Thm. 1 bound: 3)")
        print("history (every ~10% of the rows): rows_seen, unique, copies, d_eff estimate")
        hist = info["history"]
        for h in hist[:: max(1, len(hist) // 10)] + ([hist[-1]] if len(hist) % 10 else []):
            print(f"  {h['rows_seen']:>9}  {h['unique']:>6}  {h['dictionary_size']:>7}  "
                  f"{h['d_eff_estimate']:>8.1f}")
        print(f"memory: client process RSS before the pass {rss_before:.0f} MiB, "
              f"peak during the pass {peak_pass:.0f} MiB")
        for addr, mb in workers_peak.items():
            print(f"        worker {addr}: peak {mb:.0f} MiB")


if __name__ == "__main__":
    main()
