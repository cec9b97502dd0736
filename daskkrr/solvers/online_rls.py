"""Online and sliding-window ridge leverage-score sampling (Ray and Musco), in numpy.

Notation of the poster (``../shared/papers/online-sliding-window-rls-ray-musco.txt``):
rows ``b_i`` arrive one by one, ``K_i = B_i B_i^T`` is the kernel matrix of the
first ``i`` rows, ``S`` the sampling matrix whose kept column ``j`` is
``e_j / sqrt(p_j)`` (so ``B^T S S^T B = sum_kept b_j b_j^T / p_j``) and ``lam``
the ridge, fixed for the whole stream.

Online sampling (unbounded stream)
    Row ``i`` gets the approximate online ridge leverage score
    ``l~_i = 3/(2 lam) (K_ii - k_iS (S^T K S + lam I)^-1 k_Si)``, computed against
    the rows kept *before* it, and is kept with probability ``p_i = min(c l~_i, 1)``
    and weight ``1/p_i``. The poster's guarantee:
    ``(1/2)(B^T B + lam I) <= B^T S S^T B + lam I <= (3/2)(B^T B + lam I)`` at
    every step, with ``O(d_eff log n log(||K||/lam))`` samples.

Sliding window (Algorithm 1)
    Landmarks older than the window are deleted, the newest rows are added, and
    every landmark, newest first, gets the approximate *reverse* online score
    ``zeta~_j = min(3/(2 lam) (K_jj - k_jN (S^T K_NN S + lam I)^-1 k_Nj), 1)``
    against the kept landmarks ``N`` newer than it, and is kept with probability
    ``min(c zeta~_j, 1)``. A landmark already kept with probability ``p_old`` is
    kept with probability ``p_new / p_old`` (``p_new = min(c zeta~_j, 1, p_old)``),
    so that its probability of being in the sample is ``p_new`` -- the rule of
    online row sampling (Cohen, Musco and Pachocki 2016, the poster's [1]) that
    Algorithm 1 builds on; redrawing ``min(c zeta~, 1)`` afresh at every step
    would make old landmarks vanish at an exponential rate. Reverse scores only
    decrease as newer rows arrive, so the rule is always a probability.

Both reduce to one sequential sweep (:func:`sweep`): candidates in order, each
scored against the kept rows before it (the prior dictionary, whitened once for
the whole batch, plus those kept earlier in the batch, by rank-one updates of
the residuals). The same sweep with ``lam = 0`` and "keep if the residual is
above round-off" builds an orthonormal basis of the landmarks' span (a Cholesky
factor of ``K_DD``), which :mod:`daskkrr.solvers.online` uses for the ridge
regression.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import scipy.linalg as sla

from daskkrr.kernels import Kernel
from daskkrr.kernels.sparse import DENSE_PIECE_BYTES, dense_rows, is_sparse

#: Leverage-score factor of the poster's approximate scores, (1 + eps) with eps = 1/2.
SCORE_FACTOR = 1.5

#: A landmark joins the span basis only if its residual ``K_zz - ||P k_z||^2`` is above
#: this fraction of ``K_zz``: below, it is in the span to round-off.
SPAN_TOL = 1e-10


@dataclasses.dataclass
class SweepResult:
    """What a sequential sweep over candidates decided.

    Attributes
    ----------
    accepted : ndarray of int
        Positions (in candidate order) of the accepted candidates.
    scales : ndarray of float
        ``1/sqrt(p)`` of each accepted candidate (``p`` its sampling probability).
    residuals : ndarray of shape (b,)
        ``K_xx - ||v(x)||^2`` of every candidate when its turn came (``lam`` times
        its online ridge leverage score).
    new_rows : ndarray of shape (k, m0 + k)
        Rows to append to the lower Cholesky factor (m0: its size before).
    coords : ndarray of shape (m0 + k, b)
        Whitened coordinates ``v(x)`` of the candidates; a component added by
        candidate ``a`` is zero for the candidates before ``a``.
    """

    accepted: np.ndarray
    scales: np.ndarray
    residuals: np.ndarray
    new_rows: np.ndarray
    coords: np.ndarray


def whiten(L: np.ndarray, scale: np.ndarray, Kzx: np.ndarray) -> np.ndarray:
    """``L^{-1} (diag(scale) K_zx)``: coordinates against a dictionary factor."""
    if L.shape[0] == 0:
        return np.zeros((0, Kzx.shape[1]))
    return sla.solve_triangular(L, scale[:, None] * Kzx, lower=True, check_finite=False)


def sweep(
    V0: np.ndarray,
    residual0: np.ndarray,
    Xc: np.ndarray,
    kernel: Kernel,
    lam: float,
    accept: Callable[[int, float], float],
) -> SweepResult:
    """Score and accept candidates in order, each against the dictionary kept before it.

    The dictionary's factor is ``L L^T = S^T K_DD S + lam I``; ``V0 = L^{-1} S K_D,c``
    and ``residual0 = diag K_cc - colsum V0^2`` describe the candidates against
    the dictionary before the sweep. When candidate ``a`` is accepted with scale
    ``s`` (``1/sqrt(p)``), the factor gains the row ``[s v(x_a), dd]`` with
    ``dd = sqrt(lam + s^2 r_a)``, and every later candidate ``x`` the coordinate
    ``s (k(x_a, x) - v(x_a) . v(x)) / dd`` (Sherman-Morrison in kernel form).

    Parameters
    ----------
    V0 : ndarray of shape (m0, b)
    residual0 : ndarray of shape (b,)
    Xc : ndarray of shape (b, d)
        The candidates, in processing order.
    kernel : Kernel
    lam : float
        Ridge of the factor (0 for a span basis).
    accept : callable ``(position, residual) -> scale``
        The decision: 0 to reject, ``1/sqrt(p) > 0`` to accept with probability ``p``.

    Returns
    -------
    SweepResult
    """
    m0, b = V0.shape
    # One kernel row per accepted candidate: on a sparse block each is a few scipy calls
    # (~1 ms of overhead, 3-4x the dense row), so a block that densifies within the engines'
    # dense piece is densified once; the same kernel to round-off.
    if is_sparse(Xc) and Xc.shape[0] * Xc.shape[1] * Xc.dtype.itemsize <= DENSE_PIECE_BYTES:
        Xc = dense_rows(Xc)
    ext = np.zeros((min(b, 16), b))  # components added in this sweep (grown by doubling)
    residual = np.array(residual0, dtype=np.float64, copy=True)
    seen = np.empty(b)
    accepted: list[int] = []
    scales: list[float] = []
    rows: list[np.ndarray] = []
    for i in range(b):
        r_i = max(float(residual[i]), 0.0)
        seen[i] = r_i
        s = float(accept(i, r_i))
        if s <= 0.0:
            continue
        k = len(accepted)
        if k == ext.shape[0]:
            ext = np.vstack([ext, np.zeros_like(ext)])
        v_i = np.concatenate([V0[:, i], ext[:k, i]])
        dd = float(np.sqrt(lam + s * s * r_i))
        if dd <= 0.0:
            raise ValueError("a zero pivot: lam must be > 0, or a span candidate must have a residual > 0")
        rows.append(np.concatenate([s * v_i, [dd]]))
        ext[k, i] = s * r_i / dd
        if i + 1 < b:
            kap = kernel(Xc[i:i + 1], Xc[i + 1:])[0]
            inner = V0[:, i] @ V0[:, i + 1:] + ext[:k, i] @ ext[:k, i + 1:]
            comp = s * (kap - inner) / dd
            ext[k, i + 1:] = comp
            residual[i + 1:] -= comp * comp
        accepted.append(i)
        scales.append(s)
    k = len(accepted)
    new_rows = np.zeros((k, m0 + k))
    for a, row in enumerate(rows):
        new_rows[a, : row.size] = row
    return SweepResult(
        accepted=np.asarray(accepted, dtype=np.int64), scales=np.asarray(scales, dtype=np.float64),
        residuals=seen, new_rows=new_rows, coords=np.vstack([V0, ext[:k]]),
    )


def extend_factor(L: np.ndarray, new_rows: np.ndarray) -> np.ndarray:
    """The lower factor ``L`` with the rows of a sweep appended."""
    m0, k = L.shape[0], new_rows.shape[0]
    out = np.zeros((m0 + k, m0 + k))
    out[:m0, :m0] = L
    out[m0:, :] = new_rows
    return out


def online_rule(lam: float, c: float, uniforms: np.ndarray, probs_out: np.ndarray) -> Callable[[int, float], float]:
    """The online rule: keep with ``p = min(c l~, 1)``, ``l~ = 3/(2 lam) residual``.

    ``probs_out[i]`` receives the probability of candidate ``i`` (kept or not).
    """

    def accept(i: int, residual: float) -> float:
        p = min(c * SCORE_FACTOR * residual / lam, 1.0)
        probs_out[i] = p
        return 1.0 / np.sqrt(p) if (p > 0.0 and uniforms[i] < p) else 0.0

    return accept


def reverse_rule(
    lam: float, c: float, uniforms: np.ndarray, prior: np.ndarray, probs_out: np.ndarray,
) -> Callable[[int, float], float]:
    """Algorithm 1's rule: ``p = min(c zeta~, 1, p_prior)``, kept with probability ``p / p_prior``."""

    def accept(i: int, residual: float) -> float:
        zeta = min(SCORE_FACTOR * residual / lam, 1.0)
        p = min(c * zeta, 1.0, float(prior[i]))
        probs_out[i] = p
        return 1.0 / np.sqrt(p) if (p > 0.0 and uniforms[i] * prior[i] < p) else 0.0

    return accept


def span_rule(kdiag: np.ndarray, allowed: np.ndarray | None = None) -> Callable[[int, float], float]:
    """Basis rule: a candidate (allowed, e.g. kept by the sampler) joins if it adds to the span."""

    def accept(i: int, residual: float) -> float:
        if allowed is not None and not allowed[i]:
            return 0.0
        return 1.0 if residual > SPAN_TOL * float(kdiag[i]) else 0.0

    return accept


@dataclasses.dataclass
class WindowSample:
    """Outcome of Algorithm 1 on one batch: the new landmarks (as candidate positions) and all scores."""

    positions: np.ndarray
    probs: np.ndarray
    candidate_probs: np.ndarray


def window_resample(
    Xc: np.ndarray, prior: np.ndarray, kernel: Kernel, lam: float, c: float, uniforms: np.ndarray,
) -> WindowSample:
    """Steps 3-4 of Algorithm 1 over candidates given newest first.

    ``Xc`` holds the newest rows (prior probability 1) followed by the surviving
    landmarks, newest first (prior: their current probability). Each candidate
    is scored against the kept candidates newer than it (its approximate reverse
    online ridge leverage score) and kept by :func:`reverse_rule`.
    """
    b = Xc.shape[0]
    probs = np.zeros(b)
    kdiag = kernel.diag(Xc)
    res = sweep(np.zeros((0, b)), kdiag, Xc, kernel, lam, reverse_rule(lam, c, uniforms, prior, probs))
    return WindowSample(positions=res.accepted, probs=probs[res.accepted], candidate_probs=probs)


__all__ = [
    "SCORE_FACTOR",
    "SPAN_TOL",
    "SweepResult",
    "WindowSample",
    "extend_factor",
    "online_rule",
    "reverse_rule",
    "span_rule",
    "sweep",
    "whiten",
    "window_resample",
]
