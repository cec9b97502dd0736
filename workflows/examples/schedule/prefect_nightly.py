"""Serve the nightly retrain as a Prefect deployment with a cron schedule (``pip install "daskkrr[prefect]"``).

    python workflows/examples/schedule/prefect_nightly.py            # serves until stopped
    prefect deployment run 'daskkrr-workflow/daskkrr-nightly-retrain' # a run now, from another shell

The flow wraps :func:`daskkrr.workflow.run_workflow`, so each Prefect run writes
the same run directory as ``daskkrr run``; a failed run fails the flow run.
"""

from pathlib import Path

from daskkrr.workflow.prefect_flow import serve

WORKFLOW = Path(__file__).resolve().parents[1] / "nightly_retrain.toml"

if __name__ == "__main__":
    serve(str(WORKFLOW), cron="0 2 * * *", name="daskkrr-nightly-retrain")
