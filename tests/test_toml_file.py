"""One TOML reader: every caller (model configs, fit and unsupervised workflows) reports a
broken file the same way, with the position of a syntax error and a guess for a misspelt key."""

from __future__ import annotations

import pytest

from daskkrr.config import ConfigError, read_config
from daskkrr.utils.toml_file import read_toml, unknown_keys
from daskkrr.workflow.spec import WorkflowError, read_workflow
from daskkrr.workflow.unsupervised import read_unsupervised_workflow

READERS = [(read_config, ConfigError, "config file"), (read_workflow, WorkflowError, "workflow file"),
           (read_unsupervised_workflow, WorkflowError, "workflow file")]


@pytest.mark.parametrize("reader, error, what", READERS)
def test_every_reader_reports_a_broken_file_alike(tmp_path, reader, error, what):
    path = tmp_path / "w.toml"
    path.write_text("[data]\nstore = 'a'\n\nn = = 3\n")
    with pytest.raises(error, match=r"w\.toml is not valid TOML \(line 4, column 5\): "):
        reader(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(error, match=r"w\.toml is not a TOML file: it is not UTF-8 text \(invalid start byte at byte 0"):
        reader(path)
    with pytest.raises(error, match=f"{what} .* is a directory; pass the path of a .toml file"):
        reader(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"{what} .*absent.toml does not exist"):
        reader(tmp_path / "absent.toml")


def test_unknown_table_of_a_workflow_gets_a_guess(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text("[dta]\nstore = 'a'\n")
    with pytest.raises(WorkflowError, match=r"w\.toml: unknown table 'dta' \(did you mean 'data'\?\); accepted: \["):
        read_workflow(path)
    path.write_text("[kpca]\nn_components = 2\n[data]\nstore = 'a'\n[outputs]\nembeding = true\n")
    with pytest.raises(WorkflowError, match=r"unknown key 'embeding' in \[outputs\] \(did you mean 'embedding'\?\)"):
        read_unsupervised_workflow(path)


def test_unknown_keys_message():
    assert unknown_keys({"a": 1}, ["a", "b"], where="f.toml") == ""
    assert unknown_keys(["sigmaa", "zzz"], ["sigma", "penalty"], where="f.toml", context=" in [model]") == (
        "f.toml: unknown keys 'sigmaa', 'zzz' in [model] (did you mean 'sigma' for 'sigmaa'?); "
        "accepted: ['penalty', 'sigma']")
    assert unknown_keys(["qqq"], ["sigma"], where="f.toml") == "f.toml: unknown key 'qqq'; accepted: ['sigma']"


def test_end_of_file_error_and_default_error_type(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('a = "unterminated')
    with pytest.raises(ValueError, match=r"e\.toml is not valid TOML \((line 1, column \d+|at the end of the file)\)"):
        read_toml(path)
    path.write_text("a = 1\n[b]\nc = [1, 2]\n")
    assert read_toml(path) == {"a": 1, "b": {"c": [1, 2]}}
