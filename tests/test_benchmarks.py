"""The benchmark runner (``python -m workflows.benchmarks``) and the result files the docs cite.

Every ``results/...`` file named in the docs must exist and record the commit and the
machine it was measured on, and no result file may lie in the folder uncited; the
runner must write that provenance and put each figure beside its baseline.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "workflows" / "benchmarks" / "results"
# The runner lives with the benchmarks, outside the package: import it from the checkout.
sys.path.insert(0, str(ROOT))
runner = importlib.import_module("workflows.benchmarks.runner")
registry = importlib.import_module("workflows.benchmarks.registry")

#: A citation: ``results/`` then a file name (a glob or brace pattern is caught, not skipped).
CITATION = re.compile(r"results/([A-Za-z0-9_][A-Za-z0-9_.*{},\-]*)")
SHA = re.compile(r"^[0-9a-f]{40}$")


def _doc_files() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.rst") if "_build" not in p.parts and "generated" not in p.parts]
    return [*docs, ROOT / "README.md"]


def cited_results() -> dict[str, list[str]]:
    """Cited name -> the doc files citing it."""
    cited: dict[str, list[str]] = {}
    for path in _doc_files():
        for name in CITATION.findall(path.read_text()):
            cited.setdefault(name.rstrip("."), []).append(str(path.relative_to(ROOT)))
    return cited


def test_the_docs_cite_result_files():
    # Guards the two tests below against passing on nothing when the pattern stops matching.
    assert len(cited_results()) >= 20


def test_every_cited_result_exists_and_records_commit_and_machine():
    problems = []
    for name, where in sorted(cited_results().items()):
        path = RESULTS / name
        if not name.endswith(".json") or not path.is_file():
            problems.append(f"{name} (cited in {', '.join(sorted(set(where)))}): cite one existing .json file by name")
            continue
        data = json.loads(path.read_text())
        commit = data.get("commit") or {}
        if not SHA.match(str(commit.get("sha", ""))):
            problems.append(f"{name}: no commit hash (run it through the runner, or `python -m workflows.benchmarks "
                            f"adopt {path.relative_to(ROOT)}`)")
        machine = data.get("machine")
        if not (isinstance(machine, dict) and machine.get("cpu") and machine.get("cores")) and machine != "unknown":
            problems.append(f"{name}: no machine (cpu and cores, or 'unknown' where it cannot be recovered)")
    assert not problems, "\n".join(problems)


def _committed_results() -> list[str]:
    """Result files git tracks (a local run's uncommitted output is not the repository's)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--", str(RESULTS)], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file counts
        return [p.name for p in RESULTS.iterdir()]
    return [Path(name).name for name in listed]


def test_the_results_folder_holds_only_cited_files():
    cited = set(cited_results())
    uncited = sorted(name for name in _committed_results() if name not in cited)
    assert not uncited, (f"result files no doc cites (git keeps the history; delete them or cite them from "
                         f"docs/): {uncited}")


# --- the runner ---------------------------------------------------------------------------

#: A benchmark script in miniature: a baseline and a candidate row, whose figures change
#: from run to run (x1, x3, x2) so the median over three runs is known: x2.
TINY = """
    import sys
    from pathlib import Path
    sys.path.insert(0, {bench_dir!r})
    from fit_tools import write_results

    args = sys.argv[1:]
    counter = Path({counter!r})
    k = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(k + 1))
    scale = (1.0, 3.0, 2.0)[k]
    rows = [{{"n": 10, "method": "baseline", "fit_s": 4.0 * scale, "peak_mb": 100.0}},
            {{"n": 10, "method": "candidate", "fit_s": 1.0 * scale, "peak_mb": 50.0}}]
    write_results(rows, args[args.index("--out") + 1], "tiny", {{"quick": "--quick" in args}})
"""


@pytest.fixture
def tiny(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(textwrap.dedent(TINY.format(bench_dir=str(registry.HERE), counter=str(tmp_path / "runs"))))
    comparison = registry.BaselineRows("method", "baseline", ("n",), ("fit_s", "peak_mb"))
    return registry.Benchmark("tiny", str(script), "a test's benchmark", key=("n", "method"), comparison=comparison)


def _check_provenance(result: dict) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert result["commit"]["sha"] == head and isinstance(result["commit"]["dirty"], bool)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", result["date"])
    machine = result["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and machine["memory_gib"] > 0
    assert any(lib["user_api"] == "blas" for lib in machine["blas"])
    assert {"python", "numpy", "scipy", "dask", "distributed", "zarr", "daskkrr"} <= set(result["versions"])


def test_run_records_provenance_medians_and_ratios_to_the_baseline(tiny):
    result = runner.run(tiny, quick=True, repeat=3)
    _check_provenance(result)
    assert result["params"]["quick"] and result["params"]["script_args"] == ["--quick"]
    table = result["tables"]["tiny"]
    assert len(table["runs"]) == 3
    rows = {r["method"]: r for r in table["rows"]}
    # The medians of (1, 3, 2) x the figures: exact, as they are sums of small binary fractions.
    assert rows["candidate"]["fit_s"] == 2.0 and rows["baseline"]["fit_s"] == 8.0 and rows["candidate"]["runs"] == 3
    ratios = {c["figure"]: (c["value"], c["baseline"], c["ratio"]) for c in table["comparison"]}
    assert ratios == {"fit_s": (2.0, 8.0, 0.25), "peak_mb": (50.0, 100.0, 0.5)}


def test_run_records_the_commit_at_its_start_and_a_change_during_it(tiny, monkeypatch):
    states = iter([{"sha": "a" * 40, "dirty": False}, {"sha": "b" * 40, "dirty": True}])
    monkeypatch.setattr(runner, "commit_info", lambda: next(states))
    commit = runner.run(tiny, quick=True)["commit"]
    assert commit["sha"] == "a" * 40 and commit["dirty"] is False
    assert commit["changed_during_run"] == {"sha": "b" * 40, "dirty": True}


def test_median_keeps_rows_that_share_a_key_within_a_run_apart():
    runs = [[{"k": "a", "x": 1}, {"k": "a", "x": 10}], [{"k": "a", "x": 3}, {"k": "a", "x": 30}]]
    assert [(r["x"], r["runs"]) for r in runner.median_rows(runs, ["k"])] == [(2, 2), (20, 2)]


def test_run_refuses_a_quick_run_the_script_cannot_do(tiny):
    no_quick = registry.Benchmark("tiny", tiny.script, "", key=tiny.key, quick_args=None)
    with pytest.raises(runner.BenchmarkError, match="no short size"):
        runner.run(no_quick, quick=True)


def test_compare_puts_two_results_side_by_side_with_ratios(tiny, capsys):
    a = runner.run(tiny, repeat=1)  # scale 1
    b = runner.run(tiny, repeat=1)  # scale 3
    rows = runner.print_compare(a, b)
    fit = {r["method"]: r["B/A"] for r in rows if r["figure"] == "fit_s"}
    assert fit == {"baseline": 3.0, "candidate": 3.0}
    assert {r["B/A"] for r in rows if r["figure"] == "peak_mb"} == {1.0}
    out = capsys.readouterr().out
    assert "B/A" in out and a["commit"]["sha"][:10] in out


def test_the_command_line_runs_a_registered_benchmark_and_compares_it(tiny, tmp_path, monkeypatch, capsys):
    """``run NAME --quick --output F -- ARGS`` then ``compare F F``, through the runner's command line with the
    test's tiny script registered (its script's run is a second); the real scripts' quick runs are slow."""
    monkeypatch.setitem(registry.BENCHMARKS, tiny.name, tiny)
    out = tmp_path / "tiny.json"
    assert runner.main(["run", "tiny", "--quick", "--output", str(out), "--", "--extra"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    _check_provenance(result)
    assert result["benchmark"] == "tiny" and result["params"]["script_args"] == ["--quick", "--extra"]
    assert {c["figure"] for c in result["tables"]["tiny"]["comparison"]} == {"fit_s", "peak_mb"}
    assert "ratio" in printed and f"wrote {out}" in printed
    assert runner.main(["compare", str(out), str(out)]) == 0
    assert re.search(r"fit_s\s+\S+\s+\S+\s+1(\.0)?\s*$", capsys.readouterr().out, re.MULTILINE)


# slow: the default run covers the command line's run and compare in
# tests/test_benchmarks.py::test_the_command_line_runs_a_registered_benchmark_and_compares_it (the tiny script);
# this one runs the engine_throughput script itself in new processes (18 s under load).
@pytest.mark.slow
def test_cli_runs_a_registered_benchmark_quick_and_compares_it(tmp_path):
    """``run engine_throughput --quick`` on tiny blocks (a few seconds), then ``compare`` against itself."""
    out = tmp_path / "engine.json"
    cmd = [sys.executable, "-m", "workflows.benchmarks"]
    run = subprocess.run([*cmd, "run", "engine_throughput", "--quick", "--output", str(out), "--",
                          "--dims", "5", "--centers", "100", "--rows", "1000", "--repeat", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    _check_provenance(result)
    assert result["benchmark"] == "engine_throughput"
    figures = {c["figure"] for c in result["tables"]["engine_throughput"]["comparison"]}
    assert figures == {"entries_per_s", "entries_per_s_vs_gemm", "entries_per_s_1_thread"}
    assert "ratio" in run.stdout
    cmp = subprocess.run([*cmd, "compare", str(out), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    assert re.search(r"fused_Mps\s+\S+\s+\S+\s+1(\.0)?\s*$", cmp.stdout, re.MULTILINE), cmp.stdout


# --- FALKON beside daskkrr in many_centers ------------------------------------------------

many_centers = importlib.import_module("workflows.benchmarks.many_centers")
falkon_cpu = importlib.import_module("workflows.benchmarks.falkon_cpu")


def _traced(M, method, rmse, trace):
    text = many_centers.trace_text([{"iteration": i + 1, "t_s": t, "rmse": e} for i, (t, e) in enumerate(trace)])
    return {"n": 10, "M": M, "method": method, "rmse": rmse, "rmse_trace": text}


def test_many_centers_times_falkon_and_daskkrr_to_each_others_final_error():
    rows = [_traced(20, "budget", 0.30, [(1.0, 0.50), (2.0, 0.33), (3.0, 0.30)]),
            _traced(20, "falkon", 0.32, [(4.0, 0.40), (5.0, 0.32)]),
            _traced(10, "budget", 0.35, [(1.0, 0.40), (1.5, 0.35)]),
            {"M": 30_000, "method": "falkon-probe", "held": True}]
    many_centers.add_reach_times(rows)
    daskkrr, falkon, small = rows[:3]
    # Each reaches the other's final error at its first iterate at or below it; equal error is the higher, 0.32.
    assert (daskkrr["reach_falkon_s"], falkon["reach_budget_s"]) == (3.0, None)
    assert daskkrr["equal_rmse"] == falkon["equal_rmse"] == 0.32
    assert (daskkrr["equal_error_s"], falkon["equal_error_s"]) == (3.0, 5.0)
    # Across M the targets stay daskkrr's (the budget fit's), never FALKON's.
    assert (falkon["reach_M10_s"], daskkrr["reach_M10_s"], small["reach_M20_s"]) == (5.0, 2.0, None)
    assert "equal_rmse" not in small and "reach_falkon_s" not in small


def test_many_centers_compares_each_fit_with_the_dense_route_and_with_falkon():
    rows = [{"M": 20, "method": m, "fit_s": s, "rmse": 0.3, "peak_mb": mb, "max_process_mb": mb, "equal_error_s": s}
            for m, s, mb in (("dense", 10.0, 300.0), ("budget", 20.0, 100.0), ("falkon", 40.0, 200.0))]
    out = runner.compare_to_baseline(rows, registry.BENCHMARKS["many_centers"])
    ratios = {(c["method"], c["against"], c["figure"]): c["ratio"] for c in out}
    assert ratios[("budget", "dense", "fit_s")] == 2.0 and ratios[("budget", "falkon", "fit_s")] == 0.5
    assert ratios[("budget", "falkon", "equal_error_s")] == 0.5 and ratios[("dense", "falkon", "peak_mb")] == 1.5
    assert ("falkon", "falkon", "fit_s") not in ratios and ("budget", "dense", "equal_error_s") not in ratios


@functools.cache
def _falkon_missing() -> str | None:
    """Why FALKON cannot run here, or None; asked once, and only by a test that needs it.

    The answer imports torch in FALKON's interpreter (about 7 CPU seconds): asked at the module's
    import, every run paid it while collecting, also the default run, whose tests here all do without.
    """
    return falkon_cpu.falkon_unavailable_reason()


@pytest.fixture
def needs_falkon() -> None:
    """Skip the test, with the reason, where FALKON's interpreter cannot import falkon and torch."""
    reason = _falkon_missing()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.slow  # two fresh processes, one of them torch's (about 20 s under load)
@pytest.mark.usefixtures("needs_falkon")
def test_many_centers_runs_falkon_with_its_test_rmse_after_every_iteration(tmp_path):
    rows = many_centers.main(["--methods", "falkon", "--centers", "200", "--n-train-rows", "3000", "--max-iter", "6",
                              "--trace-rmse", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    (row,) = rows
    assert "error" not in row, row
    trace = many_centers.parse_trace(row["rmse_trace"])
    assert [it for it, _, _ in trace] == list(range(1, row["n_iter"] + 1)) and 1 <= row["n_iter"] <= 6
    times = [t for _, t, _ in trace]
    assert times == sorted(times) and times[-1] <= row["fit_s"] + 0.01  # the callbacks' time is out of both
    # The last iterate is the fitted model: its RMSE (FALKON's callback, float32 predictions summed in float64,
    # written with 6 decimals: 5e-7 absolute on about 0.5) and the final predictions' differ by that rounding and
    # float32 round-off (eps 1.2e-7 times a few): 1e-5 relative bounds both.
    assert trace[-1][2] == pytest.approx(row["rmse"], rel=1e-5)
    assert trace[0][2] > row["rmse"]  # a first CG step does not reach the solution


@pytest.mark.slow  # two fresh torch processes (about 20 s under load)
@pytest.mark.usefixtures("needs_falkon")
def test_falkon_probe_holds_a_small_preconditioner_and_reports_the_allocation_error_beyond_its_limit():
    held = falkon_cpu.probe_preconditioner(500, limit_bytes=8 * 2**30, hold_s=30.0, max_cpu_mem=1e8)
    assert held["held"] and held["finished"] and "error" not in held, held
    assert held["M"] == 500 and held["matrix_mb"] == round(4 * 500**2 / 2**20, 1) and held["seconds"] >= 0
    # A limit 256 MiB above the interpreter's address space: a 1 GiB matrix cannot be allocated.
    beyond = falkon_cpu.probe_preconditioner(2**14, limit_bytes=(held["vm_base_mb"] + 256) * 2**20, hold_s=1.0)
    assert not beyond["held"] and "allocate" in beyond["error"], beyond


def test_run_child_counts_the_cpu_seconds_of_the_whole_process_tree():
    """Each process of the tree burns 0.5 CPU s: the figure holds both (the sampler misses at most
    its 0.05 s interval per process), and not much more (interpreter start-up, ~0.1 s each)."""
    sys.path.insert(0, str(ROOT / "workflows" / "benchmarks"))
    fit_tools = importlib.import_module("fit_tools")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
    script = burn + textwrap.dedent(f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {burn!r}], check=True)
        print("{fit_tools.RESULT_PREFIX}" + '{{"done": true}}')
        """)
    result = fit_tools.run_child(["-c", script], timeout=120)
    assert result["n_processes"] == 2 and "error" not in result, result
    assert 0.85 <= result["cpu_s"] <= 2.0, result
