"""Follow a fit: the tracker subscribes to the fit's events, updates the record and tells the sinks.

The fit pipeline and the execution layer emit typed events (:mod:`daskkrr.events`);
:meth:`FitTracker.on_event` turns them into the :class:`FitProgress` record. The
tracker knows nothing of estimators, stages' code or Dask task functions.

Who listens is decided by :func:`report` (a context manager) or, without one, by
the fit's ``verbose`` flag:

- a progress bar (terminal or Jupyter), see :class:`daskkrr.progress.ProgressBar`;
- the ``daskkrr.progress`` logger (INFO), always;
- the scheduler, when the fit runs on a ``distributed`` client: the state is
  published to the scheduler's metadata and shown by the daskkrr dashboard page;
- any callables passed as ``callback``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from daskkrr import events as ev
from daskkrr.progress.state import ANNOTATION, FitProgress

logger = logging.getLogger("daskkrr.progress")

#: A sink gets the record and the name of the event that changed it.
Sink = Callable[[FitProgress, str], None]

#: Samplers that read every block once before the solve (one more pass).
STREAMING_SAMPLERS = frozenset({"squeak", "disqueak"})


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    """What :func:`report` asked for; None means "decide per fit"."""

    bar: Any = None
    publish: bool | None = None
    callbacks: tuple[Sink, ...] = ()


_SETTINGS: contextvars.ContextVar[ReportSettings | None] = contextvars.ContextVar("daskkrr_report", default=None)


@contextlib.contextmanager
def report(
    bar: Any = True,
    *,
    publish: bool | None = None,
    callback: Sink | Sequence[Sink] | None = None,
) -> Iterator[None]:
    """Choose how the fits inside the block report progress.

    Parameters
    ----------
    bar : bool or ProgressBar, default=True
        Show a progress bar (stderr in a terminal, a live cell output in Jupyter),
        or pass a configured :class:`~daskkrr.progress.ProgressBar`. ``False`` hides it
        even for estimators with ``verbose=True``.
    publish : bool or None
        Publish the state to the Dask scheduler for the dashboard page. None (the
        default) publishes whenever the fit runs on a ``distributed`` client.
    callback : callable or list of callables
        Called as ``callback(progress, event)`` after every event, with a
        :class:`~daskkrr.progress.FitProgress`. Exceptions in callbacks are logged, never raised.

    Yields
    ------
    None
        The settings hold until the block ends.

    Examples
    --------
    >>> from daskkrr.progress import report
    >>> seen = []
    >>> with report(bar=False, callback=lambda p, e: seen.append(e)):
    ...     pass
    """
    callbacks: tuple[Sink, ...]
    if callback is None:
        callbacks = ()
    elif callable(callback):
        callbacks = (callback,)
    else:
        callbacks = tuple(callback)
    for cb in callbacks:
        if not callable(cb):
            raise TypeError(f"callback must be callable or a list of callables; got {cb!r}")
    token = _SETTINGS.set(ReportSettings(bar=bar, publish=publish, callbacks=callbacks))
    try:
        yield
    finally:
        _SETTINGS.reset(token)


class FitTracker:
    """Updates one :class:`FitProgress` and forwards every change to the sinks.

    Sinks may be called from a helper thread (live block counts), so updates and
    notifications are serialised by a lock. A failing sink is logged and skipped:
    progress reporting never breaks a fit.

    Parameters
    ----------
    state : FitProgress
        The record to update.
    sinks : sequence of callables, default=()
        Each called as ``sink(state, event)`` after every change.
    """

    def __init__(self, state: FitProgress, sinks: Sequence[Sink] = ()):
        self.state = state
        self.sinks: list[Sink] = list(sinks)
        self._lock = threading.RLock()

    def _emit(self, event: str) -> None:
        self.state.updated = time.time()
        for sink in list(self.sinks):
            try:
                sink(self.state, event)
            except Exception:  # a sink must never break the fit
                logger.debug("progress sink %r failed on %s", sink, event, exc_info=True)

    # ------------------------------------------------------------------ events
    def begin(self, n_rows: int, n_blocks: int, n_features: int) -> None:
        """The training data are open: record their size."""
        with self._lock:
            s = self.state
            s.n_rows, s.n_blocks, s.n_features = int(n_rows), int(n_blocks), int(n_features)
            streaming = 1 if s.sampler in STREAMING_SAMPLERS else 0
            cg = int(s.max_iter or 0)
            # statistics + sampling pass + rhs + CG passes (true residual every 10 iterations)
            s.expected_passes = 1 + streaming + 1 + (cg + cg // 10 if cg else 0)
            self._emit("begin")

    def phase(self, name: str, task: str | None = None) -> None:
        """A new phase starts; ``task`` names the per-block task of its passes.

        The "sampling" phase of a streaming sampler (SQUEAK, DISQUEAK) gets its
        per-block task, ``stream_block``, by default.
        """
        with self._lock:
            self.state.phase = name
            self.state.pass_task = task
            self.state.blocks_in_pass = self.state.rows_in_pass = 0
            self._emit("phase")

    def start_pass(self, name: str, n_blocks: int) -> None:
        """A pass called ``name`` over ``n_blocks`` blocks starts (may change the phase)."""
        task = ev.block_task_prefix(name)
        with self._lock:
            phase = PASS_PHASES.get(name, self.state.phase)
            if phase != self.state.phase:
                self.phase(phase, task)
            else:
                self.state.pass_task = task
                self.state.blocks_in_pass = self.state.rows_in_pass = 0

    def pass_done(self, n_blocks: int | None = None) -> None:
        """A pass finished (``n_blocks``: its block tasks, for the live counts)."""
        with self._lock:
            self.state.close_pass(n_blocks)
            self._emit("pass")

    def task_counts(self, counts: dict[str, int]) -> None:
        """Cumulative completions per task prefix for this fit (from the scheduler)."""
        with self._lock:
            if self.state.apply_counts(counts):
                self._emit("blocks")

    def block_done(self, task: str) -> None:
        """One block task finished (local schedulers report them one by one)."""
        with self._lock:
            s = self.state
            if task != s.pass_task or s.blocks_in_pass >= s.n_blocks:
                return
            s.blocks_in_pass += 1
            self._emit("blocks")

    def sampling(self, rows_seen: int, dictionary_size: int) -> None:
        """A streaming sampler's dictionary part-way through a block: one more point of its growth."""
        with self._lock:
            s = self.state
            if s.dictionary and rows_seen <= s.dictionary[-1][0]:
                return  # a record of an earlier moment (the pass only moves forward)
            s.dictionary.append([int(rows_seen), int(dictionary_size)])
            s.rows_in_pass = max(s.rows_in_pass, int(rows_seen))
            self._emit("sampling")

    def sampled(self, dictionary: Any) -> None:
        """Centers chosen: record their number and the dictionary's growth, if any.

        The per-block history joins the points published during the pass (a one-block
        pass has one history record; the live points show how it got there).
        """
        with self._lock:
            s = self.state
            s.n_centers = int(dictionary.size)
            info = getattr(dictionary, "info", None) or {}
            history = info.get("history") or []
            points: list[list[float]] = [
                [int(h["rows_seen"]), int(h["dictionary_size"] if "dictionary_size" in h else h.get("unique", 0))]
                for h in history
                if isinstance(h, dict) and "rows_seen" in h
            ]
            if points:
                s.dictionary = merge_growth(s.dictionary, points)
            s.blocks_in_pass = s.rows_in_pass = 0
            self._emit("dictionary")

    def cg_iteration(self, iteration: int, residual: Any, solver: str = "CG") -> None:
        """The solver (CG, or k-means' Lloyd) finished ``iteration`` with the given (largest) relative residual."""
        try:
            value = float(max(residual)) if hasattr(residual, "__len__") else float(residual)
        except (TypeError, ValueError):
            value = float("nan")
        with self._lock:
            if self.state.phase != "cg":  # e.g. after the "gram" pass, CG runs on the client
                self.phase("cg")
            self.state.solver = solver
            self.state.cg.append([int(iteration), value])
            self._emit("cg")

    def finish(self) -> None:
        with self._lock:
            s = self.state
            s.phase, s.status, s.finished = "done", "done", time.time()
            s.pass_task, s.blocks_in_pass, s.rows_in_pass = None, 0, 0
            self._emit("done")

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            s = self.state
            s.status, s.finished = "failed", time.time()
            s.error = " ".join(str(exc).split()) or type(exc).__name__
            s.pass_task = None
            self._emit("failed")


    # ------------------------------------------------------------ events
    def on_event(self, event: ev.Event) -> None:
        """Subscriber for the fit's :class:`~daskkrr.events.EventBus`."""
        if isinstance(event, ev.DataOpened):
            self.begin(event.n_rows, event.n_blocks, event.n_features)
        elif isinstance(event, ev.StageStarted):
            if event.stage in STAGE_PHASES:
                self.phase(STAGE_PHASES[event.stage])
        elif isinstance(event, ev.PassStarted):
            self.start_pass(event.name, event.n_blocks)
        elif isinstance(event, ev.BlockDone):
            self.block_done(ev.block_task_prefix(event.name))
        elif isinstance(event, ev.PassDone):
            self.pass_done(event.n_blocks)
        elif isinstance(event, ev.SamplingProgress):
            self.sampling(event.rows_seen, event.dictionary_size)
        elif isinstance(event, ev.CentersChosen):
            self.sampled(event.dictionary)
        elif isinstance(event, ev.SolverStep):
            self.cg_iteration(event.iteration, event.residual, event.solver)
        elif isinstance(event, ev.FitDone):
            self.state.converged = bool(event.converged)
            self.finish()
        elif isinstance(event, ev.FitFailed):
            self.fail(event.error)


#: Phase shown for a pipeline stage (stages not listed keep the phase their passes set).
STAGE_PHASES = {"centers": "sampling", "preconditioner": "preconditioner"}
#: Phase shown while a pass of this name runs (other passes keep the current phase).
PASS_PHASES = {"statistics": "statistics", "rhs": "rhs", "matvec": "cg", "gram": "gram", "cache": "cache"}




def merge_growth(live: list[list[float]], history: list[list[float]]) -> list[list[float]]:
    """Points of the dictionary's growth published live, completed by the pass's history.

    Both are ``[rows_seen, size]``; at equal rows the history's value wins (it is the
    state the pass ended the block with). Histories of tree merges (DISQUEAK) count rows
    per leaf and have no live points: they are kept as they are.
    """
    if not live:
        return history
    by_rows = {int(r): v for r, v in live}
    by_rows.update({int(r): v for r, v in history})
    return [[r, by_rows[r]] for r in sorted(by_rows)]


def new_fit_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def fit_progress(started: ev.FitStarted, *, client: Any = None, verbose: bool = False,
                 install_dashboard: Callable[[Any], Any] | None = None) -> Iterator[FitTracker]:
    """Track one fit: a :class:`FitTracker` with the sinks of the active :func:`report` settings.

    ``verbose`` shows the bar when no :func:`report` decides. On a distributed
    ``client`` the record is published to the scheduler (``install_dashboard``
    registers the scheduler plugin that serves the dashboard page and counts block
    tasks); on the local scheduler a Dask callback counts block tasks. The fit's
    tasks are annotated with its id. Feed the tracker events with
    :meth:`FitTracker.on_event`; the record is marked done by
    :class:`~daskkrr.events.FitDone` and failed by an exception or
    :class:`~daskkrr.events.FitFailed`.

    Parameters
    ----------
    started : FitStarted
        The fit's first event (estimator, sampler, iteration limit).
    client : distributed.Client or None, default=None
        The client the fit runs on, if any.
    verbose : bool, default=False
        The estimator's ``verbose``.
    install_dashboard : callable or None, default=None
        Called with ``client`` to register the dashboard's scheduler plugin.

    Yields
    ------
    FitTracker
        The tracker of this fit.
    """
    import dask

    from daskkrr.progress.bar import ProgressBar
    from daskkrr.progress.counters import SchedulerLink
    from daskkrr.progress.sinks import LogSink

    settings = _SETTINGS.get() or ReportSettings(bar=None)
    state = FitProgress(fit_id=new_fit_id(), estimator=started.estimator, sampler=started.sampler,
                        max_iter=started.max_iter)
    sinks: list[Sink] = [LogSink()]
    bar = settings.bar if settings.bar is not None else bool(verbose)
    if isinstance(bar, ProgressBar):
        sinks.append(bar)
    elif bar:
        sinks.append(ProgressBar())
    link = None
    if client is not None and settings.publish is not False and install_dashboard is not None:
        link = SchedulerLink.connect(client, install_dashboard)
        if link is not None:
            sinks.append(link.publish)
    sinks.extend(settings.callbacks)  # last: a slow callback never delays the others
    tracker = FitTracker(state, sinks)
    # On the local scheduler the execution layer reports block tasks as BlockDone events.
    counter: Any = link.poller(tracker) if link is not None else contextlib.nullcontext()
    annotate = dask.annotate(**{ANNOTATION: state.fit_id}) if link is not None else contextlib.nullcontext()
    try:
        with annotate, counter:
            yield tracker
    except BaseException as exc:
        if tracker.state.status == "running":
            tracker.fail(exc)
        raise
    else:
        if tracker.state.status == "running":
            tracker.finish()
