"""The scheduler plugin behind the daskkrr dashboard page.

Registered by :func:`daskkrr.dashboard.install` (and automatically by every fit on
a distributed client), it

- adds the page's routes (:mod:`daskkrr.dashboard.http`) to the scheduler's web
  server, next to the Dask dashboard;
- counts, per fit, the finished per-block tasks (tasks whose name is one of
  :data:`daskkrr.events.BLOCK_PREFIX` and whose ``daskkrr_fit`` annotation names the
  fit), so the page and the client's bar see a pass advance block by block;
- keeps only the most recent fits' records in the scheduler's metadata.

The scheduler needs daskkrr importable to load it. This module imports nothing
heavy: it runs inside the scheduler process.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskkrr.events import BLOCK_PREFIX
from daskkrr.progress.state import ANNOTATION

logger = logging.getLogger("daskkrr.dashboard")

PLUGIN_NAME = "daskkrr-dashboard"
METADATA_ROOT = "daskkrr"
#: Fits kept in the scheduler's metadata (older ones are dropped).
KEEP_FITS = 20


def metadata_root(scheduler: Any) -> dict[str, Any]:
    """The ``daskkrr`` part of the scheduler's metadata, created on first use."""
    root = scheduler.task_metadata.get(METADATA_ROOT)
    if not isinstance(root, dict):
        root = scheduler.task_metadata[METADATA_ROOT] = {}
    root.setdefault("fits", {})
    root.setdefault("blocks", {})
    return root


def prune(root: dict[str, Any], keep: int = KEEP_FITS) -> None:
    """Drop all but the ``keep`` most recently updated fits (and their counts)."""
    fits = root.get("fits", {})
    if len(fits) <= keep:
        return
    order = sorted(fits, key=lambda k: updated_at(fits[k]), reverse=True)
    for fit_id in order[keep:]:
        fits.pop(fit_id, None)
        root.get("blocks", {}).pop(fit_id, None)


def updated_at(record: Any) -> float:
    """A record's ``updated`` time; 0 for a record without a finite number there (any client can publish one)."""
    value = record.get("updated", 0.0) if isinstance(record, dict) else 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return float(value)


def add_routes(scheduler: Any) -> bool:
    """Add the daskkrr page to the scheduler's web server once; False if it has none."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return False
    if getattr(scheduler, "_daskkrr_routes", False):
        return True
    from distributed.http.utils import get_handlers

    prefix = detect_prefix(app)
    handlers = get_handlers(server=scheduler, modules=["daskkrr.dashboard.http"], prefix=prefix)
    app.add_handlers(r".*$", handlers)
    scheduler._daskkrr_routes = True
    return True


def detect_prefix(app: Any) -> str:
    """The scheduler's ``--dashboard-prefix``, read from where its ``health`` route is mounted."""
    import re

    stack = [app.default_router]
    seen: set[int] = set()
    while stack:
        router = stack.pop()
        if id(router) in seen:
            continue
        seen.add(id(router))
        for rule in getattr(router, "rules", []):
            regex = getattr(getattr(rule, "matcher", None), "regex", None)
            if regex is not None:
                found = re.fullmatch(r"(.*/)health\$?", regex.pattern)
                if found:
                    return found.group(1)
            if hasattr(rule.target, "rules"):
                stack.append(rule.target)
    return "/"


class DaskkrrDashboardPlugin(SchedulerPlugin):
    """Serves the daskkrr page and counts block tasks per fit (see the module docstring)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:  # async as SchedulerPlugin declares; the scheduler awaits it
        self.scheduler = scheduler
        metadata_root(scheduler)
        if not add_routes(scheduler):
            logger.info("scheduler has no web server; the daskkrr page is not served")

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish != "memory" or self.scheduler is None:
            return
        ts = self.scheduler.tasks.get(key)
        annotations = getattr(ts, "annotations", None)
        if not annotations:
            return
        fit_id = annotations.get(ANNOTATION)
        if fit_id is None:
            return
        prefix = key_prefix(key)
        if not prefix.startswith(BLOCK_PREFIX + "-"):
            return
        root = metadata_root(self.scheduler)
        counts = root["blocks"].get(fit_id)
        if counts is None:
            counts = root["blocks"][fit_id] = {}
            prune(root)
        counts[prefix] = counts.get(prefix, 0) + 1


def key_prefix(key: Any) -> str:
    from dask.utils import key_split

    return key_split(key)
