"""Typed events of a fit, and the bus that hands them to subscribers.

The fit pipeline (:mod:`daskkrr.pipeline`) and the execution layer
(:mod:`daskkrr.parallel`) *emit* these events; progress bars, log records, the
dashboard feed, checkpoints and user callbacks *subscribe* to them. Neither side
knows the other: a subscriber sees plain dataclasses, never estimator internals
or Dask task names.

This module imports nothing from daskkrr and nothing from Dask, so every layer
may use it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

__all__ = [
    "BLOCK_PREFIX",
    "BlockDone",
    "CentersChosen",
    "DataOpened",
    "Event",
    "EventBus",
    "FitDone",
    "FitFailed",
    "FitStarted",
    "PassDone",
    "PassStarted",
    "RhsComputed",
    "SamplingProgress",
    "SolverState",
    "SolverStep",
    "StageDone",
    "StageStarted",
    "block_task_prefix",
    "subscribe",
]

logger = logging.getLogger("daskkrr")

#: Key prefix of every per-block task; the pass name follows (``daskkrr-block-rhs``).
#: Dask's ``key_split`` keeps alphabetic words only, so pass names are letters only.
BLOCK_PREFIX = "daskkrr-block"


def block_task_prefix(pass_name: str) -> str:
    """The Dask key prefix of the per-block tasks of the pass ``pass_name``.

    Parameters
    ----------
    pass_name : str
        Letters only (Dask's ``key_split`` keeps alphabetic words).

    Returns
    -------
    str
        ``"daskkrr-block-<pass_name in lower case>"``.
    """
    if not pass_name.isalpha():
        raise ValueError(f"pass names are letters only (they become Dask key prefixes); got {pass_name!r}")
    return f"{BLOCK_PREFIX}-{pass_name.lower()}"


@dataclasses.dataclass(frozen=True)
class Event:
    """Base class of every fit event."""


@dataclasses.dataclass(frozen=True)
class FitStarted(Event):
    """A fit begins (before any data is read).

    Parameters
    ----------
    estimator : str
        The estimator's class name.
    sampler : str, default=""
        The center sampler's name.
    max_iter : int or None, default=None
        The solver's iteration limit.
    """

    estimator: str
    sampler: str = ""
    max_iter: int | None = None


@dataclasses.dataclass(frozen=True)
class DataOpened(Event):
    """The training data are open: their size is known.

    Parameters
    ----------
    n_rows, n_blocks, n_features : int
        Rows, row blocks and columns of ``X``.
    """

    n_rows: int
    n_blocks: int
    n_features: int


@dataclasses.dataclass(frozen=True)
class StageStarted(Event):
    """A pipeline stage starts (``statistics``, ``centers``, ``preconditioner``, ``operator``, ``solve``).

    Parameters
    ----------
    stage : str
        The stage's name.
    """

    stage: str


@dataclasses.dataclass(frozen=True)
class StageDone(Event):
    """A pipeline stage finished.

    Parameters
    ----------
    stage : str
        The stage's name.
    seconds : float
        Its wall-clock time.
    """

    stage: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class PassStarted(Event):
    """A pass over the row blocks starts; its block tasks carry :func:`block_task_prefix` (``name``).

    Parameters
    ----------
    name : str
        The pass's name (letters only).
    n_blocks : int
        Blocks it will read.
    """

    name: str
    n_blocks: int


@dataclasses.dataclass(frozen=True)
class PassDone(Event):
    """A pass over the row blocks finished.

    Parameters
    ----------
    name : str
        The pass's name (as in :class:`PassStarted`).
    n_blocks : int
        Blocks it read.
    """

    name: str
    n_blocks: int


@dataclasses.dataclass(frozen=True)
class BlockDone(Event):
    """One block task of the pass under way finished (local schedulers report them one by one).

    Parameters
    ----------
    name : str
        The pass's name.
    """

    name: str


@dataclasses.dataclass(frozen=True)
class SamplingProgress(Event):
    """A streaming sampler's dictionary part-way through its pass, sent from inside a block task.

    Emitted from a helper thread while the pass runs, at most one a second or so per
    task (the sampler's ``progress_interval``), so that a long block (a one-block pass
    is one task) is seen advancing.

    Parameters
    ----------
    name : str
        The pass's name (as in :class:`PassStarted`).
    rows_seen : int
        Rows of the pass processed into the dictionary so far.
    dictionary_size : int
        Copies in the dictionary (what the per-block history records).
    unique : int
        Distinct rows in the dictionary.
    """

    name: str
    rows_seen: int
    dictionary_size: int
    unique: int


@dataclasses.dataclass(frozen=True)
class CentersChosen(Event):
    """The centers are chosen (a :class:`daskkrr.sampling.CenterDictionary`).

    Parameters
    ----------
    dictionary : CenterDictionary
        The centers and their weights.
    restored : bool, default=False
        Read from a checkpoint rather than sampled.
    """

    dictionary: Any
    restored: bool = False


@dataclasses.dataclass(frozen=True)
class RhsComputed(Event):
    """The right-hand side of the solve (``K_nM^T y``, ``(M, t)``) is known.

    Parameters
    ----------
    rhs : ndarray of shape (M, t)
        The right-hand side.
    restored : bool, default=False
        Read from a checkpoint rather than computed.
    """

    rhs: Any
    restored: bool = False


@dataclasses.dataclass(frozen=True)
class SolverStep(Event):
    """An iterative solver finished ``iteration`` with the given (largest) relative residual.

    ``solver`` names it for progress displays: "CG" (the regressors and classifiers), "Lloyd"
    (kernel k-means, whose ``residual`` is the centers' shift).

    Parameters
    ----------
    iteration : int
        Iterations done.
    residual : float
        The relative residual (the largest over the targets).
    solver : str, default="CG"
        The solver's name.
    """

    iteration: int
    residual: float
    solver: str = "CG"


@dataclasses.dataclass(frozen=True)
class SolverState(Event):
    """The solver's complete state (e.g. :class:`daskkrr.solvers.CGState`), to save for resume.

    Parameters
    ----------
    state : object
        The state, as the solver's ``resume`` takes it.
    """

    state: Any


@dataclasses.dataclass(frozen=True)
class FitDone(Event):
    """The fit finished.

    Parameters
    ----------
    n_iter : int
        Solver iterations run.
    converged : bool
        Whether the solver reached its tolerance.
    seconds : float
        Wall-clock time of the fit.
    """

    n_iter: int
    converged: bool
    seconds: float


@dataclasses.dataclass(frozen=True)
class FitFailed(Event):
    """The fit raised an exception.

    Parameters
    ----------
    error : BaseException
        The exception (raised to the caller after this event).
    """

    error: BaseException


Subscriber = Callable[[Event], None]


class EventBus:
    """Delivers events to subscribers in subscription order.

    A subscriber that raises is logged and skipped (progress never breaks a fit),
    unless it was subscribed with ``critical=True``: a checkpoint that cannot be
    written must stop the fit, not lose its state silently.
    """

    def __init__(self) -> None:
        self._subscribers: list[tuple[Subscriber, bool]] = []

    def subscribe(self, fn: Subscriber, *, critical: bool = False) -> Callable[[], None]:
        """Add ``fn``; returns a function that removes it."""
        entry = (fn, bool(critical))
        self._subscribers.append(entry)

        def unsubscribe() -> None:
            if entry in self._subscribers:
                self._subscribers.remove(entry)

        return unsubscribe

    def emit(self, event: Event) -> None:
        for fn, critical in list(self._subscribers):
            if critical:
                fn(event)
                continue
            try:
                fn(event)
            except Exception:  # a progress sink must never break the fit
                logger.debug("event subscriber %r failed on %s", fn, type(event).__name__, exc_info=True)


#: A bus that drops everything (code run outside a fit).
NULL_BUS = EventBus()

_USER: contextvars.ContextVar[tuple[Subscriber, ...]] = contextvars.ContextVar("daskkrr_subscribers", default=())


def user_subscribers() -> tuple[Subscriber, ...]:
    """Subscribers added with :func:`subscribe` in this context (added to every fit's bus)."""
    return _USER.get()


class subscribe:  # noqa: N801 - used as a context manager, like contextlib's helpers
    """Receive the typed events of every fit run inside the ``with`` block.

    Parameters
    ----------
    fn : callable
        Called with each :class:`Event`; its exceptions
        are logged, never raised into the fit.

    Examples
    --------
    >>> from daskkrr.events import SolverStep, subscribe
    >>> steps = []
    >>> with subscribe(lambda e: steps.append(e) if isinstance(e, SolverStep) else None):
    ...     pass  # model.fit(...)
    """

    def __init__(self, fn: Subscriber):
        if not callable(fn):
            raise TypeError(f"subscribe needs a callable; got {fn!r}")
        self.fn = fn
        self._token: contextvars.Token | None = None

    def __enter__(self) -> subscribe:
        self._token = _USER.set((*_USER.get(), self.fn))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._token is None:
            raise RuntimeError("subscribe was exited without being entered")
        _USER.reset(self._token)
