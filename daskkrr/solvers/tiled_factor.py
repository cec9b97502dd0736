"""An upper-triangular ``M x M`` factor kept as ``b x b`` tiles in a Zarr array, solved with tile by tile.

The posterior of a model fitted on the tiled preconditioner route (many centers) has its two
triangular factors ``T`` and ``R`` (:mod:`daskkrr.solvers.variance`) in a Zarr array each, chunked
by tiles (only the upper triangle's chunks are written). ``predict(X, return_std=True)`` solves with
them per block of query rows by substitution over the tile rows, reading one tile at a time: the
process that predicts a block holds one tile and the block's ``M x n_b`` right-hand side, never the
``M x M`` factor. The arrays are read-only here (a model folder may be on a read-only file system).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import numpy as np

from daskkrr.utils.linalg import solve_upper

__all__ = ["TileFile"]


@functools.lru_cache(maxsize=32)
def _open(path: str) -> Any:
    """The Zarr array at ``path``, opened read-only once per process."""
    import zarr

    return zarr.open_array(path, mode="r")


def _require_folder(path: str) -> None:
    """Refuse a factor whose folder is gone: Zarr would read its missing tiles as zeros, a silent wrong answer."""
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{path} is gone: return_std reads the posterior's tiles from it. A fitted model keeps them in a temporary "
            "folder that is removed with that model (a pickled or copied model names the folder but does not keep "
            "it); a loaded model keeps them in its model folder. save() the fitted model and load() it to keep "
            "return_std")


@dataclasses.dataclass(frozen=True)
class TileFile:
    """The upper triangle of an ``M x M`` matrix in the Zarr array at ``path``, in tiles of ``b`` rows and columns.

    Attributes
    ----------
    path : str
        The Zarr array (``shape (M, M)``, ``chunks (b, b)``).
    M : int
        Rows and columns.
    b : int
        Rows and columns of a tile (the last ones smaller).
    """

    path: str
    M: int
    b: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.M, self.M)

    @property
    def dtype(self) -> np.dtype:
        """The stored tiles' dtype."""
        return np.dtype(_open(self.path).dtype)

    @property
    def nb(self) -> int:
        """Tile rows (and columns)."""
        return -(-self.M // self.b)

    def bounds(self, i: int) -> tuple[int, int]:
        """First and one-past-last row of tile row ``i``."""
        return i * self.b, min(self.M, (i + 1) * self.b)

    def tile(self, i: int, j: int) -> np.ndarray:
        """Tile ``(i, j)``, ``i <= j`` (its dtype as stored)."""
        if i > j:
            raise IndexError(f"only the upper triangle is stored; asked for tile ({i}, {j})")
        _require_folder(self.path)
        return np.asarray(_open(self.path)[slice(*self.bounds(i)), slice(*self.bounds(j))])

    def solve(self, B: np.ndarray, *, trans: bool = False) -> np.ndarray:
        """``F^{-1} B`` (``F^{-T} B`` with ``trans``) in float64 for ``B`` of shape ``(M, k)``, one tile in memory.

        Back substitution (forward for ``F^T``) over the tile rows, as
        :func:`daskkrr.parallel.tiled_linalg.solve_graphs` does with tasks: block ``i`` subtracts
        ``F_ij x_j`` (``F_ji^T x_j``) of every solved block, then solves with the diagonal tile.
        """
        X = np.array(B, dtype=np.float64).reshape(self.M, -1)
        order = range(self.nb) if trans else range(self.nb - 1, -1, -1)
        for i in order:
            rows = slice(*self.bounds(i))
            for j in (range(i) if trans else range(i + 1, self.nb)):
                other = slice(*self.bounds(j))
                tile = np.asarray(self.tile(j, i) if trans else self.tile(i, j), dtype=np.float64)
                X[rows] -= tile.T @ X[other] if trans else tile @ X[other]
            X[rows] = solve_upper(self.tile(i, i), X[rows], trans=trans)
        return X.reshape(np.shape(B))
