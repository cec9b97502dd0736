"""Leverage-score dictionaries (SQUEAK, DISQUEAK, BLESS) and the Cholesky factors of their Grams.

A dictionary (numpy arrays only, O(m^2 + m d)) is a set of unique rows ("entries") ``j`` with

- ``copies`` q_j >= 1 (the multiplicity of the paper),
- ``probs`` p~_j (the probability the entry was last resampled with),
- ``rls`` the last Eq. 4/5 estimate of its ridge leverage score,
- ``gram`` the kernel matrix among the entries (kept so the next update does not
  recompute it).

Its *selection weight* is ``s_j = q_j / (qbar p_j)``: the diagonal of ``S S^T`` in
Eq. 3, i.e. ``sum_j s_j k(z_j, .) k(z_j, .)^T`` estimates ``sum_i k(x_i, .) k(x_i, .)^T``.
:meth:`to_center_dictionary` converts it to the package-wide convention
``w_j = (M / n) s_j`` (all ones for uniform sampling).

All leverage-score estimators of this package need solves with

    A = D K_DD D + reg * I,     D = diag(sqrt(w)),

for the dictionary Gram matrix ``K_DD``. We never form an inverse: we factor
``A = L L^T`` (adding jitter only if round-off makes the factorisation fail) and
apply ``L^{-1}`` by triangular solves. When a dictionary grows by a block of new
entries whose old part keeps its weights, the factor is extended by a Schur
complement instead of being recomputed.

Memory at large m (issue 39): SQUEAK and DISQUEAK do not keep ``gram`` (their states
travel between tasks with ``m d`` numbers, not ``m^2``). A factor is built in the memory
of the weighted Gram it factors (:func:`weighted_kernel_gram`, :func:`factor_in_place`)
and the entries' own estimates need only the diagonal of ``A^{-1}``, computed in the
factor's memory too (:func:`inverse_diagonal`): one ``m x m`` matrix, two while the factor
is extended.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.linalg.lapack import dtrtri

from daskkrr.kernels import Kernel
from daskkrr.sampling.base import CenterDictionary
from daskkrr.utils.linalg import cholesky_jitter


@dataclasses.dataclass
class DictionaryState:
    """Unique dictionary entries with their copies, probabilities, RLS estimates and Gram."""

    points: np.ndarray
    indices: np.ndarray
    probs: np.ndarray
    copies: np.ndarray
    rls: np.ndarray
    gram: np.ndarray

    @classmethod
    def empty(cls, n_features: int, dtype: Any = np.float64) -> DictionaryState:
        return cls(
            points=np.zeros((0, n_features), dtype=dtype),
            indices=np.zeros(0, dtype=np.int64),
            probs=np.zeros(0),
            copies=np.zeros(0, dtype=np.int64),
            rls=np.zeros(0),
            gram=np.zeros((0, 0)),
        )

    @property
    def size(self) -> int:
        """Number of unique entries."""
        return int(self.indices.shape[0])

    @property
    def n_copies(self) -> int:
        """Dictionary size counted with multiplicity, ``sum_j q_j`` (|I| in the papers)."""
        return int(self.copies.sum())

    def selection_weights(self, qbar: int) -> np.ndarray:
        """``s_j = q_j / (qbar p_j)``."""
        return self.copies / (qbar * self.probs)

    def d_eff_estimate(self, qbar: int, eps: float) -> float:
        """Importance-weighted sum of the RLS estimates, ``sum_j s_j tau~_j / (1 - eps)``.

        Estimates ``d_eff(gamma)`` of all rows the dictionary summarises (Eq. 4/5
        estimates are about ``(1 - eps)`` times the exact RLS).
        """
        return float(np.sum(self.selection_weights(qbar) * self.rls) / (1.0 - eps))

    def take(self, keep: np.ndarray) -> DictionaryState:
        """The entries selected by the integer or boolean index ``keep``."""
        keep = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep)
        return DictionaryState(
            points=self.points[keep],
            indices=self.indices[keep],
            probs=self.probs[keep],
            copies=self.copies[keep],
            rls=self.rls[keep],
            gram=self.gram[np.ix_(keep, keep)] if self.gram.shape[0] else self.gram,
        )

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.points, self.indices, self.probs, self.copies,
                                          self.rls, self.gram)))

    def to_center_dictionary(self, qbar: int, n_rows: int, info: dict[str, Any]) -> CenterDictionary:
        """Unique centers with weights ``w_j = (M / n) q_j / (qbar p_j)``, M = number of entries.

        With this normalisation ``(n / M) sum_j w_j k(z_j, .) k(z_j, .)^T`` is the
        dictionary's estimate of ``K_nM^T K_nM`` restricted to the centers, and a
        uniform sample would get all-ones weights.
        """
        if self.size == 0:
            raise RuntimeError(
                "the dictionary is empty: no row was kept. Increase qbar, lower gamma "
                "(or the penalty), or check that X has rows"
            )
        order = np.argsort(self.indices, kind="stable")
        st = self.take(order)
        weights = (st.size / n_rows) * st.selection_weights(qbar)
        info = dict(info)
        info["rls_estimates"] = st.rls.tolist()
        return CenterDictionary(
            centers=st.points,
            indices=st.indices,
            weights=weights,
            counts=st.copies.astype(np.int64),
            probabilities=st.probs,
            info=info,
        )


def thin_to_size(state: DictionaryState, size: int, rng: np.random.Generator) -> DictionaryState:
    """Keep exactly ``size`` entries by thinning every copy with one common probability ``c``.

    Each copy survives with probability ``c`` (``q_j -> Binomial(q_j, c)``, ``p_j -> c p_j``,
    as a SHRINK step with ratio c, i.e. a run with ``c * qbar`` copies), where ``c`` is
    the largest value leaving exactly ``size`` entries with a copy. Implemented by order
    statistics: entry j survives iff the smallest of its ``q_j`` uniforms,
    ``t_j ~ Beta(1, q_j)``, is below ``c``; ``c`` is the ``(size + 1)``-th smallest ``t``; a
    survivor keeps ``1 + Binomial(q_j - 1, (c - t_j) / (1 - t_j))`` copies.
    """
    m = state.size
    if size >= m:
        return state
    if size < 1:
        raise ValueError(f"cannot thin a dictionary to {size} entries; ask for at least 1")
    q = state.copies.astype(np.int64)
    t = 1.0 - rng.random(m) ** (1.0 / q)
    order = np.argsort(t, kind="stable")
    keep = np.sort(order[:size])
    c = float(t[order[size]])
    extra = rng.binomial(q[keep] - 1, np.clip((c - t[keep]) / (1.0 - t[keep]), 0.0, 1.0))
    out = state.take(keep)
    out.copies = 1 + extra
    out.probs = c * out.probs
    return out

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


def weighted_kernel_gram(
    points: np.ndarray, sqrt_w: np.ndarray, kernel: Kernel, reg: float, block_bytes: int
) -> np.ndarray:
    """``D K D + reg I`` of the entries ``points``, computed from the points in row blocks.

    The kernel is evaluated a block of rows at a time (``block_rows x m x 8`` bytes at most
    ``block_bytes``, and at most a quarter of the rows) into the one ``m x m`` result, so the
    kernel's temporaries stay well below one more ``m x m`` matrix.
    Recomputing the Gram (``m^2 d`` flops) costs less than the factorisation that follows
    (``m^3 / 3``) whenever ``d < m / 3``, and spares carrying it between tasks.
    """
    m = points.shape[0]
    A = np.empty((m, m))
    step = max(1, min(int(block_bytes) // (8 * max(1, m)), -(-m // 4)))
    for start in range(0, m, step):
        rows = slice(start, min(m, start + step))
        A[rows] = kernel(points[rows], points)
        A[rows] *= sqrt_w[rows, None]
        A[rows] *= sqrt_w[None, :]
    A[np.diag_indices_from(A)] += reg
    return A


def factor_in_place(
    A: np.ndarray, *, what: str = "regularised dictionary Gram matrix D K D + gamma I"
) -> tuple[np.ndarray, float]:
    """:func:`lower_cholesky` of the C-ordered symmetric ``A``, built in ``A``'s own memory.

    ``A.T`` is the same symmetric matrix, Fortran-ordered, so LAPACK factors it in place
    (its upper factor ``T`` is ``L^T``); ``A`` is given up. Returns ``(L, jitter)``.
    """
    T, jitter = cholesky_jitter(A.T, what=what, advice=_GAMMA_ADVICE, overwrite=True)
    return T.T, jitter


def inverse_diagonal(L: np.ndarray) -> np.ndarray:
    """Diagonal of ``(L L^T)^{-1}``: the squared column norms of ``L^{-1}``, built in ``L``'s memory.

    ``L`` (C-ordered, lower) is given up: ``L^T`` is Fortran-ordered upper-triangular, and
    LAPACK's ``trtri`` inverts it in place (``m^3 / 3`` flops, against ``m^3`` for solving
    ``L`` with ``m`` right-hand sides).
    """
    if L.shape[0] == 0:
        return np.zeros(0)
    inv_T, info = dtrtri(L.T, lower=0, overwrite_c=1)
    if info != 0:  # a factor from cholesky_jitter has a positive diagonal
        raise np.linalg.LinAlgError(f"trtri: the dictionary's Cholesky factor is singular at column {info}")
    return np.einsum("ij,ij->i", inv_T, inv_T)  # row i of (L^{-1})^T is column i of L^{-1}


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
