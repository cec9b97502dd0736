"""Kernel entries per second of the block engine: fused vs the numpy reference vs GEMM.

For ``d`` in {5, 20, 100} and float32/float64, one row block ``X_b`` (n_b x d) and
``M`` Gaussian-kernel centers, it times FALKON's per-block product
``k(X_b, Z)^T (k(X_b, Z) u)`` and predict's ``k(X_b, Z) alpha``:

- ``numpy``: the reference loop (:mod:`daskkrr.kernels.reference`, BLAS with its
  default threads), what daskkrr ran before the fused engine;
- ``fused``: :mod:`daskkrr.kernels.fused` on every core;
- ``blas``: :mod:`daskkrr.kernels.blas` on every core (what runs while the fused
  engine compiles after an install);
- ``gemm``: the machine's matrix-multiply rate, measured here (an ``(n_b, d) x
  (d, M)`` product, the distance part of a kernel block, and a square product),
  converted to kernel entries per second as GFLOP/s / (2 d): the rate at which the
  cross products alone could be formed, a ceiling for any kernel loop built on them.

Rates are in millions of kernel entries per second (wall clock, best of the
repetitions). Single-thread rates (CPU time) are measured too: on a shared,
loaded machine they are the stable comparison. Ratios are within one run.

Run ``python workflows/benchmarks/engine_throughput.py --quick``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import machine, print_table, write_results  # noqa: E402

from daskkrr.kernels import BlasEngine, FusedEngine, GaussianKernel, reference  # noqa: E402
from daskkrr.utils.threads import available_cores, blas_threads  # noqa: E402


def _best(fn, repeat: int, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return max(best, 1e-9)


def measure(d: int, dtype: type, n_rows: int, n_centers: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, d)).astype(dtype)
    Z = rng.normal(size=(n_centers, d)).astype(dtype)
    u = rng.normal(size=n_centers)
    k = GaussianKernel(sigma=float(np.sqrt(d)))
    E = n_rows * n_centers / 1e6
    cores = available_cores()
    fused = FusedEngine()
    fused.gram_matvec(k, X[:64], Z, u)  # load the compiled code
    row: dict = {"d": d, "dtype": np.dtype(dtype).name, "n_rows": n_rows, "M": n_centers}

    # All cores, wall clock.
    t_np = _best(lambda: reference.knm_gram_matvec(k, X, Z, u), repeat)
    t_fu = _best(lambda: fused.gram_matvec(k, X, Z, u, n_threads=cores), repeat)
    t_pr = _best(lambda: fused.matvec(k, X, Z, u, n_threads=cores), repeat)
    blas = BlasEngine()
    t_bl = _best(lambda: blas.gram_matvec(k, X, Z, u, n_threads=cores), repeat)
    ZT = np.ascontiguousarray(Z.T)
    t_gemm = _best(lambda: X @ ZT, repeat)
    S = rng.normal(size=(2048, 2048)).astype(dtype)
    t_sq = _best(lambda: S @ S, repeat)
    gemm_gflops = 2.0 * 2048**3 / t_sq / 1e9
    row.update(
        numpy_Mps=E / t_np,
        fused_Mps=E / t_fu,
        fused_predict_Mps=E / t_pr,
        blas_Mps=E / t_bl,
        gemm_block_Mps=E / t_gemm,
        gemm_gflops=gemm_gflops,
        gemm_Mps=gemm_gflops * 1e3 / (2 * d),
        speedup=t_np / t_fu,
        fused_vs_gemm=(E / t_fu) / (gemm_gflops * 1e3 / (2 * d)),
    )
    # One thread each, CPU time (stable on a loaded machine).
    with blas_threads(1):
        c_np = _best(lambda: reference.knm_gram_matvec(k, X, Z, u), repeat, time.thread_time)
        c_fu = _best(lambda: fused.gram_matvec(k, X, Z, u, n_threads=1), repeat,
                     time.thread_time)
        c_bl = _best(lambda: blas.gram_matvec(k, X, Z, u, n_threads=1), repeat, time.thread_time)
        c_sq = _best(lambda: S @ S, repeat, time.thread_time)
    row.update(numpy_1t_Mps=E / c_np, fused_1t_Mps=E / c_fu, speedup_1t=c_np / c_fu, blas_1t_Mps=E / c_bl,
               gemm_1t_Mps=2.0 * 2048**3 / c_sq / 1e9 * 1e3 / (2 * d))
    return row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller blocks, fewer repetitions (under a minute)")
    ap.add_argument("--dims", default="5,20,100")
    ap.add_argument("--centers", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=None, help="rows per block (default 50 000; 10 000 with --quick)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--out", default=None, help="directory for engine_throughput.json/.csv (default results/)")
    args = ap.parse_args(argv)
    rows = args.rows or (10_000 if args.quick else 50_000)
    repeat = args.repeat or (3 if args.quick else 5)
    out = []
    for dtype in (np.float32, np.float64):
        for d in (int(x) for x in args.dims.split(",")):
            out.append(measure(d, dtype, rows, args.centers, repeat))
    info = machine()
    title = (f"Kernel entries per second (millions), Gaussian kernel, M = {args.centers}, {rows} rows per block; "
             f"{info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, load {info['load_average_1min']}")
    print_table(out, ["dtype", "d", "numpy_Mps", "fused_Mps", "fused_predict_Mps", "blas_Mps", "gemm_Mps", "speedup",
                      "fused_vs_gemm", "numpy_1t_Mps", "fused_1t_Mps", "blas_1t_Mps", "speedup_1t"], title)
    write_results(out, args.out, "engine_throughput", {"machine": info, "args": vars(args)})
    return out


if __name__ == "__main__":
    main()
