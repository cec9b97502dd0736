"""Small dense linear algebra on the client: Cholesky with jitter escalation."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import scipy.linalg as sla

#: Above this size the factorisation runs single-threaded: scipy's bundled
#: OpenBLAS has been seen to crash in multithreaded Cholesky at M >= 16 000.
SINGLE_THREAD_FACTOR_SIZE = 8000


class JitterWarning(UserWarning):
    """Cholesky needed more diagonal jitter than the default."""


def _blas_limit(size: int):
    if size < SINGLE_THREAD_FACTOR_SIZE:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def cholesky_jitter(
    S: np.ndarray,
    *,
    what: str = "matrix",
    initial_jitter: float | None = None,
    max_jitter_ratio: float = 1e-2,
) -> tuple[np.ndarray, float]:
    """Upper Cholesky factor ``T`` with ``T^T T = S + jitter I``.

    Starts from ``initial_jitter`` (default: ``m * eps * mean(diag S)``, the usual
    round-off-level shift) and multiplies it by 100 until the factorisation
    succeeds. Escalating past the default raises a :class:`JitterWarning`; needing
    more than ``max_jitter_ratio * mean(diag S)`` means the matrix is singular for
    all practical purposes and raises ``numpy.linalg.LinAlgError``.
    """
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"{what} must be square; got shape {S.shape}")
    m = S.shape[0]
    if not np.all(np.isfinite(S)):
        raise np.linalg.LinAlgError(f"{what} of shape {S.shape} has NaN or inf entries")
    scale = float(np.mean(np.diag(S))) if m else 1.0
    if not scale > 0:
        raise np.linalg.LinAlgError(
            f"{what} of shape {S.shape} has a non-positive mean diagonal ({scale:g}); "
            "the kernel is degenerate on these points (e.g. a linear or polynomial kernel on all-zero "
            "or constant features): use another kernel or informative features"
        )
    default = m * np.finfo(np.float64).eps * scale
    jitter = default if initial_jitter is None else float(initial_jitter)
    limit = max_jitter_ratio * scale
    diag = np.diag_indices(m)
    with _blas_limit(m):
        while True:
            # One working copy per attempt, factored in place (Fortran order, so LAPACK does
            # not copy again): the peak is S plus one m x m matrix.
            work = np.array(S, dtype=np.float64, order="F")
            work[diag] += jitter
            try:
                T = sla.cholesky(work, lower=False, overwrite_a=True, check_finite=False)
                if np.all(np.isfinite(T)):
                    break
            except np.linalg.LinAlgError:
                pass
            del work
            if jitter >= limit:
                raise np.linalg.LinAlgError(
                    f"Cholesky of the {what} of shape {S.shape} failed even with jitter {jitter:.3g} "
                    f"({jitter / scale:.1e} of its mean diagonal): the problem is singular. "
                    "Use fewer centers, a larger sigma or penalty, remove duplicated rows, or standardize "
                    "the features (standardize=True: large, unscaled values lose the distances to round-off)."
                )
            jitter = min(jitter * 100, limit)
    if jitter > default * (1 + 1e-12):
        warnings.warn(
            f"Cholesky of the {what} of shape {S.shape} needed jitter {jitter:.3g} "
            f"({jitter / scale:.1e} of its mean diagonal); centers may be near-duplicates, or large "
            "unstandardized features lose their distances to round-off (standardize=True)",
            JitterWarning,
            stacklevel=2,
        )
    return T, jitter


def solve_upper(T: np.ndarray, B: np.ndarray, trans: bool = False) -> np.ndarray:
    """``T^{-1} B`` (or ``T^{-T} B`` with ``trans``) for upper-triangular ``T``."""
    return sla.solve_triangular(T, B, lower=False, trans="T" if trans else "N", check_finite=False)
