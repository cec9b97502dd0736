"""One Dask worker vs two (and four), and the model that predicts the wall time for W workers.

Configurations (each in a fresh process, the same store, ``strategy="recompute"``
so that every iteration is a full pass of kernel computations):

- ``1 worker, 1 core``: one single-threaded worker whose engine is capped at one
  thread (``DASKKRR_ENGINE_THREADS=1``): the one-core baseline, and the run the
  model's per-row costs come from;
- ``1 worker, 2 engine threads``: one single-threaded worker; the host's spare
  core goes to the engine inside each task (the thread budget rule of
  :mod:`daskkrr.parallel.resources`);
- ``2 workers``: two single-threaded worker processes (daskkrr's default local
  cluster on 2 cores), each task on one engine thread;
- ``4 workers``: four single-threaded worker processes on the 2 cores;
- ``1 worker, 1 core, sketch on the workers`` and ``2 workers, sketch on the workers``:
  the same, with the preconditioner's sketch summed on the workers
  (``DASKKRR_SKETCH_ON=workers``, :mod:`daskkrr.parallel.sketch_pass`) rather than on the
  client, the cost model's choice on this host, whose client has the workers' cores;
  the profile of the plan's third preconditioner, and its check at two workers;
- ``1 worker, 1 core, FALKON's own``: the baseline again with ``preconditioner_rows=None``
  (no row sketch) and the estimator's default ``max_iter=50``, so that it runs to the
  same tolerance as the sketch (at ``max_iter=10`` it stops short of it, 2% above the
  sketch's test error): the profile of the plan's other preconditioner.

Measured besides, each in fresh processes:

- the hardware's parallel efficiency ``e(2)``: the engine's block product
  (n = 20 000 rows, M = 2000, float32, one thread) run alone, then as two copies at
  once; ``e(2)`` is the two copies' total rate over twice the lone one's. It bounds
  what any second worker can give: ``2 e(2)``;
- the scheduler's overheads: seconds per task (400 empty tasks) and per pass (an
  8-block ``map_reduce`` of empty blocks through daskkrr's executor).

The model (``workflows/benchmarks/scaling_model.py``) takes the per-row cost of each
pass and the serial part from the one-core run and predicts every configuration;
the table shows prediction and measurement side by side, then the model's plan for
16 and 64 single-threaded workers (one core each, hosts like this one, driven from a
client with this host's cores), at this n and at n = 1e8. The plan predicts three
preconditioners, each from its own one-core profile: the row sketch the baseline's cost
model chose, summed on the client or on the workers, and FALKON's own; and marks the
one the cost model would choose for that cluster
(:func:`daskkrr.parallel.preconditioner_cost.choose_sketch_rows`, which prices a sketch
summed on the client at the client's cores, and CG's passes and a sketch summed on the
workers at the workers'). Reported: fit time, speed-up over the one-core baseline, the sum
of the processes' peak RSS. ``--fits-per-cluster K`` fits K times on each cluster and also
reports the median of the later fits ("warm": the workers have imported daskkrr and loaded
the engine, as on a cluster that stays up between fits) and their speed-up, and the model
again from the last later fit's passes, predicting the later fits. Every fit's
test RMSE is measured on 50 000 held-out rows of the same generator (rows ``n`` to
``n + 50 000`` of :func:`daskkrr.data.synthetic.make_regression`), so that speed is only
compared at equal accuracy. Run
``python workflows/benchmarks/workers_scaling.py --quick``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import PhaseClock, emit, machine, print_table, run_child, write_results  # noqa: E402

D = 20
#: name: (workers, engine threads per task, DASKKRR_ENGINE_THREADS cap).
CONFIGS = {
    "1 worker, 1 core": dict(n_workers=1, engine_threads=1, cap="1"),
    "1 worker, 2 engine threads": dict(n_workers=1, engine_threads=2, cap=""),
    "2 workers": dict(n_workers=2, engine_threads=1, cap=""),
    "4 workers": dict(n_workers=4, engine_threads=1, cap="1"),
    "1 worker, 1 core, sketch on the workers": dict(n_workers=1, engine_threads=1, cap="1", sketch_on="workers"),
    "2 workers, sketch on the workers": dict(n_workers=2, engine_threads=1, cap="", sketch_on="workers"),
    "1 worker, 1 core, FALKON's own": dict(n_workers=1, engine_threads=1, cap="1", rows="none", max_iter=50),
}
#: The configurations whose profiles the plan's other preconditioners come from (not speed-ups).
OWN = "1 worker, 1 core, FALKON's own"
ON_WORKERS = "1 worker, 1 core, sketch on the workers"
#: Compared with the baseline of their own preconditioner.
BASELINE_OF = {"2 workers, sketch on the workers": ON_WORKERS}
PLAN_WORKERS = (16, 64)
#: Held-out rows for the test error (generated after the store's ``n`` rows).
TEST_ROWS = 50_000


def child(args) -> dict:
    import numpy as np
    from distributed import Client, LocalCluster

    from daskkrr import FalkonRegressor
    from daskkrr.events import subscribe

    env = {"DASKKRR_ENGINE_THREADS": args.cap} if args.cap else {}
    os.environ["DASKKRR_SKETCH_ON"] = args.sketch_on  # read by the client's plan
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, env=env) as cluster, Client(cluster) as client:
        model = FalkonRegressor(n_centers=args.centers, penalty=1e-6, dtype="float32", max_iter=args.max_iter,
                                random_state=0, strategy="recompute",  # on the default client
                                preconditioner_rows=None if args.rows == "none" else "auto")
        clock = PhaseClock()
        t = time.perf_counter()
        with subscribe(clock):
            model.fit(args.store)
        fit_s = time.perf_counter() - t
        # Later fits on the same workers: their imports and the engine's loops are loaded.
        warm = []
        warm_clock = PhaseClock()  # the last later fit's passes: the model's input and check on warm workers
        for k in range(args.fits_per_cluster - 1):
            t = time.perf_counter()
            with subscribe(warm_clock if k == args.fits_per_cluster - 2 else (lambda event: None)):
                model.fit(args.store)
            warm.append(time.perf_counter() - t)
        budget = client.run(lambda: os.environ.get("DASKKRR_ENGINE_THREADS", ""))
        test = np.load(args.test)
        test_rmse = float(np.sqrt(np.mean((model.predict(test["X"]) - test["y"]) ** 2)))
    out = dict(test_rmse=test_rmse, fit_s=fit_s,
               passes=model.n_data_passes_, n_iter=model.n_iter_, worker_cap=sorted(budget.values()),
               sketch_rows=int(model.preconditioner_rows_),
               sketch_on=next((c["on"] for c in model.preconditioner_costs_
                               if c["rows"] == model.preconditioner_rows_ and model.preconditioner_rows_), ""),
               pass_s=clock.passes, pass_count=clock.pass_count, blocks=clock.blocks)
    if warm:
        out.update(warm_fit_s=float(statistics.median(warm)), warm_fits_s=warm, warm_pass_s=warm_clock.passes,
                   warm_pass_count=warm_clock.pass_count)
    return out


def probe_child(seconds: float) -> dict:
    """The engine's block product on one thread for ``seconds``: kernel entries per second."""
    import numpy as np

    from daskkrr.kernels import FusedEngine, GaussianKernel

    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, D)).astype(np.float32)
    Z = rng.normal(size=(2000, D)).astype(np.float32)
    u = rng.normal(size=2000)
    k, engine = GaussianKernel(sigma=float(np.sqrt(D))), FusedEngine()
    engine.gram_matvec(k, X[:64], Z, u, n_threads=1)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        engine.gram_matvec(k, X, Z, u, n_threads=1)
        done += 1
    return {"entries_per_s": done * X.shape[0] * Z.shape[0] / (time.perf_counter() - t0)}


def hardware_efficiency(seconds: float = 6.0) -> dict:
    """``e(2)``: two concurrent single-threaded copies of the probe against one alone."""
    env = {**os.environ, "DASKKRR_ENGINE_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

    def run(copies: int) -> list[float]:
        procs = [subprocess.Popen([sys.executable, __file__, "--probe", str(seconds)], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(copies)]
        rates = []
        for proc in procs:
            out, _ = proc.communicate()
            rates.append(json.loads(out.strip().splitlines()[-1])["entries_per_s"])
        return rates

    alone = max(run(1)[0], run(1)[0])
    pair = run(2)
    return {"alone_Mps": alone / 1e6, "pair_Mps": [r / 1e6 for r in pair], "efficiency_2": sum(pair) / (2 * alone)}


def overheads_child() -> dict:
    """Seconds per task (400 empty tasks) and per pass (an 8-block map_reduce of empty blocks)."""
    import dask.array as da
    import numpy as np
    from distributed import Client, LocalCluster

    from daskkrr.parallel.executor import Executor

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.gather(client.map(_empty, range(50)))  # warm up
        per_task = []
        for r in range(3):
            t = time.perf_counter()
            client.gather(client.map(_empty, range(400), key=[f"empty-{r}-{i}" for i in range(400)]))
            per_task.append((time.perf_counter() - t) / 400)
        task_s = float(np.median(per_task))
        X = da.zeros((8 * 4096, D), chunks=(4096, D), dtype=np.float32)
        passes = Executor(client).passes(X)
        per_pass = []
        for _ in range(7):
            t = time.perf_counter()
            passes.map_reduce(_block_sum, name="overhead")
            per_pass.append(time.perf_counter() - t)
    return {"task_s": task_s, "pass_s": max(0.0, float(np.median(per_pass)) - 8 * task_s)}


def _empty(i):
    return i


def _block_sum(Xb):
    import numpy as np

    return np.zeros(1)


def model_rows(rows: list[dict], over: dict, eff: dict, n: int, centers: int) -> list[dict]:
    """The model's prediction for every configuration measured, and its plan for 16 and 64 workers.

    The preconditioners are keyed ``(sketch rows, where the sketch is summed)``: the
    baseline's sketch on the client and on the workers, and ``(0, "client")``, FALKON's
    own. Each plan row is the one the cost model would choose on that cluster, predicted
    from the one-core profile measured with it (``sketch_rows``, ``sketch_on``), with the
    predictions of all three beside it. The workers' sketch also pays the network for its
    ``M x M`` matrices (:func:`~daskkrr.parallel.preconditioner_cost.worker_sketch_network_seconds`),
    which the local run moved over loopback. The cost model chooses with the estimator's
    default ``max_iter`` (50), the budget every profile ran to the tolerance with: at a
    small ``max_iter`` it would price FALKON's own at ``max_iter`` iterations, short of
    the tolerance the sketch reaches.
    """
    from scaling_model import Overheads, predict, profile_from_run

    from daskkrr.parallel.cost import Budget, Problem
    from daskkrr.parallel.preconditioner_cost import choose_sketch_rows, worker_sketch_network_seconds

    overheads = Overheads(task_s=over["task_s"], pass_s=over["pass_s"], efficiency={1: 1.0, 2: eff["efficiency_2"]})

    def profile(r: dict):
        return profile_from_run(n, r["fit_s"], r["pass_s"], r["pass_count"], r["blocks"], overheads)

    def warm_profile(r: dict):  # from the last later fit, whose passes were timed
        if "warm_pass_s" not in r:
            return None
        return profile_from_run(n, r["warm_fits_s"][-1], r["warm_pass_s"], r["warm_pass_count"], r["blocks"],
                                overheads)

    measured = {r["config"]: r for r in rows if "fit_s" in r}
    sketched = int(rows[0].get("sketch_rows", -1))  # the baseline's sketch, as the cost model chose it
    sources = {(sketched, "client"): rows[0]["config"], (sketched, "workers"): ON_WORKERS, (0, "client"): OWN}
    profiles = {key: profile(measured[name]) for key, name in sources.items() if name in measured}
    warm_profiles = {key: warm_profile(measured[name]) for key, name in sources.items() if name in measured}
    key_of = {name: key for key, name in sources.items()}
    key_of["2 workers, sketch on the workers"] = (sketched, "workers")
    cores = os.cpu_count() or 1
    for r in rows:
        key = key_of.get(r["config"], (sketched, "client"))
        if "fit_s" not in r or key not in profiles:
            continue
        cfg = CONFIGS[r["config"]]
        pred = predict(profiles[key], overheads, cfg["n_workers"], engine_threads=cfg["engine_threads"], cores=cores)
        r["predicted_s"] = pred["fit_s"]
        r["predicted_vs_measured"] = pred["fit_s"] / r["fit_s"]
        warm = warm_profiles.get(key)
        if warm is not None and "warm_fit_s" in r:
            pred = predict(warm, overheads, cfg["n_workers"], engine_threads=cfg["engine_threads"], cores=cores)
            r["warm_predicted_s"] = pred["fit_s"]
            r["warm_predicted_vs_measured"] = pred["fit_s"] / r["warm_fit_s"]
    plan = []
    base = profiles[(sketched, "client")]
    for rows_n in (n, 100_000_000):
        one = predict(base, overheads, 1, cores=1, n=rows_n)["fit_s"]
        for w in PLAN_WORKERS:
            problem = Problem(n=rows_n, d=D, n_centers=centers, n_targets=1, itemsize=4)
            budget = Budget(cores=w, memory_bytes=w * 8 * 2**30, n_workers=w, client_cores=cores)
            chosen, costs = choose_sketch_rows(problem, budget, max_iter=CONFIGS[OWN]["max_iter"], tol=1e-4,
                                               strategy="recompute", sketch_itemsize=4,
                                               candidates=tuple(sorted({k[0] for k in profiles})))
            key = (chosen, next(c.on for c in costs if c.rows == chosen))
            preds = {k: predict(p, overheads, w, cores=w, n=rows_n) for k, p in profiles.items()}
            for k in preds:  # the local run moved the partial sums over loopback; a cluster, over its network
                if k[1] == "workers":
                    moved = worker_sketch_network_seconds(problem, budget, preds[k]["blocks"])
                    preds[k] = {**preds[k], "fit_s": preds[k]["fit_s"] + moved, "serial_s": preds[k]["serial_s"]}
            pred = preds.get(key)
            row = {"config": f"MODEL: {w} workers, 1 core each", "n": rows_n, "sketch_rows": chosen,
                   "sketch_on": key[1] if chosen else ""}
            if pred is not None:
                row.update(predicted_s=pred["fit_s"], predicted_speedup=one / pred["fit_s"], blocks=pred["blocks"],
                           serial_share=pred["serial_s"] / pred["fit_s"])
            for (k_rows, k_on), p in preds.items():
                row[f"{'own' if not k_rows else 'sketch_' + k_on}_s"] = p["fit_s"]
            plan.append(row)
    return plan


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 2e5, M = 1000")
    ap.add_argument("--n", type=int, default=None, help="rows (default 1e6; 2e5 with --quick)")
    ap.add_argument("--centers", type=int, default=None, help="default 2000; 1000 with --quick")
    ap.add_argument("--max-iter", type=int, default=10)
    ap.add_argument("--fits-per-cluster", type=int, default=1,
                    help="fits on each cluster; the median of all but the first is the warm-cluster time")
    ap.add_argument("--data-dir", default="/tmp/daskkrr-bench")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--replan", default=None, metavar="JSON",
                    help="no measurement: the model's predictions and plan again, from a saved run's "
                         "workers_scaling.json (after a change to the model), written as workers_scaling_replan.*")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--overheads", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--test", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cap", default="", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--sketch-on", default="auto", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe is not None:
        print(json.dumps(probe_child(args.probe)))
        return []
    if args.overheads:
        emit(overheads_child())
        return []
    if args.child:
        emit(child(args))
        return []
    if args.replan:
        return replan(args)
    import numpy as np

    from daskkrr.data.synthetic import make_regression, write_regression_zarr

    n = args.n or (200_000 if args.quick else 1_000_000)
    centers = args.centers or (1000 if args.quick else 2000)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    store = data_dir / f"workers_n{n}_d{D}.zarr"
    if not store.exists():
        write_regression_zarr(store, n, D, chunk_rows=max(n // 8, 1), dtype="float32", random_state=0)
    test = data_dir / f"workers_n{n}_d{D}_test.npz"
    if not test.exists():
        X, y = make_regression(n + TEST_ROWS, D, chunk_rows=max(n // 8, 1), dtype="float32", random_state=0)
        np.savez(test, X=np.asarray(X[n:]), y=np.asarray(y[n:]))
    eff = hardware_efficiency(3.0 if args.quick else 6.0)
    print("hardware:", eff, flush=True)
    over = run_child([__file__, "--overheads"], timeout=args.timeout)
    print("scheduler:", {k: over.get(k) for k in ("task_s", "pass_s", "error")}, flush=True)
    rows = []
    for name, cfg in CONFIGS.items():
        res = run_child([__file__, "--child", "--store", str(store), "--workers", str(cfg["n_workers"]),
                         "--cap", cfg["cap"], "--rows", cfg.get("rows", "auto"), "--centers", str(centers),
                         "--sketch-on", cfg.get("sketch_on", "auto"),
                         "--max-iter", str(cfg.get("max_iter", args.max_iter)), "--test", str(test),
                         "--fits-per-cluster", str(args.fits_per_cluster)], timeout=args.timeout)
        rows.append({"config": name, "n": n, "M": centers, **res})
        print({k: v for k, v in rows[-1].items() if k != "peak_per_process_mb"}, flush=True)
    by_name = {r["config"]: r for r in rows}
    base = rows[0].get("fit_s")
    for r in rows:
        if r["config"] in (OWN, ON_WORKERS) or "fit_s" not in r:
            continue
        ref = by_name[BASELINE_OF.get(r["config"], rows[0]["config"])]
        if ref.get("fit_s"):
            r["speedup_vs_1_core"] = ref["fit_s"] / r["fit_s"]
        if ref.get("warm_fit_s") and "warm_fit_s" in r:
            r["warm_speedup"] = ref["warm_fit_s"] / r["warm_fit_s"]
    plan = model_rows(rows, over, eff, n, centers) if base and "task_s" in over else []
    info = machine()
    report(rows, plan, info, eff, over, n, centers, args.max_iter)
    write_results(rows + plan, args.out, "workers_scaling",
                  {"machine": info, "args": vars(args), "hardware": eff, "scheduler": over})
    return rows


def report(rows: list[dict], plan: list[dict], info: dict, eff: dict, over: dict, n: int, centers: int,
           max_iter: int) -> None:
    title = (f"1, 2 and 4 Dask workers, n = {n}, d = {D}, M = {centers}, recompute, max_iter = {max_iter} "
             f"({CONFIGS[OWN]['max_iter']} for FALKON's own); "
             f"{info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB; hardware e(2) = "
             f"{eff['efficiency_2']:.2f} (a second core gives at most {2 * eff['efficiency_2']:.2f}x); "
             f"scheduler {over.get('task_s', float('nan')) * 1e3:.2f} ms/task, "
             f"{over.get('pass_s', float('nan')) * 1e3:.1f} ms/pass")
    warm_cols = ["warm_fit_s", "warm_speedup"] if any("warm_fit_s" in r for r in rows) else []
    if any("warm_predicted_s" in r for r in rows):
        warm_cols += ["warm_predicted_s", "warm_predicted_vs_measured"]
    print_table(rows + plan, ["config", "n", "sketch_rows", "sketch_on", "n_iter", "test_rmse", "fit_s",
                              "speedup_vs_1_core", *warm_cols, "predicted_s", "predicted_vs_measured",
                              "predicted_speedup", "blocks", "serial_share", "sketch_client_s", "sketch_workers_s",
                              "own_s", "passes", "peak_mb", "n_processes"], title)


def replan(args) -> list[dict]:
    """The model's columns and plan again from a saved run (its measured rows are kept as they were)."""
    saved = json.loads(Path(args.replan).read_text())
    meta = saved["meta"]
    measured = [r for r in saved["rows"] if not str(r.get("config", "")).startswith("MODEL")]
    n, centers = int(measured[0]["n"]), int(measured[0]["M"])
    plan = model_rows(measured, meta["scheduler"], meta["hardware"], n, centers)
    report(measured, plan, meta["machine"], meta["hardware"], meta["scheduler"], n, centers,
           int(meta["args"]["max_iter"]))
    write_results(measured + plan, args.out, "workers_scaling_replan", {**meta, "replanned_from": str(args.replan)})
    return measured + plan


if __name__ == "__main__":
    main()
