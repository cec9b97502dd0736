"""The compiled loops of :mod:`daskkrr.utils.mixed_solve` (imported only where numba is)."""

from __future__ import annotations

from numba import njit

# Reductions may be reassociated (that is what lets LLVM vectorise them); FMA contraction.
_FASTMATH = {"reassoc", "contract"}


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def solve(T, Xt):  # pragma: no cover - compiled
    """``X <- T^{-1} X`` for ``X`` given transposed, C-ordered ``Xt`` of shape (k, M): backward, a
    column of ``T`` (contiguous in F order) per step, each of the ``k`` rows swept with it while it
    is in cache (``T`` is read once). One right-hand side (k = 1) runs as fast as a loop for vectors."""
    for j in range(T.shape[0] - 1, -1, -1):
        d = T[j, j]
        for c in range(Xt.shape[0]):
            xj = Xt[c, j] / d
            Xt[c, j] = xj
            for i in range(j):
                Xt[c, i] -= T[i, j] * xj
    return Xt


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def solve_t(T, Xt):  # pragma: no cover - compiled
    """``X <- T^{-T} X`` for ``X`` given transposed, as ``Xt`` of shape (k, M): forward, a dot
    product with a column of ``T`` per step and row."""
    for j in range(T.shape[0]):
        d = T[j, j]
        for c in range(Xt.shape[0]):
            s = Xt[c, j]
            for i in range(j):
                s -= T[i, j] * Xt[c, i]
            Xt[c, j] = s / d
    return Xt


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def minus_product(T, Xt, Acc):  # pragma: no cover - compiled
    """``Acc <- Acc - T X`` for a float32 ``T`` (F order, read once, a column at a time) and ``X``, ``Acc``
    given transposed as ``Xt`` (k, c) and ``Acc`` (k, r), in float64."""
    for j in range(T.shape[1]):
        for c in range(Xt.shape[0]):
            xj = Xt[c, j]
            for i in range(T.shape[0]):
                Acc[c, i] -= T[i, j] * xj
    return Acc


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def minus_product_t(T, Xt, Acc):  # pragma: no cover - compiled
    """``Acc <- Acc - T^T X`` (``Xt`` (k, r), ``Acc`` (k, c)): a dot product with a column of ``T`` per entry."""
    for j in range(T.shape[1]):
        for c in range(Xt.shape[0]):
            s = 0.0
            for i in range(T.shape[0]):
                s += T[i, j] * Xt[c, i]
            Acc[c, j] -= s
    return Acc
