"""Workflow files: a TOML document naming data, preprocessing, model, evaluation and outputs.

::

    [workflow]
    name = "nightly-retrain"          # default: the file's stem
    runs_dir = "runs/nightly-retrain" # default: runs/<name>, relative to the file

    [data]                            # exactly one of store / table / generate
    store = "data/growing.zarr"       # Zarr store with arrays X and y
    # table = "houses.tsv.gz"         # CSV/TSV(.gz), or a Parquet file or folder, converted once to a
    # target = "median_house_value"   #   cached Zarr store (target required with table)
    # categorical = "onehot"          #   Parquet: one-hot encode categorical columns (default "refuse")
    # generate = { n = 20000, d = 8, seed = 0 }   # synthetic data, cached
    # sample_weight = "w"             # store only: its array of row weights (fit's sample_weight)

    [preprocess]
    max_rows = 1_000_000              # use the first max_rows rows
    chunk_rows = 50_000               # rows per block for the fit
    standardize = true                # -> model parameter
    dtype = "float64"                 # -> model parameter

    [model]                           # the [model] table of daskkrr.config: any estimator
    estimator = "falkon"              #   parameter (daskkrr.models.registry names the estimators)
    n_centers = 1000                  #   "none" stands for None

    [sweep]                           # optional: one fit per combination of these model values
    n_centers = [500, 1000]

    [evaluation]
    method = "holdout"                # holdout | cv | none
    test_fraction = 0.2               # holdout
    split = "tail"                    # tail: the newest rows (holdout) or contiguous folds (cv);
                                      # random: rows drawn per block from seed.
                                      # Default: tail for holdout, random for cv
    folds = 3                         # cv
    seed = 0
    metrics = ["rmse", "mae", "r2"]   # regression; classifiers: ["accuracy"]

    [outputs]
    model = true                      # save the (best) model
    predictions = false               # held-out predictions -> predictions.zarr
    refit = false                     # refit the best model on all rows (always for cv)
    latest = true                     # point runs_dir/latest at the last successful run

    [cluster]
    scheduler = "tcp://host:8786"     # default: $DASK_SCHEDULER_ADDRESS, else a local cluster
    workers = 2                       # local cluster size
    # tls_ca_file = "ca.pem"          # a tls:// scheduler: the authority that signed its certificate,
    # tls_cert = "client.pem"         #   this client's certificate and key, if it requires one
    # tls_key = "client.key"          #   (PEM files; the daskkrr run --tls-* flags override them)

Paths are relative to the workflow file. Unknown tables and keys are errors that
name the key; the [model] table is checked by :func:`daskkrr.config.check_model_config`.
"""

from __future__ import annotations

import copy
import itertools
import os
import tomllib
from pathlib import Path
from typing import Any

from sklearn.base import ClassifierMixin

from daskkrr.config import ConfigError, check_model_config
from daskkrr.data.parquet import CATEGORICAL_MODES
from daskkrr.models.registry import ESTIMATORS
from daskkrr.utils.toml_file import read_toml, unknown_keys

REGRESSION_METRICS = ("rmse", "mae", "r2")
CLASSIFICATION_METRICS = ("accuracy",)
HIGHER_IS_BETTER = {"r2", "accuracy"}
MAX_VARIANTS = 64
#: The [cluster] keys of a tls:// scheduler's certificates (paths relative to the workflow file).
TLS_KEYS = ("tls_ca_file", "tls_cert", "tls_key")

# table -> key -> (types, default). A default of ... means "required or resolved later".
_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], Any]]] = {
    "workflow": {
        "name": ((str,), None),
        "runs_dir": ((str,), None),
        "description": ((str,), ""),
    },
    "data": {
        "store": ((str,), None),
        "table": ((str,), None),
        "target": ((str,), None),
        "sep": ((str,), None),
        "categorical": ((str,), None),
        "cache": ((str,), None),
        "generate": ((dict,), None),
        "sample_weight": ((str,), None),
    },
    "preprocess": {
        "max_rows": ((int,), None),
        "chunk_rows": ((int,), None),
        "standardize": ((bool,), None),
        "dtype": ((str,), None),
    },
    "evaluation": {
        "method": ((str,), "holdout"),
        "test_fraction": ((float, int), 0.2),
        "split": ((str,), None),
        "folds": ((int,), 3),
        "seed": ((int,), 0),
        "metrics": ((list,), None),
    },
    "outputs": {
        "model": ((bool,), True),
        "predictions": ((bool,), False),
        "refit": ((bool,), None),
        "latest": ((bool,), True),
    },
    "cluster": {
        "scheduler": ((str,), None),
        "workers": ((int,), None),
        "tls_ca_file": ((str,), None),
        "tls_cert": ((str,), None),
        "tls_key": ((str,), None),
    },
}
_GENERATE = {"n": (int,), "d": (int,), "seed": (int,), "chunk_rows": (int,), "classes": (int,), "noise": (float, int),
             "clusters": (int,)}
_TABLES = set(_SCHEMA) | {"model", "sweep"}


class WorkflowError(ConfigError):
    """A workflow file or override is invalid; the message names the key and the fix."""


def _check_type(where: str, key: str, value: Any, types: tuple[type, ...]) -> None:
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise WorkflowError(f"{where}: {key} must be {names}; got {value!r} ({type(value).__name__})")


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal (number, bool, string, array, inline table) or a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """Apply ``table.key=value`` overrides (strings, as on the command line, or a dict)."""
    raw = copy.deepcopy(raw)
    if not overrides:
        return raw
    items = overrides.items() if isinstance(overrides, dict) else []
    if not isinstance(overrides, dict):
        parsed = []
        for item in overrides:
            if "=" not in item:
                raise WorkflowError(f"override {item!r} must look like table.key=value, e.g. model.n_centers=500")
            key, value = item.split("=", 1)
            parsed.append((key.strip(), parse_value(value.strip())))
        items = parsed
    for dotted, value in items:
        parts = dotted.split(".")
        if len(parts) != 2 or not all(parts):
            raise WorkflowError(f"override key {dotted!r} must be table.key, e.g. data.store or model.sigma")
        table, key = parts
        if table not in _TABLES:
            raise WorkflowError(f"override {dotted!r}: unknown table {table!r}; choose one of {sorted(_TABLES)}")
        section = raw.setdefault(table, {})
        if table == "data" and key in ("store", "table", "generate"):
            for other in ("store", "table", "generate"):
                section.pop(other, None)  # a new source replaces the file's
        section[key] = value
    return raw


def read_workflow(path: str | os.PathLike, overrides: list[str] | dict[str, Any] | None = None) -> dict[str, Any]:
    """Read, override and validate a workflow file; return the resolved configuration.

    Parameters
    ----------
    path : str or os.PathLike
        The workflow TOML file.
    overrides : list of "table.key=value" strings, dict or None, default=None
        Changes to the file, e.g. ``["model.n_centers=500"]``.

    Returns
    -------
    dict
        The configuration, every table filled with its defaults and paths resolved
        against the file's folder.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    WorkflowError
        If the file is not valid TOML or does not validate; the message names the
        table and key.
    """
    path = Path(path)
    raw = read_toml(path, error=WorkflowError, what="workflow file")
    raw = apply_overrides(raw, overrides)
    return resolve(raw, base_dir=path.resolve().parent, default_name=path.stem, where=str(path))


def _resolve_path(base_dir: Path, value: str | None) -> str | None:
    if value is None:
        return None
    p = Path(os.path.expandvars(os.path.expanduser(value)))
    return str(p if p.is_absolute() else (base_dir / p).resolve())


def resolve(raw: dict[str, Any], *, base_dir: str | os.PathLike, default_name: str = "workflow",
            where: str = "workflow") -> dict[str, Any]:
    """Check a workflow dict and fill in defaults; paths become absolute (relative to ``base_dir``)."""
    base_dir = Path(base_dir)
    unknown = unknown_keys(raw, _TABLES, where=where, what="table")
    if unknown:
        raise WorkflowError(unknown)
    out: dict[str, Any] = {}
    for table, schema in _SCHEMA.items():
        section = raw.get(table, {})
        if not isinstance(section, dict):
            raise WorkflowError(f"{where}: [{table}] must be a table")
        unknown = unknown_keys(section, schema, where=where, context=f" in [{table}]")
        if unknown:
            raise WorkflowError(unknown)
        resolved = {}
        for key, (types, default) in schema.items():
            if key in section:
                _check_type(f"{where} [{table}]", key, section[key], types)
                resolved[key] = section[key]
            else:
                resolved[key] = copy.deepcopy(default)
        out[table] = resolved

    wf = out["workflow"]
    wf["name"] = wf["name"] or default_name
    if not wf["name"].replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise WorkflowError(f"{where}: workflow name {wf['name']!r} may hold only letters, digits, '-', '_' and '.'")
    wf["runs_dir"] = _resolve_path(base_dir, wf["runs_dir"] or f"runs/{wf['name']}")
    wf["base_dir"] = str(base_dir.resolve())

    _check_data(out["data"], base_dir, where)
    _check_preprocess(out["preprocess"], where)

    model = raw.get("model", {})
    if not isinstance(model, dict):
        raise WorkflowError(f"{where}: [model] must be a table")
    for key in ("standardize", "dtype"):
        if key in model and out["preprocess"][key] is not None:
            raise WorkflowError(f"{where}: {key} is set in both [model] and [preprocess]; keep one")
    for key in ("standardize", "dtype"):
        if out["preprocess"][key] is not None:
            model = {**model, key: out["preprocess"][key]}
    for key in ("client", "verbose"):
        if key in model:
            raise WorkflowError(f"{where}: [model] {key} is set by the run, not the workflow file; remove it")
    out["model"] = _check_model(model, where=f"{where} [model]", from_file=True)

    sweep = raw.get("sweep", {})
    if not isinstance(sweep, dict):
        raise WorkflowError(f"{where}: [sweep] must be a table of lists")
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise WorkflowError(f"{where}: [sweep] {key} must be a non-empty list of values, e.g. {key} = [1, 2]")
    out["sweep"] = dict(sweep)
    variants = model_variants(out["model"], out["sweep"])
    if len(variants) > MAX_VARIANTS:
        raise WorkflowError(f"{where}: [sweep] makes {len(variants)} combinations; at most {MAX_VARIANTS} are allowed")
    for variant in variants:
        _check_model(variant, where=f"{where} [sweep]")

    _check_evaluation(out["evaluation"], out["model"]["estimator"], where)
    if out["outputs"]["refit"] is None:
        out["outputs"]["refit"] = out["evaluation"]["method"] == "cv"
    if out["evaluation"]["method"] == "cv" and not out["outputs"]["refit"] and out["outputs"]["model"]:
        raise WorkflowError(f"{where}: cross-validation saves a model only with [outputs] refit = true")
    if out["outputs"]["predictions"] and out["evaluation"]["method"] != "holdout":
        raise WorkflowError(f"{where}: [outputs] predictions needs [evaluation] method = \"holdout\"")
    if out["cluster"]["workers"] is not None and out["cluster"]["workers"] < 1:
        raise WorkflowError(f"{where}: [cluster] workers must be >= 1")
    for key in TLS_KEYS:
        out["cluster"][key] = _resolve_path(base_dir, out["cluster"][key])
    return out


def _check_model(model: dict[str, Any], where: str, from_file: bool = False) -> dict[str, Any]:
    """:func:`daskkrr.config.check_model_config`, raising :class:`WorkflowError`.

    ``from_file``: the file's own ``[model]`` table (an old online penalty is converted);
    the sweep's variants are built from the table once converted.
    """
    try:
        return check_model_config(model, where=where, from_file=from_file)
    except WorkflowError:
        raise
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def _check_data(data: dict[str, Any], base_dir: Path, where: str) -> None:
    sources = [k for k in ("store", "table", "generate") if data[k] is not None]
    if len(sources) != 1:
        raise WorkflowError(
            f"{where}: [data] needs exactly one of store, table or generate; got {sources or 'none'} "
            "(e.g. store = \"train.zarr\")"
        )
    if data["table"] is not None and not data["target"]:
        raise WorkflowError(f"{where}: [data] table needs target = \"<name of the target column>\"")
    for key in ("target", "categorical"):
        if data["table"] is None and data[key] is not None:
            raise WorkflowError(f"{where}: [data] {key} only applies to table sources; remove it")
    if data["categorical"] not in (None, *CATEGORICAL_MODES):
        raise WorkflowError(f"{where}: [data] categorical must be one of {list(CATEGORICAL_MODES)}; "
                            f"got {data['categorical']!r}")
    if data["sample_weight"] is not None and data["store"] is None:
        raise WorkflowError(f"{where}: [data] sample_weight names an array of the store; it needs store = \"...\"")
    if data["generate"] is not None:
        gen = dict(data["generate"])
        unknown = unknown_keys(gen, _GENERATE, where=where, context=" in [data] generate")
        if unknown:
            raise WorkflowError(unknown)
        for key in ("n", "d"):
            if key not in gen:
                raise WorkflowError(f"{where}: [data] generate needs {key}, e.g. generate = {{ n = 20000, d = 8 }}")
        for key, value in gen.items():
            _check_type(f"{where} [data] generate", key, value, _GENERATE[key])
        if gen["n"] < 2 or gen["d"] < 1:
            raise WorkflowError(f"{where}: [data] generate needs n >= 2 and d >= 1")
        if gen.get("classes") and gen.get("clusters"):
            raise WorkflowError(f"{where}: [data] generate takes classes (classification data) or clusters "
                                "(Gaussian blobs labelled by blob), not both; remove one")
        gen.setdefault("seed", 0)
        gen.setdefault("classes", 0)
        data["generate"] = gen
    for key in ("store", "table", "cache"):
        data[key] = _resolve_path(base_dir, data[key])


def _check_preprocess(pre: dict[str, Any], where: str) -> None:
    for key in ("max_rows", "chunk_rows"):
        if pre[key] is not None and pre[key] < 1:
            raise WorkflowError(f"{where}: [preprocess] {key} must be >= 1; got {pre[key]}")


def _check_evaluation(ev: dict[str, Any], estimator: str, where: str) -> None:
    if ev["method"] not in ("holdout", "cv", "none"):
        raise WorkflowError(
            f"{where}: [evaluation] method must be \"holdout\", \"cv\" or \"none\"; got {ev['method']!r}"
        )
    if not 0 < float(ev["test_fraction"]) < 1:
        raise WorkflowError(f"{where}: [evaluation] test_fraction must be between 0 and 1; got {ev['test_fraction']}")
    if ev["split"] is None:
        ev["split"] = "random" if ev["method"] == "cv" else "tail"
    if ev["split"] not in ("tail", "random"):
        raise WorkflowError(f"{where}: [evaluation] split must be \"tail\" or \"random\"; got {ev['split']!r}")
    if ev["folds"] < 2:
        raise WorkflowError(f"{where}: [evaluation] folds must be >= 2; got {ev['folds']}")
    allowed = CLASSIFICATION_METRICS if issubclass(ESTIMATORS[estimator], ClassifierMixin) else REGRESSION_METRICS
    metrics = ev["metrics"] if ev["metrics"] is not None else list(allowed)
    bad = [m for m in metrics if m not in allowed]
    if bad or not metrics:
        raise WorkflowError(f"{where}: [evaluation] metrics {bad or metrics} not available for {estimator!r}; "
                            f"choose from {list(allowed)}")
    ev["metrics"] = list(metrics)


def model_variants(model: dict[str, Any], sweep: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the [sweep] values on top of the [model] table (just [model] without a sweep)."""
    if not sweep:
        return [dict(model)]
    keys = sorted(sweep)
    return [{**model, **dict(zip(keys, combo))} for combo in itertools.product(*(sweep[k] for k in keys))]
