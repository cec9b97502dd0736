"""pyproject.toml and environment.yml must list the same dependencies; the README opens with the commands."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
