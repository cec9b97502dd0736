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

The penalty term ``lambda v`` takes ``T^{-T} D K_MM D T^{-1} = I``, true up to the
jitter: exactly it is ``I - jitter T^{-T} T^{-1}``. FALKON drops the second part. For
a round-off jitter so may we; but a float32 fit needs a larger one (see
:data:`FLOAT32_RELATIVE_JITTER`), and so does a float64 fit with a tiny penalty
(:data:`FLOAT64_JITTER_TIMES_PENALTY`). The fits therefore ask for a floor
(:func:`jitter_floor`), and the operator then keeps the term, so that CG still
converges to the Nystrom KRR solution.

A float32 fit with many centers may also factor in float32 (``factor_precision``,
twice to three times the rate of float64 ``potrf`` and ``lauum``). ``T^T T`` then differs
from ``D K_MM D + jitter I`` by float32 round-off, so the penalty term applies
``T^{-T} D K_MM D T^{-1}`` itself (``K_MM`` is kept, float64): the factors are then only
a preconditioner, their round-off costs iterations at most, and CG still converges to
the Nystrom KRR solution.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from daskkrr.solvers.cg import CGResult, CGState, conjugate_gradient
from daskkrr.utils.linalg import JitterWarning, cholesky_jitter, mirror_triangle, solve_upper
from daskkrr.utils.threads import blas_threads


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
    #: Arithmetic the sketch Gram was computed in ("float32" only where it was accurate enough).
    precision: str = "float64"
    #: Whether the penalty term keeps the jitter's part (``I - jitter T^{-T} T^{-1}``, see the module
    #: docstring): set when the jitter was asked for (``relative_jitter``), not a round-off one.
    exact_penalty: bool = False
    #: ``D K_MM D`` (float64), kept when the factors are float32: the penalty term applies it exactly.
    kmm: np.ndarray | None = None
    #: Arithmetic ``T`` and ``A`` were factored in and are stored in ("float32": see the module
    #: docstring). Solves with them run in float64 either way (:func:`~daskkrr.utils.linalg.solve_upper`),
    #: so that each is one fixed linear map, as CG needs.
    factor_precision: str = "float64"

    @classmethod
    def from_kernel_matrix(
        cls,
        Kmm: np.ndarray,
        *,
        penalty: float,
        n: float,
        weights: np.ndarray | None = None,
        sketch: Iterable[Any] | SummedSketch | None = None,
        center_sketch: bool = False,
        precision: str = "float64",
        overwrite_kmm: bool = False,
        relative_jitter: float | None = None,
        factor_precision: str = "float64",
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
        sketch : iterable of ndarrays of shape (rows_i, M), or SummedSketch, optional
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
            ``K_nM^T W K_nM / sum(w)``). A :class:`SummedSketch` brings the sums
            made elsewhere instead (the workers', :mod:`daskkrr.parallel.sketch_pass`).
        center_sketch : bool, default=False
            Centre the sketch rows (or FALKON's, the centers) on their mean first (the Gram matrix of a model
            with an unpenalised intercept, ``K_nM^T K_nM - n mu mu^T``).
        precision : {"float64", "float32"}, default="float64"
            Arithmetic of the sketch Gram ``W^T W`` (the triangular solves and the
            rank-k updates, see :func:`sketch_gram`); ``T``, the inner matrix and
            its Cholesky factor ``A`` stay float64. "float32" halves the time of the
            ``2 s M^2`` flops. The first rows are checked against float64, which is
            used instead when float32 would slow CG (see :func:`sketch_gram`);
            the precision used is ``precision`` of the result.
        overwrite_kmm : bool, default=False
            Factor ``K_MM`` in its own memory (the caller gives it up): saves an
            ``M x M`` float64 copy (800 MB at M = 10 000). A C-ordered symmetric
            matrix is factored as its transpose, the Fortran-ordered view.
        relative_jitter : float, optional
            Factor ``D K_MM D + j I`` with at least ``j = relative_jitter * M *
            mean(diag)`` (default: the float64 round-off level). The penalty term
            then keeps the jitter's part (``exact_penalty``), so the solution does
            not change; a float32 fit needs this (:data:`FLOAT32_RELATIVE_JITTER`).
        factor_precision : {"float64", "float32"}, default="float64"
            Arithmetic of the factorisations (``potrf``, ``lauum``) and of the sketch.
            With "float32" ``D K_MM D`` is kept for the penalty term (see the module
            docstring), so the solution does not change; a float32 inner matrix that
            round-off left indefinite is factored in float64 instead.
        """
        if relative_jitter is not None and not relative_jitter >= 0:
            raise ValueError(f"relative_jitter must be >= 0; got {relative_jitter!r}")
        if factor_precision not in ("float64", "float32"):
            raise ValueError(f"factor_precision must be 'float64' or 'float32'; got {factor_precision!r}")
        single = factor_precision == "float32"
        given = Kmm
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
        owned = overwrite_kmm or S is not given  # a converted or weighted copy is ours too
        del Kmm, given  # the caller may have handed over its only reference: M x M matrices are large
        kept = S if single else None  # never written to: the penalty term's exact D K_MM D
        if single:  # symmetric: a C-ordered S is the F-ordered S.T, converted without a transposing copy
            S, owned = np.asfortranarray(S.T if S.flags.c_contiguous else S, dtype=np.float32), True
        elif owned and S.flags.c_contiguous:
            S = S.T  # symmetric: the same matrix, Fortran-ordered, so potrf can work in place
        T, jitter = cholesky_jitter(S, what="center kernel matrix K_MM", overwrite=owned,
                                    relative_jitter=relative_jitter)
        del S
        inner, used = sketch_gram(T, d, () if sketch is None else sketch, center_sketch, precision=precision,
                                  penalty=float(penalty))
        inner[np.diag_indices(M)] += penalty
        what = "FALKON inner matrix W^T W / s + lambda I"
        try:  # float32: no jitter (float32's round-off one, M eps_32, can exceed the penalty)
            A, _ = cholesky_jitter(inner, what=what, overwrite=True, initial_jitter=0.0 if single else None,
                                   escalate=not single)
        except np.linalg.LinAlgError:
            A, _ = cholesky_jitter(inner.astype(np.float64), what=what, overwrite=True)
        del inner
        return cls(T=T, A=A, d=d, penalty=float(penalty), n=float(n), jitter=jitter, precision=used,
                   exact_penalty=relative_jitter is not None or single, kmm=kept,
                   factor_precision=factor_precision)

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
            t = solve_upper(self.T, v)
            u = self._d_col(v) * t
            c = np.asarray(gram_matvec(u), dtype=np.float64).reshape(u.shape)
            w = solve_upper(self.T, self._d_col(c) * c, trans=True) / self.n
            return solve_upper(self.A, w + self.penalty * self._penalty_term(v, t), trans=True)

        return apply

    def _penalty_term(self, v: np.ndarray, t: np.ndarray) -> np.ndarray:
        """``T^{-T} D K_MM D T^{-1} v`` for ``t = T^{-1} v`` (see the module docstring)."""
        if self.kmm is not None:
            return solve_upper(self.T, self.kmm @ t, trans=True)
        return v - self.jitter * solve_upper(self.T, t, trans=True) if self.exact_penalty else v

    def _penalty_matrix(self) -> np.ndarray:
        """``T^{-T} D K_MM D T^{-1}`` as a matrix, with the jitter's part kept (``exact_penalty``)."""
        M = self.n_centers
        if self.kmm is not None:
            left = solve_upper(self.T, self.kmm, trans=True)  # T^{-T} S
            return solve_upper(self.T, left.T, trans=True).T  # (T^{-T} S) T^{-1}
        T_inv = solve_upper(self.T, np.eye(M))
        return np.eye(M) - self.jitter * (T_inv.T @ T_inv)

    def direct_solve(self, gram: np.ndarray, knm_t_y: np.ndarray) -> np.ndarray:
        """Solve the same preconditioned system exactly from ``G = K_nM^T K_nM``.

        ``(T^{-T} D G D T^{-1} / n + lambda I) v = T^{-T} D K_nM^T y / n``,
        ``alpha = D T^{-1} v``. The matrix is symmetric with eigenvalues >= lambda,
        so its Cholesky factorisation is stable.
        """
        return self._solve_inner(self._inner_gram(gram), knm_t_y)

    def _inner_gram(self, gram: np.ndarray) -> np.ndarray:
        """``T^{-T} D G D T^{-1} / n`` from ``G = K_nM^T K_nM``."""
        D = self.d
        L = solve_upper(self.T, D[:, None] * gram * D[None, :], trans=True)  # T^-T D G D
        return solve_upper(self.T, L.T, trans=True).T / self.n  # (T^-T D G D T^-1) / n

    def direct_solve_path(self, gram: np.ndarray, knm_t_y: np.ndarray,
                          penalties: Sequence[float] | np.ndarray) -> np.ndarray:
        """:meth:`direct_solve` for every penalty at once: ``(M, P)`` coefficients of a
        one-column ``knm_t_y``, column ``j`` the solution with ``penalties[j]`` in place
        of ``penalty``.

        One eigendecomposition of the inner matrix ``C = V diag(w) V^T`` gives
        ``v(lambda) = V (w + lambda)^{-1} V^T r`` for every ``lambda``: ``O(M^3)`` once,
        then ``O(M^2)`` per penalty, where the direct solve factors the system again for
        each. ``w`` is clipped at 0 (``C`` is positive semi-definite; round-off can leave
        eigenvalues of order ``-eps ||C||``). With ``exact_penalty`` the penalty term is
        ``T^{-T} D K_MM D T^{-1}``, not the identity, and near-singular where the jitter
        is large against ``K_MM``'s small eigenvalues (a generalised eigenproblem with it
        failed, or lost every digit, on float32 factors at M = 2048): each penalty is
        then solved as :meth:`direct_solve` does. Build the factors in float64 without a
        jitter floor (``relative_jitter=None``) for the fast path.
        """
        rhs = np.asarray(knm_t_y, dtype=np.float64).reshape(-1)
        if rhs.shape != (self.n_centers,):
            raise ValueError(f"the penalty path takes one right-hand side of {self.n_centers} entries; "
                             f"got K_nM^T y of shape {np.shape(knm_t_y)}")
        lams = np.asarray(penalties, dtype=np.float64).reshape(-1)
        if lams.size == 0 or not np.all(lams > 0):
            raise ValueError(f"penalties must be a non-empty sequence of positive numbers; got {penalties!r}")
        C = self._inner_gram(gram)
        if self.exact_penalty:
            return np.column_stack([dataclasses.replace(self, penalty=float(lam))._solve_inner(C.copy(), rhs)
                                    for lam in lams])
        w, V = np.linalg.eigh((C + C.T) / 2)
        r = solve_upper(self.T, self.d * rhs, trans=True) / self.n
        v = V @ ((V.T @ r)[:, None] / (np.maximum(w, 0.0)[:, None] + lams[None, :]))
        return self.d[:, None] * solve_upper(self.T, v)

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
        if self.exact_penalty:  # lambda T^{-T} D K_MM D T^{-1}: see the module docstring
            P = self._penalty_matrix()
            C += self.penalty * (P + P.T) / 2
        else:
            C[np.diag_indices_from(C)] += self.penalty
        rhs = solve_upper(self.T, self._d_col(knm_t_y) * knm_t_y, trans=True) / self.n
        try:
            R, _ = cholesky_jitter(C, what="preconditioned Nystrom system", max_jitter_ratio=1e-8)
            v = solve_upper(R, solve_upper(R, rhs, trans=True))
        except np.linalg.LinAlgError:
            v = _solve_clipped(C, rhs, floor=self.penalty)
        return self._d_col(v) * solve_upper(self.T, v)


#: The smallest jitter of a float32 fit's ``T``, relative to ``M * mean(diag(D K_MM D))``. CG's
#: products ``K_nM u`` with ``u = D T^{-1} v`` carry float32 round-off of order
#: ``eps_32 ||K|| ||u||``, and ``||T^{-1}||^2 <= 1 / jitter``: with the float64 round-off jitter
#: and near-duplicate centers (1203_BNG_pwLinear: 10 features of 2-3 values, M = 1000 of
#: n = 1e5 rows) ``u`` grew so large that the products lost every digit, and CG's residual rose
#: (1.0, 1.97, 2.98) instead of falling. A jitter bounds the growth; the operator keeps its part
#: of the penalty (``exact_penalty``), so the solution is unchanged. Larger jitters also make
#: the first iterates better (CG then favours the large eigenvalues of ``K_MM``) but slow the
#: last digits. Measured, float32, penalty 1e-6, on the 2-core AMD EPYC VM (test RMSE after
#: 5 iterations; iterations to tol 1e-3 and 1e-4):
#:
#: ============  =========================  =========================
#: jitter        synthetic n=1e5, M=5000    pwLinear n=1e5, M=1000
#: ============  =========================  =========================
#: round-off     0.4450; 24, 17             3.4-3.7 (unstable); 5, 7
#: 1.2e-7 M      0.4429; 22, 16             2.846; 5, 7
#: 1e-6 M        0.4387; 18, 16             2.803; 6, 9
#: 1e-5 M        0.4351; 43, 46             2.767; 12, 20
#: ============  =========================  =========================
#:
#: (converged: 0.4369 and 2.7558). 1e-5 is FALKON's own float32 jitter (its ``pc_epsilon_32``),
#: but FALKON drops the jitter's part of the penalty, so it solves a more regularised problem.
FLOAT32_RELATIVE_JITTER = 1e-6


#: A float64 fit's jitter floor, relative as :data:`FLOAT32_RELATIVE_JITTER`, is this over the
#: penalty (and at least float64's eps). The same growth as in float32 breaks float64 fits with
#: a wide kernel and a tiny penalty: ``A^{-1}`` adds a factor ``1 / sqrt(penalty)`` to ``T^{-1}``'s,
#: so the products' round-off grows as the penalty falls. On 1201_BNG_breastTumor (standardised,
#: 65 610 rows, M = 1000, sigma = 2 sqrt(d)), CG stopped after 3-4 iterations at relative residual
#: 0.65 (penalty 1e-9) and 1.0 (1e-11, validation R^2 -0.0003, the model all but zero), and at
#: sigma = 4 and 8 sqrt(d) at 1e-11 and 1e-10 too. With this floor every one of them ran to a
#: residual of 0.005-0.014 in 50 iterations (validation R^2 0.1225-0.1285, against 0.1293 at the
#: best penalty, 1e-8). Where the round-off jitter was enough it costs nothing measurable: the
#: iterations to tol 1e-4 were unchanged on 537_houses (penalty 1e-6 and 1e-7), 1203_BNG_pwLinear
#: (1e-6, 1e-8) and the synthetic benchmark (n = 1e5, M = 2000; 1e-6, 1e-9). Ten times larger
#: (1e-18) slowed 537_houses at 1e-7 from 42 iterations to more than 50.
FLOAT64_JITTER_TIMES_PENALTY = 1e-19


def jitter_floor(dtype: Any, penalty: float, *, iterative: bool = True) -> float | None:
    """The ``relative_jitter`` of a fit's center factor in ``dtype`` with ``penalty``:
    :data:`FLOAT32_RELATIVE_JITTER` for float32, otherwise
    :data:`FLOAT64_JITTER_TIMES_PENALTY` ``/ penalty`` and at least float64's eps. The
    operator keeps the jitter's part of the penalty (``exact_penalty``), so the floor changes
    the preconditioner only, not the solution.

    A float64 fit solved directly (``iterative=False``: no CG products to protect) keeps the
    round-off jitter (None): there the jitter's part of the penalty would only add the
    round-off of ``T^{-1}`` to the solution."""
    if np.dtype(dtype) == np.float32:
        return FLOAT32_RELATIVE_JITTER
    if not iterative:
        return None
    if not penalty > 0:
        raise ValueError(f"penalty must be > 0; got {penalty!r}")
    return max(float(np.finfo(np.float64).eps), FLOAT64_JITTER_TIMES_PENALTY / float(penalty))

#: From this many centers on, a float32 fit factors its preconditioner in float32 (``potrf`` and
#: ``lauum`` at two to three times the float64 rate; below it they take milliseconds either way).
#: Measured on the 2-core AMD EPYC VM, M = 10 000: ``potrf`` 1.6 s against 3.4 s, ``lauum`` 1.6 s
#: against 5.2 s; M = 5000: 0.23 s against 0.79 s, 0.22 s against 1.18 s.
FLOAT32_FACTOR_MIN_CENTERS = 2048


def factor_precision(dtype: Any, n_centers: int) -> str:
    """The arithmetic of FALKON's factorisations for a fit in ``dtype`` with ``n_centers`` centers."""
    single = np.dtype(dtype) == np.float32 and n_centers >= FLOAT32_FACTOR_MIN_CENTERS
    return "float32" if single else "float64"


#: Rows summed in float32 before the partial sum joins the float64 total (bounds the float32
#: accumulation error to that of a sum of this many rank-one terms).
FLOAT32_FLUSH_ROWS = 8192
#: Rows of the first sketch block solved in both precisions to check float32 (see :func:`sketch_gram`).
FLOAT32_PROBE_ROWS = 256
#: float32 is kept when the probe's error ``||W32 - W64||_2^2 / rows`` is at most this share of the penalty.
FLOAT32_ERROR_RATIO = 0.1


@runtime_checkable
class SummedSketch(Protocol):
    """A row sketch whose sums are formed elsewhere (see :func:`sketch_gram`)."""

    @property
    def rows(self) -> int: ...

    def float32_accurate(self, T64: np.ndarray, d: np.ndarray, penalty: float) -> bool: ...

    def sketch_sums(self, T64: np.ndarray, d: np.ndarray, single: bool) -> tuple[np.ndarray, np.ndarray, float]: ...


def sketch_gram(T: np.ndarray, d: np.ndarray, blocks: Iterable[Any] | SummedSketch, center: bool,
                precision: str = "float64", penalty: float = 0.0) -> tuple[np.ndarray, str]:
    """``W^T W / r`` over the ``r = M + s`` rows of ``W = [T^T; K_sM D T^{-1}]`` (``M x M``),
    and the precision it was computed in.

    The result is float64, except for a float32 ``T`` (float32 factors) without
    sketch rows: ``T T^T`` then stays float32, to be factored in float32 too.

    A block given as ``(K_b, c_b)`` has row weights ``c_b``: its rows count ``c_b``
    times in the sum, the mean and ``r``.

    The first ``M`` rows are FALKON's (the centers: ``K_MM D T^{-1} = T^T``, added
    in float64), the others come from the sketch blocks. Each block becomes
    ``W_b^T = T^{-T} D K_b^T`` by one triangular solve (BLAS ``trsm``) and is
    added by a rank-k update of the upper triangle (BLAS ``syrk``: half the flops
    of a GEMM, at its rate), so at most one block's ``W_b`` exists at a time.

    With ``precision="float32"`` both run in single precision, at twice the rate;
    partial sums of at most :data:`FLOAT32_FLUSH_ROWS` rows join a float64 total.
    The triangular solve is where float32 can hurt: its error grows with the
    condition number of ``T`` (wide kernels, many centers), and an error ``E`` in
    the rows of ``W`` moves the preconditioner's eigenvalues, relative to the
    penalty, by about ``||E||_2^2 / (rows * penalty)`` (measured: 1.6e-6 / 1e-6 gave
    eigenvalues of ``A_64^-T A_32^T A_32 A_64^-1`` up to 2.1, and 1.6e-6 / 1e-8 up to 83,
    at M = 3000 with three times the default sigma; at the default sigma the
    ratio was below 0.02 and the eigenvalues within 0.4% of 1, down to penalty 1e-10).
    So the first :data:`FLOAT32_PROBE_ROWS` rows are also solved in float64, and
    when their error exceeds :data:`FLOAT32_ERROR_RATIO` times ``penalty`` the
    whole sketch runs in float64 instead ("float64" is returned). Either way
    the preconditioner only changes CG's speed, never the solution it converges to.
    """
    if precision not in ("float64", "float32"):
        raise ValueError(f"precision must be 'float64' or 'float32'; got {precision!r}")
    from scipy.linalg import lapack

    M = T.shape[0]
    factored32 = T.dtype == np.float32
    # T T^T, upper triangle: LAPACK's lauum uses that T is triangular, M^3 / 3 flops against
    # syrk's M^3 (at M = 10 000, 2.4 s against 6.4 s on the 2-core machine), in T's precision.
    T64 = None if factored32 else np.asfortranarray(T, dtype=np.float64)
    inner, info = (lapack.slauum if factored32 else lapack.dlauum)(T if factored32 else T64, lower=0, overwrite_c=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK lauum failed (info={info}) on the factor of K_MM")
    total = T.sum(axis=1, dtype=np.float64)
    rows = float(M)
    wanted32 = precision == "float32"
    if isinstance(blocks, SummedSketch):  # summed where the rows are (the workers)
        used32 = wanted32
        if blocks.rows:
            # float32 factors with a sketch: the sums are float64, as below
            T64, inner = np.asfortranarray(T, dtype=np.float64), inner.astype(np.float64, copy=False)
            used32 = wanted32 and blocks.float32_accurate(T64, d, penalty)
            gram, block_total, block_rows = blocks.sketch_sums(T64, d, used32)
            inner += gram  # only the upper triangles are meaningful
            total += block_total
            rows += block_rows
    else:
        acc: _SketchAccumulator | None = None
        for block in blocks:
            if acc is None:  # float32 factors with a sketch: the sums are float64, as above
                inner = inner.astype(np.float64, copy=False)
                acc = _SketchAccumulator(T if T64 is None else T64, d, single=wanted32, probe_penalty=penalty,
                                         gram=inner)
            acc.add(*(block if isinstance(block, tuple) else (block, None)))
        used32 = False
        if acc is not None:
            acc.flush()
            inner = acc.gram  # (the same memory where BLAS updated it in place)
            total += acc.total
            rows += acc.rows
            used32 = acc.single and acc.added > 0  # float32 only where a block ran in it
    if center:
        from scipy.linalg import blas

        # sum (w - wbar)(w - wbar)^T = sum w w^T - r wbar wbar^T, as a rank-one update of the upper triangle
        syr = blas.ssyr if inner.dtype == np.float32 else blas.dsyr
        inner = syr(-1.0 / rows, total.astype(inner.dtype), lower=0, a=inner, overwrite_a=1)
    inner /= rows
    mirror_triangle(inner, from_upper=True)  # syrk/dsyr filled the upper triangle only
    return inner, "float32" if used32 or inner.dtype == np.float32 else "float64"


class _SketchAccumulator:
    """Adds sketch blocks ``K_b`` (kernel rows, ``(rows, M)``) to ``sum_b W_b^T W_b`` with
    ``W_b = K_b D T^{-1}``, plus their column sums and row count (see :func:`sketch_gram`).

    ``single``: the solves and rank-k updates in float32 (partial sums of at most
    :data:`FLOAT32_FLUSH_ROWS` rows join the float64 total); with ``probe_penalty``
    given, the first block's first rows decide whether float32 is accurate enough.
    The sums are added to ``gram`` (float64, upper triangle: the caller's ``T T^T``,
    or zeros), so that at most one block's ``W_b`` and one ``M x M`` float32
    partial exist besides it.
    """

    def __init__(self, T: np.ndarray, d: np.ndarray, *, single: bool, gram: np.ndarray,
                 probe_penalty: float | None = None):
        self.T = T
        self.M = T.shape[0]
        self.d = d
        self.single = single
        self.probed = probe_penalty is None or not single
        self.penalty = 0.0 if probe_penalty is None else float(probe_penalty)
        # made when first needed: an M x M copy is slow to touch (a worker's float32 share never needs T64)
        self.T64: np.ndarray | None = T if T.dtype == np.float64 and T.flags.f_contiguous else None
        self.T32: np.ndarray | None = T if T.dtype == np.float32 and T.flags.f_contiguous else None
        self.added = 0  # blocks with rows
        self.total = np.zeros(self.M)
        self.rows = 0.0
        self.gram = gram
        self.partial: np.ndarray | None = None  # float32 updates not yet in ``gram``
        self.pending = 0

    def add(self, K: Any, c: Any = None) -> bool:
        """Add one block (``c``: its rows' weights, or None); whether it had rows."""
        from scipy.linalg import blas

        K = np.asarray(K)
        if K.ndim != 2 or K.shape[1] != self.M:
            raise ValueError(f"sketch blocks must have shape (rows, {self.M}); got {K.shape}")
        if not K.shape[0]:
            return False
        self.added += 1
        if self.single:
            Wt = blas.strsm(1.0, self._t32(), np.asfortranarray((self.d[:, None] * K.T).astype(np.float32)),
                            side=0, lower=0, trans_a=1, overwrite_b=1)  # T^{-T} D K_b^T, (M, rows)
            if not self.probed:
                self.probed = True
                self.single = _float32_accurate(self._t64(), self.d, K, Wt, self.penalty)
        if not self.single:
            Wt = blas.dtrsm(1.0, self._t64(), np.asfortranarray(self.d[:, None] * K.T.astype(np.float64)), side=0,
                            lower=0, trans_a=1, overwrite_b=1)
        if c is None:
            self.total += Wt.sum(axis=1, dtype=np.float64)
            self.rows += K.shape[0]
        else:
            c = np.asarray(c, dtype=np.float64).reshape(-1)
            self.total += Wt.astype(np.float64) @ c
            self.rows += float(c.sum())
            Wt = np.asfortranarray(Wt * np.sqrt(c).astype(Wt.dtype)[None, :])
        if not self.single:
            self.gram = blas.dsyrk(1.0, Wt, beta=1.0, c=self.gram, trans=0, lower=0, overwrite_c=1)
            return True
        # beta=0 restarts the partial sum in the same memory (a fresh M x M array costs page faults)
        self.partial = blas.ssyrk(1.0, Wt, trans=0, lower=0) if self.partial is None else blas.ssyrk(
            1.0, Wt, beta=1.0 if self.pending else 0.0, c=self.partial, trans=0, lower=0, overwrite_c=1)
        self.pending += K.shape[0]
        if self.pending >= FLOAT32_FLUSH_ROWS:
            self.flush()
        return True

    def _t64(self) -> np.ndarray:
        if self.T64 is None:
            self.T64 = np.asfortranarray(self.T, dtype=np.float64)
        return self.T64

    def _t32(self) -> np.ndarray:
        if self.T32 is None:
            self.T32 = np.asfortranarray(self.T, dtype=np.float32)
        return self.T32

    def flush(self) -> None:
        """Add the float32 partial sum to ``gram``."""
        if self.partial is not None and self.pending:
            self.gram += self.partial  # the lower triangles hold leftovers: only the upper one is kept
            self.pending = 0


def block_sketch_sums(T: np.ndarray, d: np.ndarray, blocks: Iterable[Any], single: bool,
                      out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """``(sum W_b^T W_b, sum of the rows of W_b, rows)`` over ``blocks`` (as in :func:`sketch_gram`,
    float32 or not as told, without a probe): one worker's share of a sketch summed where its
    rows are. The first is ``M x M`` float64 with only its upper triangle meaningful: ``out``
    (zeros, Fortran-ordered) if given, else a new array."""
    M = T.shape[0]
    if out is not None and (out.shape != (M, M) or out.dtype != np.float64 or not out.flags.f_contiguous):
        raise ValueError(f"out must be a Fortran-ordered float64 ({M}, {M}) array")
    acc = _SketchAccumulator(T, d, single=single, gram=np.zeros((M, M), order="F") if out is None else out)
    for block in blocks:
        acc.add(*(block if isinstance(block, tuple) else (block, None)))
    acc.flush()
    return acc.gram, acc.total, acc.rows


def float32_sketch_accurate(T: np.ndarray, d: np.ndarray, K: np.ndarray, penalty: float) -> bool:
    """Whether float32 solves are accurate enough for the sketch rows ``K`` (at most
    :data:`FLOAT32_PROBE_ROWS` of them; see :func:`sketch_gram`)."""
    from scipy.linalg import blas

    K = np.asarray(K)[:FLOAT32_PROBE_ROWS]
    if not K.shape[0]:
        return True
    Wt32 = blas.strsm(1.0, np.asfortranarray(T, dtype=np.float32),
                      np.asfortranarray((d[:, None] * K.T).astype(np.float32)), side=0, lower=0, trans_a=1)
    return _float32_accurate(np.asfortranarray(T, dtype=np.float64), d, K, Wt32, penalty)


def _float32_accurate(T: np.ndarray, d: np.ndarray, K: np.ndarray, Wt32: np.ndarray, penalty: float) -> bool:
    """Whether float32 solves were accurate enough on the first rows of a block (see :func:`sketch_gram`)."""
    from scipy.linalg import blas

    k = min(FLOAT32_PROBE_ROWS, K.shape[0])
    Wt64 = blas.dtrsm(1.0, T, np.asfortranarray(d[:, None] * K[:k].T.astype(np.float64)), side=0, lower=0,
                      trans_a=1)
    E = Wt32[:, :k] - Wt64
    # ||E||_2^2 as the top eigenvalue of the small k x k Gram matrix, on one thread: an SVD of the
    # M x k matrix took 2.9 s, and this eigvalsh 0.5 s, in threaded LAPACK on the busy 2-core
    # development machine (the factorisation itself is milliseconds).
    with blas_threads(1):
        error = float(np.linalg.eigvalsh(E.T @ E)[-1]) / k
    return error <= FLOAT32_ERROR_RATIO * penalty


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
