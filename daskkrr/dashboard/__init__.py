"""The daskkrr page on the Dask dashboard: the current fit, live.

>>> from distributed import Client
>>> from daskkrr.dashboard import install
>>> client = Client()                      # doctest: +SKIP
>>> install(client)                        # doctest: +SKIP
'http://127.0.0.1:8787/daskkrr'

The page shows the fit's phase, rows streamed, blocks read, the SQUEAK dictionary
size and the CG residual by iteration. Fits on a distributed client register the
plugin themselves, so :func:`install` is only needed to get the link early. The
scheduler must be able to import daskkrr.
"""

from __future__ import annotations

from typing import Any

PAGE = "daskkrr"


def dashboard_url(client: Any) -> str | None:
    """Link to the daskkrr page of ``client``'s scheduler (None without a dashboard)."""
    link = getattr(client, "dashboard_link", None)
    if not link:
        return None
    base = link.rsplit("/status", 1)[0] if link.endswith("/status") else link.rstrip("/")
    return f"{base}/{PAGE}"


def install(client: Any) -> str | None:
    """Register the daskkrr scheduler plugin on ``client``'s cluster; return the page's URL.

    Idempotent: a plugin already registered is kept (with its counts).

    Raises
    ------
    Exception
        Whatever the scheduler raised when it could not load the plugin, typically
        because daskkrr is not installed where the scheduler runs.
    """
    from daskkrr.dashboard.plugin import PLUGIN_NAME, DaskkrrDashboardPlugin

    client.register_plugin(DaskkrrDashboardPlugin(), name=PLUGIN_NAME)
    return dashboard_url(client)


__all__ = ["PAGE", "dashboard_url", "install"]
