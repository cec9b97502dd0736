"""Which Dask scheduler runs the work, and clusters the library starts itself.

``client=None`` in the Python API means: the current distributed client if there
is one, otherwise Dask's local threaded scheduler (no cluster is started, so
small fits and GridSearchCV stay cheap). The command line instead starts a
:class:`distributed.LocalCluster` when no scheduler address is given, and always
closes what it started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


def current_client() -> Any | None:
    """The current ``distributed`` client, or None.

    Without ``distributed`` imported there can be no client, and importing it just
    to find out would add about 50 MB to every threaded fit.
    """
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


def resolve_client(client: Any | None) -> Any | None:
    """``client`` if given, else the current distributed client, else None (threads)."""
    if client is not None:
        from distributed import Client

        if not isinstance(client, Client):
            raise TypeError(
                f"client must be a distributed.Client or None; got {type(client).__name__}"
            )
        return client
    return current_client()


def scheduler_context(client: Any | None) -> contextlib.AbstractContextManager:
    """Make ``client`` the scheduler of every ``.compute()`` inside the block.

    For None, Dask's own choice stands, except that when ``distributed`` has not
    been imported (so there is no client) and no scheduler is configured, the
    threaded scheduler -- Dask's default for arrays -- is named outright: Dask
    would otherwise import ``distributed`` on every compute to look for a client.
    """
    if client is not None:
        return client.as_current()
    import dask

    if "distributed" not in sys.modules and dask.config.get("scheduler", None) is None:
        return dask.config.set(scheduler=threaded_get())
    return contextlib.nullcontext()


def threaded_get() -> Any:
    """Dask's threaded scheduler as a function: naming it ``"threads"`` instead makes Dask
    import ``distributed`` (about 50 MB) to look for a client on every compute."""
    import dask.threaded

    return dask.threaded.get


def local_cluster_kwargs(n_workers: int | None = None, memory_limit: str | int | None = None) -> dict:
    """Defaults for a local cluster sized to this machine: one single-threaded worker process
    per core (the BLAS inside each task uses that core), bound to 127.0.0.1."""
    cores = os.cpu_count() or 1
    kwargs: dict[str, Any] = {
        "n_workers": n_workers or cores,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
    }
    if memory_limit is not None:
        kwargs["memory_limit"] = memory_limit
    return kwargs


@contextlib.contextmanager
def cluster_client(
    scheduler: str | None = None, *, n_workers: int | None = None, memory_limit: str | int | None = None
) -> Iterator[Any]:
    """Connect to ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``), or start a local cluster.

    A cluster started here is closed on exit, whatever happens inside.
    """
    from distributed import Client, LocalCluster

    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    if address:
        logger.info("connecting to Dask scheduler at %s", address)
        with Client(address, set_as_default=True) as client:
            yield client
        return
    with LocalCluster(**local_cluster_kwargs(n_workers, memory_limit)) as cluster:
        with Client(cluster, set_as_default=True) as client:
            logger.info("started local Dask cluster; dashboard at %s", client.dashboard_link)
            yield client
