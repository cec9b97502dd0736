"""Kernel ridge regression on an online dictionary, from sufficient statistics (numpy only).

The model after ``n`` rows minimises ``(1/n) sum_i (y_i - f(x_i))^2 + penalty ||f||^2``
over ``f`` in the span of the dictionary's landmarks: the normalised objective of
every daskkrr estimator, i.e. the unnormalised ridge ``penalty * n`` (``n`` the rows
in the model: all rows seen, or the window). The sampler keeps its own ridge
``lam`` fixed for the whole stream, as in the poster. The model is kept in the
coordinates of an orthonormal basis of that span:
``K_BB = L L^T`` (``B`` the landmarks that add to the span, :data:`SPAN_TOL`),
``psi(x) = L^{-1} k_B(x)``; the statistics are ``G = sum psi psi^T`` and
``H = sum psi y^T`` (``L^{-1} K_BN K_NB L^{-T}`` and ``L^{-1} K_BN y``: the
``K_DN K_ND`` and ``K_DN y`` of the issue in orthonormal coordinates), and
``f = k_B(.)^T L^{-T} (G + penalty n I)^{-1} H``.

Unbounded stream: what happens when a landmark enters
    Past rows are not stored, so the kernel row ``k(z_new, x_j)`` of a new
    landmark against a past row ``x_j`` is not available. Each row is therefore
    represented by its projection onto the span of the dictionary *when it
    arrived* (itself included when it was kept): in orthonormal coordinates the
    projection of an old row onto the new basis vector is exactly zero, so a
    landmark entering costs nothing but a zero row and column of ``G``
    (``O(r^2)`` copy), and a batch of ``b`` rows is a rank-``b`` update
    ``G += Psi Psi^T``. The model is then exact ridge regression in the span of
    the dictionary over the projected rows; rows in that span (every kept row,
    and every row when ``c`` is so large that every point is kept) are exact, so
    that case is exact KRR on all rows. Landmarks never leave an unbounded model.

Sliding window: what happens when a landmark leaves
    Algorithm 1 changes the dictionary at every step (landmarks older than the
    window are deleted, others are resampled away, the newest rows enter), and
    exact ridge regression over the last ``W`` rows needs every window row
    against every landmark. The window's rows are kept (a ring buffer of
    ``W x d`` features and ``W x t`` targets: bounded, and needed anyway to
    forget a row when it leaves the window). After each batch the basis is
    refactored from the landmarks (``O(s^2 d + s^3)``) and ``G``, ``H`` are
    rebuilt from the buffer: ``O(W s (d + s))``, one kernel block of the window
    against the dictionary -- the cost of one pass of a direct Nystrom fit over
    the window, independent of how many rows were ever seen. The model is then
    exactly Nystrom KRR over the window with the current dictionary, and exact
    KRR on the last ``W`` rows when every point is kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from daskkrr.kernels import Kernel
from daskkrr.kernels.sparse import as_sparse_rows, cast_rows, dense_rows, is_sparse, take_rows
from daskkrr.solvers.online_rls import (
    extend_factor,
    online_rule,
    span_rule,
    sweep,
    whiten,
    window_resample,
)

#: Window rows turned into coordinates at a time when the statistics are rebuilt.
REBUILD_ROWS = 8192

#: How ``penalty`` is read, recorded in saved models: ``penalty * n`` is the regression's ridge.
#: Files without the record are from before it (``lam`` the ridge of both sampler and regression).
PENALTY_CONVENTION = "normalised"

#: Array fields of :class:`OnlineState`, in the order they are saved.
STATE_ARRAYS = ("landmarks", "landmark_rows", "landmark_probs", "sampler_factor", "basis", "basis_factor",
                "gram", "rhs", "window_X", "window_y")


#: Names under which a sparse window buffer is saved: the values, column indices and row pointers of its
#: CSR matrix, and its shape (instead of ``window_X``).
SPARSE_WINDOW = ("window_X_data", "window_X_indices", "window_X_indptr", "window_X_shape")


def _saved_array(arrays: dict[str, np.ndarray], name: str) -> Any:
    """A saved state array; the window from its CSR arrays when it was saved sparse."""
    if name == "window_X" and name not in arrays and all(part in arrays for part in SPARSE_WINDOW):
        data, indices, indptr, shape = (np.asarray(arrays[part]) for part in SPARSE_WINDOW)
        try:
            return sp.csr_matrix((data, indices, indptr), shape=tuple(int(v) for v in shape))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the online state's sparse window is damaged ({exc})") from exc
    return np.asarray(arrays[name])


@dataclasses.dataclass
class OnlineState:
    """Everything an online model carries from one batch to the next.

    Attributes
    ----------
    lam, c : float
        Ridge (kernel-matrix units, fixed for the stream) and oversampling constant of the sampler.
    penalty : float
        Normalised ridge of the regression: its unnormalised ridge is ``penalty * n_model``.
    window : int or None
        Rows of the sliding window, None for the unbounded stream.
    n_seen : int
        Rows processed since the start of the stream.
    landmarks, landmark_rows, landmark_probs
        The sampled dictionary: rows (in the order they arrived), their global row
        numbers and sampling probabilities (their weight in ``S S^T`` is ``1/p``).
    sampler_factor : ndarray of shape (m, m)
        Lower Cholesky factor of ``S^T K_DD S + lam I`` (unbounded stream only).
    basis : ndarray of int
        Positions in ``landmarks`` of the orthonormal span basis.
    basis_factor : ndarray of shape (r, r)
        Lower Cholesky factor of ``K_BB``.
    gram, rhs : ndarrays of shapes (r, r) and (r, t)
        ``sum psi psi^T`` and ``sum psi y^T`` over the rows seen (or the window).
    window_X, window_y : ndarrays
        The last ``min(n_seen, window)`` rows (empty without a window); ``window_X`` is a CSR matrix
        once a sparse batch has entered the window.
    """

    lam: float
    c: float
    penalty: float
    window: int | None
    landmarks: np.ndarray
    landmark_rows: np.ndarray
    landmark_probs: np.ndarray
    sampler_factor: np.ndarray
    basis: np.ndarray
    basis_factor: np.ndarray
    gram: np.ndarray
    rhs: np.ndarray
    window_X: Any
    window_y: np.ndarray
    n_seen: int = 0

    @classmethod
    def empty(cls, lam: float, c: float, penalty: float, window: int | None, n_features: int,
              n_targets: int) -> OnlineState:
        """The state before the first row."""
        return cls(
            lam=float(lam), c=float(c), penalty=float(penalty), window=window,
            landmarks=np.zeros((0, n_features)), landmark_rows=np.zeros(0, dtype=np.int64),
            landmark_probs=np.zeros(0), sampler_factor=np.zeros((0, 0)), basis=np.zeros(0, dtype=np.int64),
            basis_factor=np.zeros((0, 0)), gram=np.zeros((0, 0)), rhs=np.zeros((0, n_targets)),
            window_X=np.zeros((0, n_features)), window_y=np.zeros((0, n_targets)),
        )

    @property
    def n_features(self) -> int:
        return int(self.landmarks.shape[1])

    @property
    def n_targets(self) -> int:
        return int(self.rhs.shape[1])

    @property
    def n_model(self) -> int:
        """Rows the regression is over: all rows seen, or those in the window."""
        return self.n_seen if self.window is None else min(self.n_seen, self.window)

    @property
    def ridge(self) -> float:
        """The regression's unnormalised ridge, ``penalty * n_model``."""
        return self.penalty * self.n_model

    def arrays(self) -> dict[str, np.ndarray]:
        """The array fields by name (for saving); a sparse window as its CSR arrays (:data:`SPARSE_WINDOW`)."""
        out = {name: getattr(self, name) for name in STATE_ARRAYS}
        if is_sparse(self.window_X):
            csr = as_sparse_rows(self.window_X)
            del out["window_X"]
            parts = (csr.data, csr.indices, csr.indptr, np.asarray(csr.shape, dtype=np.int64))
            out.update(zip(SPARSE_WINDOW, parts))
        return out

    def scalars(self) -> dict[str, Any]:
        """The scalar fields (JSON-ready)."""
        return {"lam": self.lam, "c": self.c, "penalty": self.penalty, "penalty_convention": PENALTY_CONVENTION,
                "window": self.window, "n_seen": self.n_seen}

    @classmethod
    def from_saved(cls, scalars: dict[str, Any], arrays: dict[str, np.ndarray]) -> OnlineState:
        """Rebuild a state from :meth:`scalars` and :meth:`arrays` (checked shapes).

        ``scalars`` in the unnormalised convention (no ``penalty_convention``)
        must be converted by :func:`normalise_saved_scalars` first.
        """
        state = cls(
            lam=float(scalars["lam"]), c=float(scalars["c"]), penalty=float(scalars["penalty"]),
            window=None if scalars["window"] is None else int(scalars["window"]),
            n_seen=int(scalars["n_seen"]), **{name: _saved_array(arrays, name) for name in STATE_ARRAYS},
        )
        state.check()
        return state

    def check(self) -> None:
        """ValueError unless the arrays fit together."""
        m, d = self.landmarks.shape
        r, t = self.basis.size, self.rhs.shape[1]
        ok = (self.landmark_rows.shape == (m,) and self.landmark_probs.shape == (m,)
              and self.sampler_factor.shape == ((m, m) if self.window is None else (0, 0))
              and self.basis_factor.shape == (r, r) and self.gram.shape == (r, r) and self.rhs.shape == (r, t)
              and self.window_X.shape[1] == d and self.window_y.shape == (self.window_X.shape[0], t)
              and (r == 0 or (self.basis.min() >= 0 and self.basis.max() < m)))
        if not ok:
            raise ValueError("the online state's arrays do not fit together (damaged or edited)")


def normalise_saved_scalars(scalars: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Saved state scalars in the normalised convention, and a note of the conversion (None if none).

    Before the convention was recorded, one fixed ``lam`` was the ridge of both the
    sampler and the regression ``sum_i (y_i - f(x_i))^2 + lam ||f||^2``. The sampler
    keeps ``lam``; the regression's ``penalty`` becomes ``lam / n_model``, the
    normalised penalty with the same ridge now, so the converted model predicts
    exactly as saved (later rows then grow the ridge as ``penalty * n``).
    """
    if scalars.get("penalty_convention") == PENALTY_CONVENTION:
        return scalars, None
    if "penalty_convention" in scalars:
        raise ValueError(f"unknown penalty_convention {scalars['penalty_convention']!r} in the online state; "
                         f"this version writes {PENALTY_CONVENTION!r}: save the model again with it")
    lam, n_seen, window = float(scalars["lam"]), int(scalars["n_seen"]), scalars["window"]
    n_model = max(1, n_seen if window is None else min(n_seen, int(window)))
    penalty = lam / n_model
    note = (f"the model was saved with the unnormalised online penalty lam={lam:g} (ridge of "
            f"sum_i (y_i - f(x_i))^2 + lam ||f||^2); converted to the normalised convention of every daskkrr "
            f"estimator: penalty={penalty:g} (= lam / {n_model} rows) and gamma={lam:g} (the sampler's ridge). "
            "Save the model again to record the conversion")
    return {**scalars, "penalty": penalty, "penalty_convention": PENALTY_CONVENTION}, note


@dataclasses.dataclass
class Projections:
    """A batch against the current dictionary: what the blockwise pass computes.

    ``V0 = L_S^{-1} S K_D,b`` with its residuals (sampler), ``U0 = L_B^{-1} K_B,b``
    with its residuals (span basis) and ``diag K_bb``.
    """

    V0: np.ndarray
    res0: np.ndarray
    U0: np.ndarray
    resb0: np.ndarray
    kdiag: np.ndarray

    @classmethod
    def concat(cls, parts: list[Projections]) -> Projections:
        """Block results side by side, in row order."""
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts], axis=-1)
                     for f in dataclasses.fields(cls)))


def batch_projections(Xb: np.ndarray, kernel: Kernel, landmarks: np.ndarray, probs: np.ndarray,
                      sampler_factor: np.ndarray, basis: np.ndarray, basis_factor: np.ndarray) -> Projections:
    """One block of a batch against the dictionary (a pure function: a block task)."""
    Xb = cast_rows(Xb, np.float64)  # sparse rows stay sparse: their kernel blocks come from sparse products
    kdiag = kernel.diag(Xb)
    if landmarks.shape[0] == 0:
        V0 = np.zeros((0, Xb.shape[0]))
        U0 = V0
    else:
        Kzb = kernel(landmarks, Xb)
        V0 = whiten(sampler_factor, 1.0 / np.sqrt(probs), Kzb)
        U0 = whiten(basis_factor, np.ones(basis.size), Kzb[basis])
    return Projections(V0, kdiag - np.einsum("ij,ij->j", V0, V0), U0, kdiag - np.einsum("ij,ij->j", U0, U0),
                       kdiag)


def state_projections(state: OnlineState, Xb: np.ndarray, kernel: Kernel) -> Projections:
    """:func:`batch_projections` of a whole batch against ``state``'s dictionary."""
    return batch_projections(Xb, kernel, state.landmarks, state.landmark_probs, state.sampler_factor,
                             state.basis, state.basis_factor)


@dataclasses.dataclass
class StepInfo:
    """What one batch did: the sampling probability of each candidate and which were kept."""

    probs: np.ndarray
    kept: np.ndarray


def online_step(state: OnlineState, Xb: np.ndarray, Yb: np.ndarray, proj: Projections, kernel: Kernel,
                rng: np.random.Generator) -> tuple[OnlineState, StepInfo]:
    """One batch of the unbounded stream: online RLS sampling, then the rank-b statistics update.

    Returns a new state (``state`` is not modified) and the batch's probabilities.
    """
    b = Xb.shape[0]
    uniforms = np.asarray(rng.random(b))  # one per row, whatever the batching
    probs = np.zeros(b)
    samp = sweep(proj.V0, proj.res0, Xb, kernel, state.lam, online_rule(state.lam, state.c, uniforms, probs))
    m, k = state.landmarks.shape[0], samp.accepted.size
    kept = np.zeros(b, dtype=bool)
    kept[samp.accepted] = True
    span = sweep(proj.U0, proj.resb0, Xb, kernel, 0.0, span_rule(proj.kdiag, kept))
    landmark_position = np.full(b, -1, dtype=np.int64)
    landmark_position[samp.accepted] = m + np.arange(k)
    r, kb = state.basis.size, span.accepted.size
    Psi = span.coords  # coordinates at arrival: zero on basis vectors added after the row
    gram = np.zeros((r + kb, r + kb))
    gram[:r, :r] = state.gram
    gram += Psi @ Psi.T
    rhs = np.zeros((r + kb, state.n_targets))
    rhs[:r] = state.rhs
    rhs += Psi @ Yb
    new = dataclasses.replace(
        state,
        landmarks=np.vstack([state.landmarks, dense_rows(take_rows(Xb, samp.accepted))]),
        landmark_rows=np.concatenate([state.landmark_rows, state.n_seen + samp.accepted]),
        landmark_probs=np.concatenate([state.landmark_probs, probs[samp.accepted]]),
        sampler_factor=extend_factor(state.sampler_factor, samp.new_rows),
        basis=np.concatenate([state.basis, landmark_position[span.accepted]]),
        basis_factor=extend_factor(state.basis_factor, span.new_rows),
        gram=gram, rhs=rhs, n_seen=state.n_seen + b,
    )
    return new, StepInfo(probs=probs, kept=kept)


def window_step(state: OnlineState, Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel,
                rng: np.random.Generator) -> tuple[OnlineState, StepInfo]:
    """One batch of Algorithm 1: forget, add, resample newest first, rebuild the window statistics.

    ``StepInfo.probs`` are those of the candidates (newest rows first, then the
    surviving landmarks newest first) and ``kept`` which of them stay.
    """
    W = int(state.window)  # type: ignore[arg-type]
    b = Xb.shape[0]
    n_new = state.n_seen + b
    first = n_new - W  # global row number of the oldest row in the window
    fresh = np.arange(max(0, b - W), b)  # batch rows inside the window
    alive = np.flatnonzero(state.landmark_rows >= first)  # step 1: older landmarks are deleted
    alive = alive[np.argsort(-state.landmark_rows[alive], kind="stable")]
    Xc = stack_rows([take_rows(Xb, fresh[::-1]), state.landmarks[alive]])  # step 2: newest rows join, newest first
    rows = np.concatenate([state.n_seen + fresh[::-1], state.landmark_rows[alive]])
    prior = np.concatenate([np.ones(fresh.size), state.landmark_probs[alive]])
    ws = window_resample(Xc, prior, kernel, state.lam, state.c, np.asarray(rng.random(Xc.shape[0])))  # steps 3-4
    order = np.argsort(rows[ws.positions], kind="stable")
    keep = ws.positions[order]
    landmarks = dense_rows(take_rows(Xc, keep))
    window_X = stack_rows([state.window_X, Xb])[-W:]
    window_y = np.vstack([state.window_y, Yb])[-W:]
    kdiag = kernel.diag(landmarks)
    span = sweep(np.zeros((0, keep.size)), kdiag, landmarks, kernel, 0.0, span_rule(kdiag))
    basis_factor = extend_factor(np.zeros((0, 0)), span.new_rows)
    gram, rhs = window_statistics(kernel, landmarks[span.accepted], basis_factor, window_X, window_y)
    kept = np.zeros(Xc.shape[0], dtype=bool)
    kept[ws.positions] = True
    new = dataclasses.replace(
        state, landmarks=landmarks, landmark_rows=rows[keep], landmark_probs=ws.candidate_probs[keep],
        basis=span.accepted, basis_factor=basis_factor, gram=gram, rhs=rhs,
        window_X=window_X, window_y=window_y, n_seen=n_new,
    )
    return new, StepInfo(probs=ws.candidate_probs, kept=kept)


def stack_rows(parts: list[Any]) -> Any:
    """Row blocks one above the other, float64: CSR when any is sparse (a sparse stream's batches and window
    stay sparse; dense landmarks joining them are few rows), numpy otherwise."""
    if any(is_sparse(p) for p in parts):
        return sp.vstack([as_sparse_rows(p) if is_sparse(p) else sp.csr_matrix(np.asarray(p)) for p in parts],
                         format="csr", dtype=np.float64)
    return np.concatenate([np.asarray(p) for p in parts]).astype(np.float64, copy=False)


def window_statistics(kernel: Kernel, Zb: np.ndarray, basis_factor: np.ndarray, X: np.ndarray,
                      Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``G = Psi Psi^T`` and ``H = Psi Y`` over the window rows, ``Psi = L^{-1} K_B,window``."""
    r = Zb.shape[0]
    gram, rhs = np.zeros((r, r)), np.zeros((r, Y.shape[1]))
    if r == 0:
        return gram, rhs
    ones = np.ones(r)
    for start in range(0, X.shape[0], REBUILD_ROWS):
        Psi = whiten(basis_factor, ones, kernel(Zb, X[start:start + REBUILD_ROWS]))
        gram += Psi @ Psi.T
        rhs += Psi @ Y[start:start + REBUILD_ROWS]
    return gram, rhs


def ridge_coefficients(state: OnlineState) -> np.ndarray:
    """Coefficients over the basis landmarks: ``L^{-T} (G + penalty n I)^{-1} H``, shape (r, t)."""
    r = state.basis.size
    if r == 0:
        return np.zeros((0, state.n_targets))
    A = state.gram + state.ridge * np.eye(r)
    w = sla.cho_solve(sla.cho_factor(A, lower=True, check_finite=False), state.rhs, check_finite=False)
    return sla.solve_triangular(state.basis_factor, w, lower=True, trans="T", check_finite=False)


__all__ = [
    "PENALTY_CONVENTION",
    "SPARSE_WINDOW",
    "OnlineState",
    "Projections",
    "StepInfo",
    "batch_projections",
    "online_step",
    "normalise_saved_scalars",
    "ridge_coefficients",
    "stack_rows",
    "state_projections",
    "window_statistics",
    "window_step",
]
