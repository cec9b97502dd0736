"""Shared pieces of the engine/fit/scaling/workers benchmark workflows.

- :class:`PeakMemory`: a thread that samples the resident memory (RSS) of a
  process tree (a measured run and its Dask workers and nannies) and keeps each
  process's peak; the figure reported is the sum of the per-process peaks.
- :func:`run_child`: runs one measurement in a fresh Python process (so each
  library starts from the same baseline and its memory is its own), samples the
  child's process tree, and returns the JSON the child printed.
- :func:`machine`, :func:`print_table`, :func:`write_results`: the machine
  description, a plain-text table, and JSON + CSV output files.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RESULT_PREFIX = "BENCH-RESULT "


class PeakMemory:
    """Sample the RSS of ``root`` and its descendants every ``interval`` seconds.

    Use as a context manager; ``total_mb`` is the sum of the per-process peaks,
    ``per_process`` maps ``"name[pid]"`` to its peak in MiB. ``cpu_s`` is the CPU time (user +
    system) of the tree, each process's as last sampled (a process's last ``interval`` before
    it exits is missed): on a shared, loaded machine it compares fits where wall time cannot.
    """

    def __init__(self, root: int | None = None, interval: float = 0.05):
        self.root = psutil.Process(root or os.getpid())
        self.interval = interval
        self.peaks: dict[int, tuple[str, float]] = {}
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                rss = p.memory_info().rss / 2**20
                name = _role(p)
                times = p.cpu_times()
            except psutil.Error:
                continue
            self.cpu[p.pid] = max(self.cpu.get(p.pid, 0.0), times.user + times.system)
            old = self.peaks.get(p.pid, (name, 0.0))
            self.peaks[p.pid] = (name, max(old[1], rss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()

    @property
    def total_mb(self) -> float:
        return sum(peak for _, peak in self.peaks.values())

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    @property
    def per_process(self) -> dict[str, float]:
        return {f"{name}[{pid}]": round(peak, 1) for pid, (name, peak) in sorted(self.peaks.items())}


def sine_store(data_dir: Path, name: str, n: int, n_test: int, d: int) -> Path:
    """Zarr store ``data_dir/{name}_n{n}_d{d}.zarr`` of ``n + n_test`` float32 rows (train first), written once:
    standard normal features, target ``sin`` of the first three features' sum plus noise 0.1."""
    import numpy as np

    from daskkrr.data import write_zarr

    path = data_dir / f"{name}_n{n}_d{d}.zarr"
    if not path.exists():
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n + n_test, d)).astype(np.float32)
        y = np.sin(X[:, :3].sum(axis=1)) + 0.1 * rng.standard_normal(n + n_test)
        write_zarr(X, y, path, chunk_rows=min(n + n_test, 250_000))
    return path


def _role(p: psutil.Process) -> str:
    cmd = " ".join(p.cmdline()[:6])
    if "spawn_main" in cmd or "multiprocessing" in cmd:
        return "dask-process"
    return "client" if "python" in cmd else p.name()


class PhaseClock:
    """Seconds per pipeline stage and per kind of pass over the data, from a fit's events.

    Subscribe it around the fit (``with daskkrr.events.subscribe(clock): model.fit(...)``).
    """

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self.passes: dict[str, float] = {}
        self.pass_count: dict[str, int] = {}
        self.blocks = 0  # the most blocks a pass had
        self._pass_start: dict[str, float] = {}

    def __call__(self, event: Any) -> None:
        from daskkrr import events as ev

        if isinstance(event, ev.StageDone):
            self.stages[event.stage] = self.stages.get(event.stage, 0.0) + event.seconds
        elif isinstance(event, ev.PassStarted):
            self._pass_start[event.name] = time.perf_counter()
            self.blocks = max(self.blocks, event.n_blocks)
        elif isinstance(event, ev.PassDone) and event.name in self._pass_start:
            seconds = time.perf_counter() - self._pass_start.pop(event.name)
            self.passes[event.name] = self.passes.get(event.name, 0.0) + seconds
            self.pass_count[event.name] = self.pass_count.get(event.name, 0) + 1


def run_child(argv: Sequence[str], timeout: float = 3600, python: str | None = None,
              env: dict[str, str] | None = None, cpus: Sequence[int] | None = None) -> dict[str, Any]:
    """Run ``python argv...`` in a fresh process; return its result JSON plus memory peaks.

    The child prints one line ``BENCH-RESULT {json}``. Adds ``peak_mb`` (sum of
    per-process RSS peaks of the child's tree), ``peak_per_process_mb``,
    ``n_processes``, ``wall_s`` and ``cpu_s`` (the tree's CPU seconds, :class:`PeakMemory`);
    ``error`` holds the tail of stderr on failure.
    ``python`` is the interpreter (default: this one; FALKON's runs in its own venv);
    ``env`` holds variables set for the child on top of this process's; ``cpus``, the cores the child (and
    its own children) may run on, with as many BLAS/OpenMP/numba threads (two libraries fitted side by
    side at the same time, one core each, see the same load).
    """
    env = {**os.environ, **(env or {})}
    env.setdefault("PYTHONUNBUFFERED", "1")
    pin = None
    if cpus is not None:
        cores = sorted(set(cpus))
        env.update({v: str(len(cores)) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                 "NUMBA_NUM_THREADS")})

        def pin() -> None:  # runs in the child before exec: its affinity is inherited by what it starts
            os.sched_setaffinity(0, cores)
    t0 = time.perf_counter()
    proc = subprocess.Popen([python or sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(REPO), preexec_fn=pin)
    with PeakMemory(proc.pid) as mem:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\ntimed out after {timeout}s"
    result: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    if not result:
        result = {"error": (err or out)[-2000:]}
    result.update(peak_mb=round(mem.total_mb, 1), peak_per_process_mb=mem.per_process,
                  n_processes=len(mem.peaks), wall_s=round(time.perf_counter() - t0, 2), cpu_s=round(mem.cpu_s, 1))
    return result


def emit(result: dict[str, Any]) -> None:
    """Child side of :func:`run_child`: print the result line."""
    print(RESULT_PREFIX + json.dumps(result, default=float), flush=True)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import numpy as np

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    info = {
        "cpu": cpu,
        "cores": cores,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import numba

        info["numba"] = numba.__version__
    except ImportError:
        pass
    return info


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str = "") -> str:
    """Print (and return) ``rows`` as an aligned text table of ``columns``."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells)
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_results(rows: Sequence[dict[str, Any]], out: str | os.PathLike | None, name: str,
                  meta: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``<out>/<name>.json`` (rows + meta) and ``<out>/<name>.csv`` (flat rows)."""
    out_dir = Path(out) if out else Path(__file__).resolve().parent / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath = out_dir / f"{name}.json"
    cpath = out_dir / f"{name}.csv"
    jpath.write_text(json.dumps({"meta": meta, "rows": list(rows)}, indent=1, default=float))
    flat = [{k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in rows]
    keys: list[str] = []
    for r in flat:
        keys.extend(k for k in r if k not in keys)
    with open(cpath, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(flat)
    print(f"wrote {jpath} and {cpath}", flush=True)
    return jpath, cpath
