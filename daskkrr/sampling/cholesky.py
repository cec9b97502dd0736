"""Cholesky factors of regularised, weighted dictionary Gram matrices.

All leverage-score estimators of this package need solves with

    A = D K_DD D + reg * I,     D = diag(sqrt(w)),

for the dictionary Gram matrix ``K_DD``. We never form an inverse: we factor
``A = L L^T`` (with the package's jitter policy, :mod:`daskkrr.utils.linalg`) and
apply ``L^{-1}`` by triangular solves. When a dictionary grows by a block of new
entries whose old part keeps its weights, the factor is extended by a Schur
complement instead of being recomputed.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

from daskkrr.utils.linalg import cholesky_jitter


#: What to change when a dictionary's regularised Gram matrix is singular.
_GAMMA_ADVICE = (
    "The regularisation gamma is probably too small for the data scale: increase gamma "
    "(or the model penalty) or standardise the features."
)


def lower_cholesky(
    A: np.ndarray, *, what: str = "regularised dictionary Gram matrix D K D + gamma I"
) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor ``L`` with ``L L^T = A + jitter I``.

    The package's one jitter policy (:func:`daskkrr.utils.linalg.cholesky_jitter`:
    round-off-level jitter, escalated with a ``JitterWarning``, refused above 1% of
    the mean diagonal), returned lower-triangular for the forward solves below.

    Returns
    -------
    L : ndarray of shape (m, m)
        Lower-triangular factor.
    jitter : float
        The jitter that was added.
    """
    T, jitter = cholesky_jitter(A, what=what, advice=_GAMMA_ADVICE)
    return T.T, jitter


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
    L22, jitter = lower_cholesky(schur, what="Schur complement of the extended dictionary")
    out = np.zeros((m + k, m + k))
    out[:m, :m] = L
    out[m:, :m] = cross.T
    out[m:, m:] = L22
    return out, jitter
