"""Run a named benchmark, record where and on what it ran, and compare two results.

``python -m workflows.benchmarks run NAME [--quick] [--repeat K] [-- SCRIPT ARGS]`` runs
the benchmark's script ``K`` times, each time in a fresh interpreter (the scripts
themselves run each fit in a fresh process and measure the baseline in the same run),
takes the median of every numeric figure over the ``K`` runs, puts each figure beside its
baseline's with their ratio, and writes one JSON result with the commit, date, machine
and library versions. ``compare A.json B.json`` prints two results side by side with
ratios. ``adopt FILE`` adds to a result written before the runner existed the commit and
machine that can be recovered honestly (git log; the machine the script recorded, or
``"unknown"``).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .fit_tools import REPO, machine, print_table
from .registry import BENCHMARKS, BaselineRows, Benchmark, PairedColumns

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = 1
#: Distributions whose versions go into every result (the optional ones when installed).
LIBRARIES = ("numpy", "scipy", "dask", "distributed", "zarr", "numba", "daskkrr", "scikit-learn", "falkon", "torch",
             "threadpoolctl", "psutil")


class BenchmarkError(RuntimeError):
    """A benchmark could not be run or its result could not be read."""


# --- where and on what ------------------------------------------------------------------


def _git(*args: str) -> str:
    git = shutil.which("git") or "git"
    return subprocess.run([git, *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def commit_info() -> dict[str, Any]:
    """``HEAD``'s hash, and whether tracked files differ from it (the figures then measure uncommitted code)."""
    try:
        return {"sha": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"sha": "unknown", "dirty": None, "why": f"git failed in {REPO}: {exc}"}


def blas_info() -> list[dict[str, Any]]:
    """The BLAS/OpenMP libraries loaded after numpy and scipy's linear algebra, from threadpoolctl."""
    import numpy  # noqa: F401  (loads numpy's BLAS)
    import scipy.linalg  # noqa: F401  (and scipy's, which may be another)
    from threadpoolctl import threadpool_info

    keep = ("user_api", "internal_api", "version", "architecture", "threading_layer", "num_threads")
    return [{k: lib.get(k) for k in keep} | {"library": Path(lib["filepath"]).name} for lib in threadpool_info()]


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory and load (from :func:`fit_tools.machine`), plus the BLAS in use."""
    info = machine()
    info.update(logical_cpus=os.cpu_count(), platform=platform.platform(), blas=blas_info(),
                blas_env={k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "MKL", "OMP_"))})
    return info


def library_versions() -> dict[str, str]:
    """Python and the installed versions of :data:`LIBRARIES` (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


# --- running ------------------------------------------------------------------------------


def _is_figure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _row_key(row: dict[str, Any], key: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(row.get(k)) for k in key)


def _keyed(rows: Sequence[dict[str, Any]], key: Sequence[str]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Each row with its key and, after it, how many rows of ``rows`` had that key before.

    Some tables repeat a key within one run (two model rows for the same cluster size);
    the count keeps them apart instead of taking them for repeats of one row.
    """
    seen: dict[tuple[str, ...], int] = {}
    out = []
    for row in rows:
        k = _row_key(row, key)
        seen[k] = seen.get(k, 0) + 1
        out.append(((*k, str(seen[k])), row))
    return out


def median_rows(runs: Sequence[Sequence[dict[str, Any]]], key: Sequence[str]) -> list[dict[str, Any]]:
    """One row per ``key``: the median over the runs of each numeric field, other fields from the first run.

    Rows are lined up by ``key``, so a run that lost a row (a failed fit) does not shift
    the others; ``runs`` in a row says how many runs it came from.
    """
    order: list[tuple[str, ...]] = []
    grouped: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for rows in runs:
        for k, row in _keyed(rows, key):
            if k not in grouped:
                order.append(k)
            grouped.setdefault(k, []).append(row)
    out = []
    for k in order:
        group = grouped[k]
        merged: dict[str, Any] = {}
        for row in group:
            for name, value in row.items():
                if name in merged or isinstance(value, (dict, list)):
                    continue
                values = [r[name] for r in group if _is_figure(r.get(name))]
                merged[name] = statistics.median(values) if values and _is_figure(value) else value
        merged["runs"] = len(group)
        out.append(merged)
    return out


def _ratio(value: Any, baseline: Any) -> float | None:
    if not (_is_figure(value) and _is_figure(baseline)) or baseline == 0:
        return None
    return float(value) / float(baseline)


def compare_to_baseline(rows: Sequence[dict[str, Any]], bench: Benchmark) -> list[dict[str, Any]]:
    """Each figure beside its baseline's, measured in the same run, and their ratio (figure / baseline).

    With several comparisons (a tuple), each row also says ``against`` which baseline it is."""
    comparison = bench.comparison
    out: list[dict[str, Any]] = []
    if isinstance(comparison, tuple):
        for part in comparison:
            against = part.baseline if isinstance(part, BaselineRows) else ",".join(part.pairs)
            out.extend({**c, "against": against} for c in compare_to_baseline(rows, replace(bench, comparison=part)))
    elif isinstance(comparison, PairedColumns):
        for row in rows:
            for figure, (col, base_col) in comparison.pairs.items():
                out.append({**{k: row.get(k) for k in bench.key}, "figure": figure, "value": row.get(col),
                            "baseline": row.get(base_col), "ratio": _ratio(row.get(col), row.get(base_col))})
    elif isinstance(comparison, BaselineRows):
        c = comparison
        baselines = {_row_key(r, c.match): r for r in rows if str(r.get(c.column)) == c.baseline}
        for row in rows:
            base = baselines.get(_row_key(row, c.match))
            if base is None or base is row:
                continue
            for figure in c.figures:
                out.append({**{k: row.get(k) for k in bench.key}, "figure": figure, "value": row.get(figure),
                            "baseline": base.get(figure), "ratio": _ratio(row.get(figure), base.get(figure))})
    return out


def _run_script(bench: Benchmark, args: Sequence[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Run the script once in a fresh interpreter; return the tables it wrote, by file name.

    The script's output is passed on line by line as it comes (a full-size run takes hours,
    and its per-fit rows are the only record if it is stopped), and its tail is kept for the
    error message.
    """
    with tempfile.TemporaryDirectory(prefix=f"bench-{bench.name}-") as tmp:
        cmd = [sys.executable, "-u", str(bench.path), *args, "--out", tmp]
        tail: collections.deque[str] = collections.deque(maxlen=60)
        with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    print(line, end="", flush=True)
                    tail.append(line)
                returncode = proc.wait()
            finally:
                timed_out = not timer.is_alive() and proc.returncode != 0
                timer.cancel()
        if timed_out:
            raise BenchmarkError(f"{bench.path.name} ran past --timeout {timeout:g} s and was stopped "
                                 f"(command: {' '.join(cmd)})")
        if returncode != 0:
            raise BenchmarkError(f"{bench.path.name} exited with {returncode} (command: {' '.join(cmd)}); "
                                 f"its last output:\n{''.join(tail)[-3000:]}")
        tables = {p.stem: json.loads(p.read_text()) for p in sorted(Path(tmp).glob("*.json"))}
    if not tables:
        raise BenchmarkError(f"{bench.path.name} wrote no JSON result into its --out folder; it must write its rows "
                             "with fit_tools.write_results(rows, args.out, ...)")
    return tables


def run(bench: Benchmark, quick: bool = False, repeat: int = 1, script_args: Sequence[str] = (),
        timeout: float = 6 * 3600) -> dict[str, Any]:
    """Run ``bench`` ``repeat`` times and return its result (see the module docstring)."""
    if repeat < 1:
        raise BenchmarkError(f"--repeat must be at least 1, got {repeat}")
    if quick and bench.quick_args is None:
        raise BenchmarkError(f"benchmark {bench.name!r} has no short size: run it without --quick, or pass the "
                             f"script's own size arguments after '--' (python {bench.path} --help lists them)")
    args = [*(bench.quick_args or () if quick else ()), *script_args]
    started = dt.datetime.now(dt.UTC)
    # The code measured is the code at the start: a long run may outlive a commit or an edit.
    commit = commit_info()
    t0 = time.perf_counter()
    runs = [_run_script(bench, args, timeout) for _ in range(repeat)]
    at_end = commit_info()
    if at_end != commit:
        commit = {**commit, "changed_during_run": at_end}
    tables = {}
    for name in runs[0]:
        per_run = [r[name]["rows"] for r in runs if name in r]
        rows = median_rows(per_run, bench.key)
        tables[name] = {"rows": rows, "comparison": compare_to_baseline(rows, bench),
                        "script_meta": runs[0][name].get("meta", {}), "runs": per_run}
    return {
        "schema": SCHEMA, "benchmark": bench.name, "summary": bench.summary,
        "params": {"quick": quick, "repeat": repeat, "script_args": list(args),
                   "command": f"python -m workflows.benchmarks run {bench.name}" + (" --quick" if quick else "")
                   + (f" --repeat {repeat}" if repeat != 1 else "")
                   + (f" -- {' '.join(script_args)}" if script_args else "")},
        "commit": commit, "date": started.isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t0, 2), "machine": machine_info(), "versions": library_versions(),
        "summarised_by": "median over repeats", "tables": tables,
    }


# --- reading and printing ----------------------------------------------------------------


def load(path: str | os.PathLike) -> dict[str, Any]:
    """A result file: the runner's, or an older script's ``{"meta", "rows"}`` (read as one table)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchmarkError(f"cannot read the result {path}: {exc}") from exc
    if "tables" not in data:
        if "rows" not in data:
            raise BenchmarkError(f"{path} is not a benchmark result: it has neither 'tables' nor 'rows'")
        meta = data.get("meta") or {}
        data = {"machine": meta.get("machine", "unknown"), "params": {"script_args": meta.get("args", "unknown")},
                **data, "tables": {Path(path).stem: {"rows": data["rows"], "comparison": []}}}
    return data


def print_baseline_table(result: dict[str, Any]) -> None:
    """Print each table's figures beside their baselines, with the ratios."""
    bench = BENCHMARKS.get(result.get("benchmark", ""))
    key = list(bench.key) if bench else []
    for name, table in result["tables"].items():
        if table.get("comparison"):
            against = ["against"] if any("against" in c for c in table["comparison"]) else []
            print_table(table["comparison"], [*key, *against, "figure", "value", "baseline", "ratio"],
                        f"{name}: figure / baseline, both measured in this run ({result['summarised_by']})")
        else:
            print(f"{name}: {len(table['rows'])} rows (no baseline declared in registry.py)")


def _describe(result: dict[str, Any]) -> dict[str, str]:
    commit = result.get("commit") or {}
    m = result.get("machine")
    return {
        "benchmark": str(result.get("benchmark", "?")),
        "commit": f"{str(commit.get('sha', 'unknown'))[:10]}{' (dirty)' if commit.get('dirty') else ''}",
        "date": str(result.get("date", "unknown")),
        "machine": f"{m.get('cpu')}, {m.get('cores')} cores, load {m.get('load_average_1min')}"
        if isinstance(m, dict) else str(m or "unknown"),
        "params": json.dumps(result.get("params", {}).get("script_args", "unknown")),
    }


def compare(a: dict[str, Any], b: dict[str, Any], key: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of B beside the rows of A with the same key: each numeric figure, and B / A.

    ``key`` defaults to the registered benchmark's; results of unregistered scripts are
    lined up by their text columns.
    """
    bench = BENCHMARKS.get(str(a.get("benchmark", b.get("benchmark", ""))))
    out = []
    for name, table_a in a["tables"].items():
        table_b = b["tables"].get(name) or (next(iter(b["tables"].values())) if len(b["tables"]) == 1 else None)
        if table_b is None:
            continue
        rows_a, rows_b = table_a["rows"], table_b["rows"]
        text_cols = [k for k, v in rows_a[0].items() if isinstance(v, str)] if rows_a else []
        cols = list(key or (bench.key if bench else text_cols))
        by_key = dict(_keyed(rows_b, cols))
        for k, row_a in _keyed(rows_a, cols):
            row_b = by_key.get(k)
            if row_b is None:
                continue
            for figure, value in row_a.items():
                if figure in cols or figure == "runs" or not _is_figure(value) or not _is_figure(row_b.get(figure)):
                    continue
                out.append({**{k: row_a.get(k) for k in cols}, "figure": figure, "A": value, "B": row_b[figure],
                            "B/A": _ratio(row_b[figure], value)})
    return out


def print_compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Print where A and B were measured, then their figures side by side with B / A."""
    da, db = _describe(a), _describe(b)
    print_table([{"": k, "A": da[k], "B": db[k]} for k in da], ["", "A", "B"], "Results compared")
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    changed = [{"library": k, "A": va.get(k), "B": vb.get(k)} for k in sorted({*va, *vb}) if va.get(k) != vb.get(k)]
    if changed:
        print_table(changed, ["library", "A", "B"], "Library versions that differ")
    rows = compare(a, b)
    if not rows:
        raise BenchmarkError("no row of A has a row with the same key in B: are they results of the same benchmark?")
    cols = [k for k in rows[0] if k not in ("figure", "A", "B", "B/A")]
    print_table(rows, [*cols, "figure", "A", "B", "B/A"], "Figures (B / A: above 1 means B is larger)")
    return rows


# --- results written before the runner -----------------------------------------------------


def adopt(path: Path) -> dict[str, Any]:
    """Add the commit and machine that can be recovered to a result the runner did not write.

    The commit is the last one that changed the file (so the measured code is at or
    before it); the machine is what the script recorded, or ``"unknown"``. Nothing is
    guessed: a field that cannot be recovered says so.
    """
    data = json.loads(path.read_text())
    if "commit" in data and "machine" in data:
        return data
    rel = path.resolve().relative_to(REPO)
    sha, date = (_git("log", "-1", "--format=%H %cI", "--", str(rel)).split() or ["unknown", "unknown"])[:2]
    meta = data.get("meta") or {}
    recorded = meta.get("machine")
    data.update(
        commit={"sha": sha, "dirty": None,
                "source": "recovered: the last commit that changed this file; the measured code is at or before it"},
        date=date, date_source="the commit's date: the figures were measured at or before it",
        machine=recorded if recorded else "unknown",
        versions={k: recorded[k] for k in ("python", "numpy", "numba") if k in recorded} if recorded else {},
    )
    path.write_text(json.dumps(data, indent=1, default=float))
    return data


# --- command line ------------------------------------------------------------------------------


def _default_output(name: str, quick: bool) -> Path:
    return RESULTS / f"{name}{'_quick' if quick else ''}.json"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(prog="python -m workflows.benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the named benchmarks")
    p_run = sub.add_parser("run", help="run a named benchmark and write its result",
                           epilog="Arguments after '--' go to the benchmark's script unchanged.")
    p_run.add_argument("name", choices=sorted(BENCHMARKS))
    p_run.add_argument("--quick", action="store_true", help="the script's short size")
    p_run.add_argument("--repeat", type=int, default=1, help="runs of the whole script; figures are their median")
    p_run.add_argument("--output", type=Path, default=None,
                       help="result file (default: results/NAME[_quick].json beside this file)")
    p_run.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run of the script")
    p_cmp = sub.add_parser("compare", help="two results side by side, with ratios B / A")
    p_cmp.add_argument("a", type=Path)
    p_cmp.add_argument("b", type=Path)
    p_adopt = sub.add_parser("adopt", help="add the recoverable commit and machine to older result files")
    p_adopt.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        if args.command == "list":
            for bench in BENCHMARKS.values():
                print(f"{bench.name:26} {bench.summary}")
        elif args.command == "run":
            result = run(BENCHMARKS[args.name], args.quick, args.repeat, script_args, args.timeout)
            out = args.output or _default_output(args.name, args.quick)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1, default=float))
            print_baseline_table(result)
            print(f"wrote {out}")
        elif args.command == "compare":
            print_compare(load(args.a), load(args.b))
        else:
            for path in args.files:
                adopt(path)
                print(f"adopted {path}")
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
