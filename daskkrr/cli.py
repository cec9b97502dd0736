"""The ``daskkrr`` command line.

Every command exits 0 on success and 1 with a one-line ``daskkrr: error: ...`` on
any error (2 for bad usage, 130 when interrupted). Commands that compute connect
to ``--scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``) or start a local cluster
sized to the machine and close it afterwards.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("daskkrr")


def _add_scheduler(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="Dask scheduler address (default: $DASK_SCHEDULER_ADDRESS, else a local cluster)")
    p.add_argument("--workers", type=int, default=None, help="workers of the local cluster (default: one per core)")


def _parser() -> argparse.ArgumentParser:
    from daskkrr import __version__

    parser = argparse.ArgumentParser(prog="daskkrr", description="Out-of-core kernel ridge regression on Dask.")
    parser.add_argument("--version", action="version", version=f"daskkrr {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="stream a CSV/TSV (optionally .gz) into a Zarr store")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--target", required=True, help="name of the target column")
    p.add_argument("--chunk-rows", type=int, default=100_000)
    p.add_argument("--sep", default=None, help="field separator (default: from the file name)")
    p.add_argument("--overwrite", action="store_true")

    p = sub.add_parser("generate", help="write a synthetic regression/classification Zarr store")
    p.add_argument("output")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--d", type=int, default=8)
    p.add_argument("--classes", type=int, default=0, help="0 for regression, k >= 2 for classification")
    p.add_argument("--chunk-rows", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")

    p = sub.add_parser("fit", help="fit a model on a Zarr store and save it")
    p.add_argument("--data", required=True, help="Zarr store with arrays X and y")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--config", default=None, help="TOML file with a [model] table")
    p.add_argument("--estimator", choices=["falkon", "nystrom", "exact", "classifier"], default=None)
    p.add_argument("--kernel", default=None)
    p.add_argument("--sigma", type=float, default=None)
    p.add_argument("--penalty", type=float, default=None)
    p.add_argument("--centers", dest="n_centers", type=int, default=None)
    p.add_argument("--sampler", default=None)
    p.add_argument("--max-iter", dest="max_iter", type=int, default=None)
    p.add_argument("--tol", type=float, default=None)
    p.add_argument("--dtype", choices=["float32", "float64"], default=None)
    p.add_argument("--seed", dest="random_state", type=int, default=None)
    p.add_argument("--overwrite", action="store_true")
    _add_scheduler(p)

    p = sub.add_parser("predict", help="predict with a saved model into a Zarr store")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="Zarr store with array X")
    p.add_argument("--out", required=True, help="Zarr store to write (array 'y_pred')")
    p.add_argument("--overwrite", action="store_true")
    _add_scheduler(p)

    p = sub.add_parser("quickstart", help="generate data, fit on a local cluster, print the test error")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--d", type=int, default=8)
    p.add_argument("--centers", type=int, default=1000)
    p.add_argument("--max-iter", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    _add_scheduler(p)
    return parser


def _cmd_convert(args: argparse.Namespace) -> None:
    from daskkrr.data import convert_table

    summary = convert_table(args.input, args.output, target=args.target, chunk_rows=args.chunk_rows,
                            sep=args.sep, overwrite=args.overwrite)
    print(f"wrote {args.output}: {summary['rows']} rows x {summary['features']} features, target {args.target!r}")


def _cmd_generate(args: argparse.Namespace) -> None:
    from daskkrr.data import write_classification_zarr, write_regression_zarr

    if args.classes:
        write_classification_zarr(args.output, args.n, args.d, n_classes=args.classes,
                                  chunk_rows=args.chunk_rows, random_state=args.seed, overwrite=args.overwrite)
    else:
        write_regression_zarr(args.output, args.n, args.d, chunk_rows=args.chunk_rows,
                              random_state=args.seed, overwrite=args.overwrite)
    print(f"wrote {args.output}: {args.n} rows x {args.d} features")


def _cmd_fit(args: argparse.Namespace) -> None:
    from daskkrr.config import build_estimator, read_config
    from daskkrr.data.atomic import check_destination
    from daskkrr.parallel import cluster_client

    check_destination(args.out, args.overwrite)  # fail before the work, not after
    config = read_config(args.config) if args.config else {}
    if args.estimator:
        config["estimator"] = args.estimator
    overrides = {k: getattr(args, k) for k in
                 ("kernel", "sigma", "penalty", "n_centers", "sampler", "max_iter", "tol", "dtype", "random_state")}
    model = build_estimator(config, **overrides, verbose=True if args.verbose else None)
    with cluster_client(args.scheduler, n_workers=args.workers) as client:
        model.set_params(client=client)
        t0 = time.perf_counter()
        model.fit(args.data)
        model.set_params(client=None)
        model.save(args.out, overwrite=args.overwrite)
    print(f"fitted {type(model).__name__} with {model.centers_.shape[0]} centers in "
          f"{time.perf_counter() - t0:.1f}s ({model.n_iter_} CG iterations); wrote {args.out}")


def _cmd_predict(args: argparse.Namespace) -> None:
    from daskkrr.data import write_array_zarr
    from daskkrr.data.atomic import check_destination
    from daskkrr.models.persistence import load_model
    from daskkrr.parallel import cluster_client

    check_destination(args.out, args.overwrite)
    model = load_model(args.model)
    with cluster_client(args.scheduler, n_workers=args.workers):
        pred = model.predict(args.data)
        write_array_zarr(pred, args.out, name="y_pred", overwrite=args.overwrite)
    print(f"wrote {args.out}: {pred.shape[0]} predictions")


def _cmd_quickstart(args: argparse.Namespace) -> None:
    from daskkrr.quickstart import run_quickstart

    run_quickstart(n=args.n, d=args.d, n_centers=args.centers, max_iter=args.max_iter, seed=args.seed,
                   scheduler=args.scheduler, n_workers=args.workers)


_COMMANDS = {
    "convert": _cmd_convert,
    "generate": _cmd_generate,
    "fit": _cmd_fit,
    "predict": _cmd_predict,
    "quickstart": _cmd_quickstart,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskkrr`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if not args.verbose:
        # Quiet the scheduler/worker chatter, here and in worker processes (they inherit the env).
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
        import dask

        dask.config.refresh()
        logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("daskkrr: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, no traceback, for any failure
        if args.verbose:
            logger.exception("command failed")
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"daskkrr: error: {message}", file=sys.stderr)
        return 1
    return 0


def _entry() -> Any:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
