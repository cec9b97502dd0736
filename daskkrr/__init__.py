"""daskkrr: out-of-core kernel ridge regression on Dask and Zarr."""

from __future__ import annotations

__version__ = "0.1.0"
