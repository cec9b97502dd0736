"""Unsupervised workflow files: Nystrom kernel PCA and/or kernel k-means of a store, in a run directory.

::

    [workflow]
    name = "fashion-clusters"        # default: the file's stem
    runs_dir = "runs/fashion"        # default: runs/<name>, relative to the file

    [data]                           # as in fit workflows: exactly one of store / table / generate
    store = "data/fashion.zarr"      # array X; a 'y' array, if any, is used only to score the labels

    [preprocess]
    max_rows = 1_000_000             # use the first max_rows rows
    chunk_rows = 50_000              # rows per block

    [kpca]                           # optional: NystromKernelPCA parameters
    n_components = 20
    n_centers = 1000

    [kmeans]                         # optional: NystromKernelKMeans parameters; with [kpca] it
    n_clusters = 10                  #   clusters the kernel PCA components, else the data
    n_centers = 1000

    [outputs]
    model = true                     # save the fitted models (kpca/, kmeans/)
    embedding = true                 # the components -> embedding.zarr (array X, and y if any)
    labels = true                    # the clusters -> labels.zarr (array labels)
    latest = true                    # point runs_dir/latest at the last successful run

    [cluster]
    scheduler = "tcp://host:8786"    # default: $DASK_SCHEDULER_ADDRESS, else a local cluster
    workers = 2

``daskkrr run FILE`` runs such a file when it has a [kpca] or [kmeans] table.
``metrics.json`` records the fits (explained variance, inertia, iterations,
seconds) and, when the store has a target, the adjusted Rand index and the
normalised mutual information of the labels against it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from daskkrr.utils.toml_file import read_toml, unknown_keys
from daskkrr.workflow import rundir as rd
from daskkrr.workflow.data import resolve_store
from daskkrr.workflow.runner import RunResult, execute_run
from daskkrr.workflow.spec import TLS_KEYS, WorkflowError, _resolve_path, apply_overrides

_TABLES: dict[str, dict[str, Any]] = {
    "workflow": {"name": None, "runs_dir": None, "description": ""},
    "data": {"store": None, "table": None, "target": None, "sep": None, "cache": None, "generate": None},
    "preprocess": {"max_rows": None, "chunk_rows": None},
    "outputs": {"model": True, "embedding": True, "labels": True, "latest": True},
    "cluster": {"scheduler": None, "workers": None, "tls_ca_file": None, "tls_cert": None, "tls_key": None},
}
_MODELS = {"kpca": "NystromKernelPCA", "kmeans": "NystromKernelKMeans"}


def is_unsupervised(raw: dict[str, Any]) -> bool:
    """Whether a workflow document is an unsupervised one (it has a [kpca] or [kmeans] table)."""
    return any(name in raw for name in _MODELS)


def read_unsupervised_workflow(path: str | os.PathLike, overrides: list[str] | dict[str, Any] | None = None
                               ) -> dict[str, Any]:
    """Read, override and check an unsupervised workflow file; paths become absolute."""
    path = Path(path)
    raw = read_toml(path, error=WorkflowError, what="workflow file")
    raw = _overridden(raw, overrides)
    return resolve_unsupervised(raw, base_dir=path.resolve().parent, default_name=path.stem, where=str(path))


def _overridden(raw: dict[str, Any], overrides: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """``apply_overrides`` of the fit workflows, which also accepts the [kpca] and [kmeans] tables."""
    models = {name: dict(raw.get(name, {})) for name in _MODELS}
    rest = {k: v for k, v in raw.items() if k not in _MODELS}
    other: list[str] = []
    for item in overrides or []:
        table, _, rest_of_item = str(item).partition(".")
        if table in _MODELS:
            key, _, value = rest_of_item.partition("=")
            from daskkrr.workflow.spec import parse_value

            models[table][key.strip()] = parse_value(value.strip())
        else:
            other.append(item)
    out = apply_overrides(rest, other)
    out.update({name: table for name, table in models.items() if table or name in raw})
    return out


def resolve_unsupervised(raw: dict[str, Any], *, base_dir: str | os.PathLike, default_name: str = "workflow",
                         where: str = "workflow") -> dict[str, Any]:
    """Check an unsupervised workflow dict and fill in its defaults."""
    from daskkrr.models.registry import UNSUPERVISED

    base_dir = Path(base_dir)
    unknown = unknown_keys(raw, {*_TABLES, *_MODELS}, where=where, what="table")
    if unknown:
        raise WorkflowError(unknown)
    if not is_unsupervised(raw):
        raise WorkflowError(f"{where}: an unsupervised workflow needs a [kpca] or a [kmeans] table")
    out: dict[str, Any] = {}
    for table, defaults in _TABLES.items():
        section = raw.get(table, {})
        unknown = unknown_keys(section, defaults, where=where, context=f" in [{table}]")
        if unknown:
            raise WorkflowError(unknown)
        out[table] = {**defaults, **section}
    for name in _MODELS:
        if name in raw:
            try:
                model = UNSUPERVISED[name](**raw[name])
                model._validate_params()
            except TypeError as exc:
                raise WorkflowError(f"{where}: [{name}]: {exc}") from None
            except ValueError as exc:
                raise WorkflowError(f"{where}: [{name}]: {exc}") from exc
            out[name] = dict(raw[name])
    wf = out["workflow"]
    wf["name"] = wf["name"] or default_name
    wf["runs_dir"] = _resolve_path(base_dir, wf["runs_dir"] or f"runs/{wf['name']}")
    data = out["data"]
    sources = [k for k in ("store", "table", "generate") if data[k] is not None]
    if len(sources) != 1:
        raise WorkflowError(f"{where}: [data] needs exactly one of store, table or generate; got {sources or 'none'}")
    for key in ("store", "table", "cache"):
        data[key] = _resolve_path(base_dir, data[key])
    for key in TLS_KEYS:
        out["cluster"][key] = _resolve_path(base_dir, out["cluster"][key])
    return out


def _open(config: dict[str, Any]) -> tuple[Any, Any, Path]:
    from daskkrr.data import open_dataset

    store = resolve_store(config["data"], config["workflow"]["runs_dir"])
    X, y = open_dataset(store, y="y")
    pre = config["preprocess"]
    if pre["max_rows"] is not None and pre["max_rows"] < X.shape[0]:
        X = X[: pre["max_rows"]]
        y = None if y is None else y[: pre["max_rows"]]
    if pre["chunk_rows"] is not None:
        X = X.rechunk({0: pre["chunk_rows"], 1: -1})
        y = None if y is None else y.rechunk({0: pre["chunk_rows"]})
    return X, y, store


def _execute(config: dict[str, Any], run: rd.RunDirectory) -> dict[str, Any]:
    from daskkrr.data import write_array_zarr, write_zarr
    from daskkrr.models.registry import UNSUPERVISED

    X, y, store = _open(config)
    outputs = config["outputs"]
    result: dict[str, Any] = {**run.result_header(config, store, X, blocks=False), "outputs": {}}
    features = X
    if "kpca" in config:
        t0 = time.perf_counter()
        kpca = UNSUPERVISED["kpca"](**config["kpca"]).fit(X)
        features = kpca.transform(X)
        result["kpca"] = {
            "seconds": round(time.perf_counter() - t0, 3), "n_components": int(kpca.n_components_),
            "n_centers": kpca.n_centers_, "explained_variance_ratio": kpca.explained_variance_ratio_.tolist(),
        }
        if outputs["embedding"]:
            write_zarr(features, y, run.file("embedding.zarr"))
            result["outputs"]["embedding"] = str(run.file("embedding.zarr"))
        if outputs["model"]:
            kpca.save(run.file("kpca"))
            result["outputs"]["kpca"] = str(run.file("kpca"))
    if "kmeans" in config:
        t0 = time.perf_counter()
        km = UNSUPERVISED["kmeans"](**config["kmeans"]).fit(features)
        result["kmeans"] = {"seconds": round(time.perf_counter() - t0, 3), "inertia": float(km.inertia_),
                            "n_iter": int(km.n_iter_), "converged": bool(km.converged_),
                            "n_centers": km.n_centers_}
        labels = km.labels_
        if y is not None:
            from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

            from daskkrr.parallel import Executor

            truth, found = (np.asarray(a) for a in Executor().compute(y, labels))
            result["kmeans"].update(ari=float(adjusted_rand_score(truth, found)),
                                    nmi=float(normalized_mutual_info_score(truth, found)))
        if outputs["labels"]:
            write_array_zarr(labels, run.file("labels.zarr"), name="labels")
            result["outputs"]["labels"] = str(run.file("labels.zarr"))
        if outputs["model"]:
            km.save(run.file("kmeans"))
            result["outputs"]["kmeans"] = str(run.file("kmeans"))
    return result


def run_unsupervised_workflow(
    workflow: str | os.PathLike,
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    runs_dir: str | os.PathLike | None = None,
    client: Any = None,
    scheduler: str | None = None,
    n_workers: int | None = None,
    progress: bool = False,
    security: Any = None,
) -> RunResult:
    """Run an unsupervised workflow file once, in a new run directory (see the module docstring).

    Parameters
    ----------
    workflow, overrides, runs_dir, client, scheduler, n_workers, progress, security
        As in :func:`daskkrr.workflow.run_workflow`.

    Returns
    -------
    RunResult
        How the run ended: its directory, status and metrics.

    Raises
    ------
    WorkflowError
        The file does not validate (nothing is run, no directory is made).
    WorkflowRunError
        The run failed; its directory is marked failed.
    """
    config = read_unsupervised_workflow(workflow, overrides)
    return execute_run(config, str(Path(workflow).resolve()), overrides, _execute, runs_dir=runs_dir, client=client,
                       scheduler=scheduler, n_workers=n_workers, progress=progress, security=security)


__all__ = ["is_unsupervised", "read_unsupervised_workflow", "resolve_unsupervised", "run_unsupervised_workflow"]
