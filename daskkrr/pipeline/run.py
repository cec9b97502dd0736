"""Run the stages of one fit, with its subscribers: progress, log, dashboard, checkpoint, callbacks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from daskkrr import events as ev
from daskkrr.checkpoint import FitCheckpoint
from daskkrr.data.inputs import is_in_memory
from daskkrr.parallel import Executor
from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.stages import Stage
from daskkrr.progress import fit_progress
from daskkrr.utils.output_paths import check_paths

logger = logging.getLogger("daskkrr")


def sampler_name(sampler: Any) -> str:
    """The registry name of a sampler parameter (a name or a sampler object)."""
    if isinstance(sampler, str):
        return sampler.lower()
    if isinstance(sampler, np.ndarray):  # the user's centers (FixedCenters)
        return "fixed"
    return str(getattr(sampler, "name", "") or type(sampler).__name__)


#: Fitted arrays that follow the input's precision (as scikit-learn's KernelRidge keeps float32).
PRECISION_FOLLOWS_INPUT = ("coef_", "intercept_")


def keep_input_precision(fitted: dict[str, Any], input_dtype: Any) -> None:
    """Cast the model's coefficients to float32 when the training features were float32.

    The solve runs in float64 (or the estimator's ``dtype``) whatever the input; like
    scikit-learn's estimators, a float32 input gives float32 coefficients, hence float32
    predictions (see :meth:`~daskkrr.models.kernel_model.KernelModelBase._output_dtype`).
    """
    if input_dtype is None or np.dtype(input_dtype) != np.float32:
        return
    for name in PRECISION_FOLLOWS_INPUT:
        value = fitted.get(name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            fitted[name] = value.astype(np.float32)


def run_fit(
    estimator: Any,
    X: Any,
    y: Any,
    stages: Sequence[Stage],
    *,
    checkpoint: Any = None,
    checkpoint_every: int = 5,
    resume: bool = False,
    iterative: bool = False,
    sample_weight: Any = None,
) -> FitContext:
    """Run ``stages`` on ``(X, y)`` for ``estimator`` and return the finished context.

    The fit runs where Dask's current context says (see
    :func:`daskkrr.parallel.backend_for`). Every stage and pass is reported on one
    :class:`~daskkrr.events.EventBus` whose subscribers are, in order: the progress
    tracker (bar, log records, dashboard), the checkpoint (critical: a checkpoint that cannot be written
    stops the fit) and the subscribers of :func:`daskkrr.events.subscribe`.
    Whatever a stage holds on the workers is released, however the fit ends.

    ``iterative`` marks fits whose solve counts iterations (``max_iter``), for the
    progress estimate. ``sample_weight`` is ``fit``'s, checked by
    :func:`daskkrr.models.weights.check_sample_weight`; the statistics stage opens it.
    """
    # A checkpoint over the data it fits, or where nothing can be written: refused before any work.
    # (y and sample_weight given as text name arrays of X's store, not paths.)
    check_paths(inputs={"X": X}, states={"checkpoint": checkpoint})
    # Checks its arguments and refuses an existing checkpoint without resume, before any work.
    store = FitCheckpoint(checkpoint, every=checkpoint_every, resume=resume)
    bus = ev.EventBus()
    executor = Executor(events=bus)
    started = ev.FitStarted(
        estimator=type(estimator).__name__,
        sampler=sampler_name(getattr(estimator, "sampler", "")),
        max_iter=getattr(estimator, "max_iter", None) if iterative else None,
    )
    install: Callable[[Any], str | None] | None = None
    if executor.client is not None:
        from daskkrr.dashboard import install
    with fit_progress(started, client=executor.client, verbose=bool(getattr(estimator, "verbose", False)),
                      install_dashboard=install) as tracker:
        bus.subscribe(tracker.on_event)
        if store.enabled:
            bus.subscribe(store.on_event, critical=True)
        for fn in ev.user_subscribers():
            bus.subscribe(fn)
        bus.emit(started)
        # in_memory also holds for numpy rows scattered to a cluster's workers: they stay in the workers'
        # memory, so reading them is free and persisting them would copy them (issue 37: the numpy and
        # Zarr fits of numpy_on_cluster.py get the same plan, and the numpy one is not the slower).
        ctx = FitContext(
            params=estimator, executor=executor, events=bus, store=store, X_in=X, y_in=y,
            sample_weight_in=sample_weight, in_memory=is_in_memory(X), encode_targets=estimator._encode_targets,
        )
        t0 = time.perf_counter()
        try:
            with executor.context():  # any compute inside a stage runs where the fit runs
                for stage in stages:
                    bus.emit(ev.StageStarted(stage.name))
                    ts = time.perf_counter()
                    stage.run(ctx)
                    bus.emit(ev.StageDone(stage.name, time.perf_counter() - ts))
        except BaseException as exc:
            bus.emit(ev.FitFailed(exc))
            raise
        finally:
            ctx.close()
        seconds = time.perf_counter() - t0
        ctx.fitted["fit_time_"] = seconds
        keep_input_precision(ctx.fitted, ctx.input_dtype)
        bus.emit(ev.FitDone(ctx.n_iter, ctx.converged, seconds))
    logger.info("fit done in %.2fs (%d solver iterations)", seconds, ctx.n_iter)
    return ctx
