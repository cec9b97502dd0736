"""Test error vs number of Nystrom centers for uniform, SQUEAK, DISQUEAK, exact-RLS and BLESS centers.

Data sets:

(a) ``coherent``: a high-coherence synthetic set. Most rows lie in a Gaussian bulk
    with a smooth target; a few small, rare clusters (0.5% of the rows each) carry
    large bumps of the target. Uniform centers miss a rare cluster unless M is of
    order n / cluster size; leverage-score centers find them with few centers.
(b) real sets from ``../shared/data`` (tab-separated gzip, last column ``target``):
    537_houses and 564_fried by default. Skipped with a message when absent.

Every model is the same Nystrom kernel ridge regression (standardised features,
centred target, Gaussian kernel, penalty lambda), solved directly and stably by
eigen-thresholding K_MM, so only the centers change between rows of the table: the
error measures the quality of the centers, not the convergence of a solver (the
FALKON/CG side is covered by tests/test_sampling_falkon.py). The error is the test
MSE divided by the test-target variance (1 - R^2).
Exact KRR (and exact-RLS centers) are run where n allows. The summary line gives, for
each sampler, the fewest centers reaching within 1% of exact KRR's test error.

Run ``python workflows/benchmarks/sampling_centers.py --quick`` for small sizes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import dask.array as da  # noqa: E402
from scipy.linalg import cho_factor, cho_solve  # noqa: E402

from daskkrr.kernels import make_kernel  # noqa: E402
from daskkrr.sampling import (  # noqa: E402
    BlessSampler,
    DisqueakSampler,
    ExactRLSSampler,
    SqueakSampler,
    UniformSampler,
)

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REAL_SETS = ("537_houses.tsv.gz", "564_fried.tsv.gz")


def coherent_data(n: int, seed: int, n_clusters: int = 6, share: float = 0.005):
    """Bulk N(0, I_2) with target sin(x1) + 0.5 cos(x2); rare clusters with bumps of height +-3."""
    rng = np.random.default_rng(seed)
    angles = np.linspace(0, 2 * np.pi, n_clusters, endpoint=False)
    centres = 4.5 * np.c_[np.cos(angles), np.sin(angles)]
    heights = 3.0 * np.where(np.arange(n_clusters) % 2 == 0, 1.0, -1.0)

    def target(X):
        f = np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1])
        for c, h in zip(centres, heights):
            f += h * np.exp(-np.sum((X - c) ** 2, axis=1) / (2 * 0.3**2))
        return f

    def draw(m):
        k = int(round(share * m))
        bulk = rng.normal(size=(m - n_clusters * k, 2))
        rare = [c + 0.15 * rng.normal(size=(k, 2)) for c in centres]
        X = np.concatenate([bulk] + rare)
        X = X[rng.permutation(len(X))]
        return X, target(X) + 0.1 * rng.normal(size=len(X))

    Xtr, ytr = draw(n)
    Xte, yte = draw(max(2000, n // 2))
    return Xtr, ytr, Xte, yte


def real_data(name: str, n_max: int | None, seed: int):
    import pandas as pd

    path = SHARED_DATA / name
    if not path.is_file():
        print(f"[skip] {name}: {path} is absent (the shared data sets live beside the checkout)")
        return None
    df = pd.read_csv(path, sep="\t")
    X = df.drop(columns="target").to_numpy(float)
    y = df["target"].to_numpy(float)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    n_test = min(len(y) // 5, 5000)
    test, train = perm[:n_test], perm[n_test:]
    if n_max is not None:
        train = train[:n_max]
    return X[train], y[train], X[test], y[test]


class Standardised:
    """Features scaled with training statistics; target centred."""

    def __init__(self, Xtr, ytr):
        self.mu, self.sd = Xtr.mean(0), Xtr.std(0)
        self.sd[self.sd == 0] = 1.0
        self.ymu = ytr.mean()

    def x(self, X):
        return (X - self.mu) / self.sd


def nystrom_fit_predict(kernel, Xs, y, Z, penalty, Xtest, block=4096):
    """Nystrom KRR ``min (1/n)||y - K_nM a||^2 + lambda a^T K_MM a``, eigen-thresholded.

    With ``K_MM = U S U^T`` (eigenvalues below 1e-10 * max dropped), features
    ``Phi = K_nM U S^{-1/2}`` turn it into a ridge regression of dimension r <= M.
    """
    n = len(y)
    s, U = np.linalg.eigh(kernel(Z, Z))
    keep = s > 1e-10 * s.max()
    W = U[:, keep] / np.sqrt(s[keep])
    r = W.shape[1]
    G = np.zeros((r, r))
    b = np.zeros(r)
    for i in range(0, n, block):
        F = kernel(Xs[i:i + block], Z) @ W
        G += F.T @ F
        b += F.T @ y[i:i + block]
    G[np.diag_indices(r)] += penalty * n
    beta = cho_solve(cho_factor(G), b)
    return np.concatenate([kernel(Xtest[i:i + block], Z) @ (W @ beta) for i in range(0, len(Xtest), block)])


def exact_krr_predict(kernel, Xs, y, penalty, Xtest):
    K = kernel(Xs, Xs)
    K[np.diag_indices_from(K)] += penalty * len(y)
    alpha = cho_solve(cho_factor(K), y)
    return kernel(Xtest, Xs) @ alpha


def rel_mse(pred, y) -> float:
    return float(np.mean((pred - y) ** 2) / np.var(y))


def samplers(n: int, rls_max: int, n_leaves: int):
    out = {
        "uniform": UniformSampler(),
        "squeak": SqueakSampler(),
        "disqueak": DisqueakSampler(n_leaves=n_leaves),
        "bless": BlessSampler(),
    }
    if n <= rls_max:
        out["exact-rls"] = ExactRLSSampler()
    else:
        print(f"[skip] exact-RLS centers: n={n} > {rls_max} (one n x n eigendecomposition per draw)")
    return out


def run_set(name, data, *, centers, seeds, sigma, penalty, exact_max, rls_max, n_leaves, chunks):
    Xtr, ytr, Xte, yte = data
    n, d = Xtr.shape
    sigma = float(np.sqrt(d)) if sigma is None else sigma
    kernel = make_kernel("gaussian", sigma=sigma)
    st = Standardised(Xtr, ytr)
    Xs, Xts, yc = st.x(Xtr), st.x(Xte), ytr - st.ymu
    Xd = da.from_array(Xs, chunks=(chunks, d))
    print(f"\n=== {name}: n_train={n}, n_test={len(yte)}, d={d}, gaussian sigma={sigma:.3g} "
          f"(standardised features), penalty={penalty:g} ===")
    exact_err = None
    if n <= exact_max:
        t = time.perf_counter()
        exact_err = rel_mse(exact_krr_predict(kernel, Xs, yc, penalty, Xts) + st.ymu, yte)
        print(f"exact KRR: rel. test MSE {exact_err:.5f} ({time.perf_counter() - t:.1f}s)")
    results: dict[str, list[tuple[int, float]]] = {}
    print(f"{'sampler':<10} {'M asked':>7} {'M':>6} {'rel MSE':>9} {'sd':>8} {'select s':>8}  gamma")
    for label, sampler in samplers(n, rls_max, n_leaves).items():
        for m in centers:
            if m > n:
                continue
            errs, sizes, secs, gammas = [], [], [], []
            for seed in seeds:
                t = time.perf_counter()
                D = sampler.select(Xd, kernel, n_centers=m, penalty=penalty, random_state=seed)
                secs.append(time.perf_counter() - t)
                pred = nystrom_fit_predict(kernel, Xs, yc, D.centers, penalty, Xts) + st.ymu
                errs.append(rel_mse(pred, yte))
                sizes.append(D.size)
                gammas.append(D.info.get("gamma", np.nan))
            err = float(np.mean(errs))
            results.setdefault(label, []).append((int(round(np.mean(sizes))), err))
            g = np.nanmean(gammas) if np.isfinite(gammas).any() else float("nan")
            print(f"{label:<10} {m:>7} {np.mean(sizes):>6.0f} {err:>9.5f} {np.std(errs):>8.5f} "
                  f"{np.mean(secs):>8.2f}  {g:.3g}", flush=True)
    reference = exact_err if exact_err is not None else min(e for r in results.values() for _, e in r)
    ref_name = "exact KRR" if exact_err is not None else "the best Nystrom model above"
    print(f"fewest centers (of those tried) within 1% of {ref_name} ({reference:.5f}):")
    needed = {}
    for label, rows in results.items():
        ok = [m for m, e in rows if e <= 1.01 * reference]
        needed[label] = min(ok) if ok else None
        print(f"  {label:<10} {needed[label] if ok else 'not reached'}")
    if needed.get("uniform") and needed.get("squeak"):
        print(f"  uniform / squeak centers: {needed['uniform'] / needed['squeak']:.1f}x")
    elif needed.get("squeak"):
        print(f"  uniform did not reach it with up to {max(c for c in centers if c <= n)} centers "
              f"(> {max(c for c in centers if c <= n) / needed['squeak']:.1f}x squeak's)")
    return needed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a few minutes on 2 cores)")
    ap.add_argument("--sets", default="coherent,real", help="comma list: coherent, real")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    if args.quick:
        n_coh, seeds, n_real = 3000, [0, 1], 4000
        centers = [100, 200, 400, 800, 1200, 1600, 2400]
        real_centers, rls_max = [50, 100, 200, 400, 800], 4000
    else:
        n_coh, seeds, n_real = 6000, [0, 1, 2], 16000
        centers = [100, 200, 400, 800, 1200, 1600, 2400, 3200]
        real_centers, rls_max = [100, 200, 400, 800, 1600], 4000
    sets = args.sets.split(",")
    with threadpool_limits(1):
        if "coherent" in sets:
            run_set("(a) coherent synthetic", coherent_data(n_coh, 0), centers=centers, seeds=seeds,
                    sigma=0.5, penalty=1e-6, exact_max=8000, rls_max=rls_max, n_leaves=4, chunks=1000)
        if "real" in sets:
            for name in REAL_SETS:
                data = real_data(name, n_real, 0)
                if data is not None:
                    run_set(f"(b) {name}", data, centers=real_centers, seeds=seeds[:2], sigma=None,
                            penalty=1e-6, exact_max=8000, rls_max=rls_max, n_leaves=4, chunks=2000)


if __name__ == "__main__":
    main()
