"""FALKON's preconditioner with its ``M x M`` matrices tiled (:mod:`daskkrr.parallel.tiled_linalg`).

:class:`TiledFalkonPreconditioner` has the methods of
:class:`~daskkrr.solvers.FalkonPreconditioner` that CG uses (``rhs``, ``operator``,
``to_coefficients``), so :func:`~daskkrr.solvers.falkon_solve` runs unchanged; each of
them is one or two task graphs of tile solves, and only ``M x t`` blocks reach the client.

It factors FALKON's original inner matrix ``A^T A = T T^T / M + lambda I`` (centred on the
centers' mean with an intercept), not the row sketch's ``W^T W / (M + s)``: the sketch Gram
is ``s M^2`` more flops of triangular solves and rank-k updates on top of the factorisation,
and at the sizes this route serves (``M`` beyond what the client can hold) ``s >= 2 M``
sketch rows would cost more than the CG iterations they save. The preconditioner changes
CG's speed only: both converge to the same Nystrom solution.

The rest follows the dense class: the same jitter (policy and floor), the same float32
factorisation from 2048 centers in a float32 fit with ``D K_MM D`` applied exactly in the
penalty term (kept as float64 tiles in memory, as the dense route keeps it; recomputed in each
iteration where the factors are spilled to Zarr, which is cheaper than reading them back), the same
``exact_penalty`` term ``v - jitter T^{-T} T^{-1} v``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from dask.delayed import Delayed, delayed

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.parallel.executor import Executor
from daskkrr.parallel.tiled_linalg import (
    TiledMatrix,
    TileLayout,
    TileStore,
    _load,
    as_blocks,
    gather,
    kernel_cholesky,
    kernel_tiles,
    shifted_source,
    solve_graphs,
    tiled_cholesky,
    upper_matvec_graphs,
    upper_times_transpose,
)
from daskkrr.parallel.tiles import _kept_product, _key, _sum_roles
from daskkrr.utils.linalg import JitterPolicy

__all__ = ["TiledFalkonPreconditioner", "symmetric_product_graphs", "tiled_diagonal"]


def _diag_task(tile: Any) -> np.ndarray:
    return np.diag(_load(tile)).astype(np.float64)


def tiled_diagonal(S: TiledMatrix) -> np.ndarray:
    """The diagonal of a tiled matrix (read from its diagonal tiles where they are)."""
    graphs = [delayed(_diag_task, pure=True, traverse=False)(S.tile(i, i), dask_key_name=_key("diag"))
              for i in range(S.layout.nb)]
    return gather(S.executor, graphs, (S.layout.M,))


def _lincomb(a: float, x: np.ndarray, b: float, y: np.ndarray) -> np.ndarray:
    return a * np.asarray(x, dtype=np.float64) + b * np.asarray(y, dtype=np.float64)


def _scale_rows(x: np.ndarray, d: np.ndarray, factor: float) -> np.ndarray:
    return np.asarray(x, dtype=np.float64) * d[:, None] * factor


def _data_plus_penalty(c: np.ndarray, d: np.ndarray, factor: float, lam: float, q: np.ndarray) -> np.ndarray:
    """``D c * factor + lam q`` (the right-hand side of the operator's one ``T^{-T}`` solve)."""
    return _scale_rows(c, d, factor) + lam * np.asarray(q, dtype=np.float64)


def _tile_product(K: Any, vi: np.ndarray, vj: np.ndarray, diagonal: bool) -> tuple:
    """``(K v_j, K^T v_i)`` of a kept kernel tile (read from the spill store where it is a marker)."""
    return _kept_product(_load(K), vi, vj, diagonal, None, None)


#: Rows of a recomputed kernel tile built at once: a 256 x 2048 float64 strip (4 MiB) is reused from the heap,
#: where a whole 32 MiB tile is fresh memory each time (page faults at 0.5 GB/s on the development VM).
KERNEL_STRIP_ROWS = 256


def _recomputed_tile_product(shared: tuple[np.ndarray, np.ndarray, Kernel], rows: tuple[int, int],
                             cols: tuple[int, int], vi: np.ndarray, vj: np.ndarray, diagonal: bool) -> tuple:
    """``(K v_j, K^T v_i)`` (the second None on a diagonal tile) of a float64 tile of ``D K_MM D`` computed afresh
    by the block engine, a strip of rows at a time (the fused loops of the data passes: at d = 20 a 2048 x 2048
    tile in 0.03 s against 0.12 s for the kernel's numpy call; its entries differ from the kept tiles' by float64
    rounding)."""
    Z, d, kernel = shared
    Zi, Zj, di, dj = Z[slice(*rows)], Z[slice(*cols)], d[slice(*rows)], d[slice(*cols)]
    vi, vj = np.asarray(vi, dtype=np.float64), np.asarray(vj, dtype=np.float64)
    engine = engine_for(kernel)
    left = np.empty((len(Zi), vj.shape[1]))
    right = None if diagonal else np.zeros((len(Zj), vi.shape[1]))
    for a in range(0, len(Zi), KERNEL_STRIP_ROWS):
        b = slice(a, a + KERNEL_STRIP_ROWS)
        K = np.asarray(engine.kernel_block(kernel, Zi[b], Zj), dtype=np.float64)
        K *= di[b, None]
        K *= dj[None, :]
        left[b] = K @ vj
        if right is not None:
            right += K.T @ vi[b]
    return left, right


#: Builds the task of tile ``(i, j)``'s products with the blocks ``v_i``, ``v_j``: ``product(i, j, v_i, v_j)``.
TileProduct = Callable[[int, int, Any, Any], Delayed]


def symmetric_product_graphs(S: TiledMatrix, blocks: list[Any], name: str = "kmm") -> list[Delayed]:
    """Graphs of the row blocks of ``S V`` for a symmetric tiled ``S`` (upper tiles, diagonal tiles whole): a tile
    ``(i, j)`` gives ``S_ij v_j`` to block ``i`` and ``S_ij^T v_i`` to block ``j``; each tile is read once."""

    def product(i: int, j: int, vi: Any, vj: Any) -> Delayed:
        return delayed(_tile_product, pure=True, traverse=False)(S.tile(i, j), vi, vj, i == j,
                                                                 dask_key_name=_key(name))

    return _symmetric_graphs(S.layout, product, blocks, name)


def recomputed_kernel_product_graphs(layout: TileLayout, shared: Any, blocks: list[Any],
                                     name: str = "kmm") -> list[Delayed]:
    """:func:`symmetric_product_graphs` of ``D K_MM D`` with each tile computed from the centers in its task
    (``shared``: the broadcast ``(Z, d, kernel)``) instead of read from where it is kept."""

    def product(i: int, j: int, vi: Any, vj: Any) -> Delayed:
        return delayed(_recomputed_tile_product, pure=True, traverse=False)(
            shared, layout.bounds(i), layout.bounds(j), vi, vj, i == j, dask_key_name=_key(name))

    return _symmetric_graphs(layout, product, blocks, name)


def _symmetric_graphs(layout: TileLayout, product: TileProduct, blocks: list[Any], name: str) -> list[Delayed]:
    """Row blocks of ``S V`` from the upper tiles' product tasks (each task's two products go to two blocks)."""
    contrib: list[list[tuple[int, Delayed]]] = [[] for _ in range(layout.nb)]
    for i, j in layout.pairs:
        task = product(i, j, blocks[i], blocks[j])
        contrib[i].append((0, task))
        if i != j:
            contrib[j].append((1, task))
    return [delayed(_sum_roles, pure=True)(blocks[i], 0.0, tuple(r for r, _ in parts), *[p for _, p in parts],
                                           dask_key_name=_key(name))
            for i, parts in enumerate(contrib)]


@dataclasses.dataclass
class TiledFalkonPreconditioner:
    """The factors ``T`` and ``A`` of FALKON's preconditioner as tiles (see the module docstring).

    Build it with :meth:`from_centers`; free it with :meth:`close`.
    """

    T: TiledMatrix
    A: TiledMatrix
    d: np.ndarray
    penalty: float
    n: float
    jitter: float
    exact_penalty: bool
    factor_precision: str
    #: ``D K_MM D`` as float64 tiles, kept when the factors are float32: the penalty term applies it exactly
    #: (as the dense route keeps it; recomputing its tiles each CG iteration took most of an iteration's time).
    kmm: TiledMatrix | None = None
    #: ``(Z, d, kernel)`` as a task argument where the float32 factors are spilled: the kernel tiles are then
    #: recomputed in each CG iteration instead of kept (see :meth:`from_centers`).
    kmm_source: Any = None
    store: TileStore | None = None
    #: No sketch: the inner matrix is FALKON's own, in float64 unless the factors are float32.
    precision: str = "float64"

    @classmethod
    def from_centers(cls, executor: Executor, Z: np.ndarray, kernel: Kernel, *, penalty: float, n: float,
                     tile: int, weights: np.ndarray | None = None, center_sketch: bool = False,
                     relative_jitter: float | None = None, factor_precision: str = "float64",
                     spill: bool = False, spill_dir: str | None = None) -> TiledFalkonPreconditioner:
        """Factor the preconditioner of the centers ``Z`` tile by tile.

        Parameters
        ----------
        executor : Executor
            Where the tile tasks run and the tiles are kept.
        Z : ndarray of shape (M, n_features)
            The centers (scaled as the data).
        kernel : Kernel
            The fit's kernel.
        penalty, n : float
            FALKON's lambda and the sum of the row weights (as :class:`~daskkrr.solvers.FalkonPreconditioner`).
        tile : int
            Rows and columns of a tile.
        weights : ndarray of shape (M,), optional
            Importance weights of the centers (``D = diag(sqrt(weights))``).
        center_sketch : bool, default=False
            Centre the inner matrix on the centers' mean (a fit with an intercept).
        relative_jitter : float, optional
            The jitter floor of ``T`` (:func:`~daskkrr.solvers.falkon.jitter_floor`); the penalty term then
            keeps the jitter's part.
        factor_precision : {"float64", "float32"}, default="float64"
            Arithmetic and storage of the tiles of ``T`` and ``A``.
        spill : bool, default=False
            Keep the tiles in a Zarr store in a temporary folder (under ``spill_dir``) instead of memory.
        spill_dir : str, optional
            Parent folder of the spill store.

        Returns
        -------
        TiledFalkonPreconditioner
        """
        if factor_precision not in ("float64", "float32"):
            raise ValueError(f"factor_precision must be 'float64' or 'float32'; got {factor_precision!r}")
        if not penalty > 0:
            raise ValueError(f"penalty must be > 0; got {penalty!r}")
        single = factor_precision == "float32"
        store = TileStore(spill_dir) if spill else None
        T, jitter, d = kernel_cholesky(executor, Z, kernel, tile=tile, dtype=factor_precision, weights=weights,
                                       store=store, relative_jitter=relative_jitter)
        M = T.layout.M
        center = None
        if center_sketch:  # the centers' rows of W = T^T summed: T 1
            center = gather(executor, upper_matvec_graphs(T, as_blocks(T.layout, np.ones(M))), (M,))
        inner = upper_times_transpose(T, rows=float(M), center=center, shift=float(penalty), store=store)
        A = cls._factor_inner(executor, inner, single, store)
        inner.release()  # before the kernel tiles: they take its place (parallel.factor_cost counts them)
        # Spilled, the float64 kernel tiles are recomputed in each iteration rather than read back: reading an
        # entry (8 bytes from Zarr, from disk once the tiles outgrow the page cache) costs more than computing
        # it (parallel.cost's rates), and at M = 50 000 they would be 10 GB of reads per iteration.
        kept = kernel_tiles(executor, Z, kernel, d, tile=T.layout.b) if single and store is None else None
        source = executor.broadcast((np.ascontiguousarray(Z, dtype=np.float64), d, kernel)) \
            if single and store is not None else None
        return cls(T=T, A=A, d=d, penalty=float(penalty), n=float(n), jitter=jitter,
                   exact_penalty=relative_jitter is not None or single, factor_precision=factor_precision,
                   kmm=kept, kmm_source=source, store=store, precision="float32" if single else "float64")

    @staticmethod
    def _factor_inner(executor: Executor, inner: TiledMatrix, single: bool, store: TileStore | None) -> TiledMatrix:
        """``A``: float32 without jitter first where the factors are float32 (as the dense route), else
        (or when that fails) float64 with the round-off jitter policy."""
        what = "FALKON inner matrix W^T W / s + lambda I"
        scale = float(np.mean(tiled_diagonal(inner)))
        if single:
            policy = JitterPolicy.for_matrix((inner.layout.M,) * 2, scale, np.float32, what=what, initial_jitter=0.0)
            try:
                return tiled_cholesky(executor, inner.layout, shifted_source(inner, np.float32), policy,
                                      dtype=np.float32, store=store, escalate=False, name="A")[0]
            except np.linalg.LinAlgError:
                pass
        policy = JitterPolicy.for_matrix((inner.layout.M,) * 2, scale, np.float64, what=what)
        return tiled_cholesky(executor, inner.layout, shifted_source(inner, np.float64), policy, dtype=np.float64,
                              store=store, name="A")[0]

    @property
    def n_centers(self) -> int:
        return self.T.layout.M

    @property
    def executor(self) -> Executor:
        return self.T.executor

    # ------------------------------------------------------------ the products CG uses
    def _blocks(self, V: np.ndarray) -> list[np.ndarray]:
        return as_blocks(self.T.layout, V)

    def _d_blocks(self) -> list[np.ndarray]:
        return self._blocks(self.d)

    def _scaled(self, blocks: list[Any], factor: float = 1.0) -> list[Delayed]:
        """``D x / factor`` block by block."""
        return [delayed(_scale_rows, pure=True)(b, di[:, 0], factor, dask_key_name=_key("solve"))
                for b, di in zip(blocks, self._d_blocks())]

    def to_coefficients(self, beta: np.ndarray) -> np.ndarray:
        """``alpha = D T^{-1} A^{-1} beta``."""
        beta = np.asarray(beta)
        t = solve_graphs(self.T, solve_graphs(self.A, self._blocks(beta)))
        return gather(self.executor, self._scaled(t), beta.shape)

    def rhs(self, knm_t_y: np.ndarray) -> np.ndarray:
        """Preconditioned right-hand side ``A^{-T} T^{-T} D K_nM^T y / n``."""
        b = np.asarray(knm_t_y)
        w = solve_graphs(self.T, self._scaled(self._blocks(b), 1.0 / self.n), trans=True)
        return gather(self.executor, solve_graphs(self.A, w, trans=True), b.shape)

    def operator(self, gram_matvec: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        """The preconditioned FALKON operator ``beta -> P^T H P beta / n``: one graph of tile solves on each
        side of the caller's ``gram_matvec`` (the pass over the data), the least CG allows.

        ``P^T H P beta / n = A^{-T} (T^{-T} (D c / n + lambda q) + lambda r)`` with ``v = A^{-1} beta``,
        ``t = T^{-1} v``, ``c = K_nM^T K_nM D t`` (the caller's), and the penalty term
        ``T^{-T} D K_MM D t`` split as ``T^{-T} q + r``: ``q = D K_MM D t``, ``r = 0`` with the kernel
        tiles kept (float32 factors), else ``q = -jitter t``, ``r = v`` (``exact_penalty``) or ``q = 0``,
        ``r = v``. One ``T^{-T}`` solve then serves both terms (the dense route does two).
        """

        def apply(beta: np.ndarray) -> np.ndarray:
            beta = np.asarray(beta, dtype=np.float64)
            v = solve_graphs(self.A, self._blocks(beta))
            t = solve_graphs(self.T, v)
            parts = self.executor.backend.compute([*v, *t])
            nb = self.T.layout.nb
            v_blocks, t_blocks = parts[:nb], parts[nb:]
            u = (self.d[:, None] * np.concatenate(t_blocks, axis=0)).reshape(beta.shape)
            c = np.asarray(gram_matvec(u), dtype=np.float64).reshape(beta.shape)
            return gather(self.executor, self._back_graphs(self._blocks(c), v_blocks, t_blocks), beta.shape)

        return apply

    def _back_graphs(self, c: list[np.ndarray], v: list[np.ndarray], t: list[np.ndarray]) -> list[Delayed]:
        """``A^{-T} (T^{-T} (D c / n + lambda q) + lambda r)`` block by block (see :meth:`operator`)."""
        lam = self.penalty
        d = self._d_blocks()
        if self.kmm is not None or self.kmm_source is not None:
            q = self._kernel_product(t)
            inner = [delayed(_data_plus_penalty, pure=True)(ci, di[:, 0], 1.0 / self.n, lam, qi,
                                                            dask_key_name=_key("solve"))
                     for ci, di, qi in zip(c, d, q)]
            return solve_graphs(self.A, solve_graphs(self.T, inner, trans=True), trans=True)
        shift = -lam * self.jitter if self.exact_penalty else 0.0
        inner = [delayed(_data_plus_penalty, pure=True)(ci, di[:, 0], 1.0 / self.n, shift, ti,
                                                        dask_key_name=_key("solve"))
                 for ci, di, ti in zip(c, d, t)]
        w = solve_graphs(self.T, inner, trans=True)
        total = [delayed(_lincomb, pure=True)(1.0, wi, lam, vi, dask_key_name=_key("solve")) for wi, vi in zip(w, v)]
        return solve_graphs(self.A, total, trans=True)

    def _kernel_product(self, t: list[np.ndarray]) -> list[Delayed]:
        """``D K_MM D t`` from the kept tiles, or tiles recomputed from the centers where they are not kept
        (upper triangle: a tile ``(i, j)`` gives ``K_ij t_j`` to block ``i`` and ``K_ij^T t_i`` to block ``j``)."""
        if self.kmm is not None:
            return symmetric_product_graphs(self.kmm, t)
        if self.kmm_source is not None:
            return recomputed_kernel_product_graphs(self.T.layout, self.kmm_source, t)
        raise RuntimeError("the kernel product of the penalty term needs the kernel tiles (float32 factors)")

    def close(self) -> None:
        """Free the tiles (and the spill store)."""
        self.T.release()
        self.A.release()
        if self.kmm is not None:
            self.kmm.release()
        if self.store is not None:
            self.store.close()
