"""The ``daskkrr`` command line.

Every command exits 0 on success and 1 with a one-line ``daskkrr: error: ...`` on
any error (2 for bad usage, 130 on Ctrl-C, 128 + the signal number on SIGTERM or
SIGHUP; outputs are then not written). Commands that compute connect
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


#: Short flags kept from before every parameter had its own (README and scripts use them).
_FLAG_ALIASES = {"n_centers": ("--centers",), "random_state": ("--seed",)}


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """``--estimator`` and one flag per estimator parameter, all from the registry and its schema.

    Flags not given stay out of the namespace (default SUPPRESS), so the config
    file's or the estimator's value holds; see :func:`_model_overrides`.
    """
    from daskkrr.models.registry import ESTIMATORS
    from daskkrr.models.schema import union_specs

    group = p.add_argument_group("model", "estimator parameters; a flag given here overrides --config")
    group.add_argument("--estimator", choices=sorted(ESTIMATORS), default=None,
                       help="estimator (default: the config's, else falkon)")
    for name, (spec, defaults) in union_specs(ESTIMATORS).items():
        flags = (spec.flag, *_FLAG_ALIASES.get(name, ()))
        shown = {repr(v) for v in defaults.values()}
        default = (f"default: {defaults[next(iter(defaults))]!r}" if len(shown) == 1 else
                   "default: " + ", ".join(f"{k} {v!r}" for k, v in defaults.items()))
        only = "" if len(defaults) == len(ESTIMATORS) else f"; {', '.join(defaults)} only"
        help_text = f"{spec.help} ({default}{only})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if spec.types == (bool,) and not spec.nullable:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif spec.types == (dict,):
            group.add_argument(*flags, action=_KeyValueAction, metavar="KEY=VALUE[,KEY=VALUE]", nullable=spec.nullable,
                               **kwargs)
        else:
            group.add_argument(*flags, type=_flag_parser(spec), metavar=_metavar(spec), **kwargs)


def _metavar(spec: Any) -> str:
    parts = [t.__name__.upper() for t in spec.types if t is not dict and not (t is str and spec.options)]
    if spec.options:
        parts.append("{" + ",".join(spec.options) + "}")
    return "|".join(parts + (["none"] if spec.nullable else []))


def _flag_parser(spec: Any) -> Any:
    """argparse ``type=``: the text as the parameter takes it; a bad value names the flag (exit 2)."""
    def parse(text: str) -> Any:
        try:
            return spec.parse_text(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = spec.name  # argparse's "invalid <name> value" message
    return parse


def _scalar(text: str) -> Any:
    """A KEY=VALUE value: int, float, true/false, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class _KeyValueAction(argparse.Action):
    """``--kernel-params nu=1.5,degree=2`` (repeatable) -> ``{"nu": 1.5, "degree": 2}``; ``none`` -> None."""

    def __init__(self, *args: Any, nullable: bool = False, **kwargs: Any):
        self.nullable = nullable
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.nullable and values.strip().lower() == "none":
            setattr(namespace, self.dest, None)
            return
        current = dict(getattr(namespace, self.dest, None) or {})
        for item in filter(None, (part.strip() for part in values.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                parser.error(f"argument {option_string}: expected KEY=VALUE, e.g. nu=1.5; got {item!r}")
            current[key.strip()] = _scalar(value.strip())
        setattr(namespace, self.dest, current)


def _model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Estimator parameters given as flags (those not given are absent)."""
    from daskkrr.models.registry import ESTIMATORS
    from daskkrr.models.schema import union_specs

    return {name: getattr(args, name) for name in union_specs(ESTIMATORS) if hasattr(args, name)}


def _flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


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
    _add_scheduler(p)

    p = sub.add_parser("fit", help="fit a model on a Zarr store and save it")
    p.add_argument("--data", required=True, help="Zarr store with arrays X and y")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--config", default=None, help="TOML file with a [model] table")
    _add_model_flags(p)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="save the fit's state to DIR as it goes (falkon and classifier estimators)")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=5, metavar="K",
                   help="CG iterations between checkpoints (default: 5)")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted fit saved in --checkpoint DIR (starts afresh if DIR has none)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr (with -v the log shows progress instead)")
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

    p = sub.add_parser("run", help="run a workflow file (data, model, evaluation, outputs) into a new run directory")
    p.add_argument("workflow", help="workflow TOML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a value of the file, e.g. --set data.store=today.zarr (repeatable)")
    p.add_argument("--runs-dir", default=None, help="where run directories go (default: the file's runs_dir)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars on stderr")
    _add_scheduler(p)
    return parser


def _cmd_convert(args: argparse.Namespace) -> None:
    from daskkrr.data import convert_table

    summary = convert_table(args.input, args.output, target=args.target, chunk_rows=args.chunk_rows,
                            sep=args.sep, overwrite=args.overwrite)
    print(f"wrote {args.output}: {summary['rows']} rows x {summary['features']} features, target {args.target!r}")


def _cmd_generate(args: argparse.Namespace) -> None:
    from daskkrr.data import write_classification_zarr, write_regression_zarr
    from daskkrr.parallel import cluster_client
    from daskkrr.utils.atomic import check_destination

    check_destination(args.output, args.overwrite)  # fail before starting a cluster
    with cluster_client(args.scheduler, n_workers=args.workers):  # blocks are generated on the workers
        if args.classes:
            write_classification_zarr(args.output, args.n, args.d, n_classes=args.classes,
                                      chunk_rows=args.chunk_rows, random_state=args.seed, overwrite=args.overwrite)
        else:
            write_regression_zarr(args.output, args.n, args.d, chunk_rows=args.chunk_rows,
                                  random_state=args.seed, overwrite=args.overwrite)
    print(f"wrote {args.output}: {args.n} rows x {args.d} features")


def _cmd_fit(args: argparse.Namespace) -> None:
    from daskkrr.config import read_config
    from daskkrr.parallel import cluster_client
    from daskkrr.utils.atomic import check_destination

    check_destination(args.out, args.overwrite)  # fail before the work, not after
    config = read_config(args.config) if args.config else {}
    if args.estimator:
        config["estimator"] = args.estimator
    model = _build_from_flags(config, _model_overrides(args), verbose=bool(args.verbose))
    fit_kwargs = _checkpoint_kwargs(args, model)
    _check_before_start(model, args.data)
    with cluster_client(args.scheduler, n_workers=args.workers) as client:  # the fit's current client
        t0 = time.perf_counter()
        with _fit_progress(args, client):
            model.fit(args.data, **fit_kwargs)
        model.save(args.out, overwrite=args.overwrite)
    print(f"fitted {type(model).__name__} with {model.centers_.shape[0]} centers in "
          f"{time.perf_counter() - t0:.1f}s ({model.n_iter_} CG iterations); wrote {args.out}")


def _build_from_flags(config: dict[str, Any], flags: dict[str, Any], verbose: bool) -> Any:
    """The estimator of ``config`` with the flags' values on top; errors name the flag."""
    from daskkrr.config import ConfigError, build_estimator
    from daskkrr.models.registry import DEFAULT_ESTIMATOR, ESTIMATORS
    from daskkrr.models.schema import config_specs

    name = config.get("estimator", DEFAULT_ESTIMATOR)
    accepted = config_specs(ESTIMATORS[name])
    for key in flags:
        if key not in accepted:
            raise ConfigError(f"{_flag_of(key)} does not apply to estimator {name!r}; its parameters: "
                              f"{', '.join(_flag_of(k) for k in accepted)}")
    try:
        return build_estimator(config, **flags, **({"verbose": True} if verbose else {}))
    except ConfigError as exc:
        bad = getattr(exc.__cause__, "parameter", None)
        if bad in flags:
            raise ConfigError(f"{_flag_of(bad)} {flags[bad]!r}: {exc.__cause__}") from exc
        raise


def _fit_progress(args: argparse.Namespace, client: Any) -> Any:
    """Progress of the fit on stderr: a bar (unless --no-progress or -v) and the dashboard page's link."""
    from daskkrr.dashboard import dashboard_url
    from daskkrr.progress import ProgressBar, report

    def announce(progress: Any, event: str) -> None:
        if event == "begin" and args.progress:
            url = dashboard_url(client)
            if url:
                print(f"daskkrr: progress on the dashboard: {url}", file=sys.stderr, flush=True)

    return report(bar=ProgressBar() if args.progress and not args.verbose else False, callback=announce)


def _cmd_run(args: argparse.Namespace) -> None:
    from daskkrr.workflow import run_workflow

    result = run_workflow(args.workflow, overrides=args.overrides, runs_dir=args.runs_dir,
                          scheduler=args.scheduler, n_workers=args.workers,
                          progress=args.progress and not args.verbose)
    m = result.metrics
    figures = ", ".join(f"{k} {v:.4g}" for k, v in m.get("metrics", {}).items()
                        if k in ("rmse", "mae", "r2", "accuracy") and isinstance(v, float))
    print(f"run {result.run_id} succeeded in {m.get('seconds', 0):.1f}s ({m.get('evaluation')}: {figures}); "
          f"wrote {result.run_dir}")


def _check_before_start(model: Any, data: str, features_only: bool = False) -> None:
    """Refuse bad parameters and a missing or damaged store before a cluster is started."""
    from daskkrr.data import open_dataset

    if hasattr(model, "_validate_params") and not hasattr(model, "coef_"):
        model._validate_params()
    X, _ = open_dataset(data, y=None if features_only else "y")  # reads metadata only
    if features_only:
        model._check_n_features(X.shape)


def _checkpoint_kwargs(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """``fit`` keywords for --checkpoint/--resume, checked before any work starts."""
    if args.checkpoint is None:
        if args.resume:
            raise ValueError("--resume needs --checkpoint DIR (the directory of the interrupted fit)")
        return {}
    import inspect

    if "checkpoint" not in inspect.signature(model.fit).parameters:
        raise ValueError(
            f"--checkpoint is supported by the falkon and classifier estimators, not by "
            f"{type(model).__name__}; drop --checkpoint or use --estimator falkon"
        )
    from daskkrr.checkpoint import FitCheckpoint

    # Bad --checkpoint-every, or a checkpoint that exists without --resume: refused before any work.
    FitCheckpoint(args.checkpoint, every=args.checkpoint_every, resume=args.resume)
    return {"checkpoint": args.checkpoint, "checkpoint_every": args.checkpoint_every, "resume": args.resume}


def _cmd_predict(args: argparse.Namespace) -> None:
    from daskkrr.data import write_array_zarr
    from daskkrr.models.loading import load_model
    from daskkrr.parallel import cluster_client
    from daskkrr.utils.atomic import check_destination

    check_destination(args.out, args.overwrite)
    model = load_model(args.model)
    _check_before_start(model, args.data, features_only=True)
    with cluster_client(args.scheduler, n_workers=args.workers):
        pred = model.predict(args.data)
        write_array_zarr(pred, args.out, name="y_pred", overwrite=args.overwrite)
    print(f"wrote {args.out}: {pred.shape[0]} predictions")


def _cmd_quickstart(args: argparse.Namespace) -> None:
    from daskkrr.progress import ProgressBar, report
    from daskkrr.quickstart import run_quickstart

    with report(bar=False if args.verbose else ProgressBar()):  # the fit's progress on stderr
        run_quickstart(n=args.n, d=args.d, n_centers=args.centers, max_iter=args.max_iter, seed=args.seed,
                       scheduler=args.scheduler, n_workers=args.workers)


_COMMANDS = {
    "convert": _cmd_convert,
    "generate": _cmd_generate,
    "fit": _cmd_fit,
    "predict": _cmd_predict,
    "quickstart": _cmd_quickstart,
    "run": _cmd_run,
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
    from daskkrr.signals import Interrupted, interrupt_on_signals

    try:
        # SIGTERM/SIGHUP unwind like Ctrl-C: temporary outputs are removed, local clusters closed.
        with interrupt_on_signals():
            _COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:
        why = f" ({exc})" if isinstance(exc, Interrupted) else ""
        print(f"daskkrr: interrupted{why}; no partial output was left", file=sys.stderr)
        return 128 + exc.signum if isinstance(exc, Interrupted) else 130
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
