"""dask's Parquet reader calls ``reset_index(inplace=True)`` on every row group, which pandas 3.1
deprecates; daskkrr's reads (:class:`daskkrr.data.parquet_engine.QuietArrowEngine`) ignore that one
warning from dask's reader, and only it: the same call in the user's code still warns."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from daskkrr.data.parquet import open_parquet, parquet_columns


def _pandas_deprecates_inplace() -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pd.DataFrame({"a": [1.0]}).reset_index(drop=True, inplace=True)
    return any(issubclass(w.category, DeprecationWarning) for w in caught)


pytestmark = pytest.mark.skipif(not _pandas_deprecates_inplace(),
                                reason="this pandas (before 3.1) does not deprecate inplace: there is no warning")


@pytest.fixture
def table(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=90), "b": rng.normal(size=90), "y": rng.normal(size=90)})
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=30)
    return path


def test_reading_a_table_raises_no_deprecation(table):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        X, y, _ = parquet_columns(str(table), "y", ["a", "b"], None).arrays()
        assert X.data.compute().shape == (90, 2) and y.compute().shape == (90,)  # 3 row groups, threads
        assert open_parquet(table).compute().shape == (90, 3)
    # only dask's reader is quietened: the user's own deprecated call still warns
    with pytest.warns(DeprecationWarning, match="The inplace keyword in DataFrame.reset_index"):
        pd.DataFrame({"a": [1.0]}).reset_index(drop=True, inplace=True)
