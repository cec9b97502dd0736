"""The row sketch behind the preconditioner: ``s`` training rows drawn uniformly.

FALKON approximates ``K_nM^T K_nM`` by ``(n / M) K_MM^2``, i.e. it uses the
centers themselves as a sample of the data rows. With a small penalty the
effective dimension of the problem exceeds what ``M`` rows can represent, and CG
needs many iterations (36 at n = 1e5, M = 2000, lambda = 1e-6 on the synthetic
benchmark, to a residual of 1e-3). Drawing ``s`` rows of the data instead and
using ``(n / s) K_sM^T K_sM`` (sketch-to-precondition, Avron, Clarkson and
Woodruff 2017) cuts that to 21 iterations with ``s = 2 M`` and 11 with
``s = 4 M``, for about ``2 s M^2`` flops on the client, once (a triangular solve
and a rank-k update, :func:`daskkrr.solvers.falkon.sketch_gram`; in float32 for
a float32 fit, :func:`sketch_precision`).

Those flops are not always worth it: at n = 1e5, M = 5000, d = 20 (float32,
penalty 1e-6, 20 iterations) the float64 sketch of ``4 M`` rows took 10.2 s of a
16.5 s fit, and FALKON's own preconditioner reached the same test error in
7.2 s, both running all 20 iterations. ``preconditioner_rows="auto"`` therefore
weighs the sketch's cost against the iterations it is expected to save
(:mod:`daskkrr.parallel.preconditioner_cost`), among none and ``2, 4, 8, 16 M``
rows.

The rows are chosen from a seed derived from the centers (their row indices, see
:func:`sketch_indices`), so a resumed fit (whose centers come from its checkpoint)
rebuilds the same preconditioner, and so does a fit of the same rows read another way.

With row weights the rows are still drawn uniformly (drawing them in proportion
to the weights would need every weight on the client) and each counts
``w_i / mean(w)`` times in the sketch, an unbiased estimate of
``K_nM^T W K_nM / sum(w)``; zero-weight rows drawn add nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.kernels.sparse import is_sparse, take_rows

#: Rows of the sketch turned into kernel rows at a time (bounds the client's memory: ``2 x 1024 x M``
#: entries). At M = 5000 on the development machine, BLAS trsm with 1024 right-hand sides ran at
#: 120 GFlop/s (float32) and 55 (float64), with 256 at 69 and 48.
SKETCH_BLOCK_ROWS = 1024
#: The rule :func:`sketch_indices` seeds the rows by, recorded in checkpoints: a fit interrupted under
#: another rule drew other rows, and its CG state belongs to another preconditioner.
SKETCH_SEED = "center-rows"


def sketch_precision(dtype: Any) -> str:
    """Arithmetic of the sketch Gram for a fit of ``dtype``: "float32" for float32 data, else "float64".

    A float32 fit's kernel blocks, and so its CG products, carry float32 round-off
    already, so a float32 sketch Gram costs it no accuracy that the fit had; a
    float64 fit keeps float64 throughout. :func:`daskkrr.solvers.falkon.sketch_gram`
    still checks the first rows against float64 and falls back to it where the
    triangular solve loses too much (wide kernels, tiny penalties).
    """
    return "float32" if np.dtype(dtype) == np.float32 else "float64"


def sketch_indices(n: int, rows: int, centers: np.ndarray, center_rows: np.ndarray | None = None) -> np.ndarray:
    """``rows`` distinct row indices in ``[0, n)``, sorted, seeded by the centers.

    The seed is the centers' training-row indices ``center_rows`` where every center
    is a training row (the samplers' centers), else the centers' values rounded to
    float32 (centers given by the user). It must not depend on the last bits of the
    centers' values: those come out of the standardisation, whose sums round
    differently with the chunking, the input route (a Zarr store or a Parquet
    table) and the CPU, and a seed taken from them drew another sketch, hence another
    preconditioner and a model that differed by the CG tolerance, not by round-off.
    """
    if not 0 < rows <= n:
        raise ValueError(f"the sketch needs 0 < rows <= n = {n}; got {rows}")
    if rows == n:
        return np.arange(n, dtype=np.int64)
    if center_rows is not None and len(center_rows) == len(centers) and np.all(np.asarray(center_rows) >= 0):
        key = np.ascontiguousarray(center_rows, dtype=np.int64).tobytes()
    else:  # float32 rounding absorbs the round-off of the scaling (but for a value right at a rounding boundary)
        key = b"values" + np.ascontiguousarray(centers, dtype=np.float32).tobytes()
    digest = hashlib.sha256(key).digest()
    rng = np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))
    return np.sort(rng.choice(n, size=rows, replace=False)).astype(np.int64)


class KernelRowSketch:
    """The kernel rows ``k(x_i, Z)`` of the sketch rows, produced block by block.

    Iterating yields arrays of ``dtype`` (float64 by default; float32 for a
    float32 sketch Gram, see :func:`sketch_precision`) of at most
    :data:`SKETCH_BLOCK_ROWS` rows, so the whole ``s x M`` matrix never exists at
    once; with ``row_weights``, pairs ``(block, weights of its rows)``. The
    entries are computed in the dtype of ``rows`` (the fit's).
    """

    def __init__(self, kernel: Kernel, rows: np.ndarray, centers: np.ndarray,
                 row_weights: np.ndarray | None = None, dtype: Any = np.float64):
        self.kernel = kernel
        self.X = rows if is_sparse(rows) else np.ascontiguousarray(rows)  # sparse rows stay CSR
        self.Z = np.ascontiguousarray(centers, dtype=self.X.dtype)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"sketch blocks are float32 or float64; got {self.dtype}")
        self.row_weights = None if row_weights is None else np.asarray(row_weights, dtype=np.float64).reshape(-1)
        if self.row_weights is not None and self.row_weights.shape[0] != self.X.shape[0]:
            raise ValueError(f"{self.X.shape[0]} sketch rows but {self.row_weights.shape[0]} row weights")

    @property
    def rows(self) -> int:
        return int(self.X.shape[0])

    def __iter__(self) -> Iterator[Any]:
        engine = engine_for(self.kernel)
        for start in range(0, self.rows, SKETCH_BLOCK_ROWS):
            block = engine.kernel_block(self.kernel, self.X[start:start + SKETCH_BLOCK_ROWS], self.Z)
            block = np.asarray(block, dtype=self.dtype)
            if self.row_weights is None:
                yield block
            else:
                yield block, self.row_weights[start:start + SKETCH_BLOCK_ROWS]


def block_sketch_partial(Xb: np.ndarray, first_row: int, idx: np.ndarray, row_weights: np.ndarray | None,
                         kernel: Kernel, centers: np.ndarray, T: np.ndarray, d: np.ndarray,
                         single: bool) -> np.ndarray:
    """One row block's share of the sketch Gram, for a sum over blocks (a reduction tree).

    ``idx`` are the sketch's sorted global row indices (``row_weights`` theirs, or
    None); the block holds rows ``first_row .. first_row + len(Xb)``. Its sketch rows
    become kernel rows :data:`SKETCH_BLOCK_ROWS` at a time (float32 with ``single``), and
    are summed by :func:`daskkrr.solvers.falkon.block_sketch_sums`. Returned flat, float64:
    ``sum W^T W`` (``M x M``, Fortran order, upper triangle meaningful), ``sum W`` (``M``)
    and the row count, so that partial results add elementwise.
    """
    from daskkrr.solvers.falkon import block_sketch_sums

    lo, hi = np.searchsorted(idx, [first_row, first_row + Xb.shape[0]])
    rows = take_rows(Xb, idx[lo:hi] - first_row)
    weights = None if row_weights is None else row_weights[lo:hi]
    sketch = KernelRowSketch(kernel, rows, centers, row_weights=weights, dtype=np.float32 if single else np.float64)
    M = T.shape[0]
    flat = np.zeros(M * M + M + 1)  # the Gram is summed in place, in its first M * M entries
    gram, flat[M * M: M * M + M], flat[-1] = block_sketch_sums(T, d, sketch, single,
                                                               out=flat[: M * M].reshape(M, M, order="F"))
    if not np.shares_memory(gram, flat):  # BLAS made a copy after all
        flat[: M * M] = gram.ravel(order="F")
    return flat


def unpack_sketch_partial(flat: np.ndarray, n_centers: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(gram, total, rows)`` from a sum of :func:`block_sketch_partial` results."""
    M = int(n_centers)
    if flat.shape != (M * M + M + 1,):
        raise ValueError(f"a sketch partial for {M} centers has {M * M + M + 1} entries; got {flat.shape}")
    return flat[: M * M].reshape(M, M, order="F"), flat[M * M: M * M + M], float(flat[-1])
