"""Tornado routes of the daskkrr page on the scheduler's web server.

``/daskkrr``              the page (HTML; refreshes itself every second)
``/daskkrr/fragment``     its live part
``/daskkrr/state.json``   every published fit record with its live block counts

The routes are added by :class:`daskkrr.dashboard.plugin.DaskkrrDashboardPlugin`.
They can also be mounted when the scheduler starts, through Dask's config::

    DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES='["distributed.http.scheduler.prometheus",
      "distributed.http.scheduler.info", "distributed.http.scheduler.json",
      "distributed.http.health", "distributed.http.proxy", "distributed.http.statics",
      "daskkrr.dashboard.http"]'
"""

from __future__ import annotations

import json
from typing import Any

from distributed.http.utils import RequestHandler

from daskkrr.dashboard.plugin import metadata_root, prune
from daskkrr.dashboard.render import render_fragment, render_page


def _snapshot(server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    root = metadata_root(server)
    prune(root)
    return dict(root["fits"]), {k: dict(v) for k, v in root["blocks"].items()}


class _Base(RequestHandler):
    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")


class DaskkrrPage(_Base):
    def get(self) -> None:
        fits, counts = _snapshot(self.server)
        wanted = self.get_argument("fit", None)
        path = self.request.path.rstrip("/")
        prefix = path[: -len("daskkrr")] if path.endswith("daskkrr") else "/"
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(render_page(render_fragment(fits, counts, wanted), wanted, prefix or "/"))


class DaskkrrFragment(_Base):
    def get(self) -> None:
        fits, counts = _snapshot(self.server)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(render_fragment(fits, counts, self.get_argument("fit", None)))


class DaskkrrState(_Base):
    def get(self) -> None:
        fits, counts = _snapshot(self.server)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"fits": fits, "blocks": counts}, default=str))


routes: list[tuple] = [
    (r"daskkrr", DaskkrrPage, {}),
    (r"daskkrr/fragment", DaskkrrFragment, {}),
    (r"daskkrr/state.json", DaskkrrState, {}),
]
