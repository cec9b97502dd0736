"""``[model] estimator = "online"``: each run updates the previous run's model with the new rows.

Instead of refitting on every row, a run loads the model of the last successful
run (``<runs_dir>/latest/model``), scores it on the rows appended to the store
since (prequential evaluation: each row is predicted before it is learnt), then
calls :meth:`~daskkrr.models.online.OnlineKernelRidge.partial_fit` on the store,
which reads only those rows, and saves the updated model. The first run (no
previous model) fits on every row the store holds. A store with fewer rows than
the previous model has seen fails the run (the model is not touched), as does a
``[model]`` table whose parameters differ from the previous model's: start a
new stream by pointing ``runs_dir`` elsewhere or removing ``latest``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from daskkrr.workflow import rundir as rd
from daskkrr.workflow.data import resolve_store
from daskkrr.workflow.evaluate import compute_metrics
from daskkrr.workflow.spec import WorkflowError

logger = logging.getLogger("daskkrr.workflow")

#: The estimator name of the incremental mode.
ONLINE_ESTIMATOR = "online"


def previous_model(runs_dir: Path) -> Any:
    """The model saved by the last successful run, or None (first run, or it saved none)."""
    from daskkrr.models.loading import load_model

    path = runs_dir / rd.LATEST / "model"
    return load_model(path) if path.is_dir() else None


def _check_same_params(model: Any, params: dict[str, Any]) -> None:
    from daskkrr.config import build_estimator

    wanted = build_estimator(params).get_params()
    have = model.get_params()
    # A model saved in the unnormalised convention got penalty = lam / n and raw feature units on loading (with
    # a FutureWarning): the stream goes on with them whatever the table says, once; this run's model records them.
    skip = {"verbose", "penalty", "standardize"} if hasattr(model, "penalty_converted_from_") else {"verbose"}
    changed = sorted(k for k in wanted if k not in skip and wanted[k] != have.get(k))
    if changed:
        raise WorkflowError(
            f"[model] {', '.join(changed)} differ(s) from the previous run's model "
            f"({', '.join(f'{k}={have.get(k)!r}' for k in changed)}); an online run continues that model's "
            "stream: set them back, or start a new stream (another runs_dir, or remove its 'latest' link)"
        )


def execute_online(config: dict[str, Any], run: rd.RunDirectory) -> dict[str, Any]:
    """One run of an online workflow (see the module docstring); returns metrics.json's contents."""
    from daskkrr.config import build_estimator
    from daskkrr.data import open_dataset

    if config["sweep"]:
        raise WorkflowError("an online workflow updates one model: remove the [sweep] table")
    params = dict(config["model"])
    metrics_names = config["evaluation"]["metrics"]
    store = resolve_store(config["data"], config["workflow"]["runs_dir"])
    X, y = open_dataset(store)
    if y is None:
        raise ValueError(f"{store} holds no target array 'y'; a workflow needs X and y")
    model = previous_model(Path(config["workflow"]["runs_dir"]))
    seen = 0
    if model is not None:
        _check_same_params(model, params)
        seen = int(model.n_rows_seen_)
        if X.shape[0] < seen:
            raise ValueError(f"the store {store} has {X.shape[0]} rows but the previous model has seen {seen}: "
                             "it shrank, or it is another store; start a new stream")
    n_new = int(X.shape[0]) - seen
    scores: dict[str, Any] = {}
    if model is not None and n_new > 0:  # prequential: the new rows, predicted before they are learnt
        t0 = time.perf_counter()
        scores = compute_metrics(y[seen:], model.predict(X[seen:]), metrics_names)
        scores["predict_seconds"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    if model is None:
        logger.info("online: no previous model; learning all %d rows of %s", X.shape[0], store)
        model = build_estimator(params).fit(str(store))
    else:
        logger.info("online: %d rows seen by the previous model; learning the %d new rows", seen, n_new)
        model.partial_fit(str(store))
    scores.update(fit_seconds=round(time.perf_counter() - t0, 3), n_new_rows=n_new,
                  n_rows_seen=int(model.n_rows_seen_), n_landmarks=int(model.n_landmarks_),
                  n_centers=int(model.centers_.shape[0]))
    if config["outputs"]["model"]:
        model.save(run.file("model"))
    return {
        **run.result_header(config, store, X),
        "evaluation": "prequential",
        "primary_metric": metrics_names[0],
        "metrics": scores,
        "best_params": {},
        "model_params": params,
        "variants": [],
        "refit": None,
        "outputs": {"model": str(run.file("model")) if config["outputs"]["model"] else None, "predictions": None},
    }


__all__ = ["ONLINE_ESTIMATOR", "execute_online", "previous_model"]
