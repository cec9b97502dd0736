"""Dense linear algebra shared by the solvers and the samplers: one jittered Cholesky.

The policy, the same for every caller (FALKON's ``K_MM`` and inner matrix, the
exact solver, the leverage-score estimators' dictionary Gram matrices):

* start from round-off-level jitter, ``m * eps * mean(diag S)``;
* on failure multiply the jitter by 100 and retry, and say so with a
  :class:`JitterWarning` once more than round-off was needed;
* refuse with ``numpy.linalg.LinAlgError`` (saying what to change) when more than
  ``max_jitter_ratio`` (default 1%) of the mean diagonal would be needed, and with
  ``ValueError`` / ``LinAlgError`` for non-square, non-finite or degenerate input.

The factorisation runs in place (LAPACK ``potrf``) so that ``M = 10 000`` centers
need one ``M x M`` matrix, not three.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

import numpy as np
import scipy.linalg as sla
from scipy.linalg.lapack import dpotrf, spotrf

from daskkrr.utils.threads import blas_threads

__all__ = ["JitterPolicy", "JitterWarning", "cholesky_jitter", "mirror_triangle", "solve_upper"]

#: From this size on the factorisation runs single-threaded: scipy's bundled
#: OpenBLAS (0.3.30) crashes in multithreaded ``dpotrf`` at M = 16 000; it ran at
#: 10 000, 13 000, 14 500 and 15 500 (where two threads took 5.3 s against 11.1 s for
#: one at M = 10 000, on the busy 2-core machine).
SINGLE_THREAD_FACTOR_SIZE = 12000
#: Below this size too: a threaded factorisation synchronises its threads once per
#: panel, and when another process holds a core they spin. On the 2-core development
#: machine with one other job running, ``dpotrf`` at M = 1000 took 0.5-1.2 s threaded
#: against 0.01 s idle (0.02 s on one thread), and 8.7 s against 1.3 s at M = 5000.
#: One thread costs at most ~10 ms here and removes that risk.
SMALL_FACTOR_SIZE = 2048

#: What to change when a matrix is singular for all practical purposes (the solvers' case).
SINGULAR_ADVICE = (
    "Use fewer centers, a larger sigma or penalty, remove duplicated rows, or standardize "
    "the features (standardize=True: large, unscaled values lose the distances to round-off)."
)


class JitterWarning(UserWarning):
    """Cholesky needed more diagonal jitter than the default."""


def _factor_threads(size: int) -> contextlib.AbstractContextManager[None]:
    """BLAS threads for a factorisation of this size (see SINGLE_THREAD_FACTOR_SIZE, SMALL_FACTOR_SIZE)."""
    threaded = SMALL_FACTOR_SIZE <= size < SINGLE_THREAD_FACTOR_SIZE
    return contextlib.nullcontext() if threaded else blas_threads(1)


def cholesky_jitter(
    S: np.ndarray,
    *,
    what: str = "matrix",
    initial_jitter: float | None = None,
    max_jitter_ratio: float = 1e-2,
    overwrite: bool = False,
    advice: str = SINGULAR_ADVICE,
    escalate: bool = True,
    relative_jitter: float | None = None,
) -> tuple[np.ndarray, float]:
    """Upper Cholesky factor ``T`` with ``T^T T = S + jitter I``.

    Starts from ``initial_jitter`` (default: ``m * eps * mean(diag S)``, the usual
    round-off-level shift; 0 tries the plain factorisation first) and multiplies it
    by 100 until the factorisation succeeds. Escalating past the default raises a
    :class:`JitterWarning`; needing more than ``max_jitter_ratio * mean(diag S)``
    means the matrix is singular for all practical purposes and raises
    ``numpy.linalg.LinAlgError`` ending with ``advice`` (what the user should change).
    Only the upper triangle of ``S`` is factored, so ``S`` must be symmetric.

    Parameters
    ----------
    S : array_like of shape (m, m)
        Symmetric positive (semi)definite matrix. float32 is factored in float32
        (the default jitter is then float32's round-off); anything else in float64.
    what : str, default="matrix"
        Name of the matrix in messages.
    initial_jitter : float or None, default=None
        First jitter tried (None: the round-off-level default). Escalating past the
        larger of the two warns.
    max_jitter_ratio : float, default=1e-2
        Largest jitter accepted, relative to the mean diagonal.
    overwrite : bool, default=False
        Factor in ``S`` itself when it allows (see Memory).
    advice : str
        What to change when the matrix is singular (appended to the error).
    escalate : bool, default=True
        Raise the jitter on failure; with False the first failure raises
        ``numpy.linalg.LinAlgError`` (with ``S`` restored when factored in place).
    relative_jitter : float or None, default=None
        Start from ``relative_jitter * m * mean(diag S)`` instead of ``initial_jitter``
        (a floor on the jitter, relative to the matrix: see
        :data:`daskkrr.solvers.falkon.FLOAT32_RELATIVE_JITTER`).

    Returns
    -------
    T : ndarray of shape (m, m)
        Upper-triangular factor (Fortran-ordered, strict lower triangle zero), of ``S``'s dtype.
    jitter : float
        The jitter that was added.

    Raises
    ------
    ValueError
        If ``S`` is not square.
    numpy.linalg.LinAlgError
        If ``S`` has NaN/inf entries, a non-positive mean diagonal, or needs more
        than ``max_jitter_ratio`` of it as jitter.

    Notes
    -----
    Memory: ``S`` plus one ``m x m`` working matrix; with ``overwrite=True`` (``S``
    a symmetric, Fortran-ordered float32/64 array the caller gives up) the factor is
    built in ``S`` itself. A failed attempt only writes the upper triangle, so ``S``
    is restored from its lower triangle and diagonal before the next one.
    """
    S = np.asarray(S)
    dtype = np.float32 if S.dtype == np.float32 else np.float64
    S = S.astype(dtype, copy=False)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"{what} must be square; got shape {S.shape}")
    m = S.shape[0]
    if m == 0:
        return np.zeros((0, 0), dtype=dtype, order="F"), 0.0
    if not np.all(np.isfinite(S)):
        raise np.linalg.LinAlgError(f"{what} of shape {S.shape} has NaN or inf entries")
    diagonal = np.diag(S).copy()
    policy = JitterPolicy.for_matrix(S.shape, float(np.mean(diagonal)), dtype, what=what,
                                     initial_jitter=initial_jitter, max_jitter_ratio=max_jitter_ratio,
                                     relative_jitter=relative_jitter, advice=advice)
    jitter = policy.first
    in_place = overwrite and S.flags.f_contiguous and S.flags.writeable
    work = S if in_place else np.array(S, dtype=dtype, order="F")
    potrf = spotrf if dtype == np.float32 else dpotrf
    with _factor_threads(m):
        while True:
            work[np.diag_indices(m)] = diagonal + jitter
            # LAPACK's potrf on the upper triangle, in place; the lower triangle keeps S.
            T, info = potrf(work, lower=0, clean=0, overwrite_a=1)
            if info == 0 and np.all(np.isfinite(np.diag(T))):
                break
            if info < 0:  # pragma: no cover - an argument error, not a numerical one
                raise ValueError(f"LAPACK potrf rejected argument {-info} for the {what}")
            mirror_triangle(work, from_upper=False)
            if not escalate:
                work[np.diag_indices(m)] = diagonal
            jitter = policy.after_failure(jitter, escalate)
    _zero_lower(T)
    if not np.all(np.isfinite(T)):
        raise np.linalg.LinAlgError(f"Cholesky of the {what} of shape {S.shape} overflowed")
    policy.warn_if_escalated(jitter, stacklevel=2)
    return T, jitter


@dataclasses.dataclass(frozen=True)
class JitterPolicy:
    """The jitters :func:`cholesky_jitter` tries on a matrix, in order (see the module docstring).

    Shared with the tiled factorisation (:mod:`daskkrr.parallel.tiled_linalg`), which retries the
    whole factorisation with the next jitter when a diagonal tile fails, so both add the same jitter.
    """

    what: str
    shape: tuple[int, ...]
    scale: float
    default: float
    first: float
    limit: float
    advice: str = SINGULAR_ADVICE

    @classmethod
    def for_matrix(cls, shape: tuple[int, ...], scale: float, dtype: Any, *, what: str = "matrix",
                   initial_jitter: float | None = None, max_jitter_ratio: float = 1e-2,
                   relative_jitter: float | None = None, advice: str = SINGULAR_ADVICE) -> JitterPolicy:
        """The policy of a matrix of ``shape`` whose mean diagonal is ``scale``, factored in ``dtype``
        (the arguments as :func:`cholesky_jitter`'s); ``LinAlgError`` for a non-positive ``scale``."""
        if not scale > 0:
            raise np.linalg.LinAlgError(
                f"{what} of shape {tuple(shape)} has a non-positive mean diagonal ({scale:g}); "
                "the kernel is degenerate on these points (e.g. a linear or polynomial kernel on all-zero "
                "or constant features): use another kernel or informative features"
            )
        m = int(shape[0])
        default = m * float(np.finfo(dtype).eps) * scale
        if relative_jitter is not None:
            initial_jitter = relative_jitter * m * scale
        first = default if initial_jitter is None else float(initial_jitter)
        return cls(what=what, shape=tuple(int(s) for s in shape), scale=scale, default=default, first=first,
                   limit=max_jitter_ratio * scale, advice=advice)

    def after_failure(self, jitter: float, escalate: bool = True) -> float:
        """The jitter to try after a failure with ``jitter``; ``LinAlgError`` when there is none."""
        if not escalate:
            raise np.linalg.LinAlgError(f"Cholesky of the {self.what} of shape {self.shape} failed "
                                        f"(jitter {jitter:.3g})")
        if jitter >= self.limit:
            raise np.linalg.LinAlgError(
                f"Cholesky of the {self.what} of shape {self.shape} failed even with jitter {jitter:.3g} "
                f"({jitter / self.scale:.1e} of its mean diagonal): the problem is singular. {self.advice}"
            )
        return min(jitter * 100 if jitter > 0 else self.default, self.limit)

    def warn_if_escalated(self, jitter: float, stacklevel: int = 2) -> None:
        """A :class:`JitterWarning` when more than the first (or round-off) jitter was needed."""
        if jitter > max(self.default, self.first) * (1 + 1e-12):
            warnings.warn(
                f"Cholesky of the {self.what} of shape {self.shape} needed jitter {jitter:.3g} "
                f"({jitter / self.scale:.1e} of its mean diagonal); centers may be near-duplicates, or large "
                "unstandardized features lose their distances to round-off (standardize=True)",
                JitterWarning,
                stacklevel=stacklevel + 1,
            )


#: Columns handled at a time when copying or clearing a triangle (bounds temporaries).
_STRIP = 256


def mirror_triangle(A: np.ndarray, *, from_upper: bool) -> None:
    """Make square ``A`` symmetric in place by copying one strict triangle onto the other.

    Works a strip of columns at a time, so no ``m x m`` temporary is made.
    """
    m = A.shape[0]
    for j in range(0, m, _STRIP):
        k = min(m, j + _STRIP)
        block = A[j:k, j:k]
        if from_upper:
            A[j:k, :j] = A[:j, j:k].T
            lower = np.tril_indices(k - j, -1)
            block[lower] = block.T[lower]
        else:
            A[:j, j:k] = A[j:k, :j].T
            upper = np.triu_indices(k - j, 1)
            block[upper] = block.T[upper]


def _zero_lower(A: np.ndarray) -> None:
    """Clear the strict lower triangle of ``A``, in place."""
    m = A.shape[0]
    for j in range(0, m, _STRIP):
        k = min(m, j + _STRIP)
        A[k:, j:k] = 0.0
        block = A[j:k, j:k]
        block[np.tril_indices(k - j, -1)] = 0.0


#: Right-hand sides from which a float32 ``T`` is upcast for BLAS rather than read by the mixed loops.
MIXED_SOLVE_MAX_COLUMNS = 32


def solve_upper(T: np.ndarray, B: np.ndarray, trans: bool = False) -> np.ndarray:
    """``T^{-1} B`` (or ``T^{-T} B`` with ``trans``) for upper-triangular ``T``, in float64.

    A float32 ``T`` (a float32-factored preconditioner) is read as it is, in float64
    arithmetic (:func:`daskkrr.utils.mixed_solve.solve_upper_mixed`), for a few
    right-hand sides; for more it is upcast for BLAS.
    """
    if T.dtype == np.float32:
        if np.ndim(B) == 1 or np.shape(B)[1] <= MIXED_SOLVE_MAX_COLUMNS:
            from daskkrr.utils.mixed_solve import solve_upper_mixed

            return solve_upper_mixed(T, B, trans=trans)
        T = T.astype(np.float64)
    return sla.solve_triangular(T, B, lower=False, trans="T" if trans else "N", check_finite=False)
