"""Cold start: the first fit after an install, against a warm fit, in a fresh venv.

The fused engine is numba code, compiled on first use and cached on disk; the
package build compiles it into the installed package (``setup.py``). This workflow
measures what a user sees right after ``pip install``. Each repeat:

1. builds a fresh virtual environment and installs this checkout into it
   (``pip install <repo>``, not editable, so the package and its ``__pycache__``
   are new: whatever cache it has came with the install);
2. **first**: one fresh process fits (n = 1e5, d = 20, float32, M = 1000, 20
   iterations, as in issue 17) twice, recording the engine each fit ran on;
3. **warm**: ``--repeats`` more fresh processes fit twice each; the *warm*
   reference is the median of their second fits;
4. **background compile** (an install without a usable cache: a wheel built on
   another CPU): a fresh process with ``NUMBA_CACHE_DIR`` at a new empty folder, so
   ``engine="auto"`` runs the BLAS engine while a background process compiles;
   then waits for that compile (``daskkrr.kernels.warmup.fused_ready``);
5. **inline compile** (the behaviour before either): an empty cache folder and
   ``DASKKRR_BACKGROUND_COMPILE=0``, so the first fit waits for the compiler.

Each row gives the median first-fit time over the repeats, its ratio to the warm
fit, and the peak memory of the process tree (a background compile is a separate
process started by the fit, hence counted).

``python workflows/benchmarks/cold_start.py`` (``--quick``: n = 2e4, one repeat).
Needs the package registries (the venv installs daskkrr's dependencies and the
build's; pip's cache makes that fast). Writes ``results/cold_start[_quick].{json,csv}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import REPO, emit, machine, print_table, run_child, write_results  # noqa: E402


def child(n: int) -> None:
    """Two fits in this process; the engine of each (after the fit: what auto picks now)."""
    import numpy as np

    import daskkrr
    from daskkrr import FalkonRegressor
    from daskkrr.kernels import GaussianKernel, engine_for

    kernel = GaussianKernel(sigma=20**0.5)
    engine_before = engine_for(kernel).name  # what the first fit's products run on
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 20)).astype(np.float32)
    y = (np.sin(X[:, :3].sum(axis=1)) + 0.3 * rng.standard_normal(n)).astype(np.float32)
    times, engines, rmse = [], [], []
    for _ in range(2):
        engines.append(engine_for(kernel).name)
        t0 = time.perf_counter()
        model = FalkonRegressor(n_centers=1000, sigma=20**0.5, penalty=1e-6, max_iter=20, random_state=0).fit(X, y)
        times.append(time.perf_counter() - t0)
        rmse.append(float(np.sqrt(np.mean((model.predict(X[:5000]) - y[:5000]) ** 2))))
    emit({"package": str(Path(daskkrr.__file__).parent), "engine_first": engine_before, "engines": engines,
          "fit1_s": times[0], "fit2_s": times[1], "train_rmse": rmse})


def _venv(path: Path) -> tuple[str, float]:
    """A fresh venv with this checkout installed; its python and the install's seconds."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = str(path / "bin" / "python")
    t0 = time.perf_counter()
    subprocess.run([python, "-m", "pip", "install", "-q", str(REPO)], check=True)
    return python, time.perf_counter() - t0


def _fused_ready(python: str, env: dict[str, str]) -> bool:
    code = "from daskkrr.kernels import warmup; print(warmup.fused_ready())"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                         cwd=tempfile.gettempdir())
    return out.stdout.strip() == "True"


def _wait_ready(python: str, env: dict[str, str], timeout: float = 600) -> float:
    t0 = time.monotonic()
    while not _fused_ready(python, env):
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("the background compile did not finish")
        time.sleep(1.0)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 2e4, one repeat")
    ap.add_argument("--n", type=int, default=None, help="training rows (default 100000)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child)
        return
    n = args.n or (20_000 if args.quick else 100_000)
    repeats = args.repeats or (1 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="daskkrr-cold-"))
    script = [str(Path(__file__).resolve()), "--child", str(n)]
    runs: list[dict[str, Any]] = []
    for rep in range(repeats):
        python, install_s = _venv(work / f"venv-{rep}")
        print(f"repeat {rep}: installed in {install_s:.0f} s: {python}", flush=True)
        first = run_child(script, python=python)
        warm_runs = [run_child(script, python=python) for _ in range(repeats)]
        empty = {"NUMBA_CACHE_DIR": str(work / f"numba-cache-{rep}")}
        background = run_child(script, python=python, env=empty)
        waited = _wait_ready(python, empty)
        inline = run_child(script, python=python, env={"NUMBA_CACHE_DIR": str(work / f"numba-inline-{rep}"),
                                                      "DASKKRR_BACKGROUND_COMPILE": "0"})
        for r in (first, *warm_runs, background, inline):
            if "error" in r:
                raise RuntimeError(r["error"])
        warm = statistics.median(r["fit2_s"] for r in warm_runs)
        runs.append({"repeat": rep, "install_s": install_s, "first": first, "warm_runs": warm_runs,
                     "warm_s": warm, "background": background, "compile_wait_s": waited, "inline": inline})
        print(f"repeat {rep}: first fit {first['fit1_s']:.2f} s on {first['engine_first']}, warm {warm:.2f} s, "
              f"background compile {background['fit1_s']:.2f} s, inline compile {inline['fit1_s']:.2f} s",
              flush=True)
    rows = []
    for label, pick in (("first fit after install (engine compiled by the build)", lambda r: r["first"]),
                        ("first fit, second fresh process", lambda r: r["warm_runs"][0]),
                        ("first fit, no usable cache: BLAS engine, background compile", lambda r: r["background"]),
                        ("first fit, no usable cache: inline compile", lambda r: r["inline"])):
        first_s = statistics.median(pick(r)["fit1_s"] for r in runs)
        warm_s = statistics.median(r["warm_s"] for r in runs)
        rows.append({"case": label, "engine": pick(runs[0])["engine_first"], "first_fit_s": round(first_s, 3),
                     "warm_fit_s": round(warm_s, 3), "first_vs_warm": round(first_s / warm_s, 3),
                     "peak_mb": statistics.median(pick(r)["peak_mb"] for r in runs),
                     "train_rmse": round(pick(runs[0])["train_rmse"][0], 5)})
    print_table(rows, ["case", "engine", "first_fit_s", "warm_fit_s", "first_vs_warm", "peak_mb",
                             "train_rmse"],
                f"Cold start, n = {n}, d = 20, float32, M = 1000, 20 iterations; medians of {repeats}")
    print("install times: " + ", ".join(f"{r['install_s']:.0f} s" for r in runs))
    meta = {"machine": machine(), "n": n, "repeats": repeats, "python": python, "runs": runs}
    write_results(rows, args.out, "cold_start_quick" if args.quick else "cold_start", meta)


if __name__ == "__main__":
    main()
