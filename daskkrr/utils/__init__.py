"""Helpers every layer of daskkrr shares: jittered Cholesky, atomic files, JSON, BLAS threads.

This package depends on numpy, scipy, threadpoolctl and the standard library only
(numba, where installed, compiles the mixed-precision solves of :mod:`~daskkrr.utils.mixed_solve`):
it imports neither dask/distributed nor any other daskkrr subpackage, so the data,
kernel, sampling, solver and model layers can all use it without import cycles.
"""

from daskkrr.utils.atomic import atomic_directory, atomic_write, atomic_write_bytes, check_destination
from daskkrr.utils.jsonable import dumps_strict, jsonable, jsonable_params
from daskkrr.utils.linalg import cholesky_jitter
from daskkrr.utils.threads import available_cores, blas_threads

__all__ = [
    "atomic_directory",
    "atomic_write",
    "atomic_write_bytes",
    "available_cores",
    "blas_threads",
    "check_destination",
    "cholesky_jitter",
    "dumps_strict",
    "jsonable",
    "jsonable_params",
]
