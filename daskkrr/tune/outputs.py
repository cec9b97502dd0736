"""What ``daskkrr tune`` reads and writes: a Zarr store or a CSV/TSV table in, the
search history out as CSV or JSON (atomically)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from daskkrr.utils.atomic import atomic_write_bytes
from daskkrr.utils.jsonable import jsonable

TABLE_SUFFIXES = (".csv", ".tsv", ".csv.gz", ".tsv.gz", ".txt")


def is_table(path: str) -> bool:
    """A CSV/TSV file (by its name), as opposed to a Zarr store."""
    return str(path).lower().endswith(TABLE_SUFFIXES)


def read_training_data(path: str, target: str | None) -> tuple[Any, Any]:
    """``(X, y)``: a CSV/TSV table's feature columns and ``target`` column, or a Zarr store's X and y."""
    if not is_table(path):
        from daskkrr.data import open_dataset

        X, y = open_dataset(path, y="y")
        return X, y
    if not target:
        raise ValueError(f"{path} is a table: name its target column with --target")
    from daskkrr.data.tables import infer_separator

    frame = pd.read_csv(path, sep=infer_separator(path))
    if target not in frame.columns:
        raise ValueError(f"{path} has no column {target!r}; its columns: {', '.join(map(str, frame.columns))}")
    y = frame.pop(target).to_numpy()
    non_numeric = [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]
    if non_numeric:
        raise ValueError(f"{path}: feature columns must be numeric; not: {', '.join(map(str, non_numeric))}")
    return frame.to_numpy(dtype=np.float64), y


def write_history(history: pd.DataFrame, path: str | Path) -> Path:
    """The search history as CSV, or as JSON records when ``path`` ends with ``.json``."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        records = [{k: jsonable(v) for k, v in row.items()} for row in history.to_dict(orient="records")]
        data = json.dumps(records, indent=1, allow_nan=False, default=str).encode()
    else:
        frame = history.copy()
        for col in frame.columns:  # vectors (ARD sigma) as space-separated numbers in one cell
            frame[col] = [" ".join(f"{x:.6g}" for x in v) if isinstance(v, np.ndarray) else v for v in frame[col]]
        data = frame.to_csv(index=False).encode()
    return atomic_write_bytes(path, data)
