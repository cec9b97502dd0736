"""Multinomial (softmax) kernel logistic regression on Nystrom centers: the numpy pieces.

With ``C`` classes, coefficients ``U`` of shape ``(M, C)`` and intercepts ``b``
(``f_c(x) = k(x, Z) U_c + b_c``) the problem is

    minimise  (1/N) sum_i s_i CE(softmax(f(x_i)), y_i) + (lambda/2) sum_c U_c^T K_MM U_c,

with the row weights ``s_i`` and ``N = sum_i s_i`` of :mod:`daskkrr.solvers.logistic`
and ``b`` unpenalised, as there. It is solved by the same globally convergent
scheme (Marteau-Ferey, Bach and Rudi 2019) and the same driver
(:func:`daskkrr.solvers.logistic.newton_solve` with the :class:`Multinomial` loss): one
Newton step per warm-up penalty, Newton steps at the target, each Newton system by
preconditioned CG, now on the stacked ``M * C`` unknowns, since the classes are coupled in every row's Hessian
``H_i = diag(p_i) - p_i p_i^T`` (``p_i = softmax(f(x_i))``).

The data enter through two per-block products, summed over the row blocks:
:func:`gradient_terms` (loss, ``K_b^T s (p - y)``, ``K_b^T s H`` for every pair
of classes, and their column sums) and :func:`hessian_terms` (``K_b^T (s H_i V_i)``
row by row with ``V = K_b D``, ``D`` the ``(M, C)`` direction): only ``M``-sized
sums leave a block.

Two facts about the softmax shape the solver:

- The loss does not change when the same function is added to every class
  (``H_i 1 = 0``). The penalty fixes that freedom for ``U`` (the optimum has
  ``sum_c U_c = 0``), but not for the unpenalised intercepts: their Hessian
  ``H_bb = sum_i s_i H_i`` is singular along ``1``. The Newton step uses its
  pseudo-inverse (:func:`intercept_pinv`), i.e. the step with ``sum_c d_b = 0``;
  the intercepts start centred, so they stay centred.
- The preconditioner is block diagonal over the classes: class ``c`` gets the
  FALKON factor of :class:`~daskkrr.solvers.logistic.LogisticPreconditioner`
  weighted by ``p_c (1 - p_c)`` at the centers, the diagonal of ``H_i``. Since
  ``H_i`` has zero row sums its off-diagonal part ``-p_c p_c'`` sums to minus its
  diagonal, so (Gershgorin) ``0 <= H_i <= 2 diag(p_i (1 - p_i))``: dropping the
  couplings overestimates no direction's curvature by more than a factor 2.
  It underestimates it only where the classes move together (``U = v 1^T``),
  where the loss is flat and the Hessian is ``lambda K_MM`` alone. The Newton
  step has a closed form there (the Schur complement maps the matrices with
  ``sum_c U_c = 0`` and their complement to themselves): it removes
  ``mean_c U_c``. CG solves for the class-centred part only, and its result is
  projected back on the zero-sum matrices, which can only bring it nearer the
  exact step. (Measured: adding the missing curvature on ``v 1^T`` to the CG
  operator did not reduce the CG iterations.)
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_softmax

from daskkrr.kernels.base import Kernel
from daskkrr.solvers.logistic import LogisticPreconditioner, NewtonSystem, _tiles, split_targets


# --------------------------------------------------------------------------- the loss
def softmax(F: np.ndarray) -> np.ndarray:
    """Row-wise softmax without overflow."""
    return np.exp(log_softmax(np.asarray(F, dtype=np.float64), axis=1))


def one_hot(codes: np.ndarray) -> np.ndarray:
    """The one-vs-all ``+-1`` codes (one column per class) as a 0/1 indicator."""
    return (codes > 0).astype(np.float64)


def _weighted(arrays: tuple[np.ndarray, ...], s: np.ndarray | None) -> tuple[np.ndarray, ...]:
    if s is None:
        return arrays
    return tuple(a * s.reshape((-1,) + (1,) * (a.ndim - 1)) for a in arrays)


# --------------------------------------------------------------------------- block products
def gradient_terms(Kb: np.ndarray, Yb: np.ndarray, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """The gradient pass's sums over one kernel block ``K_b = k(X_b, Z)``.

    ``Yb`` holds the ``+-1`` codes of the ``C`` classes (then, optionally, the row
    weights ``s``). Returns float64 ``(M + 2, C + C^2)``: rows ``:M`` are
    ``[K_b^T s (p - y) | K_b^T s H]`` with ``H`` the rows' ``C x C`` Hessians
    flattened (column ``C + c C + c'`` holds entry ``(c, c')``), row ``M`` their
    column sums and entry ``(M + 1, 0)`` the loss ``sum s CE``, at
    ``f = K_b coef + intercept``.
    """
    C = coef.shape[1]
    codes, s = split_targets(Yb, C)
    K = np.asarray(Kb, dtype=np.float64)
    logP = log_softmax(K @ coef + intercept, axis=1)
    P = np.exp(logP)
    Y = one_hot(codes)
    loss = -np.einsum("ij,ij->i", Y, logP)
    H = -P[:, :, None] * P[:, None, :]
    H[:, np.arange(C), np.arange(C)] += P
    loss, G, H = _weighted((loss, P - Y, H), s)
    D = np.concatenate([G, H.reshape(len(K), C * C)], axis=1)
    out = np.zeros((K.shape[1] + 2, C + C * C))
    out[:-2] = K.T @ D
    out[-2] = D.sum(axis=0)
    out[-1, 0] = loss.sum()
    return out


def hessian_terms(Kb: np.ndarray, Yb: np.ndarray, coef: np.ndarray, intercept: np.ndarray,
                  U: np.ndarray) -> np.ndarray:
    """``K_b^T (s_i H_i (K_b U)_i)`` row by row, ``H_i = diag(p_i) - p_i p_i^T`` at
    ``f = K_b coef + intercept``: float64 ``(M, C)``."""
    C = coef.shape[1]
    _, s = split_targets(Yb, C)
    K = np.asarray(Kb, dtype=np.float64)
    FV = K @ np.concatenate([coef, U], axis=1)
    P = softmax(FV[:, :C] + intercept)
    V = FV[:, C:]
    HV = P * (V - np.einsum("ij,ij->i", P, V)[:, None])
    (HV,) = _weighted((HV,), s)
    return K.T @ HV


def gradient_block(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray,
                   intercept: np.ndarray) -> np.ndarray:
    """:func:`gradient_terms` of the rows ``X_b`` (kernel computed tile by tile)."""
    Yb = np.asarray(Yb).reshape(len(Yb), -1)
    C = coef.shape[1]
    return sum((gradient_terms(K, Yb[sl], coef, intercept) for sl, K in _tiles(kernel, Xb, Z)),
               np.zeros((Z.shape[0] + 2, C + C * C)))


def hessian_block(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray,
                  intercept: np.ndarray, U: np.ndarray) -> np.ndarray:
    """:func:`hessian_terms` of the rows ``X_b`` (kernel computed tile by tile)."""
    Yb = np.asarray(Yb).reshape(len(Yb), -1)
    return sum((hessian_terms(K, Yb[sl], coef, intercept, U) for sl, K in _tiles(kernel, Xb, Z)),
               np.zeros(U.shape))


def gradient_kept(kept: tuple[np.ndarray, np.ndarray], coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """:func:`gradient_terms` of a block kept by :func:`~daskkrr.solvers.logistic.kernel_and_targets`."""
    return gradient_terms(kept[0], kept[1], coef, intercept)


def hessian_kept(kept: tuple[np.ndarray, np.ndarray], coef: np.ndarray, intercept: np.ndarray,
                 U: np.ndarray) -> np.ndarray:
    """:func:`hessian_terms` of a block kept by :func:`~daskkrr.solvers.logistic.kernel_and_targets`."""
    return hessian_terms(kept[0], kept[1], coef, intercept, U)


# --------------------------------------------------------------------------- algebra on the client
def start_intercept(class_fractions: np.ndarray) -> np.ndarray:
    """The intercepts of the best constant model, ``log p_c`` centred (``sum_c b_c = 0``)."""
    logp = np.log(np.clip(np.asarray(class_fractions, dtype=np.float64), 1e-12, None))
    return logp - logp.mean()


def intercept_pinv(H_bb: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of the intercepts' Hessian on the centred vectors (``1`` is in its null space)."""
    C = H_bb.shape[0]
    J = np.eye(C) - 1.0 / C
    H = J @ ((H_bb + H_bb.T) / 2) @ J
    w, Q = np.linalg.eigh(H)
    keep = w > 1e-12 * max(float(w.max()), np.finfo(float).tiny)
    return (Q[:, keep] / w[keep]) @ Q[:, keep].T


def centred(U: np.ndarray) -> np.ndarray:
    """``U`` less its mean over the classes (columns): the nearest ``U`` with ``sum_c U_c = 0``."""
    return U - U.mean(axis=1, keepdims=True)


# --------------------------------------------------------------------------- the Newton loss
class Multinomial:
    """:class:`~daskkrr.solvers.logistic.NewtonLoss` of the multinomial model for
    :func:`daskkrr.solvers.logistic.newton_solve`: one problem over the ``C`` classes
    (the state's per-problem arrays have one entry), each Newton system one CG on the
    ``M * C`` stacked unknowns."""

    def problems(self, t: int) -> int:
        return 1

    def columns(self, problems: np.ndarray, t: int) -> np.ndarray:
        return np.full(t, bool(problems[0]))

    def objective(self, G: np.ndarray, Kmm: np.ndarray, coef: np.ndarray, penalty: float,
                  weight_sum: float) -> np.ndarray:
        M = Kmm.shape[0]
        return np.array([G[M + 1, 0] / weight_sum + 0.5 * penalty * float(np.einsum("ij,ij->", coef, Kmm @ coef))])

    def direction(self, system: NewtonSystem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        G, coef, lam, N, fit_intercept = system.G, system.coef, system.penalty, system.weight_sum, system.fit_intercept
        Kmm = system.factor.Kmm
        M, C = coef.shape
        g_a = G[:M, :C] / N + lam * (Kmm @ coef)
        # The intercepts are eliminated (Schur complement); H_ab[m, c, c'] couples U[m, c] and b[c'].
        g_b = G[M, :C] / N if fit_intercept else np.zeros(C)
        H_ab = G[:M, C:].reshape(M, C, C) / N if fit_intercept else np.zeros((M, C, C))
        H_bb_pinv = intercept_pinv(G[M, C:].reshape(C, C) / N) if fit_intercept else np.zeros((C, C))
        g_s = g_a - np.einsum("mcd,d->mc", H_ab, H_bb_pinv @ g_b)
        # Block-diagonal preconditioner: class c's FALKON factor weighted by p_c (1 - p_c) at the
        # centers, the diagonal of H_i; H_i <= 2 diag(p_i (1 - p_i)) since its rows sum to zero
        # (module docstring), so no curvature is overestimated more than twice.
        centers_p = softmax(Kmm @ coef + system.intercept)
        pre = LogisticPreconditioner.build(system.factor, centers_p * (1.0 - centers_p), lam, fit_intercept)

        def schur(U: np.ndarray) -> np.ndarray:
            HU = system.hessian_pass(coef, system.intercept, U) / N + lam * (Kmm @ U)
            if fit_intercept:
                HU -= np.einsum("mcd,d->mc", H_ab, H_bb_pinv @ np.einsum("mcd,mc->d", H_ab, U))
            return HU

        # The gradient's class-mean is lambda K_MM mean_c(U_c) (the loss part sums to zero over the
        # classes), where the Schur complement is lambda K_MM: that part of the Newton step is
        # mean_c(U_c) itself, exactly. CG solves the rest, whose solution has zero class-sum.
        mean_coef = coef.mean(axis=1, keepdims=True)
        x = system.solve(lambda beta: pre.adjoint(schur(pre.to_coefficients(beta.reshape(M, C)))).reshape(-1),
                         pre.adjoint(centred(g_s)).reshape(-1))
        # Projecting CG's direction on the zero-sum matrices only brings it nearer the exact one
        # (the Schur complement maps that subspace and its complement to themselves).
        d_a = centred(pre.to_coefficients(x.reshape(M, C))) + mean_coef
        decrement = float(np.einsum("ij,ij->", g_s, d_a) + g_b @ H_bb_pinv @ g_b)
        d_b = H_bb_pinv @ (g_b - np.einsum("mcd,mc->d", H_ab, d_a))
        return d_a, d_b, np.array([decrement])
