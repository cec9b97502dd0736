"""pyproject.toml and environment.yml must list the same dependencies; the README opens with the commands;
the build compiles the engine into the package it installs."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    name = re.split(r"[\[<>=!~ ;]", requirement.strip(), maxsplit=1)[0]
    return name.lower().replace("_", "-")


def test_environment_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]} | {_name(r) for r in project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {_name(d) for d in env["dependencies"] if isinstance(d, str)} - {"python", "pip"}
    assert conda == wanted


def test_readme_opens_with_install_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```", 2)[1]
    lines = [ln.split("#")[0].strip() for ln in block.splitlines()[1:] if ln.strip()]
    assert lines[0] == "pip install -e . && daskkrr quickstart"
    assert lines[1] == 'pip install -e ".[dev]" && python -m pytest -q'
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "python -m pytest -q"


def test_build_requirements_bound_the_engine_modules_as_the_dependencies_do():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = {_name(r): r for r in pyproject["project"]["dependencies"]}
    for req in pyproject["build-system"]["requires"]:
        if _name(req) in runtime:
            assert req == runtime[_name(req)], "setup.py's compile must see the numba the package runs with"


_LOAD_INSTALLED = """
import sys
import numpy as np
import daskkrr
from daskkrr.kernels import FusedEngine, GaussianKernel, engine_for, fused, warmup
assert daskkrr.__file__.startswith(sys.argv[1]), daskkrr.__file__
if sys.argv[2] == "same-cpu":
    k = GaussianKernel()
    assert isinstance(engine_for(k), FusedEngine)
    for dtype in (np.float32, np.float64):
        X = np.ones((10, 3), dtype)
        FusedEngine().gram_matvec(k, X, X[:4], np.ones(4))
    assert not fused._block_rows.stats.cache_misses, fused._block_rows.stats
    assert sum(fused._block_rows.stats.cache_hits.values()) == 2
else:
    assert not warmup.fused_ready()  # another CPU: the shipped code does not apply
print("ok")
"""


def _setup_py():
    spec = importlib.util.spec_from_file_location("daskkrr_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines compile_engine; setup() runs only as __main__
    return module


def test_a_failed_build_compile_warns_and_lets_the_build_go_on(tmp_path, capsys):
    broken = tmp_path / "daskkrr"
    (broken / "kernels").mkdir(parents=True)  # no engine to import
    assert _setup_py().compile_engine(broken) is False
    err = capsys.readouterr().err
    assert "could not compile the fused engine at build time" in err and "ImportError" in err


@pytest.mark.slow
def test_the_build_compiles_the_engine_into_the_package_it_installs(tmp_path):
    """setup.py's build step leaves the engine's compiled code in the built package: once that
    package is copied elsewhere (installed: new paths, new times), a fresh process runs the fused
    engine from the first call without compiling. For another CPU the marker does not match."""
    setup_py = _setup_py()
    built = tmp_path / "build" / "daskkrr"
    shutil.copytree(ROOT / "daskkrr", built, ignore=shutil.ignore_patterns("__pycache__"))
    assert setup_py.compile_engine(built)
    assert list(built.glob("kernels/__pycache__/daskkrr-engine-*.ready"))
    assert not list(built.rglob("*.lock"))
    site = tmp_path / "site"
    shutil.copytree(built, site / "daskkrr", copy_function=shutil.copy)  # new modification times

    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "DASKKRR_ENGINE")}
    env["PYTHONPATH"] = str(site)
    for case, extra in (("same-cpu", {}), ("other-cpu", {"NUMBA_CPU_NAME": "generic"})):
        out = subprocess.run([sys.executable, "-c", _LOAD_INSTALLED, str(site), case], env={**env, **extra},
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert out.stdout.strip() == "ok", (case, out.stderr[-3000:])
