"""Progress from inside a running block task, to the client that started it.

A pass reports its block tasks as they finish (:class:`~daskkrr.events.BlockDone`
locally, the dashboard plugin's counts on a cluster). A task that runs long, such as
the one task of a one-block SQUEAK pass, says nothing until it ends. The pieces here
let such a task publish small records while it works:

- :class:`TaskProgress` is a small picklable handle passed to the task as an argument;
  the task calls :meth:`TaskProgress.publisher` once and then the publisher after each
  unit of work, which sends a record at most every ``interval`` seconds (a task shorter
  than ``interval`` sends nothing: its ``BlockDone`` says enough);
- :class:`ProgressRelay`, on the client, routes the records to a callback.

How a record travels:

- the task runs in this process (Dask's threaded or synchronous scheduler, or a
  ``LocalCluster(processes=False)``): the handle finds the relay in a process-wide table
  and queues the record directly;
- the task runs in a ``distributed`` worker process: the handle logs it as a worker event
  (``Worker.log_event``, topic :data:`TOPIC`); the scheduler forwards the event to the
  subscribed client, whose handler (on its event loop) queues it. The worker sends the
  event on the same stream as the task's completion, so records reach the client before
  the pass's result.

The relay delivers queued records from a helper thread, so a slow subscriber (a
scheduler round trip to publish the dashboard record) never holds back the task, and
never runs on the client's event loop (where a blocking client call would deadlock).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("daskkrr.progress")

#: Worker-event topic of the records (one topic for every pass: the scheduler keeps a log per topic).
TOPIC = "daskkrr-task-progress"

Payload = dict[str, Any]

# Relays open in this process, by channel id.
_ROUTES: dict[str, ProgressRelay] = {}
_ROUTES_LOCK = threading.Lock()
# Clients whose handler for TOPIC is installed (one handler per client, routing by channel).
_SUBSCRIBED: weakref.WeakSet = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class TaskProgress:
    """The handle a block task publishes progress records through (picklable).

    Parameters
    ----------
    channel : str
        Id of the client-side :class:`ProgressRelay`.
    interval : float
        Least number of seconds between two records of one task.
    """

    channel: str
    interval: float

    def publisher(self) -> Callable[[Callable[[], Payload]], bool]:
        """A rate-limited sender for one task: call it with a function that makes the record.

        Returns
        -------
        callable
            ``send(make_payload) -> bool``: sends ``make_payload()`` (a dict of plain numbers
            and strings) when ``interval`` seconds have passed since the task started or
            since its last record, and says whether it did. The record is made only then.
        """
        last = [time.monotonic()]

        def send(make_payload: Callable[[], Payload]) -> bool:
            now = time.monotonic()
            if now - last[0] < self.interval:
                return False
            last[0] = now
            self.send(make_payload())
            return True

        return send

    def send(self, payload: Payload) -> None:
        """Send one record to the relay (in this process, or through the worker's event stream)."""
        relay = _ROUTES.get(self.channel)
        if relay is not None:
            relay.put(payload)
            return
        if "distributed" not in sys.modules:  # no worker can run this task: nobody to tell
            return
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:  # a process without a worker (e.g. Dask's "processes" scheduler)
            return
        worker.log_event(TOPIC, {"channel": self.channel, "payload": payload})


def _on_worker_event(event: tuple[float, Any]) -> None:
    """The client's handler for :data:`TOPIC` (runs on the client's event loop: only queues)."""
    msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else None
    if not isinstance(msg, dict):
        return
    relay = _ROUTES.get(str(msg.get("channel")))
    payload = msg.get("payload")
    if relay is not None and isinstance(payload, dict):
        relay.put(payload)


class ProgressRelay:
    """Context manager on the client: opens a channel for the tasks of one pass.

    ``with ProgressRelay(deliver, interval, client) as handle:`` gives the
    :class:`TaskProgress` to pass to the tasks; every record they send is given to
    ``deliver(payload)`` on a helper thread, in order. On exit the records already
    received are delivered, then the channel closes (later ones are dropped).

    Parameters
    ----------
    deliver : callable
        Called with each record (a dict). Its exceptions are logged and skipped.
    interval : float
        Least number of seconds between two records of one task.
    client : distributed.Client or None, default=None
        The client the tasks run on (None: they run in this process).
    """

    def __init__(self, deliver: Callable[[Payload], None], interval: float, client: Any = None):
        if not interval >= 0:
            raise ValueError(f"the progress interval must be a number of seconds >= 0; got {interval!r}")
        self.deliver = deliver
        self.interval = float(interval)
        self.client = client
        self.channel = uuid.uuid4().hex
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, payload: Payload) -> None:
        """Queue one record (any thread)."""
        self._queue.put(payload)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every record queued so far is delivered (the pass's end comes after them)."""
        if self._thread is None or not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def _drain(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                return
            if isinstance(payload, threading.Event):  # a flush marker
                payload.set()
                continue
            try:
                self.deliver(payload)
            except Exception:  # progress never breaks the pass
                logger.debug("task progress record %r could not be delivered", payload, exc_info=True)

    def _subscribe(self) -> None:
        if self.client is None or self.client in _SUBSCRIBED:
            return
        try:
            self.client.subscribe_topic(TOPIC, _on_worker_event)
            _SUBSCRIBED.add(self.client)
        except Exception:  # e.g. a closing client: the pass runs, without live records
            logger.debug("could not subscribe to the workers' progress events", exc_info=True)

    def __enter__(self) -> TaskProgress:
        with _ROUTES_LOCK:
            _ROUTES[self.channel] = self
        self._subscribe()
        self._thread = threading.Thread(target=self._drain, name="daskkrr-task-progress", daemon=True)
        self._thread.start()
        return TaskProgress(self.channel, self.interval)

    def __exit__(self, *exc: Any) -> None:
        with _ROUTES_LOCK:
            _ROUTES.pop(self.channel, None)
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
