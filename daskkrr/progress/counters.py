"""Live block counts and publishing: the Dask side of progress reporting.

- on Dask's local scheduler the execution layer reports each finished block task as a
  :class:`~daskkrr.events.BlockDone` event (see :mod:`daskkrr.parallel.backends`);
- :class:`SchedulerLink`: on a ``distributed`` cluster, registers the daskkrr
  scheduler plugin (which counts block tasks tagged with the fit's annotation and
  serves the dashboard page), publishes the fit's record to the scheduler's
  metadata, and polls the plugin's counts from a helper thread.

If the scheduler cannot import daskkrr (so cannot load the plugin) the link is not
made: the fit runs as usual, without the dashboard page and live block counts.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from daskkrr.progress.state import FitProgress

logger = logging.getLogger("daskkrr.progress")

#: Scheduler metadata path of everything daskkrr publishes.
METADATA_ROOT = "daskkrr"


class _Poller:
    """Context manager: a daemon thread that feeds the scheduler's block counts to the tracker."""

    def __init__(self, link: SchedulerLink, tracker: Any, interval: float):
        self.link = link
        self.tracker = tracker
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        path = [METADATA_ROOT, "blocks", self.tracker.state.fit_id]
        while not self._stop.wait(self.interval):
            if self.tracker.state.pass_task is None:
                continue
            try:
                counts = self.link.client.get_metadata(path, default=None)
            except Exception:  # the client may be closing; progress is best effort
                logger.debug("could not read block counts from the scheduler", exc_info=True)
                continue
            if isinstance(counts, dict):
                self.tracker.task_counts(counts)

    def __enter__(self) -> _Poller:
        self._thread = threading.Thread(target=self._run, name="daskkrr-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


# Clients on whose scheduler the plugin is known to be registered (True) or to fail (False).
_REGISTERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SchedulerLink:
    """Publishing to, and reading counts from, one distributed scheduler."""

    def __init__(self, client: Any, poll_interval: float = 0.5):
        self.client = client
        self.poll_interval = poll_interval

    @classmethod
    def connect(cls, client: Any, install: Any) -> SchedulerLink | None:
        """Register the dashboard plugin with ``install(client)`` (once per client); None if the
        scheduler refuses it."""
        known = _REGISTERED.get(client)
        if known is None:
            try:
                install(client)
                known = True
            except Exception as exc:
                logger.warning(
                    "daskkrr dashboard page not available: the scheduler could not load the daskkrr "
                    "plugin (%s). Install daskkrr where the scheduler runs to see fits on the dashboard.",
                    " ".join(str(exc).split())[:200],
                )
                known = False
            _REGISTERED[client] = known
        return cls(client) if known else None

    def publish(self, p: FitProgress, event: str) -> None:
        """Sink: write the record to ``metadata["daskkrr"]["fits"][fit_id]`` (not on live block counts)."""
        if event == "blocks":
            return
        try:
            self.client.set_metadata([METADATA_ROOT, "fits", p.fit_id], p.to_dict(thin=True))
        except Exception:
            logger.debug("could not publish progress to the scheduler", exc_info=True)

    def poller(self, tracker: Any) -> _Poller:
        return _Poller(self, tracker, self.poll_interval)
