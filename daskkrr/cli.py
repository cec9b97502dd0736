"""The ``daskkrr`` command line.

Exit codes and error lines, for every command:

- 0 on success;
- 2 for a usage error: anything wrong on the command line itself (an unknown or
  abbreviated option, a missing argument, a bad flag value, flags that do not go
  together). argparse's errors and the commands' own checks of their flags
  print the same single line, ``daskkrr: error: <what>; see 'daskkrr <command> --help'``;
- 1 for any other error (missing or damaged data, an existing output without
  ``--overwrite``, a failed fit), with one line ``daskkrr: error: <what>`` and no
  traceback (``-v`` logs it); messages name the command-line flags
  (``--overwrite``, ``--n-centers``), not the Python arguments;
- 130 on Ctrl-C, 128 + the signal number on SIGTERM or SIGHUP; outputs are then not written.

Options are never abbreviated (``--cent`` is an error, not ``--centers``), every
option's help shows its default, and ``-v``/``--verbose`` (log progress) and
``-q``/``--quiet`` (only errors on stderr: no progress bar, log or warnings) go
before or after the command. Commands that compute connect to ``--scheduler``
(or ``$DASK_SCHEDULER_ADDRESS``) or start a local cluster sized to the machine and
close it afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

from daskkrr.signals import Interrupted, interrupt_on_signals  # light: the standard library only

logger = logging.getLogger("daskkrr")


class UsageError(ValueError):
    """A command line whose flags do not go together (exit 2, like argparse's own errors)."""


class _Parser(argparse.ArgumentParser):
    """argparse with the module's convention: no abbreviations, one-line usage errors, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        #: Estimator-parameter flags and their help per estimator (filled by _add_model_flags).
        self._model_help: list[tuple[argparse.Action, dict[str, str]]] = []
        #: The estimator whose flags ``--help`` always lists (``embed``/``cluster``), else None.
        self._one_estimator: str | None = None

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"daskkrr: error: {_one_line(message)}; see '{self.prog} --help'\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        if self._model_help and args is not None and {"-h", "--help"} & set(args):
            shown = self._one_estimator or _option_value(args, "--estimator")
            for action, help_of in self._model_help:
                action.help = help_of.get(shown, argparse.SUPPRESS) if shown else argparse.SUPPRESS
        return super().parse_known_args(args, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but an unknown option is reported by its command's parser, with the closest
        option (``--centrs`` -> "did you mean --centers?")."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = _command_parser(self, parsed)
            owner.error(f"unrecognized arguments: {' '.join(extras)}{_suggestion(owner, extras)}")
        return parsed


def _option_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--estimator exact`` or ``--estimator=exact``), else None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _command_parser(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command in ``parsed`` (``daskkrr fit``'s), else ``parser`` itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(str(getattr(parsed, action.dest, "")), parser)
    return parser


def _suggestion(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """" (did you mean --centers?)" for the first unknown option close to one of ``parser``'s, else ""."""
    import difflib

    known = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    for arg in unknown:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default, unless its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or action.required:
            return text
        return super()._get_help_string(action) or ""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _add_verbosity(p: argparse.ArgumentParser, default: Any) -> None:
    """-v/-q on the main parser (``default`` False) and on every command (SUPPRESS, so that a
    flag given before the command is not reset by the command's parser)."""
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="log progress (INFO) and show tracebacks of errors (default: off)")
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="only errors on stderr: no progress bar, log or warnings (default: off)")


def _add_scheduler(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="Dask scheduler address (default: $DASK_SCHEDULER_ADDRESS, else a local cluster)")
    p.add_argument("--workers", type=_positive_int, default=None,
                   help="workers of the local cluster (default: one per core)")
    p.add_argument("--tls-ca-file", metavar="FILE", default=None,
                   help="a tls:// --scheduler: PEM file of the authority that signed its certificate (default: "
                        "Dask's distributed.comm.tls config)")
    p.add_argument("--tls-cert", metavar="FILE", default=None,
                   help="a tls:// --scheduler: this client's certificate (PEM, signed by an authority the "
                        "scheduler trusts; may hold the key too; default: Dask's distributed.comm.tls config)")
    p.add_argument("--tls-key", metavar="FILE", default=None,
                   help="the private key of --tls-cert (PEM; default: in --tls-cert)")


#: ``--target``'s help where a Parquet ``--data`` needs one (fit, score).
_TARGET_HELP = "Parquet --data: the target column (required there; a Zarr store's is its array y)"


def _add_table_columns(p: argparse.ArgumentParser, target: str | None, features: str) -> None:
    """``--target`` (with its help ``target``; None: no such flag) and ``--features`` (``features``: its
    default, in words): the columns of a Parquet ``--data``."""
    if target is not None:
        p.add_argument("--target", default=None, metavar="COLUMN", help=target)
    p.add_argument("--features", default=None, metavar="A,B,...", type=lambda text: text.split(","),
                   help=f"Parquet --data: the feature columns, comma-separated (default: {features})")


def _positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}")
    return value


#: What ``daskkrr predict --output`` writes for a classifier ("proba": classifiers with predict_proba).
PREDICT_OUTPUTS = ("label", "decision", "proba")

#: Short flags kept from before every parameter had its own (README and scripts use them).
_FLAG_ALIASES = {"n_centers": ("--centers",), "random_state": ("--seed",)}


def _add_model_flags(p: argparse.ArgumentParser, classes: dict[str, type] | None = None) -> None:
    """``--estimator`` and one flag per estimator parameter, all from the registry and its schema.

    Flags not given stay out of the namespace (default SUPPRESS), so the config
    file's or the estimator's value holds; see :func:`_model_overrides`. With
    ``classes`` (``daskkrr embed`` / ``cluster``) the flags of those classes, without ``--estimator``.
    Every flag is accepted, but ``--help`` lists one estimator's (see :meth:`_Parser.parse_known_args`):
    a help listing all of them ran to 300 lines of other estimators' parameters.
    """
    from daskkrr.models.registry import ESTIMATORS
    from daskkrr.models.schema import config_specs, union_specs

    registry = ESTIMATORS if classes is None else classes
    if classes is None:
        group = p.add_argument_group(
            "model", "estimator parameters; a flag given here overrides --config. Each estimator's parameters: "
                     "'%(prog)s --estimator NAME --help'")
        group.add_argument("--estimator", choices=sorted(ESTIMATORS), default=None,
                           help="estimator (default: the config's, else falkon)")
    else:
        group = p.add_argument_group("model", "estimator parameters")
    per_estimator = {est: config_specs(cls) for est, cls in registry.items()}
    for name, (spec, _defaults) in union_specs(registry).items():
        flags = (spec.flag, *_FLAG_ALIASES.get(name, ()))
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
        if spec.types == (bool,) and not spec.nullable:
            action = group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif spec.types == (dict,) or (dict in spec.types and spec.options):  # class_weight: "balanced" too
            plain = spec if len(spec.types) > 1 else None
            metavar = "|".join(([_metavar(spec).removesuffix("|none")] if plain else []) + ["KEY=VALUE[,KEY=VALUE]"]
                               + (["none"] if spec.nullable else []))
            action = group.add_argument(*flags, action=_KeyValueAction, metavar=metavar, nullable=spec.nullable,
                                        plain=plain, **kwargs)
        else:
            action = group.add_argument(*flags, type=_flag_parser(spec), metavar=_metavar(spec), **kwargs)
        help_of = {est: _param_help(specs[name]) for est, specs in per_estimator.items() if name in specs}
        p._model_help.append((action, help_of))  # type: ignore[attr-defined]
    p._one_estimator = None if classes is None else next(iter(registry))  # type: ignore[attr-defined]


def _param_help(spec: Any) -> str:
    """One parameter's help: the first sentence of its docstring and its default (the rest is in the docs)."""
    return f"{_first_sentence(spec.help)} (default: {spec.default!r})".replace("%", "%%")


def _first_sentence(text: str) -> str:
    """Text up to the first full stop that ends a sentence: not inside brackets, not after "e.g"/"i.e"."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([") - (char in ")]")
        if char == "." and depth == 0 and text[i + 1:i + 2] in (" ", ""):
            word = text[:i].rsplit(" ", 1)[-1]
            if word.lower() not in ("e.g", "i.e", "cf", "etc", "vs"):
                return text[:i + 1]
    return text


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
    """``--kernel-params nu=1.5,degree=2`` (repeatable) -> ``{"nu": 1.5, "degree": 2}``; ``none`` -> None.

    With ``plain`` (the parameter's spec), a value without ``=`` is read as the
    parameter's other values (``--class-weight balanced``).
    """

    def __init__(self, *args: Any, nullable: bool = False, plain: Any = None, **kwargs: Any):
        self.nullable = nullable
        self.plain = plain
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.nullable and values.strip().lower() == "none":
            setattr(namespace, self.dest, None)
            return
        if self.plain is not None and "=" not in values:
            try:
                setattr(namespace, self.dest, self.plain.parse_text(values))
            except ValueError as exc:
                parser.error(f"argument {option_string}: {exc}")
            return
        current = dict(getattr(namespace, self.dest, None) or {})
        for item in filter(None, (part.strip() for part in values.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                parser.error(f"argument {option_string}: expected KEY=VALUE, e.g. nu=1.5; got {item!r}")
            current[key.strip()] = _scalar(value.strip())
        setattr(namespace, self.dest, current)


def _model_overrides(args: argparse.Namespace, classes: dict[str, type] | None = None) -> dict[str, Any]:
    """Estimator parameters given as flags (those not given are absent)."""
    from daskkrr.models.registry import ESTIMATORS
    from daskkrr.models.schema import union_specs

    registry = ESTIMATORS if classes is None else classes
    return {name: getattr(args, name) for name in union_specs(registry) if hasattr(args, name)}


def _flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
    from daskkrr import __version__

    parser = _Parser(prog="daskkrr", description="Out-of-core kernel ridge regression on Dask.")
    parser.add_argument("--version", action="version", version=f"daskkrr {__version__}")
    _add_verbosity(parser, default=False)
    verbosity = _Parser(add_help=False)
    _add_verbosity(verbosity, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[verbosity])

    p = command("convert", "stream a CSV/TSV (optionally .gz) or Parquet table into a Zarr store")
    p.add_argument("input", help="CSV/TSV file (.gz allowed) with a header row, or a Parquet file, folder of parts "
                                 "or fsspec URL (s3://..., file://...)")
    p.add_argument("output", help="Zarr store to write")
    p.add_argument("--target", default=None, help="name of the target column (required, except with --sparse)")
    p.add_argument("--chunk-rows", type=_positive_int, default=100_000, help="rows per chunk of the store")
    p.add_argument("--sep", default=None, help="field separator (default: from the file name)")
    p.add_argument("--categorical", choices=("refuse", "onehot"), default="refuse",
                   help="Parquet: refuse categorical (text, dictionary) feature columns, or one-hot encode them "
                        "into columns named COLUMN=VALUE")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--sparse", action="store_true",
                   help="the input is a LIBSVM/svmlight file (label index:value ...): stored as CSR row blocks, "
                        "its labels as y (--target is then not used)")

    p = command("generate", "write a synthetic regression/classification Zarr store")
    p.add_argument("output", help="Zarr store to write")
    p.add_argument("--n", type=_positive_int, default=100_000, help="rows")
    p.add_argument("--d", type=_positive_int, default=8, help="features")
    p.add_argument("--classes", type=int, default=0, help="0 for regression, k >= 2 for classification")
    p.add_argument("--clusters", type=int, default=0,
                   help="k >= 2 for k Gaussian blobs labelled by blob (data for k-means; instead of --classes)")
    p.add_argument("--chunk-rows", type=_positive_int, default=50_000, help="rows per chunk of the store")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    _add_scheduler(p)

    p = command("fit", "fit a model on a Zarr store or a Parquet table and save it")
    p.add_argument("--data", required=True, help="Zarr store with arrays X and y, or a Parquet table (with --target)")
    _add_table_columns(p, _TARGET_HELP, "all columns but --target and --sample-weight")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--config", default=None, help="TOML file with a [model] table (default: none)")
    p.add_argument("--sample-weight", dest="sample_weight", metavar="VAR", default=None,
                   help="array of the store (column of a Parquet table) holding one weight per row (default: no "
                        "weights)")
    _add_model_flags(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing model directory")
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="save the fit's state to DIR as it goes (falkon, classifier, logistic and exact estimators; "
                        "default: no checkpoint)")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=_positive_int, default=5, metavar="K",
                   help="CG iterations between checkpoints")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted fit saved in --checkpoint DIR (starts afresh if DIR has none)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr (with -v the log shows progress instead; default: a bar)")
    _add_scheduler(p)

    p = command("predict", "predict with a saved model into a Zarr store")
    p.add_argument("--model", required=True, help="model directory written by 'daskkrr fit'")
    p.add_argument("--data", required=True, help="Zarr store with array X, or a Parquet table")
    _add_table_columns(p, None, "the model's feature names, else all columns")
    p.add_argument("--out", required=True, help="Zarr store to write (array 'y_pred', 'decision' or 'proba')")
    p.add_argument("--output", choices=PREDICT_OUTPUTS, default="label",
                   help="classifiers: 'label' (the predicted classes, array 'y_pred'), 'decision' (the "
                        "decision values, array 'decision') or 'proba' (class probabilities, array 'proba', "
                        "one column per class; classifiers with predict_proba, e.g. --estimator logistic). "
                        "Regressors always write their predictions (array 'y_pred')")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    _add_scheduler(p)

    p = command("score", "score a saved model on a Zarr store with X and y, or a Parquet table; print the metrics "
                         "as JSON")
    p.add_argument("--model", required=True, help="model directory written by 'daskkrr fit'")
    p.add_argument("--data", required=True, help="Zarr store with arrays X and y, or a Parquet table (with --target)")
    _add_table_columns(p, _TARGET_HELP, "the model's feature names, else all columns but --target")
    _add_scheduler(p)

    from daskkrr.models.registry import UNSUPERVISED

    for name, help_text, out_help in (
        ("embed", "Nystrom kernel PCA of a Zarr store's X (or a Parquet table's columns), written to a Zarr store",
         "Zarr store to write: array 'X' (the components) and the input's 'y', if it has one (a Parquet table's "
         "--target)"),
        ("cluster", "Nystrom kernel k-means of a Zarr store's X (or a Parquet table's columns); the labels written "
                    "to a Zarr store",
         "Zarr store to write: array 'labels'"),
    ):
        kind = "kpca" if name == "embed" else "kmeans"
        p = command(name, help_text)
        p.add_argument("--data", required=True, help="Zarr store with array X, or a Parquet table")
        if name == "embed":
            _add_table_columns(p, "Parquet --data: a column left out of the features and written to --out as its "
                                  "array 'y' (default: none)",
                               "the --model's feature names, else all columns but --target")
        else:
            _add_table_columns(p, None, "the --model's feature names, else all columns")
        p.add_argument("--out", required=True, help=out_help)
        p.add_argument("--model", default=None, metavar="DIR",
                       help="use this saved model instead of fitting one (default: fit on --data)")
        p.add_argument("--save-model", dest="save_model", default=None, metavar="DIR",
                       help="also save the fitted model to DIR (default: not saved)")
        _add_model_flags(p, {kind: UNSUPERVISED[kind]})
        p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
        p.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar on stderr (default: a bar)")
        _add_scheduler(p)

    p = command("export-onnx", "write a saved model as an ONNX model, to serve with onnxruntime without daskkrr")
    p.add_argument("model", help="model directory written by 'daskkrr fit' (or embed --save-model)")
    p.add_argument("output", help="ONNX file to write, e.g. model.onnx")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="floating type of the model's input X and of its arithmetic")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")

    p = command("quickstart", "generate data, fit on a local cluster, print the test error")
    p.add_argument("--n", type=_positive_int, default=100_000, help="rows of synthetic data")
    p.add_argument("--d", type=_positive_int, default=8, help="features")
    p.add_argument("--centers", type=_positive_int, default=1000, help="Nystrom centers")
    p.add_argument("--max-iter", type=_positive_int, default=15, help="CG iterations at most")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    _add_scheduler(p)

    p = command("run", "run a workflow file (data, model, evaluation, outputs) into a new run directory")
    p.add_argument("workflow", help="workflow TOML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="override a value of the file, e.g. --set data.store=today.zarr (repeatable; default: none)")
    p.add_argument("--runs-dir", default=None, help="where run directories go (default: the file's runs_dir)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars on stderr (default: bars)")
    _add_scheduler(p)

    p = command("tune", "tune sigma/penalty/n_centers by batched BKB; save the best model and the history")
    p.add_argument("--data", required=True, help="Zarr store (arrays X, y), CSV/TSV or Parquet table")
    _add_table_columns(p, "target column of a table --data (default: none)", "all columns but --target")
    p.add_argument("--out", required=True, help="model directory to write (the best candidate refitted on all data)")
    p.add_argument("--history", default=None, metavar="FILE",
                   help="search history, CSV or .json (default: OUT.history.csv next to --out)")
    p.add_argument("--config", default=None, help="TOML file with a [model] table (default: none)")
    _add_model_flags(p)
    space = p.add_argument_group("search", "the tuning space (log-uniform) and budget")
    space.add_argument("--sigma-range", nargs=2, type=float, metavar=("LOW", "HIGH"), default=None,
                       help="sigma range (default: sqrt(d)/10 to 10 sqrt(d))")
    space.add_argument("--penalty-range", nargs=2, type=float, metavar=("LOW", "HIGH"), default=None,
                       help="penalty range (default: 1e-8 to 1e-1)")
    space.add_argument("--centers-range", nargs=2, type=_positive_int, metavar=("LOW", "HIGH"), default=None,
                       help="n_centers range (default: n_centers not tuned)")
    space.add_argument("--ard", action="store_true", help="one sigma per feature (the estimator must accept it)")
    space.add_argument("--fixed-space", action="store_true",
                       help="never extend a range past a face the best candidate is on (default: extend, twice "
                            "per face at most)")
    space.add_argument("--no-refine", action="store_true",
                       help="spend every fit on the bandit (default: the last rounds refine the best candidate "
                            "locally)")
    space.add_argument("--no-penalty-path", action="store_true",
                       help="search the penalty as one more coordinate (default: score each candidate's whole "
                            "penalty path from one Gram pass, where the estimator allows)")
    space.add_argument("--candidates", type=_positive_int, default=256, help="candidates drawn in the space")
    space.add_argument("--budget-fits", type=_positive_int, default=40, help="model fits at most")
    space.add_argument("--budget-seconds", type=float, default=None,
                       help="no new batch of fits after this many seconds (default: no limit)")
    space.add_argument("--round-size", type=_positive_int, default=None,
                       help="candidates fitted in parallel per round, BKBSearchCV's batch_size (default: the "
                            "cluster's slots per split)")
    space.add_argument("--cv", type=_scalar, default=0.25,
                       help="validation fraction of one holdout split (0 < f < 1), or K >= 2 folds")
    space.add_argument("--scoring", default=None, help="scikit-learn scoring name (default: the estimator's score)")
    space.add_argument("--search-seed", type=int, default=0, help="seeds the candidates, splits and bandit")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model directory and history")
    _add_scheduler(p)
    return parser


def _cmd_convert(args: argparse.Namespace) -> None:
    from daskkrr.data import convert_table
    from daskkrr.utils.output_paths import check_paths

    check_paths(inputs={"input": args.input}, outputs={"output": args.output}, overwrite=args.overwrite)
    if args.sparse:
        _convert_sparse(args)
        return
    if args.target is None:
        raise UsageError("convert needs --target NAME (the target column of the table), or --sparse for a "
                         "LIBSVM/svmlight file, whose labels are the target")
    summary = convert_table(args.input, args.output, target=args.target, chunk_rows=args.chunk_rows,
                            sep=args.sep, overwrite=args.overwrite, categorical=args.categorical)
    encoded = summary.get("categories") or {}
    note = f" ({', '.join(encoded)} one-hot encoded)" if encoded else ""
    print(f"wrote {args.output}: {summary['rows']} rows x {summary['features']} features{note}, "
          f"target {args.target!r}")


def _convert_sparse(args: argparse.Namespace) -> None:
    """``convert --sparse``: a LIBSVM/svmlight file to CSR row blocks (daskkrr.data.sparse_store)."""
    from daskkrr.data.sparse_store import convert_svmlight

    summary = convert_svmlight(args.input, args.output, chunk_rows=args.chunk_rows)
    print(f"wrote {args.output}: {summary['rows']} rows x {summary['features']} features, "
          f"{summary['stored']} stored entries (sparse), target 'y'")


def _cmd_generate(args: argparse.Namespace) -> None:
    from daskkrr.data import write_blobs_zarr, write_classification_zarr, write_regression_zarr
    from daskkrr.parallel import cluster_client
    from daskkrr.utils.output_paths import check_paths

    if args.classes and args.clusters:
        raise UsageError("generate takes --classes (classification data) or --clusters (blobs), not both")
    check_paths(outputs={"output": args.output}, overwrite=args.overwrite)  # fail before starting a cluster
    # The blocks are generated on the workers.
    with cluster_client(args.scheduler, n_workers=args.workers, security=args.security):
        if args.clusters:
            write_blobs_zarr(args.output, args.n, args.d, n_clusters=args.clusters, chunk_rows=args.chunk_rows,
                             random_state=args.seed, overwrite=args.overwrite)
        elif args.classes:
            write_classification_zarr(args.output, args.n, args.d, n_classes=args.classes,
                                      chunk_rows=args.chunk_rows, random_state=args.seed, overwrite=args.overwrite)
        else:
            write_regression_zarr(args.output, args.n, args.d, chunk_rows=args.chunk_rows,
                                  random_state=args.seed, overwrite=args.overwrite)
    print(f"wrote {args.output}: {args.n} rows x {args.d} features")


def _cmd_fit(args: argparse.Namespace) -> None:
    from daskkrr.parallel import cluster_client
    from daskkrr.utils.output_paths import check_paths

    # Fail before the work, not after: --out over --data or --checkpoint, unwritable, existing.
    check_paths(inputs={"--data": args.data, "--config": args.config}, outputs={"--out": args.out},
                states={"--checkpoint": args.checkpoint}, overwrite=args.overwrite)
    model = _model_from_args(args)
    fit_kwargs = _checkpoint_kwargs(args, model)
    if args.sample_weight is not None:
        import inspect

        if "sample_weight" not in inspect.signature(model.fit).parameters:
            raise UsageError(f"--sample-weight: {type(model).__name__} takes no sample weights")
    data = _fit_inputs(args, model)
    # The fit's current client.
    with cluster_client(args.scheduler, n_workers=args.workers, security=args.security) as client:
        t0 = time.perf_counter()
        inputs, weight = _read_table(data, args.sample_weight)
        if weight is not None:  # a store's array by name, or a Parquet column
            fit_kwargs["sample_weight"] = weight
        with _fit_progress(args, client):
            model.fit(*inputs, **fit_kwargs)
        model.save(args.out, overwrite=args.overwrite)
    print(f"fitted {type(model).__name__} with {model.centers_.shape[0]} centers in "
          f"{time.perf_counter() - t0:.1f}s ({model.n_iter_} CG iterations, {convergence_note(model)}); "
          f"wrote {args.out}")


def _cmd_tune(args: argparse.Namespace) -> None:
    from daskkrr.data.parquet import is_parquet
    from daskkrr.parallel import cluster_client
    from daskkrr.tune import BKBSearchCV
    from daskkrr.tune.outputs import read_training_data, write_history
    from daskkrr.utils.output_paths import check_paths

    history = args.history or f"{str(args.out).rstrip('/')}.history.csv"
    check_paths(inputs={"--data": args.data, "--config": args.config},  # fail before the work, not after
                outputs={"--out": args.out, "--history": history}, overwrite=args.overwrite)
    if args.budget_seconds is not None and not args.budget_seconds > 0:
        raise UsageError(f"--budget-seconds must be > 0; got {args.budget_seconds!r}")
    model = _model_from_args(args)
    space = {name: tuple(r) for name, r in (("sigma", args.sigma_range), ("penalty", args.penalty_range),
                                           ("n_centers", args.centers_range)) if r is not None}
    columns = _table_columns(args, model, target_required=True) if is_parquet(args.data) else None
    if columns is None:
        if args.features is not None:
            raise UsageError("--features names the columns of a Parquet --data; a CSV/TSV table's are all its "
                             "columns but --target, a Zarr store's its array X: drop it")
        X, y = read_training_data(args.data, args.target)
    search = BKBSearchCV(model, space or None, n_candidates=args.candidates, budget_fits=args.budget_fits,
                         budget_seconds=args.budget_seconds, batch_size=args.round_size, cv=args.cv,
                         scoring=args.scoring, ard=args.ard, grow_space=not args.fixed_space,
                         refine=not args.no_refine, random_state=args.search_seed,
                         profile_penalty=False if args.no_penalty_path else "auto")
    if search.param_space is not None and search.ard and "sigma" not in space:
        raise UsageError("--ard tunes sigma per feature: give --sigma-range")
    with cluster_client(args.scheduler, n_workers=args.workers, security=args.security):  # the fits' cluster
        t0 = time.perf_counter()
        if columns is not None:
            X, y = _read_table(columns)[0]  # read into memory by the search, as a store is
        search.fit(X, y)
        search.best_estimator_.save(args.out, overwrite=args.overwrite)
    write_history(search.history_, history)
    best = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in search.best_params_.items()
                     if not hasattr(v, "__len__"))
    print(f"tuned {type(model).__name__} in {time.perf_counter() - t0:.1f}s: {search.n_fits_} fits "
          f"({search.stop_reason_}), best validation score {search.best_score_:.4g} with {best or 'ARD sigma'}; "
          f"wrote {args.out} and {history}")
    for round_, name, side, bound in search.space_growth_:
        print(f"  round {round_}: the {name} range grew past its {side} face to {bound:.4g}")


def convergence_note(model: Any) -> str:
    """"converged", or "NOT converged: residual r > tol" for a CG that stopped above ``tol``."""
    if getattr(model, "converged_", True):
        return "converged"
    residual = max(float(r) for r in model.residuals_[-1])
    return f"NOT converged: residual {residual:.3g} > tol {model.tol:g}; raise --max-iter or --tol"


def _model_from_args(args: argparse.Namespace) -> Any:
    """The estimator of ``--config`` (if any), ``--estimator`` and the parameter flags (``fit``, ``tune``)."""
    from daskkrr.config import read_config

    config = read_config(args.config, estimator=args.estimator) if args.config else {}
    if args.estimator:
        config["estimator"] = args.estimator
    return _build_from_flags(config, _model_overrides(args), verbose=bool(args.verbose))


def _build_from_flags(config: dict[str, Any], flags: dict[str, Any], verbose: bool) -> Any:
    """The estimator of ``config`` with the flags' values on top; errors name the flag."""
    from daskkrr.config import ConfigError, build_estimator
    from daskkrr.models.registry import DEFAULT_ESTIMATOR, ESTIMATORS
    from daskkrr.models.schema import config_specs

    name = config.get("estimator", DEFAULT_ESTIMATOR)
    accepted = config_specs(ESTIMATORS[name])
    for key in flags:
        if key not in accepted:
            raise UsageError(f"{_flag_of(key)} does not apply to estimator {name!r}; its parameters: "
                              f"{', '.join(_flag_of(k) for k in accepted)}")
    try:
        return build_estimator(config, **flags, **({"verbose": True} if verbose else {}))
    except ConfigError as exc:
        bad = getattr(exc.__cause__, "parameter", None)
        if bad in flags:
            raise UsageError(f"{_flag_of(bad)} {flags[bad]!r}: {exc.__cause__}") from exc
        raise


def _fit_progress(args: argparse.Namespace, client: Any) -> Any:
    """Progress of the fit on stderr: a bar (unless --no-progress or -v) and the dashboard page's link."""
    from daskkrr.dashboard import dashboard_url
    from daskkrr.progress import ProgressBar, report

    def announce(progress: Any, event: str) -> None:
        if event == "begin" and args.progress and not args.quiet:
            url = dashboard_url(client)
            if url:
                print(f"daskkrr: progress on the dashboard: {url}", file=sys.stderr, flush=True)

    return report(bar=ProgressBar() if _progress_bar(args) else False, callback=announce)


def _progress_bar(args: argparse.Namespace) -> bool:
    """A bar on stderr: not with --no-progress, -v (the log shows progress) or -q."""
    return bool(getattr(args, "progress", True)) and not args.verbose and not args.quiet


def _cmd_run(args: argparse.Namespace) -> None:
    from daskkrr.utils.toml_file import read_toml
    from daskkrr.workflow import run_workflow
    from daskkrr.workflow.unsupervised import is_unsupervised, run_unsupervised_workflow

    # --tls-* override the workflow's [cluster] keys (paths relative to here, not to the file).
    args.overrides = [*args.overrides, *(f"cluster.{key}={os.path.abspath(value)}" for key, value in (
        ("tls_ca_file", args.tls_ca_file), ("tls_cert", args.tls_cert), ("tls_key", args.tls_key)) if value)]

    try:
        unsupervised = is_unsupervised(read_toml(args.workflow))
    except (OSError, ValueError):
        unsupervised = False  # run_workflow reports the problem
    if unsupervised:
        done = run_unsupervised_workflow(args.workflow, overrides=args.overrides, runs_dir=args.runs_dir,
                                         scheduler=args.scheduler, n_workers=args.workers, security=args.security,
                                         progress=_progress_bar(args))
        parts = [f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in done.metrics[name].items()
                                         if k in ("inertia", "ari", "nmi", "seconds") and isinstance(v, float))
                 for name in ("kpca", "kmeans") if name in done.metrics]
        print(f"run {done.run_id} succeeded in {done.metrics.get('seconds', 0):.1f}s ({'; '.join(parts)}); "
              f"wrote {done.run_dir}")
        return
    result = run_workflow(args.workflow, overrides=args.overrides, runs_dir=args.runs_dir,
                          scheduler=args.scheduler, n_workers=args.workers, security=args.security,
                          progress=_progress_bar(args))
    m = result.metrics
    print(f"run {result.run_id} succeeded in {m.get('seconds', 0):.1f}s ({m.get('evaluation')}: {run_figures(m)}); "
          f"wrote {result.run_dir}")


def run_figures(metrics: dict[str, Any]) -> str:
    """A workflow run's scores for its summary line, e.g. "rmse 0.12, r2 0.98"; an online run's first
    night has none (no earlier model to score the new rows with), and says what it learnt instead."""
    scores = metrics.get("metrics", {})
    figures = ", ".join(f"{k} {v:.4g}" for k, v in scores.items()
                        if k in ("rmse", "mae", "r2", "accuracy") and isinstance(v, float))
    if figures or "n_new_rows" not in scores:
        return figures or "no scores"
    return f"no earlier model to score with; learnt {scores['n_new_rows']} rows"


def _check_before_start(model: Any, data: str | None, features_only: bool = False) -> None:
    """Refuse bad parameters and a missing or damaged store (None: no store) before a cluster is started."""
    from daskkrr.data import open_dataset

    if hasattr(model, "_validate_params") and not hasattr(model, "coef_"):
        model._validate_params()
    if data is None:
        return
    X, _ = open_dataset(data, y=None if features_only else "y")  # reads metadata only
    if features_only:
        model._check_n_features(X.shape)
    else:
        _check_row_limit(model, int(X.shape[0]), int(X.shape[1]) if X.ndim > 1 else 1)


def _check_row_limit(model: Any, n: int, d: int) -> None:
    """Refuse an exact fit's ``n > max_samples`` from the store's shape, as the fit would, but before a
    cluster is started (the memory check needs the cluster's workers: the fit makes it)."""
    max_samples = getattr(model, "max_samples", None)
    if max_samples is None or n <= int(max_samples):
        return
    from daskkrr.pipeline.exact_pcg import choose_solver
    from daskkrr.pipeline.stages import check_exact_resources

    if choose_solver(model, n, d) == "direct":  # "auto" takes the PCG solver above max_samples
        check_exact_resources(model, n, d)  # refuses n above max_samples before it looks at memory


def _fit_inputs(args: argparse.Namespace, model: Any) -> Any:
    """``fit``'s data, checked before a cluster starts: a Zarr store's path (its weight array checked), or a
    Parquet table's columns (:class:`~daskkrr.data.parquet.ParquetColumns`, read by :func:`_read_table`)."""
    columns = _table_columns(args, model, target_required=True, weight=args.sample_weight)
    if columns is not None:
        _check_before_start(model, None)
        return columns
    _check_before_start(model, args.data)
    if args.sample_weight is not None:
        _check_weight_variable(args.data, args.sample_weight)
    return args.data


def _table_columns(args: argparse.Namespace, model: Any, target_required: bool, weight: str | None = None) -> Any:
    """A Parquet ``--data``'s columns (``--target``, ``--features``, the weight column), checked on the table's
    footers before a cluster starts; None for a Zarr store, where the column flags are refused.

    The features default to those of a fitted ``model`` (by name), else to every column but the target
    and the weights.
    """
    from daskkrr.data.parquet import is_parquet, parquet_columns

    target, features = getattr(args, "target", None), getattr(args, "features", None)
    if not is_parquet(args.data):
        if target is not None or features is not None:
            raise UsageError("--target and --features name the columns of a Parquet --data; a Zarr store's are "
                             "its arrays X and y: drop them" if hasattr(args, "target") else
                             "--features names the columns of a Parquet --data; a Zarr store's are its array X: "
                             "drop it")
        return None
    if target is None and target_required:
        raise UsageError(f"--data {args.data} is a Parquet table: name its target column with --target")
    columns = parquet_columns(args.data, target, _model_features(model, features), weight)
    if hasattr(model, "n_features_in_"):  # a fitted model: as many columns as it was fitted on
        model._check_n_features((None, len(columns.features)))
    return columns


def _model_features(model: Any, features: list[str] | None) -> list[str] | None:
    """The feature columns of a Parquet table for ``model``: its feature names if it was fitted with them
    (``--features`` must then be those, in order), else ``--features`` (None: the table's own)."""
    names = getattr(model, "feature_names_in_", None)
    if names is None:
        return features
    names = [str(name) for name in names]
    if features is not None and features != names:
        raise UsageError(f"--features {','.join(features)}: the model was fitted on the columns {names}, in "
                         f"this order; drop --features (they are taken by name)")
    return names


def _read_table(data: Any, weight: str | None = None) -> tuple[tuple[Any, ...], Any]:
    """The inputs of a fit, a score or a transform (on the current client), and its weights: a Zarr store's
    path and weight array's name as they are; a Parquet table's columns read as dask arrays (one pass over
    the table counts each row group's rows and refuses a missing value by column and rows)."""
    if isinstance(data, str):
        return (data,), weight
    X, y, w = data.arrays()
    return ((X,) if y is None else (X, y)), w


def _predict_input(args: argparse.Namespace, model: Any) -> Any:
    """``predict``'s data, checked before a cluster starts: a Zarr store's path, or a Parquet table's feature
    columns: the model's feature names (or ``--features``, or all columns), in order."""
    columns = _table_columns(args, model, target_required=False)
    if columns is None:
        _check_before_start(model, args.data, features_only=True)
    return args.data if columns is None else columns


def _check_weight_variable(data: str, name: str) -> None:
    """Refuse a --sample-weight array the store lacks, or of another length, before a cluster is started."""
    from daskkrr.data import open_dataset

    X, w = open_dataset(data, y=name)  # metadata only; a missing name lists the store's arrays
    if w is None or w.ndim != 1 or w.shape[0] != X.shape[0]:
        shape = None if w is None else tuple(w.shape)
        raise UsageError(f"--sample-weight {name}: the array must hold one weight per row of X ({X.shape[0]}); "
                         f"it has shape {shape}")


def _checkpoint_kwargs(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """``fit`` keywords for --checkpoint/--resume, checked before any work starts."""
    if args.checkpoint is None:
        if args.resume:
            raise UsageError("--resume needs --checkpoint DIR (the directory of the interrupted fit)")
        return {}
    import inspect

    if "checkpoint" not in inspect.signature(model.fit).parameters:
        raise UsageError(
            f"--checkpoint is supported by the falkon, classifier, logistic and exact estimators, not by "
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
    from daskkrr.utils.output_paths import check_paths

    check_paths(inputs={"--data": args.data, "--model": args.model}, outputs={"--out": args.out},
                overwrite=args.overwrite)
    model = load_model(args.model)
    name = _predict_output(model, args.output)
    data = _predict_input(args, model)
    with cluster_client(args.scheduler, n_workers=args.workers, security=args.security):
        data = _read_table(data)[0][0]  # a Parquet table's row counts: the Zarr output's chunks
        if name == "proba":
            pred = model.predict_proba(data)
        else:
            pred = model.decision_function(data) if name == "decision" else model.predict(data)
        write_array_zarr(pred, args.out, name=name, overwrite=args.overwrite)
    what = {"decision": "decision values", "proba": "class probabilities"}.get(name, "predictions")
    print(f"wrote {args.out}: {pred.shape[0]} {what} (array {name!r})")


def _predict_output(model: Any, output: str) -> str:
    """The array ``daskkrr predict --output`` writes: "y_pred", "decision" or "proba" (refused,
    before any work, for a model without ``predict_proba``)."""
    classifier = hasattr(model, "classes_")
    if output == "proba":
        if classifier and hasattr(model, "predict_proba"):
            return "proba"
        raise UsageError(f"--output proba: {type(model).__name__} has no class probabilities; "
                         + ("use --output label or --output decision" if classifier else
                            "a regressor writes its predictions, drop --output"))
    if output == "decision" and not classifier:
        raise UsageError(f"--output decision is for classifiers; {type(model).__name__} writes its predictions "
                         "(drop --output)")
    return "decision" if output == "decision" else "y_pred"


def _cmd_score(args: argparse.Namespace) -> None:
    from daskkrr.data import open_dataset
    from daskkrr.models.loading import load_model
    from daskkrr.parallel import cluster_client

    model = load_model(args.model)
    columns = _table_columns(args, model, target_required=True)
    if columns is None:
        _check_before_start(model, args.data, features_only=True)
        X, y = open_dataset(args.data, y="y")  # metadata only; refuses a store without y
    with cluster_client(args.scheduler, n_workers=args.workers, security=args.security):
        if columns is not None:
            X, y = _read_table(columns)[0]
        metrics = score_metrics(model, X, y)
    print(json.dumps(metrics, sort_keys=True))


def score_metrics(model: Any, X: Any, y: Any) -> dict[str, Any]:
    """Metrics of ``model`` on ``(X, y)``: ``r2``, ``rmse``, ``mae`` for a regressor, ``accuracy``
    for a classifier, with ``n`` (rows) and ``model`` (the class name); computed blockwise."""
    from daskkrr.workflow.evaluate import compute_metrics

    names = ["accuracy"] if hasattr(model, "classes_") else ["r2", "rmse", "mae"]
    metrics = compute_metrics(y, model.predict(X), names)
    out: dict[str, Any] = {"model": type(model).__name__, "n": int(metrics["n"])}
    out.update({name: float(metrics[name]) for name in names})
    return out


def _cmd_unsupervised(args: argparse.Namespace) -> None:
    """``daskkrr embed`` (kernel PCA -> array 'X') and ``daskkrr cluster`` (k-means -> array 'labels')."""
    from daskkrr.data import open_dataset, write_array_zarr, write_zarr
    from daskkrr.models.loading import load_model
    from daskkrr.models.registry import UNSUPERVISED
    from daskkrr.parallel import cluster_client
    from daskkrr.utils.output_paths import check_paths

    cls = UNSUPERVISED["kpca" if args.command == "embed" else "kmeans"]
    check_paths(inputs={"--data": args.data, "--model": args.model},  # fail before the work, not after
                outputs={"--out": args.out, "--save-model": args.save_model}, overwrite=args.overwrite)
    flags = _model_overrides(args, {"model": cls})
    if args.model:
        if flags:
            raise UsageError(f"--model uses a saved model; drop {', '.join(_flag_of(k) for k in flags)}")
        model = load_model(args.model)
        if not isinstance(model, cls):
            raise UsageError(f"--model {args.model} holds a {type(model).__name__}; 'daskkrr {args.command}' "
                             f"needs a {cls.__name__}")
    else:
        model = cls(**flags, **({"verbose": True} if args.verbose else {}))
        model._validate_params()  # bad flags refused before a cluster starts
    columns = _table_columns(args, model, target_required=False)  # a Parquet table's, checked on its footers
    if columns is None:
        X, y = open_dataset(args.data, y="y")  # metadata only; y None if the store has none
        if args.model:
            model._check_n_features(X.shape)
        else:
            model._check_data_size(int(X.shape[0]))  # n_clusters > n: refused before a cluster starts
    with cluster_client(args.scheduler, n_workers=args.workers, security=args.security) as client:
        t0 = time.perf_counter()
        data: Any = args.data
        if columns is not None:
            data, *target = _read_table(columns)[0]  # the rows counted: n_clusters > n refused before the fit
            y = target[0] if target else None
            if not args.model:
                model._check_data_size(int(data.shape[0]))
        if not args.model:
            with _fit_progress(args, client):
                model.fit(data)
        if args.command == "embed":
            out = model.transform(data)
            write_zarr(out, y, args.out, overwrite=args.overwrite)
            what = f"{out.shape[0]} rows x {out.shape[1]} components (array 'X')" + (
                " and the target (array 'y')" if y is not None else "")
        else:
            out = model.predict(data) if args.model else model.labels_
            write_array_zarr(out, args.out, name="labels", overwrite=args.overwrite)
            what = f"{out.shape[0]} labels of {model.n_clusters} clusters (array 'labels')"
        if args.save_model:
            model.save(args.save_model, overwrite=args.overwrite)
    note = "" if args.model else f" (fit with {model.n_centers_} centers"
    if not args.model:
        note += f", {model.n_iter_} Lloyd iterations)" if args.command == "cluster" else ")"
    print(f"wrote {args.out}: {what} in {time.perf_counter() - t0:.1f}s{note}")


def _cmd_export_onnx(args: argparse.Namespace) -> None:
    from daskkrr.export import save_onnx
    from daskkrr.models.loading import load_model
    from daskkrr.utils.output_paths import check_paths

    # Refused before the model is read: an output over the model directory, unwritable, or existing.
    check_paths(inputs={"model": args.model}, outputs={"output": args.output}, overwrite=args.overwrite)
    model = load_model(args.model)
    save_onnx(model, args.output, dtype=args.dtype, overwrite=args.overwrite)
    print(f"wrote {args.output}: {type(model).__name__} as an ONNX model (input 'X' of {model.n_features_in_} "
          f"{args.dtype} features)")


def _cmd_quickstart(args: argparse.Namespace) -> None:
    from daskkrr.progress import ProgressBar, report
    from daskkrr.quickstart import run_quickstart

    with report(bar=ProgressBar() if _progress_bar(args) else False):  # the fit's progress on stderr
        run_quickstart(n=args.n, d=args.d, n_centers=args.centers, max_iter=args.max_iter, seed=args.seed,
                       scheduler=args.scheduler, n_workers=args.workers, security=args.security)


_COMMANDS = {
    "convert": _cmd_convert,
    "generate": _cmd_generate,
    "fit": _cmd_fit,
    "predict": _cmd_predict,
    "score": _cmd_score,
    "quickstart": _cmd_quickstart,
    "run": _cmd_run,
    "tune": _cmd_tune,
    "embed": _cmd_unsupervised,
    "cluster": _cmd_unsupervised,
    "export-onnx": _cmd_export_onnx,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskkrr`` console script; returns the exit code (see the module docstring).

    Ctrl-C (or SIGTERM/SIGHUP, under :func:`_entry`) at any moment, the imports and the
    parsing before the command included, prints the documented line and returns 130
    (128 + the signal's number), without a traceback.
    """
    from daskkrr.signals import forget_signals

    forget_signals()  # an earlier command's signal (in this process) is not this one's
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:  # before or after the command: nothing was written
        return _interrupted(exc)
    except Exception:
        seen = _signal_seen()
        if seen is None:
            raise
        return _interrupted(seen)  # the signal, turned into another error by the code it landed in


#: Ctrl-Cs seen by :func:`_entry`'s handler (a signal can be turned into another error, e.g. an ImportError).
_SIGINTS: list[int] = []


def _on_sigint(signum: int, frame: Any) -> None:
    _SIGINTS.append(signum)
    raise KeyboardInterrupt


def _signal_seen() -> KeyboardInterrupt | None:
    """The interruption of this process, if a signal arrived: Ctrl-C, else SIGTERM/SIGHUP."""
    from daskkrr.signals import last_signal

    if _SIGINTS:
        return KeyboardInterrupt()
    signum = last_signal()
    return None if signum is None else Interrupted(signum)


def _interrupted(exc: KeyboardInterrupt) -> int:
    """Say that the command was interrupted; the exit code: 130 for Ctrl-C, 128 + the signal's number."""
    why = f" ({exc})" if isinstance(exc, Interrupted) else ""
    print(f"daskkrr: interrupted{why}; no partial output was left", file=sys.stderr)
    return 128 + exc.signum if isinstance(exc, Interrupted) else 130


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.verbose and args.quiet:
            parser.error("-v/--verbose and -q/--quiet exclude each other")
    except SystemExit as exc:  # a usage error (2), or --help/--version (0): already printed
        return exc.code if isinstance(exc.code, int) else 2
    level = logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if args.quiet:
        warnings.simplefilter("ignore")
    warnings.formatwarning = _format_warning
    if not args.verbose:
        # Quiet the scheduler/worker chatter, here and in worker processes (they inherit the env).
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
        import dask

        # The one key, set in place: dask.config.refresh() would empty the whole config first, and a
        # worker running in this process (a LocalCluster(processes=False), a notebook calling main())
        # that reads it in that moment (its heartbeat) fails with KeyError and closes itself; the next
        # computation then waits forever for workers. It also dropped the caller's own dask settings.
        dask.config.set({"logging.distributed": os.environ["DASK_LOGGING__DISTRIBUTED"]})
        logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        # SIGTERM/SIGHUP unwind like Ctrl-C: temporary outputs are removed, local clusters closed.
        with interrupt_on_signals():
            args.security = _security(args)  # TLS settings checked before any work
            _COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except UsageError as exc:
        print(f"daskkrr: error: {_one_line(exc)}; see 'daskkrr {args.command} --help'", file=sys.stderr)
        return 2
    except Exception as exc:  # one line, no traceback, for any failure
        interrupt = _interruption(exc) or _signal_seen()
        if interrupt is not None:  # the signal landed inside clean-up code, which then failed
            return _interrupted(interrupt)
        if args.verbose:
            logger.exception("command failed")
        message = cli_message(_one_line(exc) or type(exc).__name__)
        print(f"daskkrr: error: {message}", file=sys.stderr)
        return 1
    return 0


def _security(args: argparse.Namespace) -> Any:
    """The TLS of a command's --scheduler (None for a local cluster or plain TCP); bad flags are usage errors."""
    if not hasattr(args, "scheduler") or args.command == "run":  # run: the workflow's [cluster] has the say
        return None
    from daskkrr.parallel.client import tls_security

    try:
        return tls_security(args.scheduler, args.tls_ca_file, args.tls_cert, args.tls_key)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    """A warning as one line for the command line's user, ``daskkrr: warning: <what>``: the library's
    source file and line (Python's default) mean nothing to them; ``-v`` still logs tracebacks of errors."""
    return f"daskkrr: warning: {_one_line(message)}\n"


def _interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The interruption an error happened while handling, if any.

    A signal can land inside a ``with lock:`` block of a library; the ``KeyboardInterrupt``
    then unwinds through the lock's exit, which may fail in turn ("release unlocked lock").
    The command was interrupted all the same, and must say so with the signal's exit code.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def cli_message(message: str) -> str:
    """An error message of the library in the command line's words: ``pass overwrite=True`` ->
    ``pass --overwrite``, ``n_centers=5000`` -> ``--n-centers=5000``, ``force=True`` -> the variable."""
    from daskkrr.models.registry import ESTIMATORS
    from daskkrr.models.schema import union_specs
    from daskkrr.parallel.guards import FORCE_ENV

    message = message.replace(f"pass force=True (or set {FORCE_ENV}=1)", f"set {FORCE_ENV}=1")
    # "pass resume=True (daskkrr fit --resume)" -> "pass --resume"
    message = re.sub(r"\bpass (overwrite|resume)=True(?: \(daskkrr [a-z]+ --\1\))?",
                     lambda m: f"pass --{m.group(1)}", message)
    flags = {name: spec.flag for name, (spec, _) in union_specs(ESTIMATORS).items()}
    names = "|".join(map(re.escape, sorted(flags, key=len, reverse=True)))
    # "n_centers=5000" (not "sampler=ExactRLSSampler(...)", Python only), "raise max_samples", "use n_centers <= 10"
    message = re.sub(r"(?<![\w.-])(" + names + r")=(?![A-Z]\w*\()", lambda m: f"{flags[m.group(1)]}=", message)
    return re.sub(r"\b(raise|use) (" + names + r")\b", lambda m: f"{m.group(1)} {flags[m.group(2)]}", message)


def _entry() -> Any:
    """The console script (and ``python -m daskkrr.cli``): SIGTERM and SIGHUP, like Ctrl-C, end even the
    start-up (the imports, before the command runs) with the documented line and code."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
        signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = _redeliver_swallowed_interrupt
    try:
        with interrupt_on_signals():
            code = main()
    except KeyboardInterrupt as exc:  # landed between the handlers' set-up and main's own guard
        code = _interrupted(exc)
    if code > 128:  # interrupted: see _exit_interrupted
        _exit_interrupted(code)
    sys.exit(code)


def _redeliver_swallowed_interrupt(unraisable: Any) -> None:
    """``sys.unraisablehook``: a signal whose exception landed where Python cannot raise it is sent again.

    A Ctrl-C (or SIGTERM) that arrives while Python runs a callback it cannot propagate from
    (a weakref callback of the import system's module locks, a ``__del__``) is printed as
    "Exception ignored in ..." with a traceback and then dropped, and the command would carry
    on as if never interrupted. Instead the same signal is sent again to the main thread a
    moment later, once this hook and the callback have returned, where the exception unwinds
    normally (a real signal, so that a blocking read is interrupted too).
    """
    exc = unraisable.exc_value
    if not isinstance(exc, KeyboardInterrupt) or threading.current_thread() is not threading.main_thread():
        sys.__unraisablehook__(unraisable)
        return
    import signal

    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    if isinstance(exc, Interrupted):  # its handler now ignores the signal (see interrupt_on_signals)
        signal.signal(signum, _raise_interrupted_once)
    main_id = threading.get_ident()
    # Raised any sooner (e.g. by _thread.interrupt_main here), the handler would run inside this hook.
    threading.Timer(_REDELIVERY_DELAY_S, signal.pthread_kill, (main_id, signum)).start()


#: How long after a dropped interruption it is sent again: long enough for the hook to have returned.
_REDELIVERY_DELAY_S = 0.05


def _raise_interrupted_once(signum: int, frame: Any) -> None:
    import signal

    signal.signal(signum, signal.SIG_IGN)  # as interrupt_on_signals does: the clean-up is not interrupted again
    raise Interrupted(signum)


def _exit_interrupted(code: int) -> None:
    """End the process with ``code`` after the usual exit clean-up.

    A Ctrl-C that lands while an extension runs Python code through the C API during its
    import (``PyRun_String``) leaves CPython 3.11 marked "unhandled KeyboardInterrupt",
    even though the error was caught here, and it then ends the process by SIGINT (-2)
    whatever ``sys.exit`` says. Exiting directly keeps the documented code.
    """
    import atexit

    atexit._run_exitfuncs()  # what a normal exit runs: logging's flush, Dask's and multiprocessing's clean-up
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    _entry()
