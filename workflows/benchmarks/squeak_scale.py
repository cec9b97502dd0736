"""SQUEAK and DISQUEAK at large dictionaries (issue 39): time and memory as the dictionary m grows.

Data: ``n`` rows of ``d = 10`` standard normal features, Gaussian kernel with ``sigma = sqrt(d) / 2``
(two rows' kernel value is about ``exp(-4)``) and ``gamma = 0.5``: the kernel matrix is nearly
diagonal, every row's ridge leverage score is close to ``1 / (1 + gamma)``, and the dictionary keeps
almost every row, so ``n`` sets ``m`` (``unique`` in the rows is the m reached). This is the worst
case of the dictionary's own ``m x m`` work, which is what the script measures; the rows' kernel
evaluations are a small part of it.

Methods, each fit in a fresh process (:func:`fit_tools.run_child`):

- ``squeak``: :class:`~daskkrr.sampling.SqueakSampler`, Dask's threaded scheduler;
- ``squeak-bytecap``: the same with the batch rule before commit 9899cf4 (``batch_fraction=0``: a batch
  bounded by 64 MiB of ``m x b`` tiles alone, ``b ~ 8.4e6 / m`` rows past m = 2900), the baseline of the
  ``m / 8`` floor;
- ``disqueak``: :class:`~daskkrr.sampling.DisqueakSampler`, one leaf per block (``--blocks``, 4 by
  default), balanced tree, threaded scheduler;
- ``disqueak-2w``: the same on a ``LocalCluster`` of 2 single-threaded worker processes;
- ``disqueak-budget``: ``DisqueakSampler(memory_budget=--budget-gb)``, threaded: the merges whose dense
  factor exceeds the budget take the tiled route (tiles spilled to Zarr when the budget cannot hold them),
  so no process holds the root's ``m x m`` matrices (``routes``: each merge's route, leaves first).

Columns: ``m`` (rows), ``unique`` (dictionary entries at the end), ``time_s`` (the sampler's
``select``), ``cpu_s`` (CPU seconds of the child and its worker processes: comparable across a
shared machine's load), ``peak_mb`` (sum of the per-process RSS peaks), ``max_process_mb`` (the
largest one), ``state_mb`` (the largest state a fold or merge task returned, i.e. what travels to
the next task: the bytes of its arrays, measured on the threaded runs; the 2-worker run's states are
the same, its randomness being keyed by rows), ``mxm_mb`` (one ``m x m`` float64 matrix, for scale).

    python -m workflows.benchmarks run squeak_scale -- --m 2000 5000 10000
    python workflows/benchmarks/squeak_scale.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from workflows.benchmarks.fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

METHODS = ("squeak", "squeak-bytecap", "disqueak", "disqueak-2w", "disqueak-budget")
D = 10
GAMMA = 0.5
BLOCKS = 4


def _record_state_bytes() -> list[int]:
    """Wrap the samplers' fold and merge tasks (threaded runs) to record the largest state they return."""
    import daskkrr.sampling.squeak as sq

    largest = [0]

    def wrap(task: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = task(*args, **kwargs)
            largest[0] = max(largest[0], out.dictionary.nbytes() + out.pending.nbytes)
            return out
        return recorded

    sq.stream_block = wrap(sq.stream_block)
    sq.merge_states = wrap(sq.merge_states)
    return largest


@contextlib.contextmanager
def _two_worker_client() -> Iterator[Any]:
    """A ``LocalCluster`` of 2 single-threaded worker processes of 3 GiB each, and its client."""
    from distributed import Client, LocalCluster

    from daskkrr.parallel.client import local_cluster_kwargs

    with LocalCluster(**local_cluster_kwargs(2, memory_limit="3GiB")) as cluster, Client(cluster) as client:
        yield client


def child(method: str, m: int, seed: int, budget_gb: float = 2.0, blocks: int = BLOCKS) -> None:
    """One fit; prints its figures (see the module docstring)."""
    import dask.array as da
    import numpy as np

    from daskkrr.kernels import make_kernel
    from daskkrr.sampling import DisqueakSampler, SqueakSampler

    X = np.random.default_rng(seed).standard_normal((m, D))
    Xd = da.from_array(X, chunks=(-(-m // blocks), D))
    kernel = make_kernel("gaussian", sigma=float(np.sqrt(D)) / 2)
    if method == "squeak-bytecap":
        import dataclasses

        import daskkrr.sampling.squeak as sq

        params = sq.squeak_params
        sq.squeak_params = lambda *a, **k: dataclasses.replace(params(*a, **k), batch_fraction=0.0)
    if method.startswith("squeak"):
        sampler = SqueakSampler(gamma=GAMMA)
    elif method == "disqueak-budget":
        sampler = DisqueakSampler(gamma=GAMMA, memory_budget=int(budget_gb * 2**30))
    else:
        sampler = DisqueakSampler(gamma=GAMMA)
    on_cluster = method.endswith("-2w")
    largest = None if on_cluster else _record_state_bytes()
    with _two_worker_client() if on_cluster else contextlib.nullcontext() as client:
        t0 = time.perf_counter()
        result = sampler.select(Xd, kernel, random_state=seed, client=client)
        seconds = time.perf_counter() - t0
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    emit({"unique": int(result.centers.shape[0]), "time_s": round(seconds, 2), "cpu_s": round(cpu, 1),
          "state_mb": None if largest is None else round(largest[0] / 2**20, 2),
          "routes": [h["factor_route"] for h in result.info["history"] if "node" in h]})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[2000, 5000, 10000], help="rows (about the dictionary m)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--quick", action="store_true", help="m = 500 and 1000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-gb", type=float, default=2.0, help="memory_budget of disqueak-budget (GiB)")
    ap.add_argument("--blocks", type=int, default=BLOCKS, help="row blocks of the data (DISQUEAK's leaves)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per fit")
    ap.add_argument("--out", default=None, help="folder of the result files (default: results/)")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "M"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.seed, args.budget_gb, args.blocks)
        return
    sizes = [500, 1000] if args.quick else args.m
    rows = []
    for m in sizes:
        for method in args.methods:
            r = run_child([str(Path(__file__).resolve()), "--child", method, str(m), "--seed", str(args.seed),
                           "--budget-gb", str(args.budget_gb), "--blocks", str(args.blocks)], timeout=args.timeout)
            row = {"method": method, "m": m,
                   **{k: r.get(k) for k in ("unique", "time_s", "cpu_s", "state_mb", "routes")},
                   "peak_mb": r["peak_mb"], "max_process_mb": max(r["peak_per_process_mb"].values(), default=0.0),
                   "mxm_mb": round(8 * m * m / 2**20, 1), "n_processes": r["n_processes"],
                   "peak_per_process_mb": r["peak_per_process_mb"]}
            if "error" in r:
                row["error"] = r["error"][-500:]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "peak_per_process_mb"}), flush=True)
    print_table(rows, ["method", "m", "unique", "time_s", "cpu_s", "peak_mb", "max_process_mb", "state_mb", "mxm_mb"],
                title="SQUEAK / DISQUEAK at growing m")
    write_results(rows, args.out, "squeak_scale",
                  {"machine": machine(), "d": D, "gamma": GAMMA, "blocks": args.blocks, "seed": args.seed,
                   "budget_gb": args.budget_gb})


if __name__ == "__main__":
    main()
