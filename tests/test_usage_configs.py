"""The shipped cluster and scheduling examples are valid (they cannot run here: no SLURM, no Kubernetes).

Checked: files parse (YAML, TOML, bash, Python), carry the keys their tools
require, and the SLURM config uses only keys that dask-jobqueue accepts.
"""

from __future__ import annotations

import ast
import configparser
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from daskkrr.cli import _parser
from daskkrr.workflow import read_workflow
from daskkrr.workflow.unsupervised import is_unsupervised, read_unsupervised_workflow

EXAMPLES = Path(__file__).resolve().parents[1] / "workflows" / "examples"
CLUSTER = EXAMPLES / "cluster"

# dask-jobqueue's documented SLURM configuration: the keys of the `jobqueue.slurm`
# section of its default config file (dask_jobqueue/jobqueue.yaml), with the
# deprecated aliases it still reads (extra, env-extra, job-extra; project for account).
JOBQUEUE_SLURM_KEYS = {
    "name", "cores", "memory", "processes", "interface", "death-timeout", "local-directory",
    "shared-temp-directory", "extra", "worker-extra-args", "shebang", "queue", "account", "project",
    "walltime", "env-extra", "job-script-prologue", "job-cpu", "job-mem", "job-extra",
    "job-extra-directives", "job-directives-skip", "log-directory", "scheduler-options",
}


def test_every_computing_command_takes_scheduler():
    sub = next(a for a in _parser()._actions if a.dest == "command")
    computing = {"generate", "fit", "predict", "quickstart", "run", "score", "embed", "cluster", "tune"}
    for name in computing:
        options = {o for a in sub.choices[name]._actions for o in a.option_strings}
        assert {"--scheduler", "--workers"} <= options, name
    # convert streams a table with pandas in this process, export-onnx rewrites a saved model: no Dask cluster
    assert set(sub.choices) == computing | {"convert", "export-onnx"}


def test_slurm_jobqueue_config_uses_documented_keys():
    conf = yaml.safe_load((CLUSTER / "slurm" / "jobqueue.yaml").read_text())
    slurm = conf["jobqueue"]["slurm"]
    unknown = set(slurm) - JOBQUEUE_SLURM_KEYS
    assert not unknown, f"keys dask-jobqueue does not know: {unknown}"
    for key in ("cores", "memory", "walltime", "queue"):
        assert slurm[key], key
    assert slurm["processes"] == slurm["cores"]  # one single-threaded worker per core
    assert isinstance(slurm["job-extra-directives"], list) and isinstance(slurm["worker-extra-args"], list)
    assert re.fullmatch(r"\d+(\.\d+)?\s*[KMGT]i?B", slurm["memory"])
    assert re.fullmatch(r"\d{2}:\d{2}:\d{2}", slurm["walltime"])


def test_slurm_scripts_parse():
    source = (CLUSTER / "slurm" / "launch_jobqueue.py").read_text()
    tree = ast.parse(source)
    assert "SLURMCluster" in source and "run_workflow" in source and ast.get_docstring(tree)
    sbatch = (CLUSTER / "slurm" / "daskkrr_fit.sbatch").read_text()
    assert re.search(r"^#SBATCH --time=\d\d:\d\d:\d\d$", sbatch, re.M)
    assert "daskkrr fit --scheduler" in sbatch and "daskkrr predict --scheduler" in sbatch
    if shutil.which("bash"):
        for script in (CLUSTER / "slurm" / "daskkrr_fit.sbatch", CLUSTER / "existing_cluster.sh"):
            subprocess.run(["bash", "-n", str(script)], check=True)


def _pod_containers(pod_spec: dict) -> list[dict]:
    containers = pod_spec["containers"]
    assert containers and all({"name", "image"} <= set(c) for c in containers)
    return containers


def _check_dask_cluster_spec(spec: dict) -> None:
    # required by the operator's DaskCluster schema: spec.worker.spec, spec.scheduler.spec/service
    assert {"worker", "scheduler"} <= set(spec)
    assert isinstance(spec["worker"]["replicas"], int) and spec["worker"]["replicas"] >= 1
    workers = _pod_containers(spec["worker"]["spec"])
    assert workers[0]["args"][:2] == ["dask", "worker"] and "--nthreads" in workers[0]["args"]
    sched = _pod_containers(spec["scheduler"]["spec"])
    assert sched[0]["args"][:2] == ["dask", "scheduler"]
    ports = {p["name"]: p["containerPort"] for p in sched[0]["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    service = spec["scheduler"]["service"]
    assert {p["port"] for p in service["ports"]} == {8786, 8787}
    assert service["selector"]["dask.org/component"] == "scheduler"
    images = {c["image"] for c in workers + sched}
    assert len(images) == 1  # one daskkrr image everywhere (the scheduler serves the daskkrr page)


def test_kubernetes_daskcluster_is_a_valid_operator_resource():
    doc = yaml.safe_load((CLUSTER / "kubernetes" / "daskcluster.yaml").read_text())
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskCluster"
    assert doc["metadata"]["name"]
    _check_dask_cluster_spec(doc["spec"])
    selector = doc["spec"]["scheduler"]["service"]["selector"]["dask.org/cluster-name"]
    assert selector == doc["metadata"]["name"]


def test_kubernetes_daskjob_runs_a_workflow():
    doc = yaml.safe_load((CLUSTER / "kubernetes" / "daskjob.yaml").read_text())
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskJob"
    # required by the DaskJob schema: spec.job and spec.cluster
    job = _pod_containers(doc["spec"]["job"]["spec"])[0]
    assert job["args"][:2] == ["daskkrr", "run"]
    _check_dask_cluster_spec(doc["spec"]["cluster"]["spec"])
    # the command line the job runs is one daskkrr accepts
    args = _parser().parse_args(job["args"][1:])
    assert args.command == "run" and args.runs_dir.startswith("/data/")
    dockerfile = (CLUSTER / "kubernetes" / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "pip install" in dockerfile


def test_existing_cluster_workflow_validates(tmp_path):
    config = read_workflow(CLUSTER / "existing_cluster.toml")
    # No scheduler in the file: one there would beat the $DASK_SCHEDULER_ADDRESS that existing_cluster.sh exports.
    assert config["cluster"]["scheduler"] is None
    # Its paths stay inside the checkout (an absolute /shared/... made folders at the filesystem root).
    root = EXAMPLES.parents[1]
    assert Path(config["workflow"]["runs_dir"]).is_relative_to(root / "runs")
    assert Path(config["data"]["store"]).is_relative_to(EXAMPLES / "data")


def test_crontab_lines_are_valid_and_run_shipped_workflows():
    lines = [ln for ln in (EXAMPLES / "schedule" / "daskkrr.crontab").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#") and not re.match(r"^[A-Z_]+=", ln)]
    assert lines
    field = r"(\*|\d+(-\d+)?(,\d+(-\d+)?)*)(/\d+)?"
    for line in lines:
        parts = line.split(None, 5)
        assert all(re.fullmatch(field, f) for f in parts[:5]), line
        command = parts[5]
        assert "daskkrr run" in command
        args = shlex.split(command.split("&&", 1)[1].split(">>")[0])
        workflow = next(a for a in args if a.endswith(".toml"))
        assert (EXAMPLES.parents[1] / workflow).is_file(), workflow
        parsed = _parser().parse_args(args[1:])
        assert parsed.command == "run"


def test_systemd_units_are_complete():
    def load(name: str) -> configparser.ConfigParser:
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        cp.optionxform = str  # systemd keys are case-sensitive
        cp.read_string((EXAMPLES / "schedule" / name).read_text())
        return cp

    service = load("daskkrr-nightly.service")
    assert service["Service"]["Type"] == "oneshot"
    exec_start = shlex.split(service["Service"]["ExecStart"])
    assert exec_start[0].endswith("/daskkrr") and exec_start[1] == "run"
    assert _parser().parse_args(exec_start[1:]).command == "run"
    timer = load("daskkrr-nightly.timer")
    assert timer["Timer"]["Unit"] == "daskkrr-nightly.service"
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d", timer["Timer"]["OnCalendar"])
    assert timer["Install"]["WantedBy"] == "timers.target"
    if shutil.which("systemd-analyze"):
        # best effort: verify needs the ExecStart binary to exist, so only the syntax is checked
        proc = subprocess.run(["systemd-analyze", "calendar", timer["Timer"]["OnCalendar"]],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_every_example_workflow_validates():
    for path in EXAMPLES.glob("*.toml"):
        if is_unsupervised(tomllib.loads(path.read_text())):  # [kpca] / [kmeans] tables: daskkrr run dispatches
            config = read_unsupervised_workflow(path)
            assert config["workflow"]["name"] and ({"kpca", "kmeans"} & set(config)), path
            continue
        config = read_workflow(path)
        assert config["workflow"]["name"] and config["model"]["estimator"]
    tomllib.loads((EXAMPLES / "nightly_retrain.toml").read_text())


def test_prefect_module_imports_and_wraps_the_same_function():
    from daskkrr.workflow import prefect_flow

    assert prefect_flow.run_workflow_once.__module__ == "daskkrr.workflow.prefect_flow"
    ast.parse((EXAMPLES / "schedule" / "prefect_nightly.py").read_text())
    if not prefect_flow.PREFECT_AVAILABLE:
        with pytest.raises(ImportError, match=r"daskkrr\[prefect\]"):
            prefect_flow.make_flow()
        pytest.skip("Prefect is not installed (optional extra 'prefect'): the flow itself is not built")
    import inspect

    flow = prefect_flow.make_flow()
    assert flow.fn is prefect_flow.run_workflow_once
    assert flow.name == "daskkrr-workflow"
    assert {"name", "cron", "parameters"} <= set(inspect.signature(flow.serve).parameters)  # what serve() passes
