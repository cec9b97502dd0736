"""The compiled loops of :mod:`daskkrr.utils.mixed_solve` (imported only where numba is)."""

from __future__ import annotations

from numba import njit

# Reductions may be reassociated (that is what lets LLVM vectorise them); FMA contraction.
_FASTMATH = {"reassoc", "contract"}


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def solve_vec(T, x):  # pragma: no cover - compiled
    """``x <- T^{-1} x``: backward, a column of ``T`` (contiguous in F order) per step."""
    for j in range(T.shape[0] - 1, -1, -1):
        xj = x[j] / T[j, j]
        x[j] = xj
        for i in range(j):
            x[i] -= T[i, j] * xj
    return x


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def solve_t_vec(T, x):  # pragma: no cover - compiled
    """``x <- T^{-T} x``: forward, a dot product with a column of ``T`` per step."""
    for j in range(T.shape[0]):
        s = x[j]
        for i in range(j):
            s -= T[i, j] * x[i]
        x[j] = s / T[j, j]
    return x


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def solve_mat(T, Xt):  # pragma: no cover - compiled
    """``X <- T^{-1} X`` for ``X`` given transposed, C-ordered ``Xt`` of shape (k, M): each of the
    ``k`` rows is swept with the column of ``T`` while that column is in cache (``T`` is read once)."""
    for j in range(T.shape[0] - 1, -1, -1):
        d = T[j, j]
        for c in range(Xt.shape[0]):
            xj = Xt[c, j] / d
            Xt[c, j] = xj
            for i in range(j):
                Xt[c, i] -= T[i, j] * xj
    return Xt


@njit(nogil=True, fastmath=_FASTMATH, cache=True)
def solve_t_mat(T, Xt):  # pragma: no cover - compiled
    """``X <- T^{-T} X`` for ``X`` given transposed, as ``Xt`` of shape (k, M)."""
    for j in range(T.shape[0]):
        d = T[j, j]
        for c in range(Xt.shape[0]):
            s = Xt[c, j]
            for i in range(j):
                s -= T[i, j] * Xt[c, i]
            Xt[c, j] = s / d
    return Xt
