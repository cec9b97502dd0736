"""engine="auto" from many threads at once: one look for the compiled engine's marker, one
background compile at most (issue 37, item 7)."""

from __future__ import annotations

import threading
import time

import pytest

from daskkrr.kernels import GaussianKernel, warmup
from daskkrr.kernels import engine as engine_module

THREADS = 16


def _run_threads(monkeypatch, marker_valid: bool) -> tuple[list[str], list[list[str]]]:
    """Every thread asks ``_auto_choice`` at once, in a fresh process state; the marker takes
    50 ms to read (a slow disk) so the threads overlap the first look. Returns their answers and
    the command lines of the background compiles started (``subprocess.Popen`` mocked)."""
    monkeypatch.delenv("DASKKRR_ENGINE", raising=False)
    monkeypatch.delenv("DASKKRR_BACKGROUND_COMPILE", raising=False)
    monkeypatch.setattr(warmup, "_ready", False)
    monkeypatch.setattr(warmup, "_last_check", -1e9)
    monkeypatch.setattr(warmup, "_started", False)
    monkeypatch.setattr(engine_module, "_fused_compiled_here", lambda: False)
    monkeypatch.setattr(engine_module, "_worker_memory_limit", lambda: None)
    monkeypatch.setattr(engine_module, "numba_installed", lambda: True)
    monkeypatch.setattr(engine_module.FusedEngine, "available", staticmethod(lambda: True))

    def slow_marker(marker) -> bool:
        time.sleep(0.05)
        return marker_valid

    monkeypatch.setattr(warmup, "_marker_valid", slow_marker)
    launches: list[list[str]] = []
    monkeypatch.setattr(warmup.subprocess, "Popen", lambda args, **kw: launches.append(list(args)))
    barrier = threading.Barrier(THREADS)
    answers: list[str] = []

    def ask() -> None:
        barrier.wait()
        answers.append(engine_module._auto_choice(GaussianKernel()))

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, launches


def test_a_valid_marker_starts_no_compile_from_concurrent_threads(monkeypatch):
    # Before the fix the first thread stamped the time, then read the marker: the others saw a
    # fresh time with _ready still False, ran on BLAS and started the compile.
    answers, launches = _run_threads(monkeypatch, marker_valid=True)
    assert answers == ["fused-auto"] * THREADS
    assert launches == []


def test_an_absent_marker_starts_one_compile_from_concurrent_threads(monkeypatch):
    answers, launches = _run_threads(monkeypatch, marker_valid=False)
    assert answers == ["blas"] * THREADS
    assert len(launches) == 1 and "--background" in launches[0]


@pytest.mark.parametrize("valid", [True, False])
def test_the_marker_is_read_once_per_recheck_interval(monkeypatch, valid):
    reads = []
    monkeypatch.setattr(warmup, "_ready", False)
    monkeypatch.setattr(warmup, "_last_check", -1e9)
    monkeypatch.setattr(warmup, "_marker_valid", lambda marker: reads.append(1) or valid)
    assert [warmup.fused_ready() for _ in range(5)] == [valid] * 5
    assert len(reads) == 1
