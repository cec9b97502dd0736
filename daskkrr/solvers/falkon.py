"""FALKON: Nystrom kernel ridge regression by preconditioned conjugate gradient.

The Nystrom KRR system for centers ``Z`` (``M`` of them) is

    (K_nM^T K_nM + lambda n K_MM) alpha = K_nM^T y.

FALKON (Rudi, Carratino, Rosasco 2017) approximates ``K_nM^T K_nM`` by
``(n/M) K_MM D^2 K_MM`` (``D = I`` for uniform centers; ``D = diag(sqrt(w))`` with
importance weights for leverage-score centers, Rudi et al. 2018) and builds two
Cholesky factors

    T^T T = D K_MM D + jitter I,      A^T A = T T^T / M + lambda I,

so that with ``alpha = D T^{-1} A^{-1} beta`` the system becomes

    A^{-T} ( T^{-T} D K_nM^T K_nM D T^{-1} v / n + lambda v ) = A^{-T} T^{-T} D K_nM^T y / n,
    v = A^{-1} beta,

whose condition number is close to one. Only ``K_nM^T (K_nM u)`` touches the data:
that is the caller's ``gram_matvec``, one distributed pass per iteration.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from daskkrr.solvers.cg import CGResult, CGState, conjugate_gradient
from daskkrr.utils.linalg import JitterWarning, cholesky_jitter, mirror_triangle, solve_upper


@dataclasses.dataclass
class FalkonPreconditioner:
    """The factors ``T`` and ``A`` of FALKON's preconditioner.

    Build it with :meth:`from_kernel_matrix`. ``n`` is the number of training rows
    (the sum of the row weights in a weighted fit), ``penalty`` FALKON's lambda.
    """

    T: np.ndarray
    A: np.ndarray
    d: np.ndarray
    penalty: float
    n: float
    jitter: float

    @classmethod
    def from_kernel_matrix(
        cls,
        Kmm: np.ndarray,
        *,
        penalty: float,
        n: float,
        weights: np.ndarray | None = None,
        sketch: Iterable[Any] | None = None,
        center_sketch: bool = False,
    ) -> FalkonPreconditioner:
        """Factor the preconditioner from ``K_MM`` (and optionally a row sketch of ``K_nM``).

        Parameters
        ----------
        Kmm : ndarray of shape (M, M)
            Kernel matrix of the centers (float64; not modified).
        penalty, n : float
            FALKON's lambda and the number of training rows (the sum of the row
            weights in a weighted fit: the "n" that scales the penalty).
        weights : ndarray of shape (M,), optional
            Importance weights of the centers (``D = diag(sqrt(weights))``).
        sketch : iterable of ndarrays of shape (rows_i, M), optional
            Kernel rows ``k(x_i, Z)`` of ``s`` training rows drawn uniformly at
            random, block by block. FALKON's ``A`` uses the centers as a sample of
            the rows of ``K_nM``: ``T T^T / M = W^T W / M`` with ``W = K_MM D T^{-1}
            = T^T``. The sketch rows join them, ``A^T A = W^T W / (M + s) + lambda I``
            with ``W = [T^T; K_sM D T^{-1}]`` -- the sketch-to-precondition idea of
            Avron, Clarkson and Woodruff (2017) applied to the Nystrom system. With
            a small penalty a sketch of a few times ``M`` rows approximates
            ``K_nM^T K_nM`` much better and cuts the CG iterations severalfold.
            A block may come with the weights of its rows, ``(K_b, c_b)``: each row
            then counts ``c_b`` times (a weighted fit's sketch rows, drawn
            uniformly, weigh ``w_i / mean(w)``, so that the sketch estimates
            ``K_nM^T W K_nM / sum(w)``).
        center_sketch : bool, default=False
            Centre the sketch rows (or FALKON's, the centers) on their mean first (the Gram matrix of a model
            with an unpenalised intercept, ``K_nM^T K_nM - n mu mu^T``).
        """
        Kmm = np.asarray(Kmm, dtype=np.float64)
        M = Kmm.shape[0]
        if Kmm.shape != (M, M):
            raise ValueError(f"K_MM must be square; got shape {Kmm.shape}")
        if not penalty > 0:
            raise ValueError(f"penalty must be > 0; got {penalty!r}")
        d = np.ones(M) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64))
        if d.shape != (M,):
            raise ValueError(f"weights must have shape ({M},); got {d.shape}")
        S = Kmm if weights is None else d[:, None] * Kmm * d[None, :]
        del Kmm  # the caller may have handed over its only reference: M x M matrices are large
        T, jitter = cholesky_jitter(S, what="center kernel matrix K_MM")
        del S
        inner = _sketch_gram(T, d, () if sketch is None else sketch, center_sketch)
        inner[np.diag_indices(M)] += penalty
        A, _ = cholesky_jitter(inner, what="FALKON inner matrix W^T W / s + lambda I", overwrite=True)
        return cls(T=T, A=A, d=d, penalty=float(penalty), n=float(n), jitter=jitter)

    @property
    def n_centers(self) -> int:
        return self.T.shape[0]

    def to_coefficients(self, beta: np.ndarray) -> np.ndarray:
        """``alpha = D T^{-1} A^{-1} beta``."""
        v = solve_upper(self.A, beta)
        return self._d_col(beta) * solve_upper(self.T, v)

    def _d_col(self, like: np.ndarray) -> np.ndarray:
        return self.d if like.ndim == 1 else self.d[:, None]

    def rhs(self, knm_t_y: np.ndarray) -> np.ndarray:
        """Preconditioned right-hand side ``A^{-T} T^{-T} D K_nM^T y / n``."""
        w = solve_upper(self.T, self._d_col(knm_t_y) * knm_t_y, trans=True) / self.n
        return solve_upper(self.A, w, trans=True)

    def operator(
        self, gram_matvec: Callable[[np.ndarray], np.ndarray]
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The preconditioned FALKON operator ``beta -> P^T H P beta / n``."""

        def apply(beta: np.ndarray) -> np.ndarray:
            v = solve_upper(self.A, beta)
            u = self._d_col(v) * solve_upper(self.T, v)
            c = np.asarray(gram_matvec(u), dtype=np.float64).reshape(u.shape)
            w = solve_upper(self.T, self._d_col(c) * c, trans=True) / self.n
            return solve_upper(self.A, w + self.penalty * v, trans=True)

        return apply

    def direct_solve(self, gram: np.ndarray, knm_t_y: np.ndarray) -> np.ndarray:
        """Solve the same preconditioned system exactly from ``G = K_nM^T K_nM``.

        ``(T^{-T} D G D T^{-1} / n + lambda I) v = T^{-T} D K_nM^T y / n``,
        ``alpha = D T^{-1} v``. The matrix is symmetric with eigenvalues >= lambda,
        so its Cholesky factorisation is stable.
        """
        D = self.d
        L = solve_upper(self.T, D[:, None] * gram * D[None, :], trans=True)  # T^-T D G D
        C = solve_upper(self.T, L.T, trans=True).T / self.n  # (T^-T D G D T^-1) / n
        return self._solve_inner(C, knm_t_y)

    def direct_solve_preconditioned(self, gram_pre: np.ndarray, knm_t_y: np.ndarray,
                                    mu: np.ndarray | None = None) -> np.ndarray:
        """:meth:`direct_solve` from the preconditioned Gram matrix ``G' = T^{-T} D G D T^{-1}``.

        ``G'`` accumulated from ``W_b = K_b D T^{-1}`` (the gram strategy with FALKON's
        factors) keeps the accuracy that forming ``G = K^T K`` first loses to the
        condition number of ``K_MM``. With ``mu = K_nM^T 1 / n`` (an intercept) the Gram
        matrix is centred, ``G - n mu mu^T``; ``gram_pre`` itself is not modified.
        """
        C = np.asarray(gram_pre, dtype=np.float64) / self.n
        if mu is not None:
            m = solve_upper(self.T, self.d * np.asarray(mu, dtype=np.float64), trans=True)
            C = C - np.outer(m, m)
        return self._solve_inner(C, knm_t_y)

    def _solve_inner(self, C: np.ndarray, knm_t_y: np.ndarray) -> np.ndarray:
        """``alpha = D T^{-1} v`` with ``(C + lambda I) v = T^{-T} D K_nM^T y / n`` (``C`` is overwritten)."""
        C = (C + C.T) / 2
        C[np.diag_indices_from(C)] += self.penalty
        rhs = solve_upper(self.T, self._d_col(knm_t_y) * knm_t_y, trans=True) / self.n
        try:
            R, _ = cholesky_jitter(C, what="preconditioned Nystrom system", max_jitter_ratio=1e-8)
            v = solve_upper(R, solve_upper(R, rhs, trans=True))
        except np.linalg.LinAlgError:
            v = _solve_clipped(C, rhs, floor=self.penalty)
        return self._d_col(v) * solve_upper(self.T, v)


def _sketch_gram(T: np.ndarray, d: np.ndarray, blocks: Iterable[Any], center: bool) -> np.ndarray:
    """``W^T W / r`` over the ``r = M + s`` rows of ``W = [T^T; K_sM D T^{-1}]`` (``M x M``).

    A block given as ``(K_b, c_b)`` has row weights ``c_b``: its rows count ``c_b``
    times in the sum, the mean and ``r``.

    The first ``M`` rows are FALKON's (the centers: ``K_MM D T^{-1} = T^T``), the
    others come from the sketch blocks. Each block becomes ``W_b^T = T^{-T} D K_b^T``
    by one triangular solve and is added by a rank-k update of the upper
    triangle, so at most one block's ``W_b`` exists at a time.
    """
    from scipy.linalg.blas import dsyr, dsyrk

    M = T.shape[0]
    inner = dsyrk(1.0, np.asfortranarray(T), trans=0, lower=0)  # T T^T, upper triangle
    total = T.sum(axis=1)
    rows = float(M)
    for block in blocks:
        K, c = block if isinstance(block, tuple) else (block, None)
        K = np.asarray(K, dtype=np.float64)
        if K.ndim != 2 or K.shape[1] != M:
            raise ValueError(f"sketch blocks must have shape (rows, {M}); got {K.shape}")
        if not K.shape[0]:
            continue
        Wt = solve_upper(T, np.asfortranarray(d[:, None] * K.T), trans=True)  # (M, rows)
        if c is None:
            inner = dsyrk(1.0, Wt, beta=1.0, c=inner, trans=0, lower=0, overwrite_c=1)
            total += Wt.sum(axis=1)
            rows += K.shape[0]
        else:
            c = np.asarray(c, dtype=np.float64).reshape(-1)
            inner = dsyrk(1.0, np.asfortranarray(Wt * np.sqrt(c)[None, :]), beta=1.0, c=inner, trans=0,
                          lower=0, overwrite_c=1)
            total += Wt @ c
            rows += float(c.sum())
    if center:
        # sum (w - wbar)(w - wbar)^T = sum w w^T - r wbar wbar^T, as a rank-one update of the upper triangle
        inner = dsyr(-1.0 / rows, total, lower=0, a=inner, overwrite_a=1)
    inner /= rows
    mirror_triangle(inner, from_upper=True)  # dsyrk/dsyr filled the upper triangle only
    return inner


def _solve_clipped(C: np.ndarray, rhs: np.ndarray, floor: float) -> np.ndarray:
    """Solve ``C v = rhs`` for a symmetric ``C`` whose exact eigenvalues are all >= ``floor``.

    Near-duplicate centers make ``T`` ill-conditioned, and round-off amplified by
    ``T^{-1}`` can push computed eigenvalues of ``C`` below ``floor`` (even below 0).
    Clipping them at ``floor`` removes that round-off instead of failing.
    """
    if not np.all(np.isfinite(C)):
        raise np.linalg.LinAlgError(
            "the preconditioned Nystrom system has NaN or inf entries: the center kernel matrix is "
            "singular. Use fewer centers, a larger sigma or penalty, or standardize the features"
        )
    w, Q = np.linalg.eigh(C)
    clipped = int(np.sum(w < floor))
    warnings.warn(
        f"the preconditioned Nystrom system had {clipped} eigenvalue(s) below the penalty {floor:.3g} "
        "from round-off (near-duplicate centers); they were clipped at the penalty",
        JitterWarning,
        stacklevel=3,
    )
    return Q @ ((Q.T @ rhs) / np.maximum(w, floor).reshape((-1,) + (1,) * (rhs.ndim - 1)))


def falkon_solve(
    preconditioner: FalkonPreconditioner,
    gram_matvec: Callable[[np.ndarray], np.ndarray],
    knm_t_y: np.ndarray,
    *,
    tol: float = 1e-7,
    max_iter: int = 50,
    true_residual_every: int = 10,
    beta0: np.ndarray | None = None,
    callback: Callable[[int, np.ndarray], None] | None = None,
    state: CGState | None = None,
    on_state: Callable[[CGState], None] | None = None,
    state_every: int = 1,
) -> tuple[np.ndarray, CGResult]:
    """Run FALKON's CG; return the Nystrom coefficients ``alpha`` and the CG record.

    ``state``, ``on_state`` and ``state_every`` checkpoint and continue the CG
    exactly (see :func:`daskkrr.solvers.conjugate_gradient`); the state lives in
    the preconditioned variable ``beta``, so it is only valid with the same
    preconditioner (same centers, kernel, penalty and n).
    """
    result = conjugate_gradient(
        preconditioner.operator(gram_matvec),
        preconditioner.rhs(knm_t_y),
        x0=beta0,
        tol=tol,
        max_iter=max_iter,
        true_residual_every=true_residual_every,
        callback=callback,
        state=state,
        on_state=on_state,
        state_every=state_every,
    )
    return preconditioner.to_coefficients(result.x), result
