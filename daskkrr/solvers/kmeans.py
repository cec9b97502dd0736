"""k-means in the Nystrom embedding, on numpy blocks: Lloyd's steps and k-means|| seeding.

Nystrom kernel k-means (Calandriello and Rosasco, NeurIPS 2018) is k-means on the
embedded points ``phi_M(x) = P^T k_M(x)`` (see :mod:`daskkrr.solvers.nystrom_embedding`):
squared distances in the embedding are ``k~(x,x) + k~(y,y) - 2 k~(x,y)`` for the
Nystrom kernel ``k~``, and with every point as a center they are those of exact
kernel k-means.

Lloyd's passes work on kernel rows ``k_M(x)`` directly (see :func:`lloyd_statistics`),
at ``O(M k)`` per row after the kernel; only seeding and the inertia embed the rows
(``O(M r)``). The pass functions return *sums* (cluster sums, counts, inertia) so that the
execution layer can add them along a tree; the client divides. Seeding follows
k-means|| (Bahmani, Moseley, Vattani, Kumar and Vassilvitskii, VLDB 2012): a few
rounds, each sampling every point independently with probability
``min(1, l d^2(x, C) / psi(C))``, then the weighted candidates are reduced to k
centers with k-means++ and Lloyd on the client.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.solvers.nystrom_embedding import embedded_tiles, kernel_tiles


def assign(E: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid of every row of ``E`` and the squared distance to it (clipped at 0)."""
    if E.shape[0] == 0:
        return np.empty(0, dtype=np.int64), np.empty(0)
    D = (E * E).sum(axis=1)[:, None] - 2.0 * (E @ C.T) + (C * C).sum(axis=1)[None, :]
    labels = np.argmin(D, axis=1)
    return labels.astype(np.int64), np.maximum(D[np.arange(D.shape[0]), labels], 0.0)


def nearest_by_scores(K: np.ndarray, A: np.ndarray, c_sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid from kernel rows: ``argmin_j ||c_j||^2 - 2 k_M(x)^T P c_j``.

    ``A = P C^T`` (M, k) and ``c_sq = ||c_j||^2``: the squared distance less the
    row's own ``||phi(x)||^2``, which does not change the argmin. Returns the labels
    and that partial distance (add ``||phi(x)||^2`` for the distance itself).
    """
    D = c_sq[None, :] - 2.0 * (K @ A)
    labels = np.argmin(D, axis=1)
    return labels.astype(np.int64), D[np.arange(D.shape[0]), labels]


def lloyd_statistics(tiles: Iterable[np.ndarray], A: np.ndarray, c_sq: np.ndarray,
                     P: np.ndarray | None = None) -> np.ndarray:
    """Statistics of one Lloyd pass from kernel rows ``K = k(X_tile, Z)``, packed for a sum.

    Lloyd needs no embedding: the assignment uses ``k_M(x)^T P c_j`` and a cluster's
    centroid is ``P^T (sum of its k_M(x)) / count``, so the pass sums kernel rows
    (M-vectors) per cluster. Returns float64 ``(k + 1, M + 1)``: rows ``0..k-1``
    hold each cluster's sum of kernel rows and (last column) its count; row ``k``
    the sum of the partial distances of :func:`nearest_by_scores` and, with ``P``,
    the sum of ``||phi(x)||^2`` (once per fit: inertia = that + the partial sum).
    """
    M, k = A.shape
    out = np.zeros((k + 1, M + 1))
    for K in tiles:
        labels, partial = nearest_by_scores(K, A, c_sq)
        onehot = np.zeros((K.shape[0], k))
        onehot[np.arange(K.shape[0]), labels] = 1.0
        out[:k, :M] += onehot.T @ K
        out[:k, M] += onehot.sum(axis=0)
        out[k, 0] += float(partial.sum())
        if P is not None:
            E = K @ P
            out[k, 1] += float((E * E).sum())
    return out


def lloyd_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, A: np.ndarray, c_sq: np.ndarray,
                P: np.ndarray | None = None) -> np.ndarray:
    """One block of a Lloyd pass that computes its kernel rows tile by tile."""
    return lloyd_statistics(kernel_tiles(Xb, kernel, Z), A, c_sq, P)


def lloyd_kept_block(Kb: np.ndarray, A: np.ndarray, c_sq: np.ndarray, P: np.ndarray | None = None) -> np.ndarray:
    """One block of a Lloyd pass over kernel rows kept in worker memory."""
    return lloyd_statistics([np.asarray(Kb, dtype=np.float64)], A, c_sq, P)


def centroid_products(P: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(A, c_sq) = (P C^T, ||c_j||^2)``: what a Lloyd pass needs of centroids ``C`` (k, r)."""
    return np.ascontiguousarray(P @ C.T), (C * C).sum(axis=1)


class LloydStep:
    """The client's side of one Lloyd pass: new centroids, inertia, shift, variance.

    Parameters
    ----------
    stats : ndarray
        The summed :func:`lloyd_statistics` of a pass against ``C``.
    C : ndarray of shape (k, r)
        The centroids the pass assigned to. An empty cluster keeps its centroid.
    P : ndarray of shape (M, r)
        The Nystrom basis.
    total_sq_norm : float
        ``sum_i ||phi(x_i)||^2`` over the data.
    """

    def __init__(self, stats: np.ndarray, C: np.ndarray, P: np.ndarray, total_sq_norm: float):
        k, r = C.shape
        M = P.shape[0]
        counts = stats[:k, M]
        sums = stats[:k, :M] @ P  # sum of phi(x) per cluster
        new = C.copy()
        filled = counts > 0
        new[filled] = sums[filled] / counts[filled, None]
        n = max(float(counts.sum()), 1.0)
        mean = sums.sum(axis=0) / n
        #: Centroids after the pass (means of their clusters).
        self.centers = new
        #: Points per cluster in the pass.
        self.counts = counts.astype(np.int64)
        #: Sum of squared distances to ``C`` (the centroids assigned to).
        self.inertia = max(0.0, float(total_sq_norm + stats[k, 0]))
        #: Squared Frobenius norm of the centroids' move.
        self.shift = float(((new - C) ** 2).sum())
        #: Mean variance per coordinate of the embedded data.
        self.mean_variance = max(0.0, (float(total_sq_norm) / n - float(mean @ mean)) / max(r, 1))


def inertia_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, P: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``[sum of squared distances to the nearest centroid, rows]`` of a block, float64 ``(2,)``."""
    total = 0.0
    for _, E in embedded_tiles(Xb, kernel, Z, P):
        total += float(assign(E, C)[1].sum())
    return np.array([total, float(Xb.shape[0])])


def labels_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, A: np.ndarray, c_sq: np.ndarray) -> np.ndarray:
    """Nearest centroid of every row of a block (as Lloyd's passes assign), int64 ``(n_b,)``."""
    parts = [nearest_by_scores(K, A, c_sq)[0] for K in kernel_tiles(Xb, kernel, Z)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


# --------------------------------------------------------------------------- k-means|| seeding
def parallel_candidates(E: np.ndarray, rows: np.ndarray, u: np.ndarray, C: np.ndarray,
                        cap: int | None) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """One block of a k-means|| round: its cost and its best candidates.

    A point is sampled when ``u < l d^2 / psi``, i.e. when ``d^2 / u > psi / l``; the
    global cost ``psi`` is known only after the pass, so each block returns its
    ``cap`` points of largest ratio ``d^2 / u`` (all with ``cap=None``) and the client applies the
    threshold. (A block whose every candidate passes may have been cut short: the
    caller asks it again without a cap.)

    Returns
    -------
    cost : float
        ``sum d^2(x, C)`` over the block.
    ratios, rows, points : ndarrays
        ``d^2 / u``, global row index and embedding of the candidates, by decreasing ratio.
    """
    _, d2 = assign(E, C)
    with np.errstate(divide="ignore"):
        ratio = np.where(d2 > 0, d2 / np.maximum(u, 1e-300), 0.0)
    take = np.argsort(-ratio, kind="stable")
    take = take[ratio[take] > 0]
    if cap is not None:
        take = take[: int(cap)]
    return float(d2.sum()), ratio[take], rows[take], E[take]


def candidate_weights_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, P: np.ndarray,
                            candidates: np.ndarray) -> np.ndarray:
    """Points of the block nearest to each candidate (k-means|| step 7) and ``sum ||phi(x)||^2``.

    Returns float64 ``(m + 1,)``: the counts, then the sum of squared norms.
    """
    m = candidates.shape[0]
    out = np.zeros(m + 1)
    for _, E in embedded_tiles(Xb, kernel, Z, P):
        labels, _ = assign(E, candidates)
        out[:m] += np.bincount(labels, minlength=m)
        out[m] += float((E * E).sum())
    return out


def weighted_kmeans_pp(points: np.ndarray, weights: np.ndarray, k: int,
                       rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding of weighted points (D^2 sampling with weights); indices of ``k`` points."""
    m = points.shape[0]
    w = np.asarray(weights, dtype=np.float64)
    chosen = [int(rng.choice(m, p=w / w.sum()))]
    _, d2 = assign(points, points[chosen])
    for _ in range(1, k):
        p = w * d2
        total = p.sum()
        nxt = int(rng.choice(m, p=p / total)) if total > 0 else int(rng.choice(
            np.setdiff1d(np.arange(m), chosen)))
        chosen.append(nxt)
        _, d_new = assign(points, points[[nxt]])
        d2 = np.minimum(d2, d_new)
    return np.asarray(chosen, dtype=np.int64)


def weighted_lloyd(points: np.ndarray, weights: np.ndarray, C: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """Lloyd's iterations on weighted points from centroids ``C`` (empty clusters keep theirs)."""
    C = C.copy()
    for _ in range(max_iter):
        labels, _ = assign(points, C)
        new = C.copy()
        for j in range(C.shape[0]):
            mask = labels == j
            wj = weights[mask].sum()
            if wj > 0:
                new[j] = weights[mask] @ points[mask] / wj
        if np.array_equal(new, C):
            break
        C = new
    return C


def reduce_candidates(points: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k initial centroids from the weighted k-means|| candidates (k-means++ then Lloyd)."""
    if points.shape[0] <= k:
        return points.copy()
    start = points[weighted_kmeans_pp(points, weights, k, rng)]
    return weighted_lloyd(points, weights, start)


__all__ = [
    "LloydStep",
    "assign",
    "candidate_weights_block",
    "centroid_products",
    "inertia_block",
    "labels_block",
    "lloyd_block",
    "lloyd_kept_block",
    "lloyd_statistics",
    "nearest_by_scores",
    "parallel_candidates",
    "reduce_candidates",
    "weighted_kmeans_pp",
    "weighted_lloyd",
]
