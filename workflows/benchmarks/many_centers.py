"""Many centers (issue 39): the dense preconditioner on the client against the tiled one.

The dense route holds ``3 x 8 M^2`` bytes of ``M x M`` matrices in the client process
(60 GB at M = 50 000); the tiled route (:mod:`daskkrr.parallel.tiled_falkon`) holds the
factors as ``2048 x 2048`` tiles on the workers or spilled to a Zarr store, and no process
holds an ``M x M`` matrix. This script fits the same data at several ``M`` on each route,
side by side.

Data: ``X`` standard normal (d = 20, float32), ``y = sin(x_1 + x_2 + x_3) + 0.1 noise``,
``n`` training and 20 000 test rows, written once to a Zarr store under ``--data-dir``.
Gaussian kernel, sigma = sqrt(20), penalty 1e-6, uniform centers (``random_state=0``),
``tol=1e-4``, ``max_iter=--max-iter``, Dask's threaded scheduler, the strategy the cost
model picks, ``preconditioner_rows=None`` on both routes (the tiled route builds FALKON's own
preconditioner, so the dense one does too: the comparison is of the factorisations).

Methods, each fit in a fresh process:

- ``dense``: ``preconditioner_route="dense"``;
- ``tiled-memory``: ``preconditioner_route="tiled"``, tiles in memory;
- ``tiled-zarr``: ``memory_budget`` of 64 MiB: the cost model takes the tiled route and spills
  the tiles to Zarr;
- ``budget``: ``memory_budget=--memory-budget`` (default 12e9 bytes, the issue's bound): the cost model
  chooses the route and where the tiles live (the issue's figure at M = 50 000);
- ``workers``: a ``LocalCluster`` of ``--workers`` single-threaded worker processes, each with a
  ``memory_limit`` below one ``M x M`` float32 matrix (``--worker-memory``, default 90% of
  ``4 M^2`` bytes), ``preconditioner_route="tiled"``: the tiles live on the workers (or are
  spilled where the cost model says they do not fit) and no process holds an ``M x M`` matrix.
  Its coefficients and test predictions are compared with the ``tiled-memory`` fit of the same run
  where there is one (one process, the same algorithm), else the ``dense`` one (``reference``;
  ``coef_rel_diff``, ``pred_rel_diff``: relative 2-norm differences);
- ``falkon``: FALKON itself (``falkon.Falkon``, CPU build without KeOps, its own interpreter: see
  ``falkon_cpu.py``; not in the default ``--methods``) on the same rows, kernel, sigma, penalty, ``M`` and
  CG iterations, float32, with kernel blocks of at most ``--falkon-max-cpu-mem`` bytes; with
  ``--trace-rmse`` its test RMSE after every CG iteration (FALKON's own validation callback).

``solve_s`` is the CG phase, the figure the tiled route's speed is judged by: run the script
through ``python -m workflows.benchmarks run many_centers --repeat 3`` for medians of 3, the
methods interleaved on the (shared) machine.

Columns: fit time and the time of each stage (centers, preconditioner, operator, solve), CG
iterations, test RMSE, peak memory (sum of the per-process peaks) and the largest single
process, the route and its reason (``preconditioner_route_``). On the tiled route the
preconditioner's parts too: ``factor_T_s`` (``K_MM``'s tiles and their Cholesky), ``lauum_s``
(``T T^T``), ``factor_A_s``; ``iteration_s``, the median seconds of a CG iteration; ``load_mean`` and
``load_max``, the 1-minute load average sampled every 15 s during the fit (the machine is shared).

``--trace-rmse``: the test RMSE of every CG iterate, with the seconds since the fit started at which
that iterate was there (``rmse_trace``): the iterates' preconditioned vectors are kept during the CG
and turned into coefficients in one tiled solve after it (its seconds, ``trace_s``, are taken out of
``fit_s`` and ``solve_s``). Each traced fit then gets ``reach_M{m}_s``: the first time its iterate's
test RMSE was at most the final test RMSE of the fit with ``m`` centers (the time to reach it), and, against
the other traced methods at the same ``M``, ``reach_{method}_s`` (the time to reach that method's final test
RMSE), ``equal_rmse`` (the highest final test RMSE of the traced methods at that ``M``, which each reaches)
and ``equal_error_s`` (the time to reach it): FALKON's and daskkrr's time to equal test error.

``--engine fused|blas|numpy``: every daskkrr fit computes its kernel blocks with that engine (``$DASKKRR_ENGINE``,
in the client and in the workers it starts). Under the default ``auto`` the workers of the ``workers`` method, below
1 GiB each, use the BLAS engine and a fit in one process the fused one: their float32 kernel entries round differently,
and at a large ``M`` and a small penalty that alone moves the CG's path and stopping point (see how_it_works,
"Across workers"); ``--engine fused`` compares the routes on the same kernel entries.

``--pin-cores``: the methods of one ``M`` are fitted at the same time, each in its own process pinned to its own
core with one BLAS/OpenMP/numba/torch thread (``cores``): FALKON and daskkrr side by side under the same load,
which fitting them one after the other on a shared machine does not give.

``--falkon-max-m-probe M1,M2,...``: the largest ``M`` FALKON's preconditioner holds here. Each ``M``
starts FALKON's preconditioner alone (``falkon_cpu.probe_preconditioner``: one ``M x M`` float32
matrix, factorised in place, and kernel blocks of ``--falkon-max-cpu-mem`` bytes while ``K_MM`` is
computed, as in the fit) in a process limited to ``--falkon-probe-limit`` bytes of address space,
and stops it 5 s after its Cholesky factorisation has started (rows ``method = falkon-probe``: ``held``,
the RSS then, or the error). A probe runs only while the machine has its memory available.

Sizes: ``--quick`` n = 50 000, M = 2000 and 6000; the full size is the issue's, n = 1e6,
M = 10 000, 20 000 and 50 000 (the dense route is left out where its matrices exceed the
machine's memory, ``--dense-max``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, sine_store, write_results  # noqa: E402

N_TEST = 20_000
D = 20
PENALTY = 1e-6
METHODS = ("dense", "tiled-memory", "tiled-zarr", "budget", "workers")
#: FALKON itself (not in the default methods: it needs its own interpreter, see falkon_cpu.py).
FALKON = "falkon"
#: ``--falkon-max-cpu-mem``: FALKON's default (no bound) asks for the whole ``n x M`` kernel block at once on
#: the CPU (80 GB at n = 1e6, M = 20 000); 2 GB gives blocks of ``2e9 / (4 M)`` rows (25 000 at M = 20 000).
FALKON_BLOCK_MEM = 2e9
#: ``--falkon-probe-limit``: the probe's address space (the machine's 23.5 GiB less room for other sessions).
FALKON_PROBE_LIMIT = 22 * 2**30
#: memory_budget of the tiled-zarr method: far below any tiles, so they are spilled.
SPILL_BUDGET = 64 * 2**20


#: ``--memory-budget`` of the budget method: the issue's 12 GB for all processes.
DEFAULT_BUDGET = 12e9
#: Seconds between two samples of the load average.
LOAD_EVERY_S = 15.0


def method_params(method: str, memory_budget: float = DEFAULT_BUDGET) -> dict:
    """The estimator parameters of a method."""
    if method == "dense":
        return {"preconditioner_route": "dense"}
    if method in ("tiled-memory", "workers"):
        return {"preconditioner_route": "tiled"}
    if method == "budget":
        return {"memory_budget": int(memory_budget)}
    return {"memory_budget": SPILL_BUDGET}


def worker_memory(M: int, given: int | None) -> int:
    """Each worker's memory limit: ``given``, else 90% of one ``M x M`` float32 matrix."""
    return int(given) if given else int(0.9 * 4 * M * M)


# --------------------------------------------------------------------------- child
def child(args: argparse.Namespace) -> dict:
    if args.child != "workers":
        return fit_child(args)
    from distributed import Client, LocalCluster

    from daskkrr.parallel.client import local_cluster_kwargs

    limit = worker_memory(args.centers, args.worker_memory)
    with LocalCluster(**local_cluster_kwargs(args.workers, memory_limit=limit)) as cluster, Client(cluster) as client:
        with client.as_current():
            result = fit_child(args)
    return {**result, "workers": args.workers, "worker_memory_mb": limit / 2**20,
            "matrix_mb": 4 * args.centers**2 / 2**20}


def fit_child(args: argparse.Namespace) -> dict:
    import dask.array as da
    import zarr

    from daskkrr import FalkonRegressor
    from daskkrr.events import SolverStep, StageDone, subscribe

    g = zarr.open_group(args.store, mode="r")
    n = args.n_train
    X, y = da.from_zarr(g["X"]), da.from_zarr(g["y"])
    stage_s: dict[str, float] = {}
    steps: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, StageDone):
            stage_s[event.stage] = stage_s.get(event.stage, 0.0) + event.seconds
        elif isinstance(event, SolverStep):
            steps.append(time.perf_counter())

    model = FalkonRegressor(n_centers=args.centers, penalty=PENALTY, dtype="float32", max_iter=args.max_iter,
                            tol=1e-4, random_state=0, preconditioner_rows=None,
                            **method_params(args.child, args.memory_budget))
    parts = PartTimer()
    trace = IterateTrace() if args.trace_rmse else None
    with subscribe(on_event), parts, LoadSampler() as load, (trace or contextlib.nullcontext()):
        t = time.perf_counter()
        if trace is not None:
            trace.start = t
        model.fit(X[:n], y[:n])
        fit_s = time.perf_counter() - t
    pred = np.asarray(model.predict(X[n:]).compute())
    yt = np.asarray(g["y"][n:])
    if args.save:  # for the comparison of the workers' fit with the dense one
        np.savez(args.save, coef=np.asarray(model.coef_), pred=pred)
    route = model.preconditioner_route_
    out = dict(fit_s=fit_s, **{f"{k}_s": v for k, v in stage_s.items()}, **parts.seconds, **load.summary(),
               iteration_s=float(np.median(np.diff(steps))) if len(steps) > 1 else float("nan"),
               rmse=float(np.sqrt(np.mean((pred - yt) ** 2))), n_iter=int(model.n_iter_),
               strategy=model.strategy_, route=route["route"], storage=route["storage"], reason=route["reason"])
    if trace is not None:  # the trace's own solve is not the fit's: take it out
        out.update(fit_s=fit_s - trace.seconds, solve_s=out.get("solve_s", 0.0) - trace.seconds,
                   trace_s=trace.seconds, rmse_trace=trace_text(trace.rmse(model, X[n:], yt)))
    return out


def trace_text(points: list[dict]) -> str:
    """The RMSE trace as text, ``"iteration@seconds:rmse; ..."`` (the runner keeps text fields, not lists)."""
    return "; ".join(f"{p['iteration']}@{p['t_s']:.1f}s:{p['rmse']:.6f}" for p in points)


def parse_trace(text: str) -> list[tuple[int, float, float]]:
    """``[(iteration, seconds, rmse)]`` of :func:`trace_text`'s text."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        it, rest = part.split("@")
        t, rmse = rest.split("s:")
        out.append((int(it), float(t), float(rmse)))
    return out


class LoadSampler:
    """The 1-minute load average every :data:`LOAD_EVERY_S` seconds while the context is open."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(LOAD_EVERY_S):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        return {"load_mean": round(float(np.mean(self.samples)), 2), "load_max": round(max(self.samples), 2),
                "load_15min_end": round(os.getloadavg()[2], 2)}


class PartTimer:
    """Seconds of the tiled preconditioner's parts, timed by wrapping its module's functions while open."""

    PARTS = {"kernel_cholesky": "factor_T_s", "upper_times_transpose": "lauum_s"}

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[object, str, object]] = []

    def _wrap(self, owner: object, name: str, label: str) -> None:
        raw = vars(owner)[name]
        original = raw.__func__ if isinstance(raw, staticmethod) else raw

        def timed(*a: object, **k: object) -> object:
            t = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t

        self._saved.append((owner, name, raw))
        setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)

    def __enter__(self) -> PartTimer:
        from daskkrr.parallel import tiled_falkon

        for name, label in self.PARTS.items():
            self._wrap(tiled_falkon, name, label)
        self._wrap(tiled_falkon.TiledFalkonPreconditioner, "_factor_inner", "factor_A_s")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


class IterateTrace:
    """Keeps each CG iterate (the preconditioned ``beta``, from the solver's state hook) with the time it was
    there, and ``mu`` of the intercept; after the CG, while the preconditioner is still open, turns them all
    into coefficients in one solve (``seconds``); :meth:`rmse` then predicts the test rows with each."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.betas: dict[int, tuple[float, np.ndarray]] = {}
        self.coefs: np.ndarray | None = None
        self.mu: np.ndarray | None = None
        self.seconds = 0.0

    def __enter__(self) -> IterateTrace:
        from daskkrr.pipeline import stages

        self._stages = stages
        self._solve, self._split = stages.falkon_solve, stages.split_column_sums

        def split(*a: object, **k: object) -> tuple:
            b, mu = self._split(*a, **k)
            self.mu = None if mu is None else np.asarray(mu, dtype=np.float64).reshape(-1)
            return b, mu

        def solve(pre: object, gram_matvec: object, b: object, *, on_state: object = None, state_every: int = 1,
                  **k: object) -> tuple:
            def keep(state: object) -> None:
                it = len(state.history) - 1
                self.betas.setdefault(it, (time.perf_counter() - self.start, np.array(state.x, dtype=np.float64)))
                if on_state is not None and it % state_every == 0:
                    on_state(state)

            out = self._solve(pre, gram_matvec, b, on_state=keep, state_every=1, **k)
            t = time.perf_counter()
            betas = np.concatenate([self.betas[i][1] for i in sorted(self.betas)], axis=1)
            self.coefs = np.concatenate([pre.to_coefficients(betas[:, a:a + 32]) for a in range(0, betas.shape[1], 32)],
                                        axis=1)
            self.seconds = time.perf_counter() - t
            return out

        stages.falkon_solve, stages.split_column_sums = solve, split
        return self

    def __exit__(self, *exc: object) -> None:
        self._stages.falkon_solve, self._stages.split_column_sums = self._solve, self._split

    def rmse(self, model: object, X_test: object, y_test: np.ndarray) -> list[dict]:
        """``[{iteration, t_s, rmse}]``: each iterate's test RMSE (the model's coefficients swapped in)."""
        coef, intercept = model.coef_, model.intercept_
        y_mean = intercept + (0.0 if self.mu is None else self.mu @ coef)  # intercept_ = y_mean - mu @ coef_
        rows = []
        try:
            for k, it in enumerate(sorted(self.betas)):
                c = self.coefs[:, k]
                model.coef_, model.intercept_ = c, y_mean - (0.0 if self.mu is None else self.mu @ c)
                pred = np.asarray(model.predict(X_test).compute())
                rows.append({"iteration": it, "t_s": round(self.betas[it][0], 2),
                             "rmse": float(np.sqrt(np.mean((pred - y_test) ** 2)))})
        finally:
            model.coef_, model.intercept_ = coef, intercept
        return rows


# --------------------------------------------------------------------------- parent
def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 50 000, M = 2000 and 6000")
    ap.add_argument("--centers", default=None, help="comma-separated M (default: by size)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--dense-max", type=int, default=30_000,
                    help="largest M fitted on the dense route (3 x 8 M^2 bytes in one process)")
    ap.add_argument("--workers", type=int, default=4, help="worker processes of the workers method")
    ap.add_argument("--memory-budget", type=float, default=DEFAULT_BUDGET,
                    help="memory_budget (bytes) of the budget method (default: the issue's 12e9)")
    ap.add_argument("--trace-rmse", action="store_true",
                    help="the test RMSE of every CG iterate and the time to reach each other M's test RMSE")
    ap.add_argument("--worker-memory", type=int, default=None,
                    help="memory_limit of each worker in bytes (default: 90%% of one M x M float32 matrix)")
    ap.add_argument("--falkon-max-cpu-mem", type=float, default=FALKON_BLOCK_MEM,
                    help="bytes of FALKON's kernel blocks (FalkonOptions.max_cpu_mem) in the falkon method")
    ap.add_argument("--falkon-max-m-probe", default="",
                    help="comma-separated M: start FALKON's preconditioner at each, alone (see above)")
    ap.add_argument("--falkon-probe-limit", type=float, default=FALKON_PROBE_LIMIT,
                    help="address-space limit (bytes) of each FALKON probe process")
    ap.add_argument("--engine", choices=("auto", "fused", "blas", "numpy"), default="auto",
                    help="the kernel engine of every daskkrr fit, client and workers alike ($DASKKRR_ENGINE; auto: "
                         "workers below 1 GiB use the BLAS engine, the client the fused one)")
    ap.add_argument("--pin-cores", action="store_true",
                    help="fit the methods of one M at the same time, each pinned to its own core with one thread "
                         "(FALKON and daskkrr side by side under the same load)")
    ap.add_argument("--n-train-rows", type=int, default=None, help="training rows (default: by size)")
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=24 * 3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--n-train", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.centers = int(args.centers)
        emit(child(args))
        return []
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    n = args.n_train_rows or (50_000 if args.quick else 1_000_000)
    sizes = [int(m) for m in args.centers.split(",")] if args.centers else (
        [2000, 6000] if args.quick else [10_000, 20_000, 50_000])
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - {*METHODS, FALKON})
    if unknown:
        ap.error(f"--methods: unknown {unknown}; choose among {', '.join((*METHODS, FALKON))}")
    store = sine_store(Path(args.data_dir), "many_centers", n, N_TEST, D)
    rows: list[dict] = [probe_row(M, args.falkon_probe_limit, args.falkon_max_cpu_mem) for M in
                        sorted(int(m) for m in args.falkon_max_m_probe.split(",") if m)]
    for M in sizes:
        todo = [m for m in methods if not (m == "dense" and M > args.dense_max)]
        if args.pin_cores:
            cores = sorted(os.sched_getaffinity(0))
            if len(todo) > len(cores):
                ap.error(f"--pin-cores: {len(todo)} methods at M = {M} but {len(cores)} cores to pin them to")
            with ThreadPoolExecutor(len(todo)) as pool:
                jobs = [pool.submit(fit_method, args, method, store, n, M, [core])
                        for method, core in zip(todo, cores)]
                fitted = [job.result() for job in jobs]
        else:
            fitted = [fit_method(args, method, store, n, M) for method in todo]
        saved: dict[str, Path] = {}
        for row, path in fitted:
            if path is not None:
                saved[row["method"]] = path
                reference = reference_method(row["method"], saved)
                if reference is not None:
                    row.update(compare_fits(saved[reference], path), reference=reference)
                    print(json.dumps({k: row[k] for k in ("M", "method", "reference", "coef_rel_diff",
                                                          "pred_rel_diff")}, default=float), flush=True)
            rows.append(row)
    add_reach_times(rows)
    info = machine()
    title = (f"many centers, {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB; d = {D}, float32, "
             f"penalty {PENALTY:g}, tol 1e-4, max_iter {args.max_iter}; one run each")
    reach = sorted({k for r in rows for k in r if k.startswith("reach_")})
    fits = [r for r in rows if r["method"] != PROBE]
    if len(fits) < len(rows):
        print_table([r for r in rows if r["method"] == PROBE],
                    ["M", "method", "held", "matrix_mb", "vm_base_mb", "rss_mb", "seconds", "peak_mb", "limit_mb",
                     "error"], f"FALKON's preconditioner alone, address space limited to "
                               f"{args.falkon_probe_limit / 2**30:g} GiB")
    print_table(fits, ["n", "M", "method", "fit_s", "centers_s", "preconditioner_s", "factor_T_s", "lauum_s",
                       "factor_A_s", "operator_s", "solve_s", "iteration_s", "n_iter", "rmse", *reach, "equal_rmse",
                       "equal_error_s", "peak_mb", "max_process_mb", "load_mean", "cores", "route", "storage",
                       "strategy", "coef_rel_diff", "pred_rel_diff"], title)
    write_results(rows, args.out, "many_centers_quick" if args.quick else "many_centers",
                  {"machine": info, "args": vars(args)})
    return rows


def fit_method(args: argparse.Namespace, method: str, store: Path, n: int, M: int,
               cpus: list[int] | None = None) -> tuple[dict, Path | None]:
    """One fit of ``method`` (FALKON's or daskkrr's) in a fresh process pinned to ``cpus`` if given: its row
    (printed as soon as it is there) and where its coefficients and predictions were saved (None for FALKON and
    for a fit that failed)."""
    head = {"n": n, "M": M, "method": method, **({"cores": cpus} if cpus is not None else {})}
    if method == FALKON:
        row, path = {**head, **falkon_fit(args, store, n, M, cpus)}, None
    else:
        path = Path(args.data_dir) / f"many_centers_fit_{method}_M{M}.npz"
        row = {**head, **fit_once(args, method, store, n, M, path, cpus)}
    print(json.dumps(row, default=float), flush=True)
    return row, (path if "error" not in row else None)


def fit_once(args: argparse.Namespace, method: str, store: Path, n: int, M: int, save: Path,
             cpus: list[int] | None = None) -> dict:
    """One fit of ``method`` in a fresh process (its coefficients and predictions saved to ``save``), pinned to
    ``cpus`` if given."""
    argv = [__file__, "--child", method, "--store", str(store), "--n-train", str(n), "--centers", str(M),
            "--max-iter", str(args.max_iter), "--workers", str(args.workers), "--save", str(save)]
    if args.worker_memory:
        argv += ["--worker-memory", str(args.worker_memory)]
    argv += ["--memory-budget", str(args.memory_budget)] + (["--trace-rmse"] if args.trace_rmse else [])
    # the variable reaches the child and the workers it starts: their kernel blocks come from one engine
    env = {} if args.engine == "auto" else {"DASKKRR_ENGINE": args.engine}
    res = run_child(argv, timeout=args.timeout, cpus=cpus, env=env)
    if "error" in res:
        print(f"M={M} {method}: failed: {res['error'][-600:]}", flush=True)
        return {"error": res["error"][-600:]}
    per_process = res.pop("peak_per_process_mb", {})
    return {**res, "max_process_mb": max(per_process.values(), default=float("nan"))}


def add_reach_times(rows: list[dict]) -> None:
    """``reach_M{m}_s`` of each traced row: when (seconds since its fit started) its iterate first had at most the
    final test RMSE of the fit with ``m`` centers (the budget method's fit where there is one, else the first),
    None if it never did; and among the traced rows of one ``M`` (FALKON's beside daskkrr's),
    ``reach_{method}_s`` (the time to reach that method's final test RMSE), ``equal_rmse`` (the highest of their
    final test RMSEs) and ``equal_error_s`` (the time to reach it)."""
    fits = [r for r in rows if "error" not in r and r["method"] != PROBE]
    final = {}
    for r in fits:
        if r["method"] != FALKON and (r["M"] not in final or r["method"] == "budget"):
            final[r["M"]] = r["rmse"]
    traced = [r for r in fits if r.get("rmse_trace")]
    for r in traced:
        for m, target in final.items():
            if m != r["M"]:
                r[f"reach_M{m}_s"] = time_to_reach(r["rmse_trace"], target)
        peers = [o for o in traced if o["M"] == r["M"]]
        for o in peers:
            if o is not r:
                r[f"reach_{o['method']}_s"] = time_to_reach(r["rmse_trace"], o["rmse"])
        if len(peers) > 1:
            r["equal_rmse"] = max(o["rmse"] for o in peers)
            r["equal_error_s"] = time_to_reach(r["rmse_trace"], r["equal_rmse"])


def time_to_reach(trace: str, target: float) -> float | None:
    """The first time in an RMSE trace (:func:`trace_text`) at which the RMSE was at most ``target``, or None."""
    return next((t for _, t, rmse in parse_trace(trace) if rmse <= target), None)


def falkon_fit(args: argparse.Namespace, store: Path, n: int, M: int, cpus: list[int] | None = None) -> dict:
    """FALKON (``falkon_cpu.run_falkon``: a fresh process in its own interpreter) on the rows the daskkrr methods
    fit, or ``error`` (why FALKON is not available, or the tail of its stderr).

    Same problem: both libraries minimise ``(1/n) sum (f(x_i) - y_i)^2 + lambda ||f||^2`` over
    ``f = sum_j c_j k(., z_j)``: daskkrr's ``penalty`` is this ``lambda`` (its docstring), and FALKON's
    ``penalty`` is too (its CG solves ``(K_nM^T K_nM / n + penalty K_MM) c = K_nM^T y / n``,
    ``FalkonConjugateGradient.falkon_mmv``). The features are standardised as daskkrr's ``standardize=True``
    does (the training rows' mean and population std); FALKON has no intercept, so it gets the training targets
    centred and the mean added back (daskkrr fits an unpenalised intercept, a difference of one constant). Its
    M centers are drawn uniformly by FALKON's own sampler (``seed=0``), not the same rows as daskkrr's.
    """
    import zarr
    from falkon_cpu import falkon_unavailable_reason, run_falkon

    reason = falkon_unavailable_reason()
    if reason is not None:
        return {"error": reason}
    g = zarr.open_group(store, mode="r")
    X, y = np.asarray(g["X"][:], dtype=np.float64), np.asarray(g["y"][:], dtype=np.float64)
    mean, std = X[:n].mean(axis=0), X[:n].std(axis=0)
    X = ((X - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)
    y_mean = float(y[:n].mean())
    with LoadSampler() as load:
        out = run_falkon(X[:n], y[:n] - y_mean, X[n:], model="regression", sigma=float(np.sqrt(D)), M=M,
                         penalty=PENALTY, maxiter=args.max_iter, seed=0, dtype="float32",
                         y_test=(y[n:] - y_mean) if args.trace_rmse else None,
                         max_cpu_mem=args.falkon_max_cpu_mem, timeout=args.timeout, cpus=cpus)
    if "error" in out:
        print(f"M={M} falkon: failed: {out['error'][-600:]}", flush=True)
        return {"error": out["error"][-600:], "peak_mb": out.get("peak_mb")}
    pred = np.asarray(out.pop("decision"), dtype=np.float64).ravel() + y_mean
    out.pop("classes", None)
    per_process = out.pop("peak_per_process_mb", {})
    trace = out.pop("rmse_trace", None)
    row = {**out, "rmse": float(np.sqrt(np.mean((pred - y[n:]) ** 2))), **load.summary(),
           "max_process_mb": max(per_process.values(), default=float("nan")),
           "max_cpu_mem": args.falkon_max_cpu_mem, "route": f"falkon {out.get('falkon', '?')} (cpu)"}
    if trace is not None:
        row["rmse_trace"] = trace_text([{"iteration": it, "t_s": t, "rmse": e} for it, t, e in trace])
    return row


#: The method name of a probe row (``--falkon-max-m-probe``).
PROBE = "falkon-probe"


def probe_row(M: int, limit: float, block_mem: float) -> dict:
    """One ``--falkon-max-m-probe`` row: FALKON's preconditioner at ``M`` (``falkon_cpu.probe_preconditioner``),
    run only while the machine has the memory it may take available (other processes share the machine)."""
    import psutil
    from falkon_cpu import probe_preconditioner

    need = min(limit, 4.0 * M * M + block_mem + 2**30)  # the matrix, blocks and interpreter, at most the limit
    available = psutil.virtual_memory().available
    if available < need:
        row = {"M": M, "method": PROBE, "held": None,
               "error": f"not run: {available / 2**30:.1f} GiB available, the probe may take {need / 2**30:.1f} GiB; "
                        f"run it again when the machine is free"}
    else:
        row = {"method": PROBE, **probe_preconditioner(M, limit_bytes=limit, d=D, sigma=float(np.sqrt(D)),
                                                       penalty=PENALTY, max_cpu_mem=block_mem)}
    print(json.dumps(row, default=float), flush=True)
    return row


def reference_method(method: str, saved: dict) -> str | None:
    """The fit of the same run that ``method``'s is compared with: for ``workers`` the single-process
    ``tiled-memory`` fit where there is one (the same tiled factorisation code, in one process), else the
    ``dense`` fit. Every method fits with ``preconditioner_rows=None`` (:func:`fit_child`): FALKON's own
    preconditioner, so the fits differ by round-off and by where CG stops within its tolerance."""
    if method == "workers" and "tiled-memory" in saved:
        return "tiled-memory"
    return "dense" if method != "dense" and "dense" in saved else None


def compare_fits(reference: Path, other: Path) -> dict:
    """Relative 2-norm differences of the coefficients and test predictions of two saved fits."""
    a, b = np.load(reference), np.load(other)
    return {f"{k}_rel_diff": float(np.linalg.norm(b[k] - a[k]) / np.linalg.norm(a[k])) for k in ("coef", "pred")}


if __name__ == "__main__":
    main()
