"""Resource guards for the methods whose memory grows as n^2.

The exact leverage-score sampler (:class:`~daskkrr.sampling.exact.ExactRLSSampler`)
and exact kernel ridge regression (:class:`~daskkrr.ExactKernelRidge`) form the
whole ``n x n`` kernel matrix on the client and factor it. Before they start
(from the data's shape, before any pass over the data) they ask
:func:`check_quadratic`, which estimates

- the memory: ``matrices * 8 n^2`` bytes (the float64 ``n x n`` matrices held at
  once, counted for each method) plus the gathered ``n x d`` data;
- the time: ``cubic * n^3 + 2 n^2 d`` flops at the float64 GEMM rate of
  :data:`daskkrr.parallel.cost.DEFAULT_RATES` times the client's cores (rough:
  LAPACK's eigensolver runs below GEMM speed, which ``cubic`` absorbs);

and refuses, naming the estimate and the alternative, when the memory exceeds
what this machine has available (``psutil``) or what the workers have (the sum of
their memory limits, :meth:`Executor.resources`). The exact sampler's constants
match the measurement that motivated the guard: ``sampler="rls"`` at n = 18 000 on
a 2-core machine took 546 s and 13 GB (estimate: 580 s, 13 GB).

To run anyway (a machine whose free memory psutil under-reports, or swap you are
willing to use), pass ``force=True`` where the method takes it
(``ExactRLSSampler(force=True)``) or set the environment variable
``DASKKRR_FORCE_EXACT=1``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from typing import Any

from daskkrr.parallel.cost import DEFAULT_RATES
from daskkrr.utils.threads import available_cores

logger = logging.getLogger("daskkrr")

#: Environment variable that lets every n^2 method run whatever its estimate.
FORCE_ENV = "DASKKRR_FORCE_EXACT"
#: Estimated seconds above which a method that is allowed to run still warns.
SLOW_SECONDS = 60.0


__all__ = [
    "FORCE_ENV",
    "QuadraticCost",
    "ResourceGuardError",
    "check_quadratic",
    "force_requested",
    "memory_limits",
    "quadratic_cost",
]


class ResourceGuardError(MemoryError):
    """An n^2 method would need more memory than the machine or the workers have."""


@dataclasses.dataclass(frozen=True)
class QuadraticCost:
    """Estimated memory and time of an n^2-memory, n^3-time method.

    Attributes
    ----------
    method : str
        What runs, e.g. ``"ExactRLSSampler"``.
    n : int
        Rows.
    memory_bytes : int
        Peak memory on the client.
    flops : float
        Floating-point operations.
    seconds : float
        ``flops`` at the assumed rate.
    """

    method: str
    n: int
    memory_bytes: int
    flops: float
    seconds: float

    def describe(self) -> str:
        """``"about 100 GB of memory and roughly 3.2 h"``."""
        return f"about {_gb(self.memory_bytes)} of memory and roughly {_duration(self.seconds)}"


def quadratic_cost(method: str, n: int, d: int, *, matrices: float, cubic: float,
                   cores: int | None = None) -> QuadraticCost:
    """Memory and time of a method holding ``matrices`` float64 ``n x n`` matrices and
    spending ``cubic * n^3`` flops (plus ``2 n^2 d`` for the kernel matrix)."""
    n, d = int(n), int(d)
    memory = int(matrices * 8 * n * n + 8 * n * d)
    flops = float(cubic) * float(n) ** 3 + 2.0 * float(n) ** 2 * d
    rate = DEFAULT_RATES.gemm_flops[1] * max(1, cores if cores is not None else available_cores())
    return QuadraticCost(method=method, n=n, memory_bytes=memory, flops=flops, seconds=flops / rate)


def memory_limits(executor: Any = None) -> dict[str, int]:
    """Memory available, in bytes: ``{"this machine": ..., "the workers": ...}``.

    "This machine" is what this (client) process may take, where the quadratic methods
    form their matrices: the free memory less what workers on the same host may still
    claim (:func:`~daskkrr.parallel.resources.client_memory_budget`). The workers' entry
    is the sum of their memory limits and appears only on a distributed cluster (the
    threaded scheduler's memory is this machine's).
    """
    from daskkrr.parallel.resources import _available_memory, client_memory_budget

    client = getattr(executor, "client", None) if executor is not None else None
    free = _available_memory()
    budget = client_memory_budget(client, free)  # one reading: without a cluster, budget == free
    # Name the smaller figure for what it is, or a user who sees more free memory is puzzled.
    where = ("this machine" if budget >= free
             else f"this process (of {_gb(free)} free, less the local workers' headroom)")
    limits = {where: budget}
    if client is not None:
        limits["the workers"] = int(executor.resources().memory_bytes)
    return limits


def force_requested(force: bool = False) -> bool:
    """``force``, or ``$DASKKRR_FORCE_EXACT`` set to 1/true/yes."""
    return bool(force) or os.environ.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def check_quadratic(cost: QuadraticCost, *, alternative: str, executor: Any = None, force: bool = False,
                    max_rows: int | None = None, max_rows_name: str = "max_rows",
                    raise_hint: str | None = None) -> None:
    """Refuse ``cost`` if it exceeds the available memory or ``max_rows``; warn if it is slow.

    Parameters
    ----------
    cost : QuadraticCost
        The estimate (:func:`quadratic_cost`).
    alternative : str
        What to use instead, e.g. ``"use sampler='squeak' or 'bless'"``.
    executor : Executor or None
        Where the fit runs; its workers' memory limits count too.
    force : bool
        Run whatever the memory estimate (also ``$DASKKRR_FORCE_EXACT=1``).
    max_rows : int or None
        The method's own row limit (a parameter the user sets); refused above it
        whatever ``force`` says.
    max_rows_name : str
        That parameter's name, for the message.
    raise_hint : str or None
        How to raise it (default: "raise ``max_rows_name``").

    Raises
    ------
    ValueError
        ``n`` is above ``max_rows``.
    ResourceGuardError
        The memory estimate exceeds what this machine or the workers have.
    """
    what = f"{cost.method} forms the {cost.n}x{cost.n} kernel matrix: at n={cost.n} it needs {cost.describe()}"
    if max_rows is not None and cost.n > int(max_rows):
        hint = raise_hint or f"raise {max_rows_name}"
        raise ValueError(f"{what}; n={cost.n} is above {max_rows_name}={max_rows}. {_capitalised(alternative)} "
                         f"(or {hint} if memory allows)")
    if not force_requested(force):
        short = {where: avail for where, avail in memory_limits(executor).items() if cost.memory_bytes > avail}
        if short:
            have = " and ".join(f"{where} {_gb(avail)}" for where, avail in short.items())
            raise ResourceGuardError(
                f"{what}, more than is available ({have}). {_capitalised(alternative)}, or pass force=True "
                f"(or set {FORCE_ENV}=1) to run it anyway"
            )
    logger.info("%s at n=%d: %s", cost.method, cost.n, cost.describe())
    if cost.seconds > SLOW_SECONDS:
        warnings.warn(f"{what}; {alternative} for a faster fit", UserWarning, stacklevel=3)


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
