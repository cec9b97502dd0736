"""Optional Prefect flow around :func:`daskkrr.workflow.run_workflow` (``pip install "daskkrr[prefect]"``).

The flow runs the same function as ``daskkrr run``, so a run started by Prefect
writes the same run directory; a failed run fails the flow run. Serve it on a
cron schedule with::

    python -m daskkrr.workflow.prefect_flow workflows/examples/nightly_retrain.toml --cron "0 2 * * *"

This module imports without Prefect; :func:`make_flow` and :func:`serve` then
raise an ImportError that says how to install it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daskkrr.workflow.runner import run_workflow

try:  # optional dependency
    import prefect
except ImportError:  # pragma: no cover - depends on the environment
    prefect = None

PREFECT_AVAILABLE = prefect is not None
DEFAULT_CRON = "0 2 * * *"


def run_workflow_once(
    workflow: str,
    overrides: list[str] | None = None,
    runs_dir: str | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    """Run ``workflow`` once; return the run's id, directory, status and metrics (JSON-ready).

    Raises :class:`daskkrr.workflow.WorkflowRunError` when the run fails.
    """
    result = run_workflow(workflow, overrides=overrides, runs_dir=runs_dir, scheduler=scheduler)
    return {"run_id": result.run_id, "run_dir": str(result.run_dir), "status": result.status,
            "metrics": result.metrics}


def _require_prefect() -> Any:
    if prefect is None:
        raise ImportError('the Prefect flow needs Prefect: pip install "daskkrr[prefect]"')
    return prefect


def make_flow(name: str = "daskkrr-workflow", retries: int = 0) -> Any:
    """The Prefect flow wrapping :func:`run_workflow_once` (its ``.fn`` is that function)."""
    return _require_prefect().flow(name=name, retries=retries, log_prints=True)(run_workflow_once)


def serve(
    workflow: str,
    cron: str = DEFAULT_CRON,
    *,
    name: str | None = None,
    overrides: list[str] | None = None,
    runs_dir: str | None = None,
    scheduler: str | None = None,
) -> None:
    """Serve the flow with a cron schedule (blocks; needs a Prefect server or Prefect Cloud)."""
    flow = make_flow()
    path = str(Path(workflow).resolve())
    flow.serve(
        name=name or f"daskkrr-{Path(workflow).stem}",
        cron=cron,
        parameters={"workflow": path, "overrides": overrides, "runs_dir": runs_dir, "scheduler": scheduler},
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a daskkrr workflow as a scheduled Prefect flow.")
    parser.add_argument("workflow")
    parser.add_argument("--cron", default=DEFAULT_CRON, help=f"cron schedule (default: {DEFAULT_CRON!r})")
    parser.add_argument("--name", default=None, help="deployment name (default: daskkrr-<file stem>)")
    parser.add_argument("--set", dest="overrides", action="append", default=None, metavar="TABLE.KEY=VALUE")
    parser.add_argument("--runs-dir", default=None)
    parser.add_argument("--scheduler", default=None)
    args = parser.parse_args(argv)
    serve(args.workflow, args.cron, name=args.name, overrides=args.overrides, runs_dir=args.runs_dir,
          scheduler=args.scheduler)


if __name__ == "__main__":  # pragma: no cover
    main()
