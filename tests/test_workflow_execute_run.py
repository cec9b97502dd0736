"""Unsupervised workflows run through the fit workflows' run-directory driver (``runner.execute_run``)."""

from __future__ import annotations

import json

from daskkrr.workflow.rundir import read_status
from daskkrr.workflow.unsupervised import run_unsupervised_workflow

WORKFLOW = """
[data]
generate = { n = 200, d = 2, clusters = 2, seed = 0, chunk_rows = 100 }

[kmeans]
n_clusters = 2
n_centers = 20
random_state = 0

[outputs]
model = false
labels = false
"""


def test_an_unsupervised_run_marks_a_dead_processs_run_failed_and_records_its_dashboard(tmp_path, cluster2):
    runs = tmp_path / "runs"
    dead = runs / "20200101T000000Z-dead00"
    dead.mkdir(parents=True)
    (dead / "status.json").write_text(json.dumps({"status": "running", "run_id": dead.name}))
    wf = tmp_path / "km.toml"
    wf.write_text(WORKFLOW)
    result = run_unsupervised_workflow(wf, runs_dir=runs, client=cluster2)
    assert result.status == "succeeded" and read_status(result.run_dir)["status"] == "succeeded"
    assert read_status(dead)["status"] == "failed" and "interrupted" in read_status(dead)["error"]
    assert "dashboard" in result.metrics and result.metrics["kmeans"]["n_centers"] == 20
    assert json.loads((result.run_dir / "config.json").read_text())["source"] == str(wf.resolve())
