"""The README's command blocks and the examples under workflows/examples/ run as written.

Each runs in a fresh folder, as a new user would: the README's blocks from the
checkout (they ``cd`` into a temporary folder themselves), the workflow files'
header commands (``#   daskkrr ...``) in a copy of ``workflows/examples``, and
``cluster/existing_cluster.sh`` against a scheduler and workers started here on
127.0.0.1. Each must exit 0, print no non-convergence and leave nothing behind: the
checkout's untracked and ignored files are the same before and after, and the
temporary folder the commands see (``TMPDIR``, private to the test so that other
processes' files in /tmp do not interfere) holds no ``daskkrr-*`` entry afterwards.

The commands are read from README.md and the example files, never copied here, so
that they cannot drift. The tests that run them are marked slow: together they fit
some twenty models, the cost of running every example.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "workflows" / "examples"
SHARED = ROOT.parent / "shared"

#: The checks of the README and the example files themselves run by default; every test that
#: runs commands is marked slow: each fits models (the unsupervised example alone took 116 s,
#: the nightly online one 89 s, on a 2-core AMD EPYC VM at a load average of 20), together far
#: beyond the default run's budget.
_RUNS = pytest.mark.slow

#: A README block the test runs follows this comment (its tail may say what is left out).
_MARKER = re.compile(r"<!-- tests/test_examples\.py runs this block[^>]*-->\s*```bash\n(.*?)```", re.S)
#: What a run must not print (compared in lower case): a fit that stopped short of its tolerance
#: (the warning, the fit's summary, the bar's "done (not converged)"), or a crash.
_FAILURE_SIGNS = ("convergencewarning", "cg stopped at", "did not converge", "not converged", "traceback")


def readme_blocks() -> list[str]:
    """The README's marked ```bash blocks, without ``pip install`` (the package is installed) and the suite itself."""
    blocks = _MARKER.findall((ROOT / "README.md").read_text())
    return [_without_installs(block) for block in blocks]


def _without_installs(block: str) -> str:
    lines = []
    for line in block.splitlines():
        line = re.sub(r"^pip install \S+(?: \S+)* && ", "", line)  # "pip install -e . && daskkrr quickstart"
        if re.match(r"python -m pytest\b", line):
            continue  # the test suite itself, which runs this test
        lines.append(line)
    return "\n".join(lines) + "\n"


def header_commands(path: Path) -> list[str]:
    """The ``#   daskkrr ...`` lines of a workflow file's header comment, as written."""
    commands = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        match = re.match(r"#\s+(daskkrr .*?)(?:\s+#.*)?$", line)
        if match:
            commands.append(match.group(1))
    return commands


def _leftovers() -> set[str]:
    """The checkout's untracked and ignored paths (bytecode caches aside)."""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!") and "__pycache__" not in line}


def _run(script: str, cwd: Path, tmpdir: Path, env: dict[str, str] | None = None) -> str:
    """Run ``script`` with bash -euo pipefail; assert it succeeds, converges and leaves nothing behind."""
    before = _leftovers()
    full_env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(ROOT), **(env or {})}
    log = tmpdir.parent / "output.log"  # a file, so that a run cut short still shows how far it got
    with open(log, "w") as out:
        try:
            code = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=full_env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=580).returncode
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after 580 s:\n{script}\n{log.read_text()}")
    output = log.read_text()
    assert code == 0, f"exit {code} of\n{script}\n{output}"
    for sign in _FAILURE_SIGNS:
        assert sign not in output.lower(), f"{sign!r} in the output of\n{script}\n{output}"
    assert _leftovers() == before, f"left in the checkout: {_leftovers() - before}"
    stray = sorted(p.name for p in tmpdir.glob("daskkrr-*"))
    assert not stray, f"left in the temporary folder: {stray}"
    return output


@pytest.fixture
def tmpdir_(tmp_path: Path) -> Path:
    path = tmp_path / "tmp"
    path.mkdir()
    return path


def test_readme_has_the_blocks():
    blocks = readme_blocks()
    assert len(blocks) == 2, "README.md: the quickstart and the CLI blocks are marked for this test"
    assert "daskkrr quickstart" in blocks[0] and "pip install" not in blocks[0]
    assert blocks[1].startswith('REPO=$PWD && cd "$(mktemp -d)"')  # its outputs go to a temporary folder


@_RUNS
def test_readme_quickstart(tmpdir_):
    output = _run(readme_blocks()[0], ROOT, tmpdir_)
    assert "test RMSE" in output


@_RUNS
def test_readme_command_line(tmpdir_):
    if not (SHARED / "data" / "537_houses.tsv.gz").is_file():
        pytest.skip(f"{SHARED / 'data'} is absent: the README's CLI block converts a table from it")
    output = _run(readme_blocks()[1], ROOT, tmpdir_)
    assert output.count("converged") >= 2 and "tuned FalkonRegressor" in output
    made = [p for p in tmpdir_.iterdir() if (p / "model").is_dir()]  # beside it: dask's scratch space
    assert len(made) == 1 and {"houses.zarr", "model2", "preds.zarr", "runs", "best"} <= {
        p.name for p in made[0].iterdir()}  # every output under the block's mktemp -d


WORKFLOW_FILES = sorted(EXAMPLES.rglob("*.toml"))


def test_every_workflow_file_has_commands():
    assert WORKFLOW_FILES
    for path in sorted(EXAMPLES.rglob("*.toml")):
        assert any(" run " in c for c in header_commands(path)), f"{path}: no '#   daskkrr run ...' line"


@_RUNS
@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_workflow_file_runs_as_written(path, tmp_path, tmpdir_):
    """The file's header commands, from the root of a copy of the checkout's workflows/examples."""
    if "shared/data" in path.read_text() and not (SHARED / "data").is_dir():
        pytest.skip(f"{path.name} reads a table from {SHARED / 'data'}, which is absent")
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES, repo / "workflows" / "examples",
                    ignore=shutil.ignore_patterns("*.zarr", "data", "runs", "__pycache__"))
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)  # ../shared beside the checkout, as in CI
    output = _run("\n".join(header_commands(path)) + "\n", repo, tmpdir_)
    assert output.count("succeeded") == sum(" run " in c for c in header_commands(path))
    assert re.search(r"\(\w+: \)", output) is None, output  # a summary with no figures: "(prequential: )"
    assert {p.name for p in tmp_path.iterdir()} <= {"repo", "shared", "tmp", "output.log"}  # nothing beside the copy


@pytest.fixture
def local_scheduler(tmp_path: Path):
    """``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 (2 workers, 1 thread each); the address."""
    from distributed import Client

    scheduler_file = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "dask"]  # the `dask` command of this interpreter's environment
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address",
                               "127.0.0.1:0", "--scheduler-file", str(scheduler_file)], **quiet)]
    try:
        deadline = time.monotonic() + 120
        while not scheduler_file.exists():
            assert time.monotonic() < deadline, "the scheduler did not start in 120 s"
            time.sleep(0.2)
        procs.append(subprocess.Popen(
            [*dask, "worker", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--nworkers", "2",
             "--nthreads", "1", "--dashboard-address", "127.0.0.1:0", "--local-directory", str(tmp_path / "workers")],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, **quiet))
        with Client(scheduler_file=str(scheduler_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            yield client.scheduler.address
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@_RUNS
def test_existing_cluster_script_runs_as_written(local_scheduler, tmp_path, tmpdir_):
    script = EXAMPLES / "cluster" / "existing_cluster.sh"
    output = _run(f"bash {script}\n", tmp_path, tmpdir_, env={"SCHEDULER": local_scheduler})
    match = re.search(r"^outputs in (.+)$", output, re.M)
    assert match, output
    out_dir = Path(match.group(1))
    assert out_dir.parent == tmpdir_  # mktemp -d: in the temporary folder
    assert (out_dir / "train.zarr").is_dir() and (out_dir / "runs" / "latest").is_dir()
    assert "succeeded" in output
