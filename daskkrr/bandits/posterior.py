"""The Nystrom Gaussian-process posterior over a finite arm set, as BKB maintains it.

Conventions (those of BKB, Calandriello et al., COLT 2019): with penalty ``lambda``,
a dictionary ``S`` of arms and the Nystrom embedding ``z(x) = K_SS^{-1/2} k_S(x)``
(``K_SS^{-1/2}`` a pseudo-inverse square root: directions with eigenvalue below
round-off are dropped),

- ``mean(x) = z(x)^T G^{-1} sum_s z(x_s) y_s`` with ``G = sum_s z(x_s) z(x_s)^T + lambda I``;
- ``var(x) = (k(x, x) - |z(x)|^2) / lambda + z(x)^T G^{-1} z(x)``.

This is the posterior of the Gaussian process with prior covariance ``k / lambda``
and noise variance 1 on the Nystrom-projected kernel; when ``S`` holds every
observed arm, ``mean`` is the exact GP (kernel ridge) mean and ``lambda * var`` is
the exact posterior variance of the GP with prior ``k`` and noise variance ``lambda``.

Observations are kept per arm (pull count and sum of rewards), so a posterior
costs ``O(A m d + m^3 + A m^2)`` for ``A`` arms and ``m`` dictionary arms,
whatever the number of steps.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from daskkrr.kernels import Kernel


def nystrom_embedding(kernel: Kernel, arms: np.ndarray, dictionary: np.ndarray) -> np.ndarray:
    """``Z`` (A, r): row ``i`` is ``z(x_i) = K_SS^{+1/2} k_S(x_i)``, ``r <= len(dictionary)``.

    Eigen-directions of ``K_SS`` below ``m * eps * max eigenvalue`` are dropped, so
    duplicated or nearly dependent dictionary arms give a smaller ``r``, not a
    singular factor.

    Parameters
    ----------
    kernel : Kernel
        The kernel.
    arms : ndarray of shape (A, d)
        The arm set.
    dictionary : ndarray of int
        Indices of the dictionary's arms ``S``.

    Returns
    -------
    Z : ndarray of shape (A, r)
        The embedded arms.
    """
    if dictionary.size == 0:
        return np.zeros((arms.shape[0], 0))
    centers = arms[dictionary]
    eigval, eigvec = np.linalg.eigh(kernel(centers, centers))
    keep = eigval > max(eigval.max(), 0.0) * len(dictionary) * np.finfo(float).eps
    root_inv = eigvec[:, keep] / np.sqrt(eigval[keep])
    return kernel(arms, centers) @ root_inv


class NystromPosterior:
    """Mean and variance of every arm for one dictionary and the observations so far.

    Parameters
    ----------
    Z : ndarray of shape (A, r)
        Nystrom embedding of the arms (:func:`nystrom_embedding`).
    kernel_diag : ndarray of shape (A,)
        ``k(x_i, x_i)``.
    counts, sums : ndarray of shape (A,)
        Pulls of each arm and the sum of its rewards.
    penalty : float
        ``lambda``.
    """

    def __init__(self, Z: np.ndarray, kernel_diag: np.ndarray, counts: np.ndarray, sums: np.ndarray,
                 penalty: float):
        self.Z = Z
        self.penalty = float(penalty)
        pulled = np.flatnonzero(counts)
        Zp = Z[pulled]
        G = Zp.T @ (counts[pulled, None] * Zp)
        G[np.diag_indices_from(G)] += self.penalty
        # G >= lambda I: the Cholesky factor exists (an empty dictionary gives r = 0).
        self.factor = np.linalg.cholesky(G)
        self.weights = self._solve(Zp.T @ sums[pulled])
        self.mean = Z @ self.weights
        # Part of k(x, x) outside the dictionary's span: round-off can make it slightly negative.
        self.residual = np.maximum(kernel_diag - np.einsum("ij,ij->i", Z, Z), 0.0)
        #: ``z^T G^{-1} z`` per arm: summed over the pulls it is the trace of the hat matrix (d_eff).
        self.projected_variance = self._projected_variance(Z)
        self.variance = self.residual / self.penalty + self.projected_variance

    def _projected_variance(self, Z: np.ndarray) -> np.ndarray:
        if Z.shape[1] == 0:
            return np.zeros(Z.shape[0])
        W = sla.solve_triangular(self.factor, Z.T, lower=True, check_finite=False)
        return np.einsum("ij,ij->j", W, W)

    def _solve(self, b: np.ndarray) -> np.ndarray:
        """``G^{-1} b``."""
        if b.shape[0] == 0:
            return b.copy()
        return sla.cho_solve((self.factor, True), b, check_finite=False)

    def inverse(self) -> np.ndarray:
        """``G^{-1}`` (r, r), the start of the rank-one updates of a batch."""
        return self._solve(np.eye(self.Z.shape[1]))


class HallucinatedVariance:
    """Posterior variances as arms are added to a batch, before their rewards come.

    The variance does not depend on the rewards, so each arm chosen in a batch
    updates every arm's variance as if it had been observed (GP-BUCB's and BBKB's
    "hallucination"). An arm outside the dictionary's span first joins the
    dictionary for the rest of the batch (the embedding gains the arm's residual
    direction, as in an incremental Cholesky), otherwise its own variance could
    never shrink and a fixed-size batch would repeat it. With ``G^{-1}`` updated by
    block inversion and Sherman-Morrison, one arm costs ``O(A (r + d) + r^2)``.

    Parameters
    ----------
    posterior : NystromPosterior
        The posterior at the start of the batch.
    kernel : Kernel
        The kernel; ``points`` the (scaled) arms it is evaluated on.
    counts : ndarray of shape (A,)
        Pulls of each arm so far.
    """

    def __init__(self, posterior: NystromPosterior, kernel: Kernel, points: np.ndarray, counts: np.ndarray):
        self.kernel = kernel
        self.points = points
        self.penalty = posterior.penalty
        self.Z = posterior.Z
        self.G_inv = posterior.inverse()
        self.weights = counts.astype(np.float64)  # pulls, hallucinated ones included
        self.residual = posterior.residual.copy()
        self.variance = posterior.variance.copy()
        self._tol = 1e-10 * max(float(np.max(kernel.diag(points[:1]))), 1e-300)

    def add(self, index: int) -> None:
        """Account for one more (hallucinated) pull of arm ``index``."""
        if self.residual[index] > self._tol:
            self._extend(index)
        z = self.Z[index]
        v = self.G_inv @ z
        denom = 1.0 + z @ v
        u = self.Z @ v
        self.variance -= u * u / denom
        np.maximum(self.variance, 0.0, out=self.variance)
        self.G_inv -= np.outer(v, v) / denom
        self.weights[index] += 1.0

    def _extend(self, index: int) -> None:
        """Add arm ``index`` to the dictionary: one more embedding column ``e``."""
        k_col = self.kernel(self.points, self.points[index : index + 1])[:, 0]
        e = (k_col - self.Z @ self.Z[index]) / np.sqrt(self.residual[index])
        we = self.weights * e
        g = self.Z.T @ we
        Gg = self.G_inv @ g
        schur = float(e @ we) + self.penalty - float(g @ Gg)
        # var = residual / lambda + z^T G^-1 z: the residual loses e^2, the projection gains
        # the Schur-complement term of the bordered G.
        self.variance += (self.Z @ Gg - e) ** 2 / schur - e * e / self.penalty
        np.maximum(self.variance, 0.0, out=self.variance)
        self.residual = np.maximum(self.residual - e * e, 0.0)
        self.residual[index] = 0.0
        r = self.G_inv.shape[0]
        G_inv = np.empty((r + 1, r + 1))
        G_inv[:r, :r] = self.G_inv + np.outer(Gg, Gg) / schur
        G_inv[:r, r] = G_inv[r, :r] = -Gg / schur
        G_inv[r, r] = 1.0 / schur
        self.G_inv = G_inv
        self.Z = np.column_stack([self.Z, e])
