"""Exact kernel ridge regression for small n: the reference every approximation is tested against."""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla

from daskkrr.utils.linalg import cholesky_jitter, solve_upper


def exact_krr_coefficients(K: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """Solve ``(K + penalty * n * I) c = y`` (scikit-learn's KernelRidge with alpha = penalty * n)."""
    return exact_krr_solve(K, y, penalty)[0]


def exact_krr_solve(K: np.ndarray, y: np.ndarray, penalty: float) -> tuple[np.ndarray, np.ndarray]:
    """``c`` with ``(K + penalty * n * I) c = y``, and the upper factor ``R^T R = K + penalty * n * I``
    (what the predictive variance needs, :func:`daskkrr.solvers.variance.exact_posterior`)."""
    K = np.asarray(K, dtype=np.float64)
    n = K.shape[0]
    if K.shape != (n, n):
        raise ValueError(f"K must be square; got shape {K.shape}")
    y = np.asarray(y, dtype=np.float64)
    if y.shape[0] != n:
        raise ValueError(f"y has {y.shape[0]} rows but K has {n}")
    if not penalty > 0:
        raise ValueError(f"penalty must be > 0; got {penalty!r}")
    S = K.copy()
    S[np.diag_indices(n)] += penalty * n
    R, _ = cholesky_jitter(S, what="regularised kernel matrix K + lambda n I")
    return solve_upper(R, solve_upper(R, y, trans=True)), R


def nystrom_lstsq_coefficients(
    Knm: np.ndarray, Kmm: np.ndarray, y: np.ndarray, penalty: float
) -> np.ndarray:
    """Dense Nystrom KRR from an in-memory ``K_nM`` (small problems and tests only).

    Solves ``(K_nM^T K_nM + lambda n K_MM) alpha = K_nM^T y`` with a symmetric solver.
    """
    n = Knm.shape[0]
    H = Knm.T @ Knm + penalty * n * Kmm
    return sla.solve(H, Knm.T @ y, assume_a="sym")
