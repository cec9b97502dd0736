"""Scheduled workflows: ``daskkrr run WORKFLOW.toml``.

A workflow file names the data source, the preprocessing, the model (the
``[model]`` table of :mod:`daskkrr.config`), an optional parameter sweep, the
evaluation (held-out split or cross-validation) and the outputs. Each run writes
a directory of its own (time + id) holding the resolved configuration, a log,
``metrics.json``, the model and, if asked, predictions; a failed run is marked
failed and the command exits non-zero. Re-running the same file is safe: runs
never share a directory, a lock keeps two runs of one workflow apart, and caches
are reused. See :mod:`daskkrr.workflow.spec` for the file format.
"""

from daskkrr.workflow.rundir import WorkflowLockedError, read_status
from daskkrr.workflow.runner import RunResult, WorkflowRunError, run_workflow
from daskkrr.workflow.spec import WorkflowError, read_workflow
from daskkrr.workflow.unsupervised import run_unsupervised_workflow

__all__ = [
    "RunResult",
    "WorkflowError",
    "WorkflowLockedError",
    "WorkflowRunError",
    "read_status",
    "read_workflow",
    "run_unsupervised_workflow",
    "run_workflow",
]
