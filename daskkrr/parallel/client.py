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
    per core (the BLAS inside each task uses that core), bound to 127.0.0.1, whose worker processes
    end without finalising Python once closed (:mod:`daskkrr.parallel.worker_exit`; the configured
    worker preloads are kept)."""
    import dask

    from daskkrr.parallel.worker_exit import with_fast_exit

    cores = os.cpu_count() or 1
    kwargs: dict[str, Any] = {
        "n_workers": n_workers or cores,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        **with_fast_exit(dask.config.get("distributed.worker.preload", []),
                         dask.config.get("distributed.worker.preload-argv", [])),
    }
    if memory_limit is not None:
        kwargs["memory_limit"] = memory_limit
    return kwargs


#: The names of the TLS settings where the command line gives them; a workflow names its [cluster] keys.
TLS_FLAGS = ("--tls-ca-file", "--tls-cert", "--tls-key")


def scheduler_address(scheduler: str | None = None) -> str | None:
    """``scheduler``, else ``$DASK_SCHEDULER_ADDRESS``, else None (a local cluster)."""
    return scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None


def tls_security(
    scheduler: str | None,
    ca_file: str | os.PathLike | None = None,
    cert: str | os.PathLike | None = None,
    key: str | os.PathLike | None = None,
    *,
    names: tuple[str, str, str] = TLS_FLAGS,
) -> Any:
    """A :class:`distributed.security.Security` for a ``tls://`` scheduler, or None; checked before any work.

    Parameters
    ----------
    scheduler : str or None
        The address given (else ``$DASK_SCHEDULER_ADDRESS`` is used).
    ca_file : path, optional
        PEM file of the certificate authority that signed the scheduler's certificate.
    cert, key : path, optional
        This client's certificate and its private key (PEM); ``cert`` alone may
        hold both. Dask's TLS is mutual: the scheduler checks the client's
        certificate against its own authority, so ``cert`` is needed with ``ca_file``.
    names : tuple of 3 str
        How the caller names the three settings, for the messages.

    Returns
    -------
    distributed.security.Security or None
        None without TLS settings: a ``tcp://`` scheduler, a local cluster, or a
        ``tls://`` scheduler configured through Dask's ``distributed.comm.tls`` settings.

    Raises
    ------
    ValueError
        Settings that do not go together, an unreadable file, or a ``tls://``
        scheduler without any certificate authority.
    """
    import dask

    address = scheduler_address(scheduler)
    given = {name: path for name, path in zip(names, (ca_file, cert, key), strict=True) if path is not None}
    tls = bool(address) and str(address).startswith("tls://")
    if not given:
        if tls and not dask.config.get("distributed.comm.tls.ca-file", None):
            raise ValueError(f"scheduler {address} speaks TLS: give {names[0]} (the authority that signed its "
                             f"certificate) and {names[1]}/{names[2]} (this client's certificate and key), or set "
                             f"Dask's distributed.comm.tls configuration")
        return None
    if not tls:
        raise ValueError(f"{', '.join(given)} apply to a tls:// scheduler; "
                         + (f"the scheduler is {address}" if address else "no scheduler was given (a local "
                            "cluster needs no certificates)"))
    missing = [name for name, path in zip(names[:2], (ca_file, cert), strict=True) if path is None]
    if missing:
        raise ValueError(f"TLS needs {names[0]} (the authority that signed the scheduler's certificate) and "
                         f"{names[1]} (this client's certificate; its key in it or in {names[2]}); "
                         f"{' and '.join(missing)} missing")
    for name, path in given.items():
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ValueError(f"{name} {path}: no such readable file")
    from distributed.security import Security

    # ca_file and cert are given (checked above); Security takes file names as text.
    return Security(tls_ca_file=os.fspath(ca_file or ""), tls_client_cert=os.fspath(cert or ""),
                    tls_client_key=None if key is None else os.fspath(key), require_encryption=True)


@contextlib.contextmanager
def cluster_client(
    scheduler: str | None = None, *, n_workers: int | None = None, memory_limit: str | int | None = None,
    security: Any = None,
) -> Iterator[Any]:
    """Connect to ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``), or start a local cluster.

    A cluster started here is closed on exit, whatever happens inside. ``security``
    (a :class:`distributed.security.Security`, see :func:`tls_security`) is the
    connection's TLS. Connecting to a scheduler trusts it fully: whoever runs it
    can run code in this process (Dask sends pickled functions and results both ways).
    Workers that log to this terminal (a local cluster's, or in this process) do not log
    a traceback for a task that found its disk full (see :mod:`daskkrr.parallel.worker_logs`).
    """
    from distributed import Client, LocalCluster

    from daskkrr.parallel.worker_logs import QuietDiskFull, quiet_disk_full_failures

    address = scheduler_address(scheduler)
    if address:
        logger.info("connecting to Dask scheduler at %s", address)
        quiet_disk_full_failures()  # only workers in this process log here; remote ones log where they run
        with Client(address, set_as_default=True, security=security) as client:
            yield client
        return
    with LocalCluster(**local_cluster_kwargs(n_workers, memory_limit)) as cluster:
        with Client(cluster, set_as_default=True) as client:
            logger.info("started local Dask cluster; dashboard at %s", client.dashboard_link)
            # Its workers share this terminal: a full disk is reported once, as a DiskFullError.
            client.register_plugin(QuietDiskFull(), name="daskkrr-quiet-disk-full")
            yield client

