"""'M ~ sqrt(n) suffices': Nystrom kernel k-means and kernel PCA losses against M, on Fashion-MNIST.

As in the FALKON slides ("MNIST-60k: expected loss vs projection size M"), on a
subset of Fashion-MNIST (10 000 rows; ``--quick``: 2 000) where the exact methods
fit in memory:

- k-means: the objective ``(1/n) sum_i min_j ||phi(x_i) - c_j||^2`` of the Nystrom
  centroids, measured in the *exact* feature space (with the full kernel), against
  exact kernel k-means (Lloyd on the n x n kernel, k-means++ seeds, best of 3);
- kernel PCA: the reconstruction error ``(1/n) sum ||phi_c(x) - P_l phi_c(x)||^2``
  of the Nystrom components in the exact feature space, against exact kernel PCA.

for M from 50 to 5000 (uniform centers, several seeds: medians). Prints a table
(loss, ratio to exact, fit seconds, peak memory of this process), writes
``results/unsupervised_m_sweep.{json,csv}`` and the figure ``.png`` (loss against M,
with sqrt(n) marked).

    python workflows/benchmarks/unsupervised_m_sweep.py [--quick] [--n 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_tools import REPO, PeakMemory, machine, print_table, write_results  # noqa: E402
from unsupervised_data import (  # noqa: E402
    centred_diagonal,
    exact_kernel_kmeans,
    exact_kpca_errors,
    fashion_mnist,
    gaussian_gram,
    median_sigma,
    subset,
)

sys.path.insert(0, str(REPO))


def nystrom_kmeans_loss(model: object, X: np.ndarray, K_diag: np.ndarray) -> float:
    """The Nystrom centroids' k-means objective in the exact feature space."""
    from daskkrr.solvers.kmeans import centroid_products

    A, c_sq = centroid_products(model.basis_, model.cluster_centers_)  # type: ignore[attr-defined]
    KM = gaussian_gram(X, model.centers_, model.kernel_.sigma)  # type: ignore[attr-defined]
    D = K_diag[:, None] - 2 * KM @ A + c_sq[None, :]
    return float(np.maximum(D.min(axis=1), 0).mean())


def nystrom_kpca_error(model: object, X: np.ndarray, centred_diag: np.ndarray) -> float:
    """The Nystrom components' reconstruction error in the exact feature space."""
    scores = model.transform(X)  # type: ignore[attr-defined]
    return float((centred_diag - (scores**2).sum(axis=1)).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 000 rows, M up to 1 000, one seed")
    parser.add_argument("--n", type=int, default=None, help="rows of the subset (default 10 000)")
    parser.add_argument("--repeats", type=int, default=None, help="seeds per M (default 3)")
    parser.add_argument("--max-m", type=int, default=5000, help="largest M of the grid")
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--components", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n = args.n or (2000 if args.quick else 10_000)
    repeats = args.repeats or (1 if args.quick else 3)
    largest = min(n, args.max_m, 1000 if args.quick else args.max_m)
    grid = [m for m in (50, 100, 200, 500, 1000, 2000, 5000) if m <= largest]
    from daskkrr import NystromKernelKMeans, NystromKernelPCA

    X_all, y_all = fashion_mnist()
    X, _ = subset(X_all, y_all, n, seed=0)
    sigma = median_sigma(X)
    rows = []
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        K = gaussian_gram(X, X, sigma)
        diag, cdiag = np.diag(K).copy(), centred_diagonal(K)
        exact_km, _ = exact_kernel_kmeans(K, args.clusters, seed=0)
        t_km = time.perf_counter() - t0
        t0 = time.perf_counter()
        exact_pca = exact_kpca_errors(K, [args.components])[args.components]
        t_pca = time.perf_counter() - t0
        del K
    rows.append({"method": "exact", "M": n, "kmeans_loss": exact_km, "kpca_error": exact_pca,
                 "kmeans_ratio": 1.0, "kpca_ratio": 1.0, "kmeans_s": t_km, "kpca_s": t_pca,
                 "peak_mb": round(mem.total_mb, 1)})
    for m in grid:
        km_loss, pca_err, km_s, pca_s = [], [], [], []
        with PeakMemory() as mem:
            for seed in range(repeats):
                t0 = time.perf_counter()
                km = NystromKernelKMeans(n_clusters=args.clusters, sigma=sigma, n_centers=m, standardize=False,
                                         random_state=seed).fit(X)
                km_s.append(time.perf_counter() - t0)
                km_loss.append(nystrom_kmeans_loss(km, X, diag))
                t0 = time.perf_counter()
                pca = NystromKernelPCA(n_components=args.components, sigma=sigma, n_centers=m, standardize=False,
                                       random_state=seed).fit(X)
                pca_s.append(time.perf_counter() - t0)
                pca_err.append(nystrom_kpca_error(pca, X, cdiag))
        rows.append({"method": "nystrom", "M": m, "kmeans_loss": float(np.median(km_loss)),
                     "kpca_error": float(np.median(pca_err)),
                     "kmeans_ratio": float(np.median(km_loss)) / exact_km,
                     "kpca_ratio": float(np.median(pca_err)) / exact_pca,
                     "kmeans_s": float(np.median(km_s)), "kpca_s": float(np.median(pca_s)),
                     "peak_mb": round(mem.total_mb, 1), "repeats": repeats})
    print_table(rows, ["method", "M", "kmeans_loss", "kmeans_ratio", "kpca_error", "kpca_ratio", "kmeans_s",
                       "kpca_s", "peak_mb"],
                title=f"Fashion-MNIST subset n={n}, sigma={sigma:.3g} (median distance), k={args.clusters}, "
                      f"l={args.components}; sqrt(n)={np.sqrt(n):.0f}")
    meta = {"machine": machine(), "n": n, "sigma": sigma, "clusters": args.clusters,
            "components": args.components, "quick": args.quick, "repeats": repeats, "grid": grid,
            "note": "losses measured in the exact feature space; times in this process (not a fresh one per fit)"}
    jpath, _ = write_results(rows, args.out, "unsupervised_m_sweep", meta)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is absent: no figure (pip install matplotlib)")
        return
    ny = [r for r in rows if r["method"] == "nystrom"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, exact, title in ((axes[0], "kmeans_loss", exact_km, f"kernel k-means, k={args.clusters}"),
                                  (axes[1], "kpca_error", exact_pca, f"kernel PCA, l={args.components}")):
        ax.plot([r["M"] for r in ny], [r[key] for r in ny], "o-", label="Nystrom")
        ax.axhline(exact, color="k", ls="--", label="exact")
        ax.axvline(np.sqrt(n), color="grey", ls=":", label="M = sqrt(n)")
        ax.set_xscale("log")
        ax.set_xlabel("M (centers)")
        ax.set_ylabel("loss (exact feature space)")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"Fashion-MNIST, n = {n}: loss against M")
    fig.tight_layout()
    png = jpath.with_suffix(".png")
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
