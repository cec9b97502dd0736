"""The exact kernel system on the workers: ``n x n`` tiles, n-vectors and feature blocks.

Exact kernel ridge regression by PCG (:mod:`daskkrr.solvers.pcg`) needs three
distributed pieces, all here:

- :class:`TileOperator`: ``v -> (K + lambda I) v`` over row-block x row-block
  tiles ``K_ij = k(X_i, X_j)``. Only the upper triangle ``i <= j`` is computed (the
  kernel is symmetric): tile ``(i, j)`` adds ``K_ij v_j`` to block ``i`` and
  ``K_ij^T v_i`` to block ``j``. The tiles are either kept in worker memory (in
  ``tile_dtype``, float32 halves the memory) or recomputed by the fused engine on
  every product (out of core: a tile per task), as :func:`plan_tiles` decides from
  the cost model's rates and the workers' memory.
- :class:`BlockOps`: the n-vectors as row blocks chunked like ``X``, kept on the
  workers (:class:`BlockVector`); a linear combination is one task per block and
  only column dot products (scalars) come to the client. Plain task graphs, not
  dask arrays: an iteration makes a dozen small graphs, and dask.array's graph
  optimisation cost more than the arithmetic at small n.
- :class:`FeatureBlocks`: ``Z`` (random or Nystrom features) computed block by
  block from ``X`` (kept on the workers when it fits, recomputed otherwise),
  ``Z^T Z`` in one tree-reduced pass, and the Woodbury preconditioner
  ``(Z Z^T + lambda_p I)^{-1} r``: ``Z^T r`` is a reduction (``s x t`` to the client),
  ``Z w`` a blockwise product.

With per-row weights ``w`` the operator is the symmetric ``W^{1/2} K W^{1/2}`` and
the features are ``W^{1/2} Z`` (``scale`` = ``sqrt(w)``).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

import dask.array as da
import numpy as np
from dask.delayed import Delayed, delayed

from daskkrr.events import PassDone, PassStarted, block_task_prefix
from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.kernels.sparse import as_sparse_rows, is_sparse
from daskkrr.parallel.cost import DEFAULT_RATES, Rates
from daskkrr.parallel.executor import Executor, tree_reduce
from daskkrr.parallel.resources import Resources
from daskkrr.solvers.pcg import WoodburyFactor

__all__ = [
    "TILE_CHOICES",
    "BlockOps",
    "BlockVector",
    "FeatureBlocks",
    "TileOperator",
    "TilePlan",
    "data_blocks",
    "plan_tiles",
    "random_vector",
    "rechunk_rows",
    "tile_bytes",
]

logger = logging.getLogger("daskkrr")

#: Rows of a tile block by default: a float64 tile is 32 MiB.
TILE_ROWS = 2048
#: Largest share of the workers' memory the kept tiles may take.
TILE_MEMORY_FRACTION = 0.5
#: Largest share of the workers' memory the kept feature blocks ``Z`` may take.
FEATURE_MEMORY_FRACTION = 0.125
TILE_CHOICES = ("auto", "keep", "recompute")


# --------------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class TilePlan:
    """How the ``n x n`` products run, and what they are expected to cost.

    Attributes
    ----------
    keep : bool
        Tiles kept in worker memory (else recomputed on every product).
    tile_rows : int
        Rows of a tile block.
    tile_dtype : str
        dtype of kept tiles.
    tile_bytes : int
        Memory of all kept tiles (upper triangle).
    build_seconds, product_seconds : float
        Estimated wall-clock seconds to compute all tiles once, and of one product
        (with kept tiles: reading them; without: recomputing them).
    budget_bytes : int
        The workers' memory (or this machine's on threads).
    """

    keep: bool
    tile_rows: int
    tile_dtype: str
    tile_bytes: int
    build_seconds: float
    product_seconds: float
    budget_bytes: int

    def seconds(self, iterations: int) -> float:
        """Estimated seconds of ``iterations`` products (plus building kept tiles)."""
        if self.keep:
            return self.build_seconds + iterations * self.product_seconds
        return iterations * self.product_seconds

    def describe(self, n: int, iterations: int) -> str:
        held = (f"keeps the upper-triangle tiles in {self.tile_dtype} ({self.tile_bytes / 1e9:.3g} GB of "
                f"{self.budget_bytes / 1e9:.3g} GB)" if self.keep else
                f"recomputes the tiles on every product (kept tiles would take {self.tile_bytes / 1e9:.3g} GB "
                f"of {self.budget_bytes / 1e9:.3g} GB)")
        return (f"exact KRR by PCG at n={n}: {held}; tiles of {self.tile_rows} rows; about "
                f"{self.product_seconds:.3g} s per product, roughly {_duration(self.seconds(iterations))} for "
                f"{iterations} products")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def tile_bytes(n: int, tile_rows: int, itemsize: int) -> int:
    """Bytes of the upper-triangle tiles (diagonal tiles whole) at ``n`` rows."""
    b = max(1, min(int(tile_rows), int(n)))
    full, rest = divmod(int(n), b)
    sizes = [b] * full + ([rest] if rest else [])
    total = sum(sizes[i] * sizes[j] for i in range(len(sizes)) for j in range(i, len(sizes)))
    return int(total * itemsize)


def plan_tiles(n: int, d: int, *, resources: Resources, tiles: str = "auto", tile_rows: int | None = None,
               tile_dtype: str = "float32", data_itemsize: int = 8, rates: Rates = DEFAULT_RATES) -> TilePlan:
    """Keep or recompute the tiles, by the cost model's rates and the workers' memory.

    Kept tiles cost one kernel evaluation of the upper triangle, then each product
    streams them (``n^2 / 2`` entries at ``stream_bytes_per_s`` per core);
    recomputing costs the upper triangle's kernel evaluations on every product.
    Kept tiles win whenever they fit in :data:`TILE_MEMORY_FRACTION` of the memory.
    """
    if tiles not in TILE_CHOICES:
        raise ValueError(f"kernel_tiles must be one of {TILE_CHOICES}; got {tiles!r}")
    rows = int(tile_rows or TILE_ROWS)
    itemsize = np.dtype(tile_dtype).itemsize
    nbytes = tile_bytes(n, rows, itemsize)
    entries = nbytes / itemsize
    cores = max(1, resources.cores)
    build = entries * rates.entry_s(d, data_itemsize) / cores
    stream = entries * itemsize / rates.stream_bytes_per_s / cores
    fits = nbytes <= TILE_MEMORY_FRACTION * resources.memory_bytes
    keep = fits if tiles == "auto" else tiles == "keep"
    return TilePlan(keep=keep, tile_rows=rows, tile_dtype=str(np.dtype(tile_dtype)), tile_bytes=nbytes,
                    build_seconds=build, product_seconds=stream if keep else build,
                    budget_bytes=int(resources.memory_bytes))


# --------------------------------------------------------------------------- block tasks
# Module-level functions: workers unpickle them.
def _tile_task(Xi: np.ndarray, Xj: np.ndarray, kernel: Kernel, dtype: str) -> np.ndarray:
    K = engine_for(kernel).kernel_block(kernel, Xi, Xj)
    return np.ascontiguousarray(K, dtype=dtype)


#: Rows of a float32 tile widened to float64 at once by the products.
WIDEN_ROWS = 256


def _products(K: np.ndarray, vi: np.ndarray, vj: np.ndarray, diagonal: bool,
              si: np.ndarray | None, sj: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(K v_j, K^T v_i)`` in float64 (the second None on a diagonal tile), with row scales.

    A float32 tile is widened to float64 a strip of rows at a time: the operator is then
    exactly the symmetric matrix of the rounded entries, applied in float64. (Casting the
    vectors to float32 instead would make each product err by ``eps_32 ||K|| ||v||``, which
    next to a small ``lambda`` stops CG far from ``tol``.)
    """
    if si is not None and sj is not None:
        vi, vj = vi * si, vj * sj
    vi = np.asarray(vi, dtype=np.float64)
    vj = np.asarray(vj, dtype=np.float64)
    if K.dtype == np.float64:
        left = K @ vj
        right = None if diagonal else K.T @ vi
    else:
        left = np.empty((K.shape[0], vj.shape[1]))
        right = None if diagonal else np.zeros((K.shape[1], vi.shape[1]))
        for a in range(0, K.shape[0], WIDEN_ROWS):
            strip = K[a:a + WIDEN_ROWS].astype(np.float64)
            left[a:a + WIDEN_ROWS] = strip @ vj
            if right is not None:
                right += strip.T @ vi[a:a + WIDEN_ROWS]
    if si is not None and sj is not None:
        left = left * si
        right = None if right is None else right * sj
    return left, right


def _recompute_product(Xi: np.ndarray, Xj: np.ndarray, vi: np.ndarray, vj: np.ndarray, kernel: Kernel,
                       diagonal: bool, si: np.ndarray | None, sj: np.ndarray | None) -> tuple:
    K = engine_for(kernel).kernel_block(kernel, Xi, Xj)
    return _products(K, vi, vj, diagonal, si, sj)


def _kept_product(K: np.ndarray, vi: np.ndarray, vj: np.ndarray, diagonal: bool,
                  si: np.ndarray | None, sj: np.ndarray | None) -> tuple:
    return _products(K, vi, vj, diagonal, si, sj)


def _sum_roles(v: np.ndarray, shift: float, roles: tuple[int, ...], *parts: tuple) -> np.ndarray:
    total = shift * np.asarray(v, dtype=np.float64)
    for role, part in zip(roles, parts):
        total += part[role]
    return total


def _lincomb_task(coefs: tuple, *blocks: np.ndarray) -> np.ndarray:
    out = None
    for c, b in zip(coefs, blocks):
        term = b * c
        out = term if out is None else out + term
    return np.asarray(out, dtype=np.float64)


def _dots_task(*blocks: np.ndarray) -> np.ndarray:
    """Column dots of consecutive pairs, stacked ``(pairs, t)``."""
    return np.stack([np.einsum("ij,ij->j", blocks[k], blocks[k + 1]) for k in range(0, len(blocks), 2)])


def _features_task(Xb: np.ndarray, fmap: Any, scale: np.ndarray | None) -> np.ndarray:
    Z = fmap(Xb)
    return Z if scale is None else Z * scale


def _zt_r_task(Zb: np.ndarray, Rb: np.ndarray) -> np.ndarray:
    return Zb.T @ Rb


def _zt_r_recompute(Xb: np.ndarray, fmap: Any, scale: np.ndarray | None, Rb: np.ndarray) -> np.ndarray:
    return _features_task(Xb, fmap, scale).T @ Rb


def _gram_task(Zb: np.ndarray) -> np.ndarray:
    return Zb.T @ Zb


def _gram_recompute(Xb: np.ndarray, fmap: Any, scale: np.ndarray | None) -> np.ndarray:
    Z = _features_task(Xb, fmap, scale)
    return Z.T @ Z


def _woodbury_task(Zb: np.ndarray, Rb: np.ndarray, w: np.ndarray, penalty: float) -> np.ndarray:
    return (Rb - Zb @ w) / penalty


def _woodbury_recompute(Xb: np.ndarray, fmap: Any, scale: np.ndarray | None, Rb: np.ndarray, w: np.ndarray,
                        penalty: float) -> np.ndarray:
    return (Rb - _features_task(Xb, fmap, scale) @ w) / penalty


def _scale_task(v: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return v * scale


def _random_task(rows: int, seed: int, index: int) -> np.ndarray:
    return np.random.default_rng([int(seed), int(index)]).standard_normal((int(rows), 1))


def _block(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


def _data_block(a: Any) -> Any:
    """A row block to keep: C-contiguous numpy, or CSR for a sparse block (its tiles come from sparse products)."""
    return as_sparse_rows(a) if is_sparse(a) else np.ascontiguousarray(a)


def submit(executor: Executor, graphs: list[Any]) -> list[Any]:
    """Start per-block graphs and return handles to their results, kept where computed.

    On a cluster the futures are returned at once (the next graph can depend on them;
    only a computation that brings a value back waits), which saves a round trip per
    step of the solver; on threads the results are computed here.
    """
    backend = executor.backend
    if backend.is_distributed:
        return list(backend.client.compute(list(graphs)))
    return backend.keep(graphs)


def _key(name: str) -> str:
    """A fresh task key counted by the progress bar under the pass ``name``."""
    return f"{block_task_prefix(name)}-{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- vectors
@dataclasses.dataclass
class BlockVector:
    """An ``(n, t)`` vector as row blocks kept where they were computed (futures on a
    cluster, arrays on threads), chunked like the tile blocks of ``X``."""

    blocks: list[Any]
    t: int


class BlockOps:
    """:class:`~daskkrr.solvers.pcg.VectorOps` for :class:`BlockVector`: every linear
    combination is one task per block, kept on the workers; dot products are
    tree-reduced and only their ``(t,)`` results come to the client."""

    def __init__(self, executor: Executor, row_chunks: tuple[int, ...]):
        self.executor = executor
        self.row_chunks = tuple(int(c) for c in row_chunks)

    @property
    def backend(self) -> Any:
        return self.executor.backend

    def keep(self, graphs: list[Any], t: int) -> BlockVector:
        """Compute per-block graphs and keep the results: a vector."""
        return BlockVector(submit(self.executor, graphs), int(t))

    def lincomb(self, terms: list[tuple[Any, BlockVector]]) -> BlockVector:
        return self.lincombs([terms])[0]

    def lincombs(self, combos: list[list[tuple[Any, BlockVector]]]) -> list[BlockVector]:
        """Several linear combinations in one round trip."""
        graphs = []
        for terms in combos:
            coefs = tuple(c if np.isscalar(c) else np.asarray(c, dtype=np.float64) for c, _ in terms)
            graphs += [delayed(_lincomb_task, pure=True)(coefs, *[v.blocks[b] for _, v in terms],
                                                         dask_key_name=_key("axpy"))
                       for b in range(len(self.row_chunks))]
        kept = submit(self.executor, graphs)
        nb = len(self.row_chunks)
        return [BlockVector(kept[k * nb:(k + 1) * nb], combos[k][0][1].t) for k in range(len(combos))]

    def dots(self, pairs: list[tuple[BlockVector, BlockVector]]) -> list[np.ndarray]:
        parts = [delayed(_dots_task, pure=True)(*[x for a, b in pairs for x in (a.blocks[k], b.blocks[k])],
                                                dask_key_name=_key("dot"))
                 for k in range(len(self.row_chunks))]
        (total,) = self.backend.compute([tree_reduce(parts)])
        return [np.asarray(row, dtype=np.float64) for row in np.asarray(total)]

    def to_numpy(self, v: BlockVector) -> np.ndarray:
        return np.concatenate([np.asarray(b) for b in self.backend.compute(list(v.blocks))], axis=0)

    def from_numpy(self, a: np.ndarray) -> BlockVector:
        a = np.asarray(a, dtype=np.float64)
        a = a.reshape(a.shape[0], -1)
        bounds = np.concatenate([[0], np.cumsum(self.row_chunks)])
        graphs = [delayed(_block, pure=True)(a[int(lo):int(hi)], dask_key_name=_key("vector"))
                  for lo, hi in zip(bounds[:-1], bounds[1:])]
        return self.keep(graphs, a.shape[1])

    def scale_rows(self, v: BlockVector, scale: list[Any]) -> BlockVector:
        """``v`` with every row multiplied by its scale (kept ``(n_b, 1)`` blocks)."""
        graphs = [delayed(_scale_task, pure=True)(b, s, dask_key_name=_key("scale")) for b, s in zip(v.blocks, scale)]
        return self.keep(graphs, v.t)

    def from_dask(self, A: da.Array) -> BlockVector:
        """A row-chunked ``(n, t)`` dask array (chunked like the tiles) as a kept vector."""
        A = A.reshape(A.shape[0], -1).rechunk({1: -1})
        if tuple(int(c) for c in A.chunks[0]) != self.row_chunks:
            raise ValueError(f"chunks {A.chunks[0]} differ from the tile blocks {self.row_chunks}")
        blocks = list(A.to_delayed().ravel())
        graphs = [delayed(_block, pure=True)(b, dask_key_name=_key("vector")) for b in blocks]
        return self.keep(graphs, int(A.shape[1]))


def random_vector(ops: BlockOps, seed: int) -> BlockVector:
    """A standard normal ``(n, 1)`` vector made block by block on the workers (seeded per block)."""
    graphs = [delayed(_random_task, pure=True)(rows, seed, k, dask_key_name=_key("vector"))
              for k, rows in enumerate(ops.row_chunks)]
    return ops.keep(graphs, 1)


# --------------------------------------------------------------------------- the operator
def data_blocks(executor: Executor, X: da.Array, keep: bool | None = None) -> list[Any]:
    """The row blocks of ``X`` as task arguments: kept in worker memory when they take at most
    :data:`FEATURE_MEMORY_FRACTION` of it (else read from the source by every task)."""
    blocks = list(X.to_delayed().ravel())
    nbytes = int(X.shape[0]) * int(X.shape[1]) * X.dtype.itemsize
    if keep is None:
        keep = nbytes <= FEATURE_MEMORY_FRACTION * executor.resources().memory_bytes
    if not keep:
        return blocks
    graphs = [delayed(_data_block, pure=True)(b, dask_key_name=_key("data")) for b in blocks]
    with _pass(executor, "data", len(graphs)):
        return executor.backend.keep(graphs)


class TileOperator:
    """``v -> (K + shift I) v`` (or ``S K S v + shift v`` with row scales ``S``) over upper-triangle tiles.

    Parameters
    ----------
    executor : Executor
        Where the tiles are computed and kept.
    x_blocks : list
        The (scaled) training rows in tile blocks (:func:`data_blocks`).
    chunks : tuple of int
        Rows of every block.
    kernel : Kernel
        The kernel.
    shift : float
        ``lambda`` of ``K + lambda I``.
    plan : TilePlan
        Keep or recompute the tiles.
    scale : list or None
        Row scales (``sqrt`` of the sample weights), ``(n_b, 1)`` blocks kept like ``x_blocks``.
    """

    def __init__(self, executor: Executor, x_blocks: list[Any], chunks: tuple[int, ...], kernel: Kernel,
                 shift: float, plan: TilePlan, scale: list[Any] | None = None):
        self.executor, self.kernel, self.shift, self.plan = executor, kernel, float(shift), plan
        self.chunks = tuple(int(c) for c in chunks)
        self.x_blocks = x_blocks
        self.s_blocks: list[Any] = [None] * len(self.chunks) if scale is None else scale
        self.pairs = [(i, j) for i in range(len(self.chunks)) for j in range(i, len(self.chunks))]
        self.tiles: list[Any] | None = None
        self.n_products = 0
        if plan.keep:
            graphs = [delayed(_tile_task, pure=True)(self.x_blocks[i], self.x_blocks[j], kernel, plan.tile_dtype,
                                                     dask_key_name=_key("tiles"))
                      for i, j in self.pairs]
            with _pass(executor, "tiles", len(graphs)):
                self.tiles = executor.backend.keep(graphs)

    @property
    def n(self) -> int:
        return int(sum(self.chunks))

    def __call__(self, v: BlockVector) -> BlockVector:
        """``(K + shift I) v``, kept on the workers."""
        vb = v.blocks
        contrib: list[list[tuple[int, Delayed]]] = [[] for _ in self.chunks]
        for k, (i, j) in enumerate(self.pairs):
            diag = i == j
            si, sj = self.s_blocks[i], self.s_blocks[j]
            if self.tiles is not None:
                task = delayed(_kept_product, pure=True)(self.tiles[k], vb[i], vb[j], diag, si, sj,
                                                         dask_key_name=_key("matvec"))
            else:
                task = delayed(_recompute_product, pure=True)(self.x_blocks[i], self.x_blocks[j], vb[i], vb[j],
                                                              self.kernel, diag, si, sj, dask_key_name=_key("matvec"))
            contrib[i].append((0, task))
            if not diag:
                contrib[j].append((1, task))
        graphs = [delayed(_sum_roles, pure=True)(vb[i], self.shift, tuple(r for r, _ in parts),
                                                 *[p for _, p in parts], dask_key_name=_key("tilesum"))
                  for i, parts in enumerate(contrib)]
        self.n_products += 1
        return BlockVector(submit(self.executor, graphs), v.t)

    def close(self) -> None:
        """Free the kept tiles."""
        if self.tiles is not None:
            self.executor.backend.release(self.tiles)
            self.tiles = None


class _pass:
    """PassStarted/PassDone around a piece of work (the progress bar counts the blocks)."""

    def __init__(self, executor: Executor, name: str, n_blocks: int):
        self.executor, self.name, self.n_blocks = executor, name, n_blocks

    def __enter__(self) -> None:
        self.executor.events.emit(PassStarted(self.name, self.n_blocks))

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.executor.events.emit(PassDone(self.name, self.n_blocks))


# --------------------------------------------------------------------------- features
class FeatureBlocks:
    """``Z`` (features of every row) in row blocks on the workers, and the Woodbury preconditioner.

    Parameters
    ----------
    executor : Executor
        Where the blocks live.
    x_blocks : list
        Training rows in tile blocks (:func:`data_blocks`).
    n : int
        Rows.
    fmap : FeatureMap
        ``x -> z(x)`` (:mod:`daskkrr.kernels.random_features`).
    penalty : float
        ``lambda_p`` of ``Z Z^T + lambda_p I``.
    scale : list or None
        Row scales (``sqrt`` of the sample weights).
    keep : bool or None
        Keep ``Z`` in worker memory; None: when it takes at most
        :data:`FEATURE_MEMORY_FRACTION` of the memory (otherwise every application
        recomputes it from ``X``).
    """

    def __init__(self, executor: Executor, x_blocks: list[Any], n: int, fmap: Any, penalty: float,
                 scale: list[Any] | None = None, keep: bool | None = None):
        self.executor = executor
        self.fmap = fmap
        s = int(fmap.n_features)
        self.x_blocks = x_blocks
        self.s_blocks: list[Any] = [None] * len(x_blocks) if scale is None else scale
        self.handle = executor.broadcast(fmap)
        if keep is None:
            keep = n * s * 8 <= FEATURE_MEMORY_FRACTION * executor.resources().memory_bytes
        self.z_blocks: list[Any] | None = None
        if keep:
            graphs = [delayed(_features_task, pure=True)(x, self.handle, sc, dask_key_name=_key("features"))
                      for x, sc in zip(x_blocks, self.s_blocks)]
            with _pass(executor, "features", len(graphs)):
                self.z_blocks = executor.backend.keep(graphs)
            parts = [delayed(_gram_task, pure=True)(z, dask_key_name=_key("gram")) for z in self.z_blocks]
        else:
            parts = [delayed(_gram_recompute, pure=True)(x, self.handle, sc, dask_key_name=_key("gram"))
                     for x, sc in zip(x_blocks, self.s_blocks)]
        with _pass(executor, "gram", len(parts)):
            (ZtZ,) = executor.backend.compute([tree_reduce(parts)])
        self.factor = WoodburyFactor.from_gram(np.asarray(ZtZ), penalty)
        self._s = s

    @property
    def kept(self) -> bool:
        return self.z_blocks is not None

    @property
    def n_features(self) -> int:
        return self._s

    def __call__(self, r: BlockVector) -> BlockVector:
        """``(Z Z^T + lambda_p I)^{-1} r``: ``Z^T r`` reduced to the client, ``Z w`` blockwise."""
        rb = r.blocks
        if self.z_blocks is not None:
            parts = [delayed(_zt_r_task, pure=True)(z, b, dask_key_name=_key("precond"))
                     for z, b in zip(self.z_blocks, rb)]
        else:
            parts = [delayed(_zt_r_recompute, pure=True)(x, self.handle, sc, b, dask_key_name=_key("precond"))
                     for x, sc, b in zip(self.x_blocks, self.s_blocks, rb)]
        (ZtR,) = self.executor.backend.compute([tree_reduce(parts)])
        w = self.factor.solve_small(np.asarray(ZtR).reshape(self._s, -1))
        lp = self.factor.penalty
        if self.z_blocks is not None:
            graphs = [delayed(_woodbury_task, pure=True)(z, b, w, lp, dask_key_name=_key("precond"))
                      for z, b in zip(self.z_blocks, rb)]
        else:
            graphs = [delayed(_woodbury_recompute, pure=True)(x, self.handle, sc, b, w, lp,
                                                              dask_key_name=_key("precond"))
                      for x, sc, b in zip(self.x_blocks, self.s_blocks, rb)]
        return BlockVector(submit(self.executor, graphs), r.t)

    def close(self) -> None:
        """Free the kept feature blocks."""
        if self.z_blocks is not None:
            self.executor.backend.release(self.z_blocks)
            self.z_blocks = None


def rechunk_rows(X: da.Array, rows: int) -> da.Array:
    """``X`` in blocks of ``rows`` rows, one block across the columns."""
    rows = max(1, min(int(rows), int(X.shape[0])))
    if X.ndim == 2:
        return X.rechunk({0: rows, 1: -1}, method="tasks")
    return X.rechunk({0: rows}, method="tasks")
