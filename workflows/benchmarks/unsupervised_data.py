"""Data and exact references shared by the unsupervised benchmarks.

- :func:`fashion_mnist`: the Fashion-MNIST training images (60 000 x 784, scaled to
  [0, 1]) and labels from ``../shared/data/fashion-mnist`` (idx format, gzipped);
- :func:`sleep`: the PMLB ``sleep`` table (features, class);
- :func:`median_sigma`: a Gaussian length scale from the median pairwise distance;
- :func:`exact_kernel_kmeans`, :func:`exact_kpca_errors`: the exact methods on the
  full n x n kernel, the baselines of the M sweep.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from fit_tools import SHARED_DATA  # type: ignore[import-not-found]


def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fashion_mnist() -> tuple[np.ndarray, np.ndarray]:
    """Training images as float64 rows in [0, 1], and their labels; FileNotFoundError if absent."""
    root = SHARED_DATA / "fashion-mnist"
    images, labels = root / "train-images-idx3-ubyte.gz", root / "train-labels-idx1-ubyte.gz"
    if not images.is_file():
        raise FileNotFoundError(f"{images} is absent: the shared data sets live beside the checkout")
    X = _idx(images).reshape(-1, 28 * 28).astype(np.float64) / 255.0
    return X, _idx(labels).astype(np.int64)


def sleep() -> tuple[np.ndarray, np.ndarray]:
    """The PMLB sleep table: features and class labels."""
    import pandas as pd

    path = SHARED_DATA / "sleep.tsv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is absent: the shared data sets live beside the checkout")
    table = pd.read_csv(path, sep="\t")
    return table.drop(columns="target").to_numpy(np.float64), table["target"].to_numpy()


def subset(X: np.ndarray, y: np.ndarray, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], size=min(n, X.shape[0]), replace=False))
    return X[idx], y[idx]


def median_sigma(X: np.ndarray, rows: int = 1000, seed: int = 0) -> float:
    """Median distance between rows of a sample, the usual Gaussian length scale."""
    S = subset(X, np.zeros(len(X)), rows, seed)[0]
    sq = (S * S).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * S @ S.T, 0)
    return float(np.sqrt(np.median(d2[np.triu_indices(len(S), 1)])))


def gaussian_gram(A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
    d2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2 * A @ B.T
    return np.exp(-np.maximum(d2, 0) / (2 * sigma**2))


def kernel_kmeans_pp(K: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding in feature space from the kernel matrix; the initial labels."""
    n = K.shape[0]
    diag = np.diag(K)
    chosen = [int(rng.integers(n))]
    d2 = diag + diag[chosen[0]] - 2 * K[:, chosen[0]]
    for _ in range(1, k):
        p = np.maximum(d2, 0)
        nxt = int(rng.choice(n, p=p / p.sum()))
        chosen.append(nxt)
        d2 = np.minimum(d2, diag + diag[nxt] - 2 * K[:, nxt])
    D = diag[:, None] + diag[chosen][None, :] - 2 * K[:, chosen]
    return np.argmin(D, axis=1)


def exact_kernel_kmeans(K: np.ndarray, k: int, seed: int = 0, n_init: int = 3,
                        max_iter: int = 100) -> tuple[float, np.ndarray]:
    """Exact kernel k-means (Lloyd on the n x n kernel, k-means++ seeds, best of ``n_init``):
    the objective ``(1/n) sum_i ||phi(x_i) - c_(i)||^2`` and the labels."""
    n = K.shape[0]
    diag = np.diag(K)
    best: tuple[float, np.ndarray] | None = None
    rng = np.random.default_rng(seed)
    for _ in range(n_init):
        labels = kernel_kmeans_pp(K, k, rng)
        for _ in range(max_iter):
            onehot = np.zeros((n, k))
            onehot[np.arange(n), labels] = 1.0
            counts = np.maximum(onehot.sum(0), 1.0)
            KC = K @ onehot / counts  # mean kernel to each cluster
            within = (onehot * KC).sum(0) / counts  # mean kernel within each cluster
            D = diag[:, None] - 2 * KC + within[None, :]
            new = np.argmin(D, axis=1)
            if np.array_equal(new, labels):
                break
            labels = new
        objective = float(D[np.arange(n), labels].mean())
        if best is None or objective < best[0]:
            best = (objective, labels)
    assert best is not None
    return best


def centred_diagonal(K: np.ndarray) -> np.ndarray:
    """``||phi(x_i) - mean||^2`` for every row, from the full kernel matrix."""
    row = K.mean(axis=1)
    return np.diag(K) - 2 * row + row.mean()


def exact_kpca_errors(K: np.ndarray, components: list[int]) -> dict[int, float]:
    """Exact kernel PCA reconstruction error ``(1/n) sum ||phi_c(x) - P_l phi_c(x)||^2`` for each l."""
    import scipy.linalg

    n = K.shape[0]
    H = K - K.mean(axis=0)[None, :] - K.mean(axis=1)[:, None] + K.mean()
    top = max(components)
    w = scipy.linalg.eigh(H, eigvals_only=True, subset_by_index=[n - top, n - 1])[::-1]
    trace = float(np.trace(H))
    return {ell: (trace - float(w[:ell].sum())) / n for ell in components}
