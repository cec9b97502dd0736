"""Run a workflow: data -> fits (each [sweep] variant, held-out or cross-validated) -> outputs.

:func:`run_workflow` is what ``daskkrr run``, cron/systemd and the Prefect flow call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import daskkrr
from daskkrr.data.splits import holdout_split, kfold
from daskkrr.workflow import rundir as rd
from daskkrr.workflow.data import load_data, load_sample_weight
from daskkrr.workflow.evaluate import better, compute_metrics, summarize_folds
from daskkrr.workflow.spec import WorkflowError, model_variants, read_workflow, resolve

logger = logging.getLogger("daskkrr.workflow")


@dataclasses.dataclass
class RunResult:
    """How a run ended.

    Attributes
    ----------
    run_id : str
    run_dir : pathlib.Path
    status : str
        "succeeded" or "failed".
    metrics : dict
        Contents of metrics.json (empty for a failed run).
    error : str or None
    """

    run_id: str
    run_dir: Path
    status: str
    metrics: dict[str, Any]
    error: str | None = None


class WorkflowRunError(RuntimeError):
    """The run failed; ``result`` points at its directory (marked failed)."""

    def __init__(self, message: str, result: RunResult):
        super().__init__(message)
        self.result = result


def _fit_and_score(
    params: dict[str, Any], X_train: Any, y_train: Any, X_test: Any, y_test: Any, metrics: list[str],
    w_train: Any = None,
) -> tuple[Any, dict[str, Any]]:
    from daskkrr.config import build_estimator

    model = build_estimator(params)  # fits on the run's client: _client_for made it current
    t0 = time.perf_counter()
    model.fit(X_train, y_train, **({} if w_train is None else {"sample_weight": w_train}))
    fit_seconds = time.perf_counter() - t0
    scores: dict[str, Any] = {}
    if X_test is not None:
        t0 = time.perf_counter()
        scores = compute_metrics(y_test, model.predict(X_test), metrics)
        scores["predict_seconds"] = round(time.perf_counter() - t0, 3)
    scores.update(_fit_figures(model), fit_seconds=round(fit_seconds, 3))
    return model, scores


def _fit_figures(model: Any) -> dict[str, Any]:
    return {
        "n_centers": int(model.centers_.shape[0]),
        "cg_iterations": int(getattr(model, "n_iter_", 0)),
        "converged": bool(getattr(model, "converged_", True)),
        "data_passes": int(getattr(model, "n_data_passes_", 0)),
    }


def _split_weights(w: Any, X: Any, ev: dict[str, Any]) -> list[Any]:
    """The training rows' weights of each split (the same rows as X's: same split, same blocks)."""
    if w is None:
        return [None] * (int(ev["folds"]) if ev["method"] == "cv" else 1)
    as_x = w[:, None].rechunk({0: X.chunks[0]})
    if ev["method"] == "holdout":
        return [holdout_split(as_x, w, float(ev["test_fraction"]), ev["split"], int(ev["seed"]))[1]]
    return [fold[1] for fold in kfold(as_x, w, int(ev["folds"]), ev["split"], int(ev["seed"]))]


def _evaluate_variant(
    params: dict[str, Any], X: Any, y: Any, ev: dict[str, Any], w: Any = None
) -> tuple[Any, dict[str, Any], Any]:
    """Fit one variant as the evaluation says; return (model or None, scores, held-out X).

    ``w``: the rows' weights (fit's ``sample_weight``) or None; the metrics weigh every row alike.
    """
    if ev["method"] == "holdout":
        X_tr, y_tr, X_te, y_te = holdout_split(X, y, float(ev["test_fraction"]), ev["split"], int(ev["seed"]))
        (w_tr,) = _split_weights(w, X, ev)
        model, scores = _fit_and_score(params, X_tr, y_tr, X_te, y_te, ev["metrics"], w_tr)
        scores.update(n_train=int(X_tr.shape[0]), n_test=int(X_te.shape[0]))
        return model, scores, X_te
    if ev["method"] == "cv":
        per_fold = []
        folds = kfold(X, y, int(ev["folds"]), ev["split"], int(ev["seed"]))
        for k, ((X_tr, y_tr, X_te, y_te), w_tr) in enumerate(zip(folds, _split_weights(w, X, ev))):
            logger.info("fold %d/%d", k + 1, ev["folds"])
            _, s = _fit_and_score(params, X_tr, y_tr, X_te, y_te, ev["metrics"], w_tr)
            per_fold.append(s)
        scores = summarize_folds([{k: v for k, v in s.items() if isinstance(v, (int, float))} for s in per_fold])
        return None, scores, None
    model, scores = _fit_and_score(params, X, y, None, None, ev["metrics"], w)
    scores.update(n_train=int(X.shape[0]))
    return model, scores, None


def _execute(config: dict[str, Any], run: rd.RunDirectory) -> dict[str, Any]:
    from daskkrr.workflow.online import ONLINE_ESTIMATOR, execute_online

    if config["model"].get("estimator") == ONLINE_ESTIMATOR:  # update the last run's model, no refit
        return execute_online(config, run)
    ev, outputs = config["evaluation"], config["outputs"]
    X, y, store = load_data(config)
    w = load_sample_weight(config, X)
    logger.info("data: %s, %d rows x %d features in %d blocks", store, X.shape[0], X.shape[1], X.numblocks[0])
    variants = model_variants(config["model"], config["sweep"])
    primary = ev["metrics"][0]
    results, best = [], None
    for i, params in enumerate(variants):
        if len(variants) > 1:
            swept = {k: params[k] for k in config["sweep"]}
            logger.info("variant %d/%d: %s", i + 1, len(variants), swept)
        model, scores, X_test = _evaluate_variant(params, X, y, ev, w)
        entry = {"params": {k: params[k] for k in config["sweep"]} if config["sweep"] else {}, **scores}
        results.append(entry)
        score = scores.get(primary, float("nan"))
        if best is None or better(primary, score, best[1].get(primary, float("nan"))):
            best = (params, scores, model, X_test)
    if best is None:
        raise WorkflowError("the workflow has no model variant to evaluate (is a [sweep] list empty?)")
    params, scores, model, X_test = best

    held_out_model = model
    if outputs["model"] and (model is None or (outputs["refit"] and ev["method"] == "holdout")):
        logger.info("refitting the best model on all %d rows", X.shape[0])
        model, refit_scores = _fit_and_score(params, X, y, None, None, ev["metrics"], w)
        scores = {**scores, "refit": refit_scores}
    if outputs["predictions"] and X_test is not None:
        from daskkrr.data import write_array_zarr

        pred = held_out_model.predict(X_test)  # the predictions that were scored
        write_array_zarr(pred, run.file("predictions.zarr"), name="y_pred")
    if outputs["model"] and model is not None:
        model.save(run.file("model"))

    return {
        **run.result_header(config, store, X),
        "evaluation": ev["method"],
        "primary_metric": primary,
        "metrics": {k: v for k, v in scores.items() if k != "refit"},
        "best_params": {k: params[k] for k in config["sweep"]} if config["sweep"] else {},
        "model_params": dict(params),
        "variants": results,
        "refit": scores.get("refit"),
        "outputs": {
            "model": str(run.file("model")) if outputs["model"] and model is not None else None,
            "predictions": str(run.file("predictions.zarr")) if outputs["predictions"] and X_test is not None else None,
        },
    }


def check_run_paths(config: dict[str, Any], runs: Path) -> None:
    """Refuse, before the run, a runs_dir at or inside the data it reads, and a [data] cache over its table.

    A store kept inside runs_dir (an earlier run's cache) is read and never
    replaced, so only runs_dir at or inside an input is refused.
    """
    from daskkrr.utils.output_paths import check_paths

    data = config["data"]
    inputs = {f"[data] {key}": data.get(key) for key in ("store", "table")}
    outside = {k: v for k, v in inputs.items() if v is None or runs.resolve() not in Path(v).resolve().parents}
    check_paths(inputs=outside, states={"[workflow] runs_dir": runs})
    if data.get("table") and data.get("cache"):
        check_paths(inputs={"[data] table": data["table"]}, states={"[data] cache": data["cache"]})


def workflow_security(config: dict[str, Any], scheduler: str | None) -> Any:
    """The TLS of the run's scheduler from [cluster] tls_ca_file/tls_cert/tls_key, or None; refused before the run."""
    from daskkrr.parallel.client import tls_security
    from daskkrr.workflow.spec import TLS_KEYS

    cluster = config["cluster"]
    try:
        return tls_security(scheduler or cluster["scheduler"], *(cluster.get(key) for key in TLS_KEYS),
                            names=tuple(f"[cluster] {key}" for key in TLS_KEYS))  # type: ignore[arg-type]
    except ValueError as exc:
        raise WorkflowError(str(exc)) from None


@contextlib.contextmanager
def _client_for(config: dict[str, Any], client: Any, scheduler: str | None, n_workers: int | None,
                security: Any = None):
    """The client given, else a connection to the configured scheduler (with ``security``'s TLS), else a
    local cluster."""
    if client is not None:
        with client.as_current():  # dask computations in the run (metrics, writes) use it too
            yield client
        return
    from daskkrr.parallel import cluster_client

    address = scheduler or config["cluster"]["scheduler"]
    workers = n_workers or config["cluster"]["workers"]
    with cluster_client(address, n_workers=workers, security=security) as c:
        yield c


def run_workflow(
    workflow: str | os.PathLike | dict[str, Any],
    *,
    overrides: list[str] | dict[str, Any] | None = None,
    runs_dir: str | os.PathLike | None = None,
    client: Any = None,
    scheduler: str | None = None,
    n_workers: int | None = None,
    progress: bool = False,
    security: Any = None,
) -> RunResult:
    """Run a workflow once, in a new run directory.

    Parameters
    ----------
    workflow : path or dict
        A workflow TOML file, or its contents as a dict (paths then relative to
        the current directory).
    overrides : list of "table.key=value" strings, or dict
        Changes to the file, e.g. ``["data.store=/data/today.zarr", "model.n_centers=500"]``.
    runs_dir : path, optional
        Where run directories go (default: ``[workflow] runs_dir``).
    client : distributed.Client, optional
        Run on this client. Without one: ``scheduler``, else ``[cluster] scheduler``,
        else ``$DASK_SCHEDULER_ADDRESS``, else a local cluster closed at the end.
    n_workers : int, optional
        Size of that local cluster (default: ``[cluster] workers``, else one per core).
    progress : bool
        Show a progress bar for each fit.
    security : distributed.security.Security, optional
        TLS of the connection to a ``tls://`` scheduler (default: from ``[cluster]
        tls_ca_file``, ``tls_cert`` and ``tls_key``; see :func:`daskkrr.parallel.client.tls_security`).

    Returns
    -------
    RunResult

    Raises
    ------
    WorkflowError
        The file does not validate (nothing is run, no directory is made).
    WorkflowLockedError
        Another run of the same workflow is under way.
    WorkflowRunError
        The run failed; its directory is marked failed and ``error.result`` says where.
    """
    if isinstance(workflow, dict):
        from daskkrr.workflow.spec import apply_overrides

        config = resolve(apply_overrides(workflow, overrides), base_dir=Path.cwd())
        source = None
    else:
        config = read_workflow(workflow, overrides)
        source = str(Path(workflow).resolve())
    return execute_run(config, source, overrides, _execute, runs_dir=runs_dir, client=client, scheduler=scheduler,
                       n_workers=n_workers, progress=progress, security=security)


def execute_run(
    config: dict[str, Any],
    source: str | None,
    overrides: list[str] | dict[str, Any] | None,
    execute: Callable[[dict[str, Any], rd.RunDirectory], dict[str, Any]],
    *,
    runs_dir: str | os.PathLike | None,
    client: Any,
    scheduler: str | None,
    n_workers: int | None,
    progress: bool,
    security: Any,
) -> RunResult:
    """Run a checked workflow ``config`` once, in a new run directory: what every kind of workflow shares.

    The run holds the workflow's lock, writes its resolved config, logs to its ``run.log`` and,
    on the run's client, calls ``execute(config, run)`` for the metrics; a failure (Ctrl-C too)
    marks the directory failed. ``source`` is the workflow file (None for a dict); the other
    arguments are :func:`run_workflow`'s.
    """
    if runs_dir is not None:
        config["workflow"]["runs_dir"] = str(Path(runs_dir).resolve())
    runs = Path(config["workflow"]["runs_dir"])
    check_run_paths(config, runs)
    security = security or (None if client is not None else workflow_security(config, scheduler))

    from daskkrr.progress import report

    with rd.workflow_lock(runs):
        for stale in rd.mark_interrupted_runs(runs):
            logger.warning("run %s was left running by a process that died; marked it failed", stale)
        run = rd.RunDirectory(runs)
        resolved = {**config, "source": source, "overrides": overrides, "daskkrr_version": daskkrr.__version__}
        rd.write_json(run.file(rd.CONFIG_FILE), resolved)
        with rd.run_log(run.file(rd.LOG_FILE)):
            logger.info("run %s of workflow %s started in %s", run.run_id, config["workflow"]["name"], run.path)
            t0 = time.perf_counter()
            try:
                with _client_for(config, client, scheduler, n_workers, security) as c, report(bar=progress):
                    from daskkrr.dashboard import dashboard_url

                    logger.info("Dask dashboard: %s", getattr(c, "dashboard_link", None))
                    metrics = execute(config, run)
                    metrics["dashboard"] = dashboard_url(c)
                metrics["seconds"] = round(time.perf_counter() - t0, 3)
                rd.write_json(run.file(rd.METRICS_FILE), metrics)
            except BaseException as exc:
                # INFO: the traceback goes to run.log; the caller reports the error itself
                logger.info("run %s failed", run.run_id, exc_info=True)
                run.fail(exc)
                result = RunResult(run.run_id, run.path, "failed", {}, rd.read_status(run.path).get("error"))
                if isinstance(exc, Exception):
                    raise WorkflowRunError(
                        f"run {run.run_id} failed: {result.error} (see {run.file(rd.LOG_FILE)})", result
                    ) from exc
                raise
            run.succeed(seconds=metrics["seconds"])
            if config["outputs"]["latest"]:
                run.point_latest()
            logger.info("run %s succeeded in %.1fs", run.run_id, metrics["seconds"])
    return RunResult(run.run_id, run.path, "succeeded", metrics)
