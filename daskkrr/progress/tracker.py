"""Follow a fit: the estimator reports events, the tracker updates the record and tells the sinks.

The estimators call :func:`current_tracker` at a handful of points (phase changes,
the end of a pass, each CG iteration, the chosen dictionary). Outside a fit that
returns a tracker that does nothing, so those calls cost nothing.

Who listens is decided by :func:`report` (a context manager) or, without one, by
the estimator's ``verbose`` flag:

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
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from daskkrr.progress.state import ANNOTATION, FitProgress, task_name

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
_CURRENT: contextvars.ContextVar[FitTracker | None] = contextvars.ContextVar("daskkrr_fit", default=None)


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
            if task is None and name == "sampling" and self.state.sampler in STREAMING_SAMPLERS:
                task = "stream_block"
            self.state.phase = name
            self.state.pass_task = task
            self.state.blocks_in_pass = 0
            self._emit("phase")

    def start_pass(self, task: str) -> None:
        """A pass whose per-block tasks are called ``task`` starts (may change the phase)."""
        task = task_name(task)
        with self._lock:
            phase = PASS_PHASES.get(task, self.state.phase)
            if phase != self.state.phase:
                self.phase(phase, task)
            else:
                self.state.pass_task = task
                self.state.blocks_in_pass = 0

    def watch(self, passes: Any) -> Any:
        """Wrap a :class:`~daskkrr.parallel.RowBlockPasses`: each ``reduce``, ``keep`` and
        ``reduce_kept`` becomes a tracked pass. Passes it made already (``persist``) are counted."""
        if self is _NULL:
            return passes
        with self._lock:
            s = self.state
            s.n_blocks = int(getattr(passes, "n_blocks", s.n_blocks) or s.n_blocks)
            for _ in range(int(getattr(passes, "n_passes", 0) or 0)):
                s.pass_task = None
                s.close_pass()
            self._emit("pass")
        return _WatchedPasses(passes, self)

    def pass_done(self) -> None:
        """A full pass over the data finished."""
        with self._lock:
            self.state.close_pass()
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

    def sampled(self, dictionary: Any) -> None:
        """Centers chosen: record their number and the dictionary's growth, if any."""
        with self._lock:
            s = self.state
            s.n_centers = int(dictionary.size)
            info = getattr(dictionary, "info", None) or {}
            history = info.get("history") or []
            points = [
                [int(h["rows_seen"]), int(h.get("dictionary_size", h.get("unique", 0)))]
                for h in history
                if isinstance(h, dict) and "rows_seen" in h
            ]
            if points:
                s.dictionary = points
                s.close_pass()  # the sampler streamed the data once
            s.blocks_in_pass = 0
            self._emit("dictionary")

    def cg_iteration(self, iteration: int, residual: Any) -> None:
        """CG finished ``iteration`` with the given (largest) relative residual."""
        try:
            value = float(max(residual)) if hasattr(residual, "__len__") else float(residual)
        except (TypeError, ValueError):
            value = float("nan")
        with self._lock:
            if self.state.phase != "cg":  # e.g. after the "gram" pass, CG runs on the client
                self.phase("cg")
            self.state.cg.append([int(iteration), value])
            self._emit("cg")

    def finish(self) -> None:
        with self._lock:
            s = self.state
            s.phase, s.status, s.finished = "done", "done", time.time()
            s.pass_task, s.blocks_in_pass = None, 0
            self._emit("done")

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            s = self.state
            s.status, s.finished = "failed", time.time()
            s.error = " ".join(str(exc).split()) or type(exc).__name__
            s.pass_task = None
            self._emit("failed")


#: Phase of a pass, by the name of its per-block task (see daskkrr.parallel.strategies).
PASS_PHASES = {
    "rhs_task": "rhs", "cached_rhs_task": "rhs",
    "gram_matvec_task": "cg", "cached_gram_matvec_task": "cg",
    "gram_rhs_task": "gram",          # one pass: K_nM^T K_nM and K_nM^T y
    "kernel_block_task": "cache",     # kernel blocks kept in worker memory
}


class _WatchedPasses:
    """A RowBlockPasses whose passes report to a tracker; everything else passes through."""

    def __init__(self, passes: Any, tracker: FitTracker):
        self._passes = passes
        self._tracker = tracker

    def _tracked(self, method: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._tracker.start_pass(task_name(fn))
        out = getattr(self._passes, method)(*args, **kwargs)
        self._tracker.pass_done()
        return out

    def reduce(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._tracked("reduce", fn, fn, *args, **kwargs)

    def keep(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._tracked("keep", fn, fn, *args, **kwargs)

    def reduce_kept(self, handles: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._tracked("reduce_kept", fn, handles, fn, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._passes, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:  # e.g. passes.thread_budget = 2 reaches the real object
            setattr(self._passes, name, value)


_NULL = FitTracker(FitProgress(fit_id="none"))


def current_tracker() -> FitTracker:
    """The tracker of the fit running in this context, or one that ignores every event."""
    return _CURRENT.get() or _NULL


def new_fit_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def _sampler_name(estimator: Any) -> str:
    sampler = getattr(estimator, "sampler", "")
    if isinstance(sampler, str):
        return sampler.lower()
    return str(getattr(sampler, "name", "") or type(sampler).__name__)


def tracked_fit(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for an estimator's fit method: run it inside :func:`fit_progress`."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from daskkrr.parallel import resolve_client

        try:
            client = resolve_client(getattr(self, "client", None))
        except TypeError:  # the fit itself reports a bad client, with its own message
            client = None
        with fit_progress(self, client):
            return method(self, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def fit_progress(estimator: Any, client: Any = None) -> Iterator[FitTracker]:
    """Track one fit of ``estimator`` (used by the estimators; nestable).

    Builds the sinks from the active :func:`report` settings (or ``estimator.verbose``),
    attaches a live block counter (a local-scheduler callback, or the scheduler
    plugin when ``client`` is a distributed client), tags the fit's tasks with the
    ``daskkrr_fit`` annotation, and marks the record done or failed at the end.
    """
    import dask

    from daskkrr.progress.bar import ProgressBar
    from daskkrr.progress.counters import LocalBlockCounter, SchedulerLink
    from daskkrr.progress.sinks import LogSink

    settings = _SETTINGS.get() or ReportSettings(bar=None)
    state = FitProgress(
        fit_id=new_fit_id(),
        estimator=type(estimator).__name__,
        sampler=_sampler_name(estimator),
        max_iter=getattr(estimator, "max_iter", None) if getattr(estimator, "_solver", "") == "falkon" else None,
    )
    sinks: list[Sink] = [LogSink()]
    bar = settings.bar if settings.bar is not None else bool(getattr(estimator, "verbose", False))
    if isinstance(bar, ProgressBar):
        sinks.append(bar)
    elif bar:
        sinks.append(ProgressBar())
    link = None
    if client is not None and settings.publish is not False:
        link = SchedulerLink.connect(client)
        if link is not None:
            sinks.append(link.publish)
    sinks.extend(settings.callbacks)  # last: a slow callback never delays the others
    tracker = FitTracker(state, sinks)
    counter: Any = link.poller(tracker) if link is not None else (
        LocalBlockCounter(tracker) if client is None else contextlib.nullcontext()
    )
    annotate = dask.annotate(**{ANNOTATION: state.fit_id}) if link is not None else contextlib.nullcontext()
    token = _CURRENT.set(tracker)
    try:
        with annotate, counter:
            yield tracker
    except BaseException as exc:
        tracker.fail(exc)
        raise
    else:
        tracker.finish()
    finally:
        _CURRENT.reset(token)
