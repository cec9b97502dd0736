"""Helpers every layer of daskkrr shares: jittered Cholesky, atomic files, JSON, BLAS threads.

This package depends on numpy, scipy, threadpoolctl and the standard library only:
it imports neither dask/distributed nor any other daskkrr subpackage, so the data,
kernel, sampling, solver and model layers can all use it without import cycles.
"""
