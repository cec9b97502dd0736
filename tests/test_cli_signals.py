"""Ctrl-C at any moment of the command line, its start-up (imports, parsing) included: the
documented line and exit code 130 (128 + n for SIGTERM/SIGHUP), never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from daskkrr import cli

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status (Linux)")


def _caught(pid: int) -> int:
    """The mask of signals the process ``pid`` handles (SigCgt of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    return 0


def _default_sigint() -> None:
    # A suite started in the background ignores SIGINT, and a child inherits that; a user's shell does not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_blocked_convert(tmp_path) -> subprocess.Popen:
    """``daskkrr convert`` of a FIFO no one writes to: whatever the delay, the command is still running
    (in its imports, its parsing, or waiting on the input), so the test does not depend on speed."""
    fifo = tmp_path / "table.csv"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "daskkrr.cli", "convert", str(fifo), str(tmp_path / "out.zarr"),
                             "--target", "y"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint)


def _wait_for_daskkrr(proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Wait until daskkrr's first line has run: it handles SIGTERM from then on (Python itself does not).

    Before that, the interpreter and ``site`` start; a signal there meets Python's own handling.
    """
    deadline = time.monotonic() + timeout
    while not _caught(proc.pid) & (1 << (signal.SIGTERM - 1)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "daskkrr did not start"
        time.sleep(0.001)


# Each case starts a Python process: the default run keeps 0, 0.2 and 1 s of SIGINT (before, during and
# after daskkrr's imports) and one of SIGTERM and SIGHUP; the delays between are marked slow.
@pytest.mark.parametrize("signum, delay", [(signal.SIGINT, d) if d in (0.0, 0.2, 1.0) else
                                           pytest.param(signal.SIGINT, d, marks=pytest.mark.slow)
                                           for d in (0.0, 0.05, 0.2, 0.5, 1.0, 1.5)]
                         + [(signal.SIGTERM, 0.0), (signal.SIGHUP, 0.3)])
def test_signal_at_any_moment_of_startup(tmp_path, signum, delay):
    proc = _start_blocked_convert(tmp_path)
    try:
        _wait_for_daskkrr(proc)
        time.sleep(delay)
        assert proc.poll() is None, "the command ended before the signal"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    code = 130 if signum == signal.SIGINT else 128 + signum
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("daskkrr: interrupted") and "no partial output was left" in err
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"], "an output or a temporary was left"


def test_interrupt_while_parsing_is_reported(monkeypatch, capsys):
    """In-process: Ctrl-C while the parser is built (it imports the estimators) -> 130 and the line."""
    def interrupted_parser():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", interrupted_parser)
    assert cli.main(["score", "--model", "m", "--data", "d"]) == 130
    assert capsys.readouterr().err == "daskkrr: interrupted; no partial output was left\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_python_had_to_drop_is_raised_again(monkeypatch, signum):
    """A signal whose exception lands in a weakref callback (as during an import, where the module lock's
    callback runs) is printed by Python as "Exception ignored" and dropped; the console script's
    unraisable hook sends it again, so it unwinds the command like any other interruption."""
    import weakref

    from daskkrr.signals import Interrupted, interrupt_on_signals

    class Target:
        pass

    def callback(_ref):
        raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)

    monkeypatch.setattr(sys, "unraisablehook", cli._redeliver_swallowed_interrupt)
    monkeypatch.setattr(cli, "_SIGINTS", [])
    previous = signal.signal(signal.SIGINT, cli._on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt) as info, interrupt_on_signals():
            target = Target()
            ref = weakref.ref(target, callback)
            del target  # the callback runs here; its exception cannot propagate
            for _ in range(10_000):  # the signal is delivered again at one of these instructions
                time.sleep(0.0001)
        assert ref() is None
        assert isinstance(info.value, Interrupted) == (signum != signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
