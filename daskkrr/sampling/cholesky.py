"""Cholesky factors of regularised, weighted dictionary Gram matrices.

All leverage-score estimators of this package need solves with

    A = D K_DD D + reg * I,     D = diag(sqrt(w)),

for the dictionary Gram matrix ``K_DD``. We never form an inverse: we factor
``A = L L^T`` (adding jitter only if round-off makes the factorisation fail) and
apply ``L^{-1}`` by triangular solves. When a dictionary grows by a block of new
entries whose old part keeps its weights, the factor is extended by a Schur
complement instead of being recomputed.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import LinAlgError, cholesky, solve_triangular


def cholesky_with_jitter(A: np.ndarray, *, max_tries: int = 8) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of the symmetric positive (semi)definite ``A``.

    Tries the plain factorisation first; on failure adds ``jitter * I`` with jitter
    growing from ``1e-12 * mean(diag(A))`` by factors of 100.

    Returns
    -------
    L : ndarray of shape (m, m)
        Lower-triangular factor, ``L @ L.T ~ A + jitter * I``.
    jitter : float
        The jitter that was added (0.0 when none was needed).
    """
    A = np.asarray(A, dtype=np.float64)
    m = A.shape[0]
    if A.shape != (m, m):
        raise ValueError(f"cholesky_with_jitter needs a square matrix; got shape {A.shape}")
    if m == 0:
        return np.zeros((0, 0)), 0.0
    scale = float(np.mean(np.abs(np.diag(A)))) or 1.0
    jitter = 0.0
    for attempt in range(max_tries + 1):
        try:
            Aj = A if jitter == 0.0 else A + jitter * np.eye(m)
            return cholesky(Aj, lower=True, check_finite=False), jitter
        except LinAlgError:
            jitter = scale * 1e-12 * (100.0**attempt)
    raise LinAlgError(
        f"Cholesky of a {m}x{m} regularised Gram matrix failed even with jitter {jitter:.3g}; "
        "the regularisation gamma is probably too small for the data scale: increase gamma "
        "(or the model penalty) or standardise the features"
    )


def weighted_gram(gram: np.ndarray, sqrt_w: np.ndarray, reg: float) -> np.ndarray:
    """``D K D + reg I`` with ``D = diag(sqrt_w)``."""
    A = gram * sqrt_w[:, None]
    A *= sqrt_w[None, :]
    A[np.diag_indices_from(A)] += reg
    return A


def forward_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``L^{-1} B`` for lower-triangular ``L`` (an empty ``L`` returns an empty array)."""
    if L.shape[0] == 0:
        return np.zeros((0,) + B.shape[1:])
    return solve_triangular(L, B, lower=True, check_finite=False)


def extend_cholesky(
    L: np.ndarray, cross: np.ndarray, corner: np.ndarray
) -> tuple[np.ndarray, float]:
    """Factor of ``[[A, B], [B^T, C]]`` from the factor ``L`` of ``A``.

    Parameters
    ----------
    L : ndarray of shape (m, m)
        Lower Cholesky factor of ``A``.
    cross : ndarray of shape (m, k)
        ``L^{-1} B`` (already solved; the caller usually has it from an estimate).
    corner : ndarray of shape (k, k)
        ``C``.

    Returns
    -------
    L_new : ndarray of shape (m + k, m + k)
    jitter : float
        Jitter added to the Schur complement ``C - cross^T cross``.
    """
    m, k = L.shape[0], corner.shape[0]
    if cross.shape != (m, k):
        raise ValueError(f"extend_cholesky: cross has shape {cross.shape}, expected ({m}, {k})")
    schur = corner - cross.T @ cross
    schur = 0.5 * (schur + schur.T)
    L22, jitter = cholesky_with_jitter(schur)
    out = np.zeros((m + k, m + k))
    out[:m, :m] = L
    out[m:, :m] = cross.T
    out[m:, m:] = L22
    return out, jitter
