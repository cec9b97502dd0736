"""Dense ``M x M`` linear algebra as ``b x b`` tiles that no single process holds whole.

FALKON's preconditioner needs ``K_MM``, its Cholesky factor ``T``, ``T T^T`` and the
factor ``A`` of the inner matrix: four ``M x M`` matrices, 40 GB in float64 at
M = 50 000. Here each is a grid of ``b x b`` tiles (the upper triangle only: the
matrices are symmetric or upper triangular), computed by a task graph in which every
task is one LAPACK/BLAS call on a few tiles:

- :func:`kernel_cholesky` / :func:`tiled_cholesky`: right-looking Cholesky, ``potrf`` on
  the diagonal tile, ``trsm`` on the row panel, ``syrk``/``gemm`` updates of the trailing
  tiles, with the jitter policy of :func:`~daskkrr.utils.linalg.cholesky_jitter`: a failed
  diagonal ``potrf`` raises :class:`TileFactorError` and the *whole* factorisation is
  redone with the next jitter (a tile's failure says the matrix needs more, and the
  tiles already factored used the smaller one);
- :func:`upper_times_transpose`: ``T T^T`` (LAPACK's ``lauum``, tiled: ``lauum``, ``syrk``
  and ``gemm`` on tiles);
- :func:`solve_graphs` / :func:`solve_upper_tiled`: ``T^{-1} V`` and ``T^{-T} V`` for an
  ``M x k`` block, sequential over the tile rows, each step one ``gemm`` or ``trsm`` of one
  tile; only the ``b x k`` pieces of ``V`` move between tasks;
- :func:`inverse_row_squares`: the diagonal of ``(T^T T)^{-1}`` from ``T^{-1}`` (LAPACK's ``trtri``,
  tiled: ``trtri`` on the diagonal tiles, ``gemm`` on the others), built over ``T``'s own tiles.

Where the tiles live (:class:`TiledMatrix`): in memory where they were computed (futures on
a ``distributed`` cluster, arrays in this process on the threaded scheduler), or, when
the memory budget cannot hold them, spilled to a Zarr store in a temporary folder
(:class:`TileStore`, one Zarr chunk per tile): each task then reads its tiles from the
store and writes its result there, and only a :class:`ZarrTile` marker travels in the
graph. The folder must be visible to every worker (a local cluster, or a shared file
system given as ``spill_dir``).
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dask.delayed import Delayed, delayed

from daskkrr.events import block_task_prefix
from daskkrr.kernels.base import Kernel
from daskkrr.parallel.executor import Executor
from daskkrr.utils.linalg import SINGULAR_ADVICE, JitterPolicy

__all__ = [
    "STORAGE_CHOICES",
    "TileFactorError",
    "TileLayout",
    "TileStore",
    "TiledMatrix",
    "ZarrTile",
    "inverse_row_squares",
    "kernel_cholesky",
    "kernel_tiles",
    "solve_column_norms",
    "solve_graphs",
    "solve_upper_tiled",
    "tiled_cholesky",
    "triangle_bytes",
    "upper_times_transpose",
]

#: Where tiles live: "memory" (the workers', or this process's on threads) or "zarr" (a spill store).
STORAGE_CHOICES = ("memory", "zarr")


class TileFactorError(np.linalg.LinAlgError):
    """``potrf`` failed on a diagonal tile: the matrix (with this jitter) is not positive definite."""


# --------------------------------------------------------------------------- layout and storage
@dataclasses.dataclass(frozen=True)
class TileLayout:
    """An ``M x M`` matrix cut into tiles of ``b`` rows and columns (the last ones smaller)."""

    M: int
    b: int

    def __post_init__(self) -> None:
        if self.M < 1 or self.b < 1:
            raise ValueError(f"a tile layout needs M >= 1 and b >= 1; got M={self.M}, b={self.b}")

    @property
    def nb(self) -> int:
        """Tile rows (and columns)."""
        return -(-self.M // self.b)

    def bounds(self, i: int) -> tuple[int, int]:
        """First and one-past-last row of tile row ``i``."""
        return i * self.b, min(self.M, (i + 1) * self.b)

    def split(self, V: np.ndarray) -> list[np.ndarray]:
        """The row blocks of ``V`` (``(M, k)``), one per tile row."""
        return [V[slice(*self.bounds(i))] for i in range(self.nb)]

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The tiles ``(i, j)`` of the upper triangle, ``i <= j``."""
        return [(i, j) for i in range(self.nb) for j in range(i, self.nb)]


def triangle_bytes(M: int, b: int, itemsize: int) -> int:
    """Bytes of the upper-triangle tiles of an ``M x M`` matrix (diagonal tiles whole)."""
    layout = TileLayout(int(M), max(1, min(int(b), int(M))))
    sizes = [hi - lo for lo, hi in (layout.bounds(i) for i in range(layout.nb))]
    total = sum(sizes[i] * sizes[j] for i, j in layout.pairs)
    return int(total * itemsize)


@dataclasses.dataclass(frozen=True)
class ZarrTile:
    """Tile ``(i, j)`` of the Zarr array at ``path``: read and written by the tasks themselves."""

    path: str
    rows: tuple[int, int]
    cols: tuple[int, int]

    def read(self) -> np.ndarray:
        """The tile as Zarr stores it, C-ordered. Not copied to Fortran order: that transposing copy took five
        times the read itself (45 ms against 9 ms for a 2048 x 2048 float32 tile) and was most of a spilled CG
        iteration; LAPACK's wrappers copy what they overwrite anyway, and the solves take either order."""
        return _open_tiles(self.path)[slice(*self.rows), slice(*self.cols)]

    def write(self, tile: np.ndarray) -> None:
        _open_tiles(self.path)[slice(*self.rows), slice(*self.cols)] = tile


@functools.lru_cache(maxsize=32)
def _open_tiles(path: str) -> Any:
    """The Zarr array at ``path``, opened once per process (opening it took two thirds of a
    64 x 64 tile's read and write)."""
    import zarr

    return zarr.open_array(path, mode="r+")


class TileStore:
    """A temporary folder of Zarr arrays whose chunks are the tiles; removed by :meth:`close`
    (or when the store is garbage-collected).

    Parameters
    ----------
    spill_dir : str or None
        Parent of the temporary folder (None: the system's temporary directory). On a
        cluster of several hosts it must be a file system every worker sees.
    """

    def __init__(self, spill_dir: str | None = None):
        self.path = tempfile.mkdtemp(prefix="daskkrr-tiles-", dir=spill_dir)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)

    def array(self, name: str, layout: TileLayout, dtype: Any) -> str:
        """Create an ``M x M`` array chunked by tiles; its path."""
        import zarr

        path = f"{self.path}/{name}-{uuid.uuid4().hex[:8]}.zarr"
        zarr.create_array(store=path, shape=(layout.M, layout.M), chunks=(layout.b, layout.b),
                          dtype=np.dtype(dtype), fill_value=0, compressors=None)
        return path

    def close(self) -> None:
        """Remove the folder and every tile in it."""
        self._cleanup()

    def __getstate__(self) -> dict[str, Any]:
        """A copy sent to a worker (a posterior's store travels with predict's tasks) names the folder only."""
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # the copy does not own the folder: removing it is left to the process that made it
        self.path = state["path"]
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)
        self._cleanup.detach()


def _load(x: Any) -> Any:
    return x.read() if isinstance(x, ZarrTile) else x


def _apply(op: Callable[..., np.ndarray], target: ZarrTile | None, *args: Any) -> Any:
    """``op`` on the tiles (read from the store where they are markers); the result itself, or
    written to ``target`` and its marker returned (so that only the marker travels)."""
    out = op(*[_load(a) for a in args])
    if target is None:
        return out
    target.write(out)
    return target


def _key(name: str) -> str:
    """A fresh task key counted by the progress bar under the pass ``name``."""
    return f"{block_task_prefix(name)}-{uuid.uuid4().hex}"


def _task(name: str, op: Callable[..., np.ndarray], target: ZarrTile | None, *args: Any) -> Delayed:
    return delayed(_apply, pure=True, traverse=False)(op, target, *args, dask_key_name=_key(name))


# --------------------------------------------------------------------------- tile operations
# Module-level functions (workers unpickle them); each is one LAPACK/BLAS call on its tiles.
def _lapack(name: str, dtype: Any) -> Any:
    from scipy.linalg import blas, lapack

    prefix = "s" if np.dtype(dtype) == np.float32 else "d"
    return getattr(lapack if name in ("potrf", "lauum", "trtri") else blas, prefix + name)


def _op_kernel(Zi: np.ndarray, Zj: np.ndarray, kernel: Kernel, di: np.ndarray, dj: np.ndarray,
               diagonal: np.ndarray | None, dtype: str) -> np.ndarray:
    """``D_i K(Z_i, Z_j) D_j`` in ``dtype``; on a diagonal tile ``diagonal`` replaces the diagonal
    (the kernel's diagonal plus the jitter, as the dense factorisation sets it)."""
    K = kernel(Zi, Zj) * di[:, None] * dj[None, :]
    if diagonal is not None:
        K[np.diag_indices_from(K)] = diagonal
    return np.asfortranarray(K, dtype=dtype)


def _op_shifted(S: np.ndarray, shift: float, dtype: str) -> np.ndarray:
    """A diagonal tile plus ``shift`` on its diagonal (off-diagonal tiles: ``shift=0``), in ``dtype``."""
    out = np.array(S, dtype=dtype, order="F")
    if shift:
        out[np.diag_indices_from(out)] += shift
    return out


def _op_potrf(S: np.ndarray) -> np.ndarray:
    T, info = _lapack("potrf", S.dtype)(S, lower=0, clean=1, overwrite_a=0)
    if info < 0:  # pragma: no cover - an argument error, not a numerical one
        raise ValueError(f"LAPACK potrf rejected argument {-info} on a diagonal tile")
    if info > 0 or not np.all(np.isfinite(np.diag(T))):
        raise TileFactorError(f"potrf failed on a diagonal tile (leading minor {info})")
    return T


def _op_trsm(Tkk: np.ndarray, Skj: np.ndarray) -> np.ndarray:
    """``T_kk^{-T} S_kj``: a tile of the row panel."""
    return _lapack("trsm", Skj.dtype)(1.0, Tkk, Skj, side=0, lower=0, trans_a=1, overwrite_b=0)


def _op_syrk_minus(Sii: np.ndarray, Tki: np.ndarray) -> np.ndarray:
    """``S_ii - T_ki^T T_ki`` (upper triangle)."""
    return _lapack("syrk", Sii.dtype)(-1.0, Tki, beta=1.0, c=Sii, trans=1, lower=0, overwrite_c=0)


def _op_gemm_minus(Sij: np.ndarray, Tki: np.ndarray, Tkj: np.ndarray) -> np.ndarray:
    """``S_ij - T_ki^T T_kj``."""
    return _lapack("gemm", Sij.dtype)(-1.0, Tki, Tkj, beta=1.0, c=Sij, trans_a=1, overwrite_c=0)


def _op_lauum(Tkk: np.ndarray) -> np.ndarray:
    """``T_kk T_kk^T`` (upper triangle) of an upper-triangular tile."""
    out, info = _lapack("lauum", Tkk.dtype)(Tkk, lower=0, overwrite_c=0)
    if info != 0:  # pragma: no cover - lauum fails only on bad arguments
        raise np.linalg.LinAlgError(f"LAPACK lauum failed (info={info}) on a diagonal tile")
    return out


def _op_trtri(Tkk: np.ndarray) -> np.ndarray:
    """``T_kk^{-1}`` of an upper-triangular tile (upper triangular; its lower part zero)."""
    out, info = _lapack("trtri", Tkk.dtype)(Tkk, lower=0, overwrite_c=0)
    if info != 0:  # a factor from the jittered Cholesky has a positive diagonal
        raise np.linalg.LinAlgError(f"LAPACK trtri failed (info={info}) on a diagonal tile")
    return np.triu(out)


def _op_minus_times(acc: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``-acc B``."""
    return -(acc @ B)


def _op_syrk_plus(acc: np.ndarray, Tik: np.ndarray) -> np.ndarray:
    """``acc + T_ik T_ik^T`` (upper triangle)."""
    return _lapack("syrk", acc.dtype)(1.0, Tik, beta=1.0, c=acc, trans=0, lower=0, overwrite_c=0)


def _op_gemm_nt(acc: np.ndarray | None, Tik: np.ndarray, Tjk: np.ndarray) -> np.ndarray:
    """``acc + T_ik T_jk^T`` (``acc`` None: the product alone)."""
    gemm = _lapack("gemm", Tik.dtype)
    if acc is None:
        return gemm(1.0, Tik, Tjk, trans_b=1)
    return gemm(1.0, Tik, Tjk, beta=1.0, c=acc, trans_b=1, overwrite_c=0)


def _op_scale_center(G: np.ndarray, rows: float, wi: np.ndarray | None, wj: np.ndarray | None,
                     shift: float) -> np.ndarray:
    """``G / rows - w_i w_j^T / rows^2`` (centred when ``w`` is given) plus ``shift`` on a diagonal tile."""
    out = np.asfortranarray(G / rows)
    if wi is not None and wj is not None:
        out -= np.outer(wi, wj).astype(out.dtype) / rows**2
    if shift:
        out[np.diag_indices_from(out)] += shift
    return out


def _op_trsv(Tii: np.ndarray, B: np.ndarray, trans: bool) -> np.ndarray:
    """``T_ii^{-1} B`` (``T_ii^{-T} B``) in float64: every solve is then one fixed linear map. A float32
    tile is read as it is (:func:`~daskkrr.utils.linalg.solve_upper`'s mixed loops): upcasting it took
    twenty times the solve itself."""
    from daskkrr.utils.linalg import solve_upper

    if Tii.dtype == np.float32 and not Tii.flags.f_contiguous:
        # a spilled tile (C order): the mixed loops read Fortran order, and the transposing copy took five times
        # a float64 copy, which LAPACK's trtrs reads in C order as it is (the same float64 arithmetic)
        Tii = np.asarray(Tii, dtype=np.float64)
    return solve_upper(Tii, np.asarray(B, dtype=np.float64), trans=trans)


def _op_minus_product(acc: np.ndarray, Tij: np.ndarray, x: np.ndarray, trans: bool) -> np.ndarray:
    """``acc - T_ij x`` (``acc - T_ij^T x``) in float64 (a float32 tile read as it is for a few columns, as
    in :func:`_op_trsv`; for more, upcast for BLAS)."""
    from daskkrr.utils.linalg import MIXED_SOLVE_MAX_COLUMNS

    x = np.asarray(x, dtype=np.float64)
    if Tij.dtype == np.float32:
        if x.ndim == 1 or x.shape[1] <= MIXED_SOLVE_MAX_COLUMNS:
            from daskkrr.utils.mixed_solve import minus_product_mixed

            if not Tij.flags.f_contiguous:  # a spilled tile (C order): its transpose is the Fortran tile the loops read
                return minus_product_mixed(acc, Tij.T, x, not trans)
            return minus_product_mixed(acc, Tij, x, trans)
        Tij = np.asarray(Tij, dtype=np.float64)
    return np.asarray(acc, dtype=np.float64) - (Tij.T @ x if trans else Tij @ x)


def _op_upper_matvec(acc: np.ndarray | None, Tij: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``acc + T_ij x`` in float64 (``acc`` None: the product alone; ``x`` a block of columns or a tile)."""
    out = np.asarray(Tij, dtype=np.float64) @ x
    return out if acc is None else acc + out


# --------------------------------------------------------------------------- the matrix
@dataclasses.dataclass
class TiledMatrix:
    """The upper-triangle tiles of a symmetric or upper-triangular ``M x M`` matrix.

    ``tiles[(i, j)]`` (``i <= j``) is where tile ``(i, j)`` is: an array in this process (threaded
    scheduler), a future (a ``distributed`` cluster) or a :class:`ZarrTile` (spilled); any of them
    can be a task's argument.
    """

    executor: Executor
    layout: TileLayout
    dtype: np.dtype
    tiles: dict[tuple[int, int], Any]
    storage: str = "memory"

    def tile(self, i: int, j: int) -> Any:
        if i > j:
            raise IndexError(f"only the upper triangle is held; asked for tile ({i}, {j})")
        return self.tiles[(i, j)]

    @property
    def nbytes(self) -> int:
        return triangle_bytes(self.layout.M, self.layout.b, self.dtype.itemsize)

    def to_numpy(self, *, symmetric: bool = False) -> np.ndarray:
        """The whole matrix here (tests and small ``M`` only): upper triangle, or mirrored with ``symmetric``.

        Diagonal tiles of a symmetric matrix hold only their upper triangle (``syrk``); it is mirrored.
        """
        L = self.layout
        out = np.zeros((L.M, L.M), dtype=self.dtype)
        keys = L.pairs
        values = self.executor.backend.compute([delayed(_load, pure=True)(self.tiles[k]) for k in keys])
        for (i, j), tile in zip(keys, values):
            r, c = slice(*L.bounds(i)), slice(*L.bounds(j))
            out[r, c] = np.triu(tile) if i == j else tile
        if symmetric:
            out = np.triu(out) + np.triu(out, 1).T
        return out

    def release(self) -> None:
        """Free the tiles held in worker memory (spilled tiles go with their :class:`TileStore`).

        The handles are dropped, not cancelled: on a cluster, cancelling a key also cancels the keys
        computed from it (releasing the inner matrix cancelled the factor ``A`` built from it, and the
        next pass failed with "lost dependencies"); a dropped future is freed once nothing holds it.
        """
        self.tiles = {}


def _hold(executor: Executor, graphs: list[Delayed]) -> list[Any]:
    """Compute ``graphs`` and keep the results where they were computed (futures on a cluster)."""
    backend = executor.backend
    if not backend.is_distributed:
        return backend.compute(graphs)
    from distributed import wait

    futures = list(backend.client.compute(graphs))
    with backend.client.as_current():
        wait(futures)
    for f in futures:
        if f.status == "error":
            f.result()  # raises the task's exception here
    return futures


def _targets(store: TileStore | None, layout: TileLayout, dtype: Any, name: str) -> dict[tuple[int, int], Any]:
    """Where each upper tile of a new matrix goes: a :class:`ZarrTile` each, or None (kept in memory)."""
    if store is None:
        return dict.fromkeys(layout.pairs)
    path = store.array(name, layout, dtype)
    return {(i, j): ZarrTile(path, layout.bounds(i), layout.bounds(j)) for i, j in layout.pairs}


# --------------------------------------------------------------------------- Cholesky
#: Builds tile ``(i, j)`` of the matrix to factor with ``shift`` added to its diagonal, as a task
#: writing to the given target: ``source(i, j, shift, target)``.
TileSource = Callable[[int, int, float, Any], Delayed]


def _cholesky_graphs(layout: TileLayout, source: TileSource, shift: float,
                     targets: dict[tuple[int, int], Any]) -> dict[tuple[int, int], Delayed]:
    """The right-looking tiled Cholesky ``T^T T = S + shift I`` (upper ``T``) as one graph.

    Step ``k``: ``T_kk = potrf(S_kk)``; ``T_kj = T_kk^{-T} S_kj`` for ``j > k``; then every trailing
    tile ``S_ij`` (``k < i <= j``) loses ``T_ki^T T_kj``. A spilled factor is written over the
    tiles of ``S`` in the store, as LAPACK does in memory.
    """
    nb = layout.nb
    S = {(i, j): source(i, j, shift if i == j else 0.0, targets[(i, j)]) for i, j in layout.pairs}
    T: dict[tuple[int, int], Delayed] = {}
    for k in range(nb):
        T[(k, k)] = _task("potrf", _op_potrf, targets[(k, k)], S[(k, k)])
        for j in range(k + 1, nb):
            T[(k, j)] = _task("trsm", _op_trsm, targets[(k, j)], T[(k, k)], S[(k, j)])
        for i in range(k + 1, nb):
            S[(i, i)] = _task("syrk", _op_syrk_minus, targets[(i, i)], S[(i, i)], T[(k, i)])
            for j in range(i + 1, nb):
                S[(i, j)] = _task("gemm", _op_gemm_minus, targets[(i, j)], S[(i, j)], T[(k, i)], T[(k, j)])
    return T


def tiled_cholesky(executor: Executor, layout: TileLayout, source: TileSource, policy: JitterPolicy, *,
                   dtype: Any, store: TileStore | None = None, escalate: bool = True,
                   name: str = "factor") -> tuple[TiledMatrix, float]:
    """Upper Cholesky factor ``T`` (tiled) with ``T^T T = S + jitter I``, and the jitter.

    ``source`` builds the tiles of ``S`` (with a shift on the diagonal); ``policy`` gives the
    jitters to try (:class:`~daskkrr.utils.linalg.JitterPolicy`, as
    :func:`~daskkrr.utils.linalg.cholesky_jitter`): when a diagonal tile's ``potrf`` fails the
    factorisation starts again from ``source`` with the next jitter (``escalate=False``: raises
    ``LinAlgError`` instead). With ``store`` the tiles are spilled to it.
    """
    dtype = np.dtype(dtype)
    targets = _targets(store, layout, dtype, name)
    jitter = policy.first
    while True:
        graphs = _cholesky_graphs(layout, source, jitter, targets)
        keys = layout.pairs
        try:
            held = _hold(executor, [graphs[k] for k in keys])
            break
        except TileFactorError:
            jitter = policy.after_failure(jitter, escalate)
    policy.warn_if_escalated(jitter, stacklevel=2)
    return TiledMatrix(executor, layout, dtype, dict(zip(keys, held)), "memory" if store is None else "zarr"), jitter


def kernel_cholesky(executor: Executor, Z: np.ndarray, kernel: Kernel, *, tile: int, dtype: Any = "float64",
                    weights: np.ndarray | None = None, store: TileStore | None = None,
                    relative_jitter: float | None = None, what: str = "center kernel matrix K_MM",
                    regularizer: float = 0.0,
                    advice: str = SINGULAR_ADVICE) -> tuple[TiledMatrix, float, np.ndarray]:
    """Tiled upper Cholesky factor of ``D K(Z, Z) D + (regularizer + jitter) I`` (``D = diag(sqrt(weights))``).

    The tiles of ``K`` are computed from the centers inside the graph (and again on a jitter
    retry): they are never all held at once beside the factor. The jitter policy is the dense
    :func:`~daskkrr.utils.linalg.cholesky_jitter`'s on the regularised matrix (``advice`` ends its
    error). Returns the factor, the jitter and ``d = sqrt(weights)``.
    """
    Z = np.ascontiguousarray(Z, dtype=np.float64)
    M = Z.shape[0]
    d = np.ones(M) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64))
    if d.shape != (M,):
        raise ValueError(f"weights must have shape ({M},); got {d.shape}")
    layout = TileLayout(M, max(1, min(int(tile), M)))
    diagonal = kernel.diag(Z) * d**2 + float(regularizer)
    if not np.all(np.isfinite(diagonal)):
        raise np.linalg.LinAlgError(f"{what} of shape {(M, M)} has NaN or inf entries")
    policy = JitterPolicy.for_matrix((M, M), float(np.mean(diagonal)), np.dtype(dtype), what=what,
                                     relative_jitter=relative_jitter, advice=advice)
    handle = executor.broadcast((Z, d, kernel))

    def source(i: int, j: int, shift: float, target: Any) -> Delayed:
        rows, cols = layout.bounds(i), layout.bounds(j)
        diag = diagonal[slice(*rows)] + shift if i == j else None
        return delayed(_kernel_tile, pure=True, traverse=False)(handle, rows, cols, diag, str(np.dtype(dtype)),
                                                                target, dask_key_name=_key("kmm"))

    factor, jitter = tiled_cholesky(executor, layout, source, policy, dtype=dtype, store=store, name="T")
    return factor, jitter, d


def _kernel_tile(shared: tuple[np.ndarray, np.ndarray, Kernel], rows: tuple[int, int], cols: tuple[int, int],
                 diagonal: np.ndarray | None, dtype: str, target: ZarrTile | None) -> Any:
    Z, d, kernel = shared
    r, c = slice(*rows), slice(*cols)
    return _apply(_op_kernel, target, Z[r], Z[c], kernel, d[r], d[c], diagonal, dtype)


def kernel_tiles(executor: Executor, Z: np.ndarray, kernel: Kernel, d: np.ndarray, *, tile: int,
                 dtype: Any = "float64", store: TileStore | None = None, name: str = "K") -> TiledMatrix:
    """The upper-triangle tiles of ``D K(Z, Z) D`` (``D = diag(d)``), diagonal tiles whole (symmetric), kept
    where they are computed (or spilled to ``store``)."""
    Z = np.ascontiguousarray(Z, dtype=np.float64)
    layout = TileLayout(Z.shape[0], max(1, min(int(tile), Z.shape[0])))
    handle = executor.broadcast((Z, np.asarray(d, dtype=np.float64), kernel))
    targets = _targets(store, layout, dtype, name)
    graphs = [delayed(_kernel_tile, pure=True, traverse=False)(handle, layout.bounds(i), layout.bounds(j), None,
                                                               str(np.dtype(dtype)), targets[(i, j)],
                                                               dask_key_name=_key("kmm"))
              for i, j in layout.pairs]
    held = _hold(executor, graphs)
    return TiledMatrix(executor, layout, np.dtype(dtype), dict(zip(layout.pairs, held)),
                       "memory" if store is None else "zarr")


# --------------------------------------------------------------------------- T T^T
def upper_times_transpose(T: TiledMatrix, *, rows: float = 1.0, center: np.ndarray | None = None,
                          shift: float = 0.0, store: TileStore | None = None, dtype: Any = None,
                          name: str = "inner") -> TiledMatrix:
    """``T T^T / rows + shift I`` (tiled, upper triangle) for a tiled upper-triangular ``T``; with
    ``center = T 1`` it is centred, ``(T T^T - center center^T / rows) / rows`` (FALKON's inner matrix
    of a fit with an intercept, :func:`daskkrr.solvers.falkon.sketch_gram`).

    ``(T T^T)_ij = sum_{k >= j} T_ik T_jk^T`` for ``i <= j``: ``lauum`` of ``T_ii`` and ``syrk``
    on a diagonal tile, ``gemm`` on the others.
    """
    L = T.layout
    dtype = T.dtype if dtype is None else np.dtype(dtype)
    targets = _targets(store, L, dtype, name)
    graphs: list[Delayed] = []
    for i, j in L.pairs:
        if i == j:
            acc = _task("lauum", _op_lauum, None, T.tile(i, i))
            for k in range(i + 1, L.nb):
                acc = _task("lauum", _op_syrk_plus, None, acc, T.tile(i, k))
        else:
            acc = _task("lauum", _op_gemm_nt, None, None, T.tile(i, j), T.tile(j, j))
            for k in range(j + 1, L.nb):
                acc = _task("lauum", _op_gemm_nt, None, acc, T.tile(i, k), T.tile(j, k))
        wi = None if center is None else center[slice(*L.bounds(i))]
        wj = None if center is None else center[slice(*L.bounds(j))]
        scaled = _task("lauum", _op_scale_center, None, acc, float(rows), wi, wj, shift if i == j else 0.0)
        graphs.append(_task("lauum", _op_shifted, targets[(i, j)], scaled, 0.0, str(dtype)))
    held = _hold(T.executor, graphs)
    return TiledMatrix(T.executor, L, dtype, dict(zip(L.pairs, held)), T.storage if store is None else "zarr")


def shifted_source(S: TiledMatrix, dtype: Any) -> TileSource:
    """A :data:`TileSource` reading the tiles of ``S`` (a factorisation of ``S + shift I`` in ``dtype``)."""

    def source(i: int, j: int, shift: float, target: Any) -> Delayed:
        return _task("shift", _op_shifted, target, S.tile(i, j), shift, str(np.dtype(dtype)))

    return source


# --------------------------------------------------------------------------- solves and products
def solve_graphs(T: TiledMatrix, blocks: Sequence[Any], *, trans: bool = False) -> list[Delayed]:
    """Graphs of the row blocks of ``T^{-1} V`` (``T^{-T} V`` with ``trans``), ``V`` given as
    ``blocks`` (arrays or graphs, one per tile row, float64).

    Back substitution (forward for ``T^T``), one tile at a time: block ``i`` subtracts
    ``T_ij x_j`` (``T_ji^T x_j``) of every solved block, then solves with ``T_ii``.
    """
    L = T.layout
    if len(blocks) != L.nb:
        raise ValueError(f"expected {L.nb} row blocks; got {len(blocks)}")
    x: list[Any] = [None] * L.nb
    order = range(L.nb) if trans else range(L.nb - 1, -1, -1)
    for i in order:
        acc = blocks[i]
        for j in (range(i) if trans else range(i + 1, L.nb)):
            tile = T.tile(j, i) if trans else T.tile(i, j)
            acc = _task("solve", _op_minus_product, None, acc, tile, x[j], trans)
        x[i] = _task("solve", _op_trsv, None, T.tile(i, i), acc, trans)
    return x


def upper_matvec_graphs(T: TiledMatrix, blocks: Sequence[Any]) -> list[Delayed]:
    """Graphs of the row blocks of ``T V`` for upper-triangular ``T`` (``V`` in row blocks)."""
    L = T.layout
    out = []
    for i in range(L.nb):
        acc: Any = None
        for j in range(i, L.nb):
            acc = _task("solve", _op_upper_matvec, None, acc, T.tile(i, j), blocks[j])
        out.append(acc)
    return out


def as_blocks(layout: TileLayout, V: np.ndarray) -> list[np.ndarray]:
    """``V`` (``(M,)`` or ``(M, k)``) as float64 ``(rows, k)`` row blocks of the layout."""
    V = np.asarray(V, dtype=np.float64)
    if V.shape[0] != layout.M:
        raise ValueError(f"expected {layout.M} rows; got shape {V.shape}")
    return layout.split(V.reshape(layout.M, -1))


def gather(executor: Executor, graphs: Sequence[Any], shape: tuple[int, ...]) -> np.ndarray:
    """Compute row-block graphs here and stack them into an array of ``shape``."""
    parts = executor.backend.compute(list(graphs))
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts], axis=0).reshape(shape)


def _column_squares(V: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->j", V, V)


def solve_column_norms(T: TiledMatrix, V: np.ndarray, *, trans: bool = False) -> np.ndarray:
    """``||(T^{-1} V)_{:, c}||^2`` (``T^{-T}`` with ``trans``) of each column of ``V`` (``(M, k)``): the solved
    blocks are squared where they are computed, and only ``k`` numbers per tile row come here."""
    solved = solve_graphs(T, as_blocks(T.layout, V), trans=trans)
    squares = [delayed(_column_squares, pure=True)(x, dask_key_name=_key("solve")) for x in solved]
    return np.sum(T.executor.backend.compute(squares), axis=0)


def solve_upper_tiled(T: TiledMatrix, V: np.ndarray, *, trans: bool = False) -> np.ndarray:
    """``T^{-1} V`` (``T^{-T} V`` with ``trans``) for a tiled upper-triangular ``T``, in float64, here."""
    V = np.asarray(V)
    return gather(T.executor, solve_graphs(T, as_blocks(T.layout, V), trans=trans), V.shape)


# --------------------------------------------------------------------------- inverse
def _inverse_tile(target: ZarrTile | None, after: Any, n: int, *tiles: Any) -> Any:
    """``U_ij = -(sum_k U_ik T_kj) U_jj`` from ``tiles`` = ``U_ik`` (``n`` of them), ``T_kj`` (``n``) and
    ``U_jj``, read one pair at a time, so that a task holds its sum and two tiles whatever ``n``; written to
    ``target`` where given. ``after``: a task whose value is not used (it orders writes in place)."""
    acc = _op_upper_matvec(None, _load(tiles[0]), _load(tiles[n]))  # n >= 1: off-diagonal tiles only
    for u, t in zip(tiles[1:n], tiles[n + 1:2 * n]):
        acc = _op_upper_matvec(acc, _load(u), _load(t))
    return _apply(_op_minus_times, target, acc, tiles[2 * n])


def _row_squares(first: Any, *rest: Any) -> np.ndarray:
    """``sum_j ||row r of tile j||^2`` over a tile row, in float64, reading one tile at a time."""
    a = np.asarray(_load(first), dtype=np.float64)
    out = np.einsum("ij,ij->i", a, a)
    for t in rest:
        a = np.asarray(_load(t), dtype=np.float64)
        out += np.einsum("ij,ij->i", a, a)
    return out


def inverse_row_squares(T: TiledMatrix) -> np.ndarray:
    """``diag((T^T T)^{-1})`` for a tiled upper-triangular ``T``: the squared row norms of ``U = T^{-1}``.

    ``U`` is upper triangular, a block column at a time: ``U_jj = T_jj^{-1}`` (``trtri``) and, for
    ``i < j``, ``U_ij = -(sum_{i <= k < j} U_ik T_kj) U_jj``, which reads ``U`` of the columns before
    and ``T`` of column ``j`` only: ``M^3 / 3`` flops in all, as one graph, against ``M^3`` for solving
    ``T^T`` with ``M`` right-hand sides, which also reads every tile once per chunk of them. Only each tile
    row's squares come here. Each ``U_ij`` is one task that reads its tiles a pair at a time: as a chain of
    tasks, the scheduler started many chains at once and held their partial sums (two thirds of the
    triangle at ``M = 6000``). ``T`` is given up (released): a spilled ``U`` is written over ``T``'s tiles
    in the store, as LAPACK's ``trtri`` does in memory, each tile of column ``j`` after the one above it
    (whose sum read it; so tiles ``(i, j)`` run as a wavefront over ``i + j``); in memory, ``U``'s tiles
    are new, beside ``T``'s until it is freed.
    :func:`~daskkrr.parallel.tiled_posterior.inverse_square_norm` keeps its factor (the posterior needs it
    after): it solves ``R^{-1}`` a column panel at a time instead, holding panels of ``M x b`` in memory.
    """
    L = T.layout
    spilled = T.storage == "zarr"
    U: dict[tuple[int, int], Any] = {}
    for j in range(L.nb):
        U[(j, j)] = _task("trtri", _op_trtri, T.tile(j, j) if spilled else None, T.tile(j, j))
        above: Any = None
        for i in range(j):
            ks = range(i, j)
            U[(i, j)] = delayed(_inverse_tile, pure=True, traverse=False)(
                T.tile(i, j) if spilled else None, above if spilled else None, len(ks),
                *[U[(i, k)] for k in ks], *[T.tile(k, j) for k in ks], U[(j, j)], dask_key_name=_key("trtri"))
            above = U[(i, j)]
    rows = [delayed(_row_squares, pure=True, traverse=False)(*[U[(i, j)] for j in range(i, L.nb)],
                                                              dask_key_name=_key("trtri"))
            for i in range(L.nb)]
    try:
        return np.concatenate(T.executor.backend.compute(rows))
    finally:
        T.release()
