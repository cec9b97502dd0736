"""The fit as a pipeline of named stages: statistics -> centers -> preconditioner -> operator -> solve.

- :mod:`~daskkrr.pipeline.stages`: the stages (pure orchestration of the algorithms in
  ``kernels/``, ``sampling/`` and ``solvers/`` through the execution layer);
- :mod:`~daskkrr.pipeline.context`: the state they share;
- :mod:`~daskkrr.pipeline.run`: runs them with the fit's event subscribers
  (progress, dashboard, checkpoint, user callbacks);
- :mod:`~daskkrr.pipeline.fingerprint`: what ties a checkpoint to its fit.

A new estimator lists its stages (reusing ``statistics``, ``choose_centers``,
``falkon_preconditioner`` and ``kernel_operator`` as they fit) and brings its own
solve stage; it reports progress by emitting :mod:`daskkrr.events` on ``ctx.events``.
"""

from daskkrr.pipeline.context import FitContext
from daskkrr.pipeline.run import run_fit
from daskkrr.pipeline.stages import (
    Stage,
    cg_solve,
    choose_centers,
    direct_solve,
    exact_solve,
    falkon_preconditioner,
    kernel_operator,
    nystrom_stages,
    statistics,
)

__all__ = [
    "FitContext",
    "Stage",
    "cg_solve",
    "choose_centers",
    "direct_solve",
    "exact_solve",
    "falkon_preconditioner",
    "kernel_operator",
    "nystrom_stages",
    "run_fit",
    "statistics",
]
