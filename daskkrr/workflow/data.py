"""The data of a workflow run: open a Zarr store, or convert/generate one into a cache first.

- ``store``: opened as is (a nightly workflow simply sees the rows the store holds now);
- ``table``: a CSV/TSV file or a Parquet file or folder of parts, converted once into
  ``cache`` (default ``<runs_dir>/cache/<stem>.zarr``) and converted again only when the
  size or modification time of the table (of any of its files) changes;
- ``generate``: synthetic data written once into a cache keyed by its settings.

Then the preprocessing: keep the first ``max_rows`` rows and re-chunk to ``chunk_rows``
(the ``sample_weight`` array of a store alike, see :func:`load_sample_weight`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the data layer builds the arrays
    import dask.array as da

logger = logging.getLogger("daskkrr.workflow")


def _source_stamp(path: Path, target: str, categorical: str) -> dict[str, Any]:
    """What the cached copy was made from: the size and modification time of the table's files (a folder's
    part files, in order), and how it was converted."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stats = [(str(p.relative_to(path)) if path.is_dir() else "", p.stat()) for p in files]
    return {"path": str(path), "files": [[name, st.st_size, st.st_mtime_ns] for name, st in stats],
            "target": target, "categorical": categorical}


def cached_table(table: str, target: str, cache: str, sep: str | None = None, categorical: str = "refuse") -> Path:
    """Path of a Zarr copy of ``table`` (CSV/TSV, or a Parquet file or folder) in ``cache``, (re)converted if
    the table changed; ``categorical`` is :func:`daskkrr.data.convert_table`'s (Parquet's categorical columns)."""
    from daskkrr.data import convert_table

    source, store = Path(table), Path(cache)
    if not source.exists():
        raise FileNotFoundError(f"[data] table {source} does not exist; fix the path in the workflow file")
    stamp_file = store.with_name(store.name + ".source.json")
    stamp = _source_stamp(source, target, categorical)
    if store.exists() and stamp_file.is_file():
        try:
            if json.loads(stamp_file.read_text()) == stamp:
                logger.info("using cached conversion %s of %s", store, source)
                return store
        except ValueError:
            pass
    logger.info("converting %s into %s", source, store)
    store.parent.mkdir(parents=True, exist_ok=True)
    convert_table(source, store, target=target, sep=sep, overwrite=True, categorical=categorical)
    stamp_file.write_text(json.dumps(stamp))
    return store


def generated_store(settings: dict[str, Any], cache_dir: str | os.PathLike) -> Path:
    """Path of synthetic data with these settings in ``cache_dir``, written on first use."""
    from daskkrr.data import write_blobs_zarr, write_classification_zarr, write_regression_zarr

    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    store = Path(cache_dir) / f"generated-{key}.zarr"
    if store.exists():
        return store
    store.parent.mkdir(parents=True, exist_ok=True)
    n, d, seed = int(settings["n"]), int(settings["d"]), int(settings.get("seed", 0))
    chunk_rows = settings.get("chunk_rows")
    logger.info("generating %d rows x %d features into %s", n, d, store)
    if int(settings.get("clusters", 0)):
        write_blobs_zarr(store, n, d, n_clusters=int(settings["clusters"]), chunk_rows=chunk_rows, random_state=seed)
    elif int(settings.get("classes", 0)):
        write_classification_zarr(store, n, d, n_classes=int(settings["classes"]), chunk_rows=chunk_rows,
                                  random_state=seed)
    else:
        kwargs: dict[str, Any] = {"noise": float(settings["noise"])} if "noise" in settings else {}
        write_regression_zarr(store, n, d, chunk_rows=chunk_rows, random_state=seed, **kwargs)
    return store


def resolve_store(data: dict[str, Any], runs_dir: str) -> Path:
    """The Zarr store the run reads (converting or generating it into the cache if needed)."""
    cache_dir = Path(runs_dir) / "cache"
    if data["store"] is not None:
        store = Path(data["store"])
        if not store.exists():
            raise FileNotFoundError(f"[data] store {store} does not exist; fix the path in the workflow "
                                    "file or pass --set data.store=PATH")
        return store
    if data["table"] is not None:
        cache = data["cache"] or str(cache_dir / (Path(data["table"]).name.split(".")[0] + ".zarr"))
        return cached_table(data["table"], data["target"], cache, data.get("sep"),
                            data.get("categorical") or "refuse")
    return generated_store(data["generate"], cache_dir)


def load_data(config: dict[str, Any]) -> tuple[da.Array, da.Array, Path]:
    """Open the run's data and apply the preprocessing; return ``X``, ``y`` and the store's path."""
    from daskkrr.data import open_dataset

    store = resolve_store(config["data"], config["workflow"]["runs_dir"])
    X, y = open_dataset(store)
    if y is None:
        raise ValueError(f"{store} holds no target array 'y'; a workflow needs X and y")
    pre = config["preprocess"]
    if pre["max_rows"] is not None and pre["max_rows"] < X.shape[0]:
        X, y = X[: pre["max_rows"]], y[: pre["max_rows"]]
    if pre["chunk_rows"] is not None:
        X = X.rechunk({0: pre["chunk_rows"], 1: -1})
        y = y.rechunk({0: pre["chunk_rows"]})
    return X, y, store


def load_sample_weight(config: dict[str, Any], X: da.Array) -> da.Array | None:
    """The ``[data] sample_weight`` array of the store, cut and chunked like the run's ``X`` (or None)."""
    from daskkrr.data import open_dataset
    from daskkrr.data.sample_weight import open_sample_weight

    name = config["data"].get("sample_weight")
    if name is None:
        return None
    store = config["data"]["store"]
    _, w = open_dataset(store, y=name)
    if w is None or w.ndim != 1 or w.shape[0] < X.shape[0]:
        raise ValueError(f"[data] sample_weight {name!r} of {store} must hold one weight per row of X")
    return open_sample_weight(w[: X.shape[0]], store, X, None)
