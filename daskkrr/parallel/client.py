"""Clusters the library connects to or starts itself (the CLI and workflows).

In the Python API a fit runs where Dask's current context says (see
:mod:`daskkrr.parallel.backends`); no cluster is started, so small fits and
GridSearchCV stay cheap. The command line instead starts a
:class:`distributed.LocalCluster` when no scheduler address is given, and always
closes what it started.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


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
