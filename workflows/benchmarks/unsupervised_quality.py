"""Clustering quality: Nystrom kernel k-means against linear k-means and spectral clustering.

Adjusted Rand index and normalised mutual information against the true labels on
data where linear k-means fails or struggles:

- ``rings``: two nested noisy circles (scikit-learn's ``make_circles``);
- ``fashion``: Fashion-MNIST classes (a subset; ``../shared/data/fashion-mnist``);
- ``sleep``: the PMLB ``sleep`` classes (``../shared/data/sleep.tsv.gz``).

Methods: daskkrr's ``NystromKernelKMeans``; scikit-learn's ``KMeans`` on the raw
features (n_init=10); scikit-learn's ``SpectralClustering`` on a subsample (its
n x n affinity limits it), scored on that subsample. Each method runs with
several seeds (medians). The table has seconds, the peak RSS of this process
during the method, ARI and NMI, and kernel k-means' ARI gain over linear k-means.

    python workflows/benchmarks/unsupervised_quality.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_tools import REPO, PeakMemory, machine, print_table, write_results  # noqa: E402
from unsupervised_data import fashion_mnist, median_sigma, sleep, subset  # noqa: E402

sys.path.insert(0, str(REPO))


def datasets(quick: bool) -> dict[str, dict]:
    from sklearn.datasets import make_circles

    n_rings = 2000 if quick else 10_000
    X, y = make_circles(n_samples=n_rings, factor=0.2, noise=0.05, random_state=0)
    out = {"rings": dict(X=X, y=y, k=2, sigma=0.3, standardize=False)}
    try:
        Xf, yf = subset(*fashion_mnist(), 3000 if quick else 10_000, seed=1)
        out["fashion"] = dict(X=Xf, y=yf, k=10, sigma=median_sigma(Xf), standardize=False)
    except FileNotFoundError as exc:
        print(f"skipping fashion: {exc}")
    try:
        Xs, ys = sleep()
        if quick:
            Xs, ys = subset(Xs, ys, 5000, seed=1)
        out["sleep"] = dict(X=Xs, y=ys, k=len(np.unique(ys)), sigma=None, standardize=True)
    except FileNotFoundError as exc:
        print(f"skipping sleep: {exc}")
    return out


def scores(y: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    return float(adjusted_rand_score(y, labels)), float(normalized_mutual_info_score(y, labels))


def kernel_kmeans(d: dict, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from daskkrr import NystromKernelKMeans

    model = NystromKernelKMeans(n_clusters=d["k"], sigma=d["sigma"], n_centers=m, standardize=d["standardize"],
                                random_state=seed).fit(d["X"])
    return d["y"], model.labels_


def linear(d: dict, Xs: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import KMeans

    return d["y"], KMeans(n_clusters=d["k"], n_init=10, random_state=seed).fit_predict(Xs)


def spectral(d: dict, S: np.ndarray, ys: np.ndarray, sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import SpectralClustering

    model = SpectralClustering(n_clusters=d["k"], affinity="rbf", gamma=1 / (2 * sigma**2), random_state=seed,
                               assign_labels="cluster_qr")
    return ys, model.fit_predict(S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, one seed")
    parser.add_argument("--repeats", type=int, default=None, help="seeds per method (default 3)")
    parser.add_argument("--spectral-rows", type=int, default=2000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    from sklearn.preprocessing import StandardScaler

    rows = []
    for name, d in datasets(args.quick).items():
        X, y, k = d["X"], d["y"], d["k"]
        n = X.shape[0]
        m = int(min(n, max(100, 4 * np.sqrt(n))))
        Xs = StandardScaler().fit_transform(X) if d["standardize"] else X
        sig = d["sigma"] if d["sigma"] is not None else float(np.sqrt(X.shape[1]))
        S, ys = subset(Xs, y, args.spectral_rows, seed=2)

        methods = ((f"NystromKernelKMeans M={m}", functools.partial(kernel_kmeans, d, m), n),
                   ("sklearn KMeans (raw)", functools.partial(linear, d, Xs), n),
                   ("SpectralClustering (subsample)", functools.partial(spectral, d, S, ys, sig), len(S)))
        for method, run, rows_used in methods:
            aris, nmis, secs = [], [], []
            with PeakMemory() as mem:
                for seed in range(repeats):
                    t0 = time.perf_counter()
                    truth, labels = run(seed)
                    secs.append(time.perf_counter() - t0)
                    a, b = scores(truth, labels)
                    aris.append(a)
                    nmis.append(b)
            rows.append({"data": name, "n": rows_used, "k": k, "method": method, "ari": float(np.median(aris)),
                         "nmi": float(np.median(nmis)), "seconds": float(np.median(secs)),
                         "peak_mb": round(mem.total_mb, 1), "repeats": repeats})
        kk, lin = rows[-3], rows[-2]
        kk["ari_gain_vs_linear"] = kk["ari"] - lin["ari"]
    print_table(rows, ["data", "n", "k", "method", "ari", "nmi", "ari_gain_vs_linear", "seconds", "peak_mb"],
                title="Clustering quality against the true labels (medians over seeds)")
    write_results(rows, args.out, "unsupervised_quality",
                  {"machine": machine(), "quick": args.quick, "repeats": repeats,
                   "note": "peak_mb: RSS of this process while the method ran (data included)"})


if __name__ == "__main__":
    main()
