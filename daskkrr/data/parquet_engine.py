"""dask's pyarrow Parquet engine without the pandas deprecation its reader raises on every row group.

dask's reader (``ArrowDatasetEngine.read_partition``) calls ``reset_index(inplace=True)`` on each row
group it reads, which pandas 3.1 deprecates: a ``Pandas4Warning`` (a DeprecationWarning), "The
inplace keyword in DataFrame.reset_index is deprecated", once per row group read. It is dask's call
(dask's inplace calls under pandas 3.1: https://github.com/dask/dask/issues/12444), and no argument of
``read_parquet`` avoids it. :class:`QuietArrowEngine` is that engine, passed to ``read_parquet`` as
its ``engine`` (the reader's documented way to plug one in), that ignores this one message from
dask's reader module, in whichever process the read task runs. Imported lazily: it imports
``dask.dataframe``.
"""

from __future__ import annotations

import warnings
from typing import Any

from dask.dataframe.io.parquet.arrow import ArrowDatasetEngine

#: The start of pandas' message, the only warning ignored.
RESET_INDEX_DEPRECATION = "The inplace keyword in DataFrame.reset_index is deprecated"
#: Where it is ignored: pandas attributes it to its caller, dask's reader (a user's own call still warns).
READER_MODULE = r"dask\.dataframe\.io\.parquet\.arrow"


class QuietArrowEngine(ArrowDatasetEngine):
    """dask's pyarrow engine; its reads ignore pandas' ``reset_index(inplace=True)`` deprecation."""

    @classmethod
    def read_partition(cls, *args: Any, **kwargs: Any) -> Any:
        # A filter added for good (ahead of any added since, e.g. a test's), not a catch_warnings block:
        # the threaded scheduler reads row groups in several threads at once, and one thread leaving a
        # catch_warnings block would restore the filters under another still reading.
        warnings.filterwarnings("ignore", message=RESET_INDEX_DEPRECATION, category=DeprecationWarning,
                                module=READER_MODULE)
        return super().read_partition(*args, **kwargs)
