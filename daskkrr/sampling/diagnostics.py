"""Exact checks of a dictionary on small data: the spectral guarantee of Eq. 3.

SQUEAK/DISQUEAK promise (with high probability) that the regularised Nystrom
approximation built from their dictionary,

    K~ = K S (S^T K S + gamma I)^{-1} S^T K,

satisfies ``0 <= K - K~ <= gamma / (1 - eps) I``. Here ``S`` has one column per
unique center j, equal to ``sqrt(s_j) e_{i_j}`` with the *selection weight*
``s_j = q_j / (qbar p_j)``; in terms of :attr:`CenterDictionary.weights` (normalised
to the number of centers M), ``s_j = (n / M) w_j``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.sampling.base import CenterDictionary
from daskkrr.sampling.cholesky import forward_solve, lower_cholesky, weighted_gram
from daskkrr.sampling.exact import EXACT_MAX_ROWS, _as_small_numpy


def selection_weights(dictionary: CenterDictionary, n: int) -> np.ndarray:
    """``s_j = (n / M) w_j`` (equal to ``q_j / (qbar p_j)`` for SQUEAK dictionaries)."""
    return (n / dictionary.size) * dictionary.weights


def regularized_nystrom(
    K: np.ndarray, indices: np.ndarray, sel_weights: np.ndarray, gamma: float
) -> np.ndarray:
    """``K S (S^T K S + gamma I)^{-1} S^T K`` for the full matrix ``K`` (small n)."""
    sw = np.sqrt(np.asarray(sel_weights, dtype=np.float64))
    C = K[:, indices] * sw[None, :]
    L, _ = lower_cholesky(weighted_gram(K[np.ix_(indices, indices)], sw, gamma))
    G = forward_solve(L, C.T)  # L^{-1} S^T K, shape (m, n)
    return G.T @ G


def spectral_error_bounds(
    X: Any,
    kernel: Kernel,
    dictionary: CenterDictionary,
    gamma: float,
    *,
    max_rows: int = EXACT_MAX_ROWS,
) -> tuple[float, float]:
    """Smallest and largest eigenvalue of ``K - K~`` for the dictionary's centers and weights.

    The dictionary is gamma/(1-eps)-accurate when the result lies in
    ``[-tol, gamma / (1 - eps) + tol]``.
    """
    Xn = _as_small_numpy(X, max_rows, "spectral_error_bounds")
    K = np.asarray(kernel(Xn, Xn), dtype=np.float64)
    Kt = regularized_nystrom(K, dictionary.indices, selection_weights(dictionary, Xn.shape[0]), gamma)
    E = K - Kt
    ev = np.linalg.eigvalsh(0.5 * (E + E.T))
    return float(ev[0]), float(ev[-1])
