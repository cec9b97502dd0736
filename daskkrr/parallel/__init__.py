"""The execution layer: the only code that talks to Dask (and to ``distributed``).

- :mod:`~daskkrr.parallel.backends`: where graphs run (threads or a cluster, from Dask's current context);
- :mod:`~daskkrr.parallel.executor`: the passes over row blocks (map-reduce, fold, tree merge,
  keep/release, gather rows, broadcast);
- :mod:`~daskkrr.parallel.strategies` and :mod:`~daskkrr.parallel.cost`: how the solver's
  products are computed (recompute, cache, gram) and the cost model that chooses;
- :mod:`~daskkrr.parallel.preconditioner_cost`: the expected time to the tolerance of each size of the
  preconditioner's row sketch (``preconditioner_rows="auto"``);
- :mod:`~daskkrr.parallel.resources`: slots, cores, memory and thread budgets;
- :mod:`~daskkrr.parallel.guards`: the memory and time checks of the n^2 methods, from those resources;
- :mod:`~daskkrr.parallel.client`: clusters started or joined by the CLI and workflows;
- :mod:`~daskkrr.parallel.tasks`: independent whole-function tasks (one model fit each), as a search runs.
"""

from typing import TYPE_CHECKING

from daskkrr.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from daskkrr.parallel.backends import Backend, DistributedBackend, ThreadedBackend, backend_for, current_client
    from daskkrr.parallel.client import cluster_client, local_cluster_kwargs
    from daskkrr.parallel.executor import BlockPasses, Executor, gather_rows, tree_reduce
    from daskkrr.parallel.tasks import TaskOutcome, TaskRunner, task_slots

#: Where each exported name lives (module of this package): imported on first use, so that a worker
#: preload (:mod:`~daskkrr.parallel.worker_exit`) or a task of one module imports that module alone.
_LAZY = {
    "Backend": "backends",
    "BlockPasses": "executor",
    "DistributedBackend": "backends",
    "Executor": "executor",
    "TaskOutcome": "tasks",
    "TaskRunner": "tasks",
    "ThreadedBackend": "backends",
    "backend_for": "backends",
    "cluster_client": "client",
    "current_client": "backends",
    "gather_rows": "executor",
    "local_cluster_kwargs": "client",
    "task_slots": "tasks",
    "tree_reduce": "executor",
}

__all__ = [
    "Backend",
    "BlockPasses",
    "DistributedBackend",
    "Executor",
    "TaskOutcome",
    "TaskRunner",
    "ThreadedBackend",
    "backend_for",
    "cluster_client",
    "current_client",
    "gather_rows",
    "local_cluster_kwargs",
    "task_slots",
    "tree_reduce",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
