"""The Nystrom embedding and Nystrom kernel PCA on numpy blocks.

With centers ``Z`` (M rows) the Nystrom feature map is the projection of the
kernel feature map onto ``span{phi(z_j)}``; in an orthonormal basis of that span
its coordinates are

    phi_M(x) = K_MM^{+1/2} k_M(x),    k_M(x) = (k(x, z_1), ..., k(x, z_M)),

so that ``phi_M(x) . phi_M(x') = k_M(x)^T K_MM^+ k_M(x')``, the Nystrom kernel of
the FALKON slides ("Nystrom to rescue!"). :func:`nystrom_basis` gives the
``M x r`` matrix ``P = V_r S_r^{-1/2}`` (``K_MM = V S V^T``, the ``r`` eigenvalues
above a matrix-rank cut-off), so ``phi_M(x) = P^T k_M(x)`` has ``r <= M``
coordinates: the pseudo-inverse ``K_MM^+`` of the slides, without the directions
where round-off would dominate.

Kernel PCA (Sterge, Sriperumbudur, Rosasco and Rudi, AISTATS 2020) diagonalises
``K_MM^{-1/2} K_MN K_NM K_MM^{-1/2} / n``, which is ``E^T E / n`` for the embedded
rows ``E = K_NM P``; centring in feature space subtracts the mean embedding. The
blocks accumulate ``E^T E`` and ``E^T 1`` (a shifted version, see
:func:`moments_block`) rather than ``K_MN K_NM``: the explicit ``K^T K`` squares
the condition number of ``K_MM`` in its round-off, the whitened product does not.

Every function here is pure numpy; :mod:`daskkrr.pipeline.unsupervised` maps the
block functions over the row blocks of the data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.kernels.engine import engine_for

#: Bytes of the kernel tile plus its embedding held at once inside a block task.
TILE_BYTES = 32 * 2**20


def nystrom_basis(K_MM: np.ndarray, rcond: float | None = None) -> np.ndarray:
    """``P = V_r S_r^{-1/2}`` with ``K_MM = V S V^T``, so that ``phi_M(x) = P^T k_M(x)``.

    Parameters
    ----------
    K_MM : ndarray of shape (M, M)
        The kernel matrix of the centers.
    rcond : float or None
        Eigenvalues below ``rcond * max(S)`` are dropped (pseudo-inverse). None uses
        numpy's matrix-rank tolerance ``M * eps``.

    Returns
    -------
    ndarray of shape (M, r)
        Columns in decreasing order of the eigenvalues of ``K_MM``; ``r`` is the
        numerical rank.
    """
    K = np.asarray(K_MM, dtype=np.float64)
    K = (K + K.T) / 2
    s, V = np.linalg.eigh(K)
    s, V = s[::-1], V[:, ::-1]
    if s.size == 0 or s[0] <= 0:
        raise ValueError("the kernel matrix of the centers is zero; the Nystrom embedding is empty")
    cut = (K.shape[0] * np.finfo(np.float64).eps if rcond is None else float(rcond)) * s[0]
    keep = s > cut
    return np.ascontiguousarray(V[:, keep] / np.sqrt(s[keep]))


def tile_rows(n_centers: int, width: int, tile_bytes: int = TILE_BYTES) -> int:
    """Rows per tile so that a kernel tile and its embedding take at most ``tile_bytes``."""
    return max(1, int(tile_bytes // (8 * (n_centers + width))))


def embedded_tiles(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, P: np.ndarray,
                   tile_bytes: int = TILE_BYTES) -> Iterator[tuple[int, np.ndarray]]:
    """``(first_row, phi_M(X_tile))`` over row tiles of ``Xb`` (float64, ``(rows, r)``).

    The kernel tile is materialised and multiplied by BLAS: with ``r`` columns a
    GEMM beats the engines' fused products, which are built for a few columns.
    """
    engine = engine_for(kernel)
    step = tile_rows(Z.shape[0], P.shape[1], tile_bytes)
    for start in range(0, Xb.shape[0], step):
        K = engine.kernel_block(kernel, Xb[start : start + step], Z)
        yield start, np.asarray(K, dtype=np.float64) @ P


def kernel_tiles(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray,
                 tile_bytes: int = TILE_BYTES) -> Iterator[np.ndarray]:
    """``k(X_tile, Z)`` as float64 over row tiles of ``Xb``."""
    engine = engine_for(kernel)
    step = tile_rows(Z.shape[0], 0, tile_bytes)
    for start in range(0, Xb.shape[0], step):
        yield np.asarray(engine.kernel_block(kernel, Xb[start : start + step], Z), dtype=np.float64)


def embed_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, P: np.ndarray) -> np.ndarray:
    """The embedding ``phi_M`` of every row of ``Xb``, float64 ``(n_b, r)``."""
    out = np.empty((Xb.shape[0], P.shape[1]))
    for start, E in embedded_tiles(Xb, kernel, Z, P):
        out[start : start + E.shape[0]] = E
    return out


def moments_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, P: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``[(E - s)^T (E - s) | (E - s)^T 1]`` for the block's embedding ``E``: float64 ``(r, r + 1)``.

    The shift ``s`` (a guess of the mean embedding) keeps the centred covariance
    ``(E-s)^T(E-s)/n - (m-s)(m-s)^T`` free of the cancellation that
    ``E^T E / n - m m^T`` suffers when the mean is large against the spread.
    """
    r = P.shape[1]
    out = np.zeros((r, r + 1))
    for _, E in embedded_tiles(Xb, kernel, Z, P):
        E -= shift
        out[:, :r] += E.T @ E
        out[:, r] += E.sum(axis=0)
    return out


@dataclasses.dataclass(frozen=True)
class KernelPCAResult:
    """The centred eigendecomposition of the Nystrom covariance.

    Attributes
    ----------
    eigenvalues : ndarray of shape (r,)
        Eigenvalues of the centred covariance ``C = (1/n) sum (phi_i - m)(phi_i - m)^T``,
        decreasing, clipped at 0.
    vectors : ndarray of shape (r, r)
        Its eigenvectors (columns), in the embedding's coordinates.
    mean : ndarray of shape (r,)
        The mean embedding ``m``.
    """

    eigenvalues: np.ndarray
    vectors: np.ndarray
    mean: np.ndarray


def kpca_from_moments(moments: np.ndarray, n: int, shift: np.ndarray) -> KernelPCAResult:
    """Eigendecomposition of the centred covariance from the summed :func:`moments_block`."""
    r = moments.shape[0]
    delta = moments[:, r] / n  # m - s
    C = moments[:, :r] / n - np.outer(delta, delta)
    C = (C + C.T) / 2
    w, U = np.linalg.eigh(C)
    w, U = np.clip(w[::-1], 0.0, None), U[:, ::-1]
    return KernelPCAResult(eigenvalues=w, vectors=np.ascontiguousarray(U), mean=shift + delta)


def projection(P: np.ndarray, result: KernelPCAResult, n_components: int) -> tuple[np.ndarray, np.ndarray]:
    """``(W, offset)`` with ``transform(x) = k_M(x) W - offset``: ``W = P U_k``, ``offset = m^T U_k``.

    The sign of each component is fixed so that its largest coefficient on the
    centers (a column of ``W``, which does not depend on the basis of the
    embedding) is positive.
    """
    U = result.vectors[:, :n_components]
    W = P @ U
    flip = np.sign(W[np.argmax(np.abs(W), axis=0), np.arange(W.shape[1])])
    flip[flip == 0] = 1.0
    W = W * flip
    return np.ascontiguousarray(W), (result.mean @ U) * flip


def transform_block(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, W: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Kernel PCA scores of a block: ``k(Xb, Z) W - offset``, float64 ``(n_b, n_components)``."""
    out = np.empty((Xb.shape[0], W.shape[1]))
    for start, E in embedded_tiles(Xb, kernel, Z, W):
        out[start : start + E.shape[0]] = E
    return out - offset


def center_shift(K_MM: np.ndarray, P: np.ndarray) -> np.ndarray:
    """The mean embedding of the centers, ``P^T K_MM 1 / M``: the shift of :func:`moments_block`."""
    return P.T @ np.asarray(K_MM, dtype=np.float64).mean(axis=1)


__all__ = [
    "KernelPCAResult",
    "center_shift",
    "embed_block",
    "embedded_tiles",
    "kernel_tiles",
    "kpca_from_moments",
    "moments_block",
    "nystrom_basis",
    "projection",
    "tile_rows",
    "transform_block",
]
