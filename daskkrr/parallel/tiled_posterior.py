"""The posterior behind ``return_std`` for a model fitted on the tiled preconditioner route (many centers).

The dense route (:mod:`daskkrr.pipeline.posterior`, :func:`daskkrr.solvers.variance.nystrom_posterior`)
holds the preconditioned Gram matrix ``G = T^{-T} D K_MN K_NM D T^{-1}``, the factor ``R`` of
``I + G_c / sigma^2`` and ``R^{-1}`` whole on the client. Here every ``M x M`` matrix is tiles
(:mod:`daskkrr.parallel.tiled_linalg`), and every task holds a tile or a row block:

- :func:`preconditioned_gram`: per row block ``X_b`` of the data, the panels ``D_i k(Z_i, X_b)``, one
  tiled triangular solve ``C_b = T^{-T} D k(Z, X_b)`` (as the dense route's Gram pass: the kernel rows
  are preconditioned before they are multiplied, so the round-off of the product is not amplified by
  the condition number of ``K_MM``) and the tile products ``C_{b,i} C_{b,j}^T``, summed over the row
  blocks: ``n M^2`` flops of solves and ``n M^2`` of products, the dense route's arithmetic;
- :func:`tiled_nystrom_posterior`: ``R`` by the tiled Cholesky (the dense jitter policy),
  ``||R^{-1}||_F^2`` by a tiled triangular inverse whose column panels are squared where they are
  computed (``M^3 / 3`` flops), the residual sum of squares from ``T D^{-1} alpha`` and ``G`` applied
  tile by tile, then the dense route's formulas (:func:`~daskkrr.solvers.variance.assemble_nystrom_posterior`).

``T`` and ``R`` are written to a Zarr array each (a temporary folder the posterior keeps alive, copied
into the model folder by ``save``), and ``predict(X, return_std=True)`` solves with them tile by tile
(:class:`~daskkrr.solvers.tiled_factor.TileFile`). The fast (low-rank) variance needs an ``M x M``
eigenproblem, so a tiled posterior has the exact variance only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dask.delayed import Delayed, delayed

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.parallel.executor import BlockPasses, Executor, tree_reduce
from daskkrr.parallel.tiled_falkon import symmetric_product_graphs, tiled_diagonal
from daskkrr.parallel.tiled_linalg import (
    TiledMatrix,
    TileLayout,
    TileStore,
    ZarrTile,
    _hold,
    _key,
    _load,
    _op_minus_product,
    _op_shifted,
    _op_trsv,
    _targets,
    _task,
    as_blocks,
    gather,
    solve_graphs,
    solve_upper_tiled,
    tiled_cholesky,
    upper_matvec_graphs,
)
from daskkrr.solvers.tiled_factor import TileFile
from daskkrr.solvers.variance import (
    POSTERIOR_MATRIX,
    PosteriorVariance,
    assemble_nystrom_posterior,
    rss_from_gram_product,
)
from daskkrr.utils.linalg import JitterPolicy

__all__ = ["FAST_STD_REFUSED", "preconditioned_gram", "tiled_nystrom_posterior"]

#: Bytes of a row slice's ``M x rows`` float64 panels in the Gram pass (its triangular solve holds as much again):
#: a data block of ``n_b`` rows is cut into slices so that no task holds ``n_b x M`` (80 GB for 10^5 rows at
#: M = 50 000); 64 MiB is 167 rows at M = 50 000, whose tile products still run at BLAS speed.
PANEL_BYTES = 64 * 2**20

#: Why the tiled route has the exact variance only (``std_method="auto"`` records it, ``"fast"`` is refused with it).
FAST_STD_REFUSED = ("the fast variance needs an M x M eigenproblem on one process, which the tiled "
                    "preconditioner route exists to avoid; return_std uses the exact variance (two tiled "
                    "triangular solves per row block)")


# --------------------------------------------------------------------------- tasks
def _panel(shared: tuple[np.ndarray, np.ndarray, Kernel], rows: tuple[int, int], Xb: Any, first: int,
           last: int) -> np.ndarray:
    """``D_i k(Z_i, X_s)`` (``b_i x n_s``, float64) of the center tile ``i`` and the slice ``first:last`` of a row
    block: the kernel in the block's dtype by the engine, widened, as the dense route's Gram pass computes it."""
    Z, d, kernel = shared
    r = slice(*rows)
    K = engine_for(kernel).kernel_block(kernel, Xb[first:last], Z[r])
    return np.asarray(K, dtype=np.float64).T * d[r, None]


def _panel_rhs(panel: np.ndarray, d: np.ndarray, Yb: Any, first: int, last: int) -> np.ndarray:
    """``k(Z_i, X_s) Y_s`` of a row slice from the scaled panel."""
    Y = np.asarray(Yb, dtype=np.float64)[first:last].reshape(panel.shape[1], -1)
    return (panel / d[:, None]) @ Y


def _gram_tile(Ci: np.ndarray, Cj: np.ndarray) -> np.ndarray:
    """``C_i C_j^T``: one row block's share of the Gram tile ``(i, j)``."""
    return Ci @ Cj.T


def _posterior_tile(G: Any, si: np.ndarray, sj: np.ndarray, n: float, sigma2: float, diagonal: bool) -> np.ndarray:
    """Tile of ``I + (G - n s s^T) / sigma^2`` (``s`` the shift; zeros without an intercept)."""
    out = (np.asarray(_load(G), dtype=np.float64) - n * np.outer(si, sj)) / sigma2
    if diagonal:
        out[np.diag_indices_from(out)] += 1.0
    return np.asfortranarray(out)


def _unit_block(rows: int, cols: int, identity: bool) -> np.ndarray:
    """The identity (a diagonal block of ``I``) or zeros, made where it is used (not shipped in the graph)."""
    return np.eye(rows, cols) if identity else np.zeros((rows, cols))


def _square_sum(*blocks: np.ndarray) -> np.ndarray:
    return np.array(sum(np.einsum("ij,ij->", b, b) for b in blocks))


# --------------------------------------------------------------------------- the Gram pass
def preconditioned_gram(passes: BlockPasses, kernel: Kernel, Z: np.ndarray, T: TiledMatrix, d: np.ndarray, *,
                        segment: int = 8, panel_bytes: int = PANEL_BYTES) -> tuple[TiledMatrix, np.ndarray]:
    """``G = T^{-T} D K_MN K_NM D T^{-1}`` as float64 tiles (upper triangle, diagonal tiles whole) and
    ``K_MN Y`` (``Y`` the passes' targets, with their column of ones for an intercept) here.

    Parameters
    ----------
    passes : BlockPasses
        The row blocks of the training data and targets.
    kernel : Kernel
        The fit's kernel.
    Z : ndarray of shape (M, n_features)
        The centers (scaled as the data, in its dtype).
    T : TiledMatrix
        The preconditioner's upper factor, ``T^T T = D K_MM D``.
    d : ndarray of shape (M,)
        ``D``'s diagonal.
    segment : int, default=8
        Row slices per graph: the tile sums stay where they are computed between segments, so at most
        this many slices' panels are in flight at once.
    panel_bytes : int, default=PANEL_BYTES
        The row blocks are cut into slices whose ``M x rows`` float64 panels take about this many bytes.

    Returns
    -------
    gram : TiledMatrix
        ``G``'s tiles, where they were computed.
    knm_t_y : ndarray of shape (M, n_targets)
        ``K_MN Y``.
    """
    if passes.y_blocks is None:
        raise ValueError("the posterior's Gram pass needs the targets; make the passes with Y")
    layout, executor = T.layout, T.executor
    handle = executor.broadcast((np.ascontiguousarray(Z), np.asarray(d, dtype=np.float64), kernel))
    d_blocks = layout.split(np.asarray(d, dtype=np.float64))
    sums: dict[tuple[int, int], Any] = {}
    rhs: list[Any] = [None] * layout.nb
    step = max(1, int(panel_bytes // (8 * layout.M)))
    slices = [(b, a, min(a + step, rows)) for b, rows in enumerate(passes.X.chunks[0]) for a in range(0, rows, step)]
    for start in range(0, len(slices), max(1, int(segment))):
        parts: dict[tuple[int, int], list[Any]] = {k: [] if sums.get(k) is None else [sums[k]] for k in layout.pairs}
        rparts: list[list[Any]] = [[] if r is None else [r] for r in rhs]
        for b, first, last in slices[start:start + max(1, int(segment))]:
            Xb, Yb = passes.x_blocks[b], passes.y_blocks[b]
            panels = [delayed(_panel, pure=True, traverse=False)(handle, layout.bounds(i), Xb, first, last,
                                                                 dask_key_name=_key("posterior"))
                      for i in range(layout.nb)]
            for i, panel in enumerate(panels):
                rparts[i].append(_task("posterior", _panel_rhs, None, panel, d_blocks[i], Yb, first, last))
            C = solve_graphs(T, panels, trans=True)
            for i, j in layout.pairs:
                parts[(i, j)].append(_task("posterior", _gram_tile, None, C[i], C[j]))
        keys = list(layout.pairs)
        held = _hold(executor, [tree_reduce(parts[k]) for k in keys] + [tree_reduce(r) for r in rparts])
        sums = dict(zip(keys, held[:len(keys)]))
        rhs = held[len(keys):]
    knm_t_y = gather(executor, rhs, (layout.M, -1))
    return TiledMatrix(executor, layout, np.dtype(np.float64), sums), knm_t_y


# --------------------------------------------------------------------------- the posterior
def inverse_square_norm(R: TiledMatrix) -> float:
    """``||R^{-1}||_F^2`` of a tiled upper-triangular ``R``: column panel ``j`` of ``R^{-1}`` has tile rows
    ``0..j`` only, solved by back substitution from the identity tile and squared where it is computed."""
    L = R.layout
    squares: list[Delayed] = []
    for j in range(L.nb):
        width = L.bounds(j)[1] - L.bounds(j)[0]
        x: dict[int, Any] = {}
        for i in range(j, -1, -1):
            rows = L.bounds(i)[1] - L.bounds(i)[0]
            acc: Any = _task("inverse", _unit_block, None, rows, width, i == j)
            for k in range(i + 1, j + 1):
                acc = _task("inverse", _op_minus_product, None, acc, R.tile(i, k), x[k], False)
            x[i] = _task("inverse", _op_trsv, None, R.tile(i, i), acc, False)
        squares.append(_task("inverse", _square_sum, None, *x.values()))
    return float(sum(R.executor.backend.compute(squares)))


def _stored(executor: Executor, S: TiledMatrix, store: TileStore, name: str) -> TileFile:
    """The tiles of ``S`` written to a Zarr array of ``store`` (in their dtype), as a :class:`TileFile`."""
    targets = _targets(store, S.layout, S.dtype, name)
    _hold(executor, [_task("posterior", _op_shifted, targets[k], S.tile(*k), 0.0, str(S.dtype))
                     for k in S.layout.pairs])
    return _tile_file(executor, targets, S.layout)


def _tile_file(executor: Executor, tiles: dict[tuple[int, int], Any], layout: TileLayout) -> TileFile:
    """The :class:`TileFile` of tiles spilled to one Zarr array (their markers, here or held on a cluster)."""
    first = tiles[(0, 0)]
    if not isinstance(first, ZarrTile):
        first = executor.backend.fetch(first)
    if not isinstance(first, ZarrTile):
        raise TypeError(f"the posterior's factors are written to a Zarr store; got {type(first).__name__}")
    return TileFile(first.path, layout.M, layout.b)


def tiled_nystrom_posterior(T: TiledMatrix, d: np.ndarray, gram: TiledMatrix, *, noise_ratio: float, n: int,
                            mu: np.ndarray | None, y_sq: np.ndarray, knm_t_y: np.ndarray, coef: np.ndarray,
                            mean_kxx: float | None = None, spill_dir: str | None = None) -> PosteriorVariance:
    """:func:`~daskkrr.solvers.variance.nystrom_posterior` with ``T`` and the Gram matrix as tiles.

    Parameters
    ----------
    T : TiledMatrix
        The preconditioner's upper factor (its tiles are copied into the posterior's store).
    d : ndarray of shape (M,)
        ``D``'s diagonal.
    gram : TiledMatrix
        ``T^{-T} D K_MN K_NM D T^{-1}`` (:func:`preconditioned_gram`; not centred).
    noise_ratio, n, mu, y_sq, knm_t_y, coef, mean_kxx
        As for :func:`~daskkrr.solvers.variance.nystrom_posterior`.
    spill_dir : str, optional
        Parent folder of the posterior's Zarr store (the system's temporary directory by default).

    Returns
    -------
    PosteriorVariance
        With :class:`~daskkrr.solvers.tiled_factor.TileFile` factors; its ``storage`` keeps their folder.
    """
    executor, layout = T.executor, T.layout
    M, sigma2 = layout.M, float(noise_ratio)
    d = np.asarray(d, dtype=np.float64)
    shift = np.zeros(M) if mu is None else solve_upper_tiled(T, d * np.asarray(mu, dtype=np.float64), trans=True)
    store = TileStore(spill_dir)
    s_blocks = layout.split(shift)

    def source(i: int, j: int, jitter: float, target: Any) -> Delayed:
        tile = _task("posterior", _posterior_tile, None, gram.tile(i, j), s_blocks[i], s_blocks[j], float(n),
                     sigma2, i == j)
        return _task("posterior", _op_shifted, target, tile, jitter, "float64")

    mean_diagonal = 1.0 + float(np.mean(tiled_diagonal(gram) - n * shift**2)) / sigma2
    policy = JitterPolicy.for_matrix((M, M), mean_diagonal, np.float64, what=POSTERIOR_MATRIX)
    R, _ = tiled_cholesky(executor, layout, source, policy, dtype=np.float64, store=store, name="R")
    C = np.asarray(coef, dtype=np.float64).reshape(M, -1)
    u = gather(executor, upper_matvec_graphs(T, as_blocks(layout, C / d[:, None])), C.shape)
    gram_u = gather(executor, symmetric_product_graphs(gram, as_blocks(layout, u)), C.shape)
    return assemble_nystrom_posterior(
        _stored(executor, T, store, "T"), d, _tile_file(executor, R.tiles, layout), shift, noise_ratio=sigma2, n=n,
        intercept=mu is not None, inverse_square_norm=inverse_square_norm(R),
        rss=rss_from_gram_product(u, gram_u, shift, n=n, y_sq=y_sq, knm_t_y=knm_t_y, coef=C),
        y_sq=y_sq, knm_t_y=knm_t_y, coef=C,
        gram_trace=None if mean_kxx is None else float(np.sum(tiled_diagonal(gram))), storage=store,
    )
