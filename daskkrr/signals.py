"""Termination signals as ordinary interruptions, so that atomic writers clean up.

Python turns SIGINT (Ctrl-C) into :class:`KeyboardInterrupt`, which unwinds the
stack: :func:`daskkrr.utils.atomic.atomic_directory` removes its temporary
directory and a local cluster is closed. SIGTERM (sent by ``kill``, systemd,
batch schedulers, container runtimes) and SIGHUP instead end the process on the
spot, leaving temporary siblings of outputs and orphaned worker processes.
:func:`interrupt_on_signals` makes them raise :class:`Interrupted` (a
``KeyboardInterrupt``) too. The ``daskkrr`` command line runs every command
inside it; a library user can do the same.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["Interrupted", "forget_signals", "interrupt_on_signals", "last_signal"]

#: The signals the handlers below turned into exceptions, in order.
_RECEIVED: list[int] = []


def last_signal() -> int | None:
    """The last signal :func:`interrupt_on_signals` turned into :class:`Interrupted`, or None.

    Code that the exception passes through may replace it with another error (an
    extension being imported reports "could not import ..."); this still says why.
    """
    return _RECEIVED[-1] if _RECEIVED else None


def forget_signals() -> None:
    """Clear what :func:`last_signal` says (a new command in the same process starts afresh)."""
    _RECEIVED.clear()


class Interrupted(KeyboardInterrupt):
    """The process received a termination signal.

    Attributes
    ----------
    signum : int
        The signal number (``signal.SIGTERM``, ...).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    def __str__(self) -> str:
        return f"received {signal.Signals(self.signum).name}"


def _default_signals() -> tuple[signal.Signals, ...]:
    return tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


@contextlib.contextmanager
def interrupt_on_signals(signals: Sequence[int] | None = None) -> Iterator[None]:
    """Within the block, raise :class:`Interrupted` in the main thread on ``signals``.

    Parameters
    ----------
    signals : sequence of int, optional
        Default: SIGTERM and SIGHUP (where the platform has them).

    Notes
    -----
    Only the first signal raises; later ones are ignored until the block ends,
    so that the clean-up it triggers is not itself interrupted (SIGKILL still
    ends the process). Outside the main thread this does nothing, as Python
    only runs signal handlers there. The previous handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    chosen = tuple(_default_signals() if signals is None else signals)
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        for sig in chosen:
            signal.signal(sig, signal.SIG_IGN)
        _RECEIVED.append(signum)
        raise Interrupted(signum)

    try:
        for sig in chosen:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
