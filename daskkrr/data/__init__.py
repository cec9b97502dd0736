"""Data layer: open, write, convert, generate and standardise row-chunked data.

Every function here works on *row blocks*: dask arrays whose blocks hold a
contiguous range of rows and all columns, with the target split at the same
row boundaries.

* :func:`open_dataset` -- Zarr (v2/v3), xarray, numpy or dask sources -> ``(X, y)``.
* :func:`write_zarr`, :func:`write_array_zarr` -- atomic, block-by-block Zarr v3 writers.
* :func:`convert_table` -- stream a CSV/TSV (optionally gzip) table into Zarr.
* :func:`make_regression`, :func:`make_classification`, :func:`make_blobs` and their
  ``write_*_zarr`` counterparts -- lazy synthetic data, one seed per block.
* :class:`Standardizer` -- per-column scaling fitted in one pass.

The names are imported on first use: a worker that unpickles a task function of one
module (a block summary, a checked Zarr read) imports that module alone, not the table
converters (pandas, pyarrow) or the estimator base classes (scikit-learn) beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskkrr.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from daskkrr.data.chunking import auto_chunk_rows
    from daskkrr.data.loading import open_dataset
    from daskkrr.data.scaling import Standardizer
    from daskkrr.data.synthetic import (
        make_blobs,
        make_classification,
        make_regression,
        write_blobs_zarr,
        write_classification_zarr,
        write_regression_zarr,
    )
    from daskkrr.data.tables import convert_table
    from daskkrr.data.validation import CorruptStoreError
    from daskkrr.data.writing import FORMAT_VERSION, write_array_zarr, write_zarr

#: Where each exported name lives (module of this package).
_LAZY = {
    "FORMAT_VERSION": "writing",
    "CorruptStoreError": "validation",
    "Standardizer": "scaling",
    "auto_chunk_rows": "chunking",
    "convert_table": "tables",
    "make_blobs": "synthetic",
    "make_classification": "synthetic",
    "make_regression": "synthetic",
    "open_dataset": "loading",
    "write_blobs_zarr": "synthetic",
    "write_classification_zarr": "synthetic",
    "write_array_zarr": "writing",
    "write_regression_zarr": "synthetic",
    "write_zarr": "writing",
}

__all__ = [
    "FORMAT_VERSION",
    "CorruptStoreError",
    "Standardizer",
    "auto_chunk_rows",
    "convert_table",
    "make_blobs",
    "make_classification",
    "make_regression",
    "open_dataset",
    "write_blobs_zarr",
    "write_classification_zarr",
    "write_array_zarr",
    "write_regression_zarr",
    "write_zarr",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
