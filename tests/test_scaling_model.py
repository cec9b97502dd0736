"""The W-worker wall-time model (workflows/benchmarks/scaling_model.py, benchmark tooling): pure arithmetic."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

# The model lives with the benchmarks, outside the package: import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
_model = importlib.import_module("workflows.benchmarks.scaling_model")
Overheads, predict, profile_from_run = _model.Overheads, _model.predict, _model.profile_from_run

N = 1_000_000
PASS_S = {"rhs": 4.0, "matvec": 40.0}
COUNT = {"rhs": 1, "matvec": 10}


def _profile(overheads: Overheads, blocks: int = 8):
    return profile_from_run(N, fit_s=50.0, pass_s=PASS_S, pass_count=COUNT, blocks=blocks, overheads=overheads)


def test_one_worker_reproduces_the_run_it_was_measured_on():
    over = Overheads(task_s=0.002, pass_s=0.03)
    prof = _profile(over)
    assert prof.serial_s == pytest.approx(6.0)
    assert predict(prof, over, 1, cores=1)["fit_s"] == pytest.approx(50.0)


def test_ideal_workers_divide_the_passes_and_keep_the_serial_part():
    over = Overheads(task_s=0.0, pass_s=0.0)
    prof = _profile(over)
    two = predict(prof, over, 2, cores=2)
    assert two["fit_s"] == pytest.approx(6.0 + 44.0 / 2)
    # 8 blocks on 3 workers: 3 waves of a block each (the quantisation of ceil(blocks / slots)).
    assert predict(prof, over, 3, cores=3)["matvec_s"] == pytest.approx(40.0 / 8 * 3)


def test_the_hardware_efficiency_and_oversubscription_bound_the_gain():
    over = Overheads(task_s=0.0, pass_s=0.0, efficiency={1: 1.0, 2: 0.7})
    prof = _profile(over)
    two = predict(prof, over, 2, cores=2)["fit_s"]
    four = predict(prof, over, 4, cores=2)["fit_s"]
    assert two == pytest.approx(6.0 + 44.0 / (2 * 0.7))
    assert four == pytest.approx(two)  # four single-threaded workers on two cores: no faster
    # One worker whose tasks run the engine on both cores: the same busy cores as two workers.
    assert predict(prof, over, 1, engine_threads=2, cores=2)["fit_s"] == pytest.approx(two)


def test_the_scheduler_overhead_grows_with_the_blocks():
    over = Overheads(task_s=0.01, pass_s=0.0)
    prof = _profile(over)
    many = predict(prof, over, 64, cores=64)
    assert many["blocks"] == 128  # two blocks per slot (balance_blocks)
    work = (PASS_S["matvec"] - 10 * 8 * 0.01) / 10  # one matvec pass's work at one core
    assert many["matvec_s"] == pytest.approx(10 * (2 * work / 128 + 128 * 0.01))  # two waves of blocks
    # n scales the work, not the serial part.
    big = predict(prof, over, 64, cores=64, n=100 * N)
    assert big["serial_s"] == many["serial_s"] and big["blocks"] == 800  # the store's blocks grow with n
    assert big["matvec_s"] == pytest.approx(10 * (13 * work * 100 / 800 + 800 * 0.01))  # ceil(800 / 64) waves


def test_the_workers_sketch_does_the_same_work_at_any_size():
    """A sketch summed on the workers (a fixed number of rows) divides among the workers but does
    not grow with n, as the passes over all the rows do."""
    over = Overheads(task_s=0.0, pass_s=0.0)
    prof = profile_from_run(N, fit_s=52.0, pass_s={**PASS_S, "sketch": 2.0}, pass_count={**COUNT, "sketch": 1},
                            blocks=8, overheads=over)
    assert prof.fixed == {"sketch"} and prof.serial_s == pytest.approx(6.0)
    assert predict(prof, over, 2, cores=2)["sketch_s"] == pytest.approx(1.0)
    big = predict(prof, over, 16, cores=16, n=100 * N)
    assert big["sketch_s"] == pytest.approx(2.0 / big["blocks"] * 50)  # 800 blocks: 50 waves of 16
    assert big["rhs_s"] == pytest.approx(4.0 * 100 / 16)
