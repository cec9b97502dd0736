"""Model configuration from TOML files and command-line flags.

A config file holds one ``[model]`` table whose keys are estimator parameters::

    [model]
    estimator = "falkon"          # falkon | nystrom | exact | classifier
    kernel = "gaussian"
    sigma = 3.0
    penalty = 1e-6
    n_centers = 2000
    max_iter = 20
    random_state = 0

Unknown tables or keys, and values of the wrong type, are errors naming the key.
"""

from __future__ import annotations

import os
import tomllib
from typing import Any

from daskkrr.models import ExactKernelRidge, FalkonClassifier, FalkonRegressor, NystromRegressor

ESTIMATORS: dict[str, type] = {
    "falkon": FalkonRegressor,
    "nystrom": NystromRegressor,
    "exact": ExactKernelRidge,
    "classifier": FalkonClassifier,
}

# Expected types of each parameter (None allowed where the estimator accepts None).
_TYPES: dict[str, tuple[type, ...]] = {
    "kernel": (str,),
    "sigma": (int, float),
    "penalty": (int, float),
    "n_centers": (int,),
    "sampler": (str,),
    "max_iter": (int,),
    "tol": (int, float),
    "kernel_params": (dict,),
    "dtype": (str,),
    "standardize": (bool,),
    "chunks": (int,),
    "random_state": (int,),
    "verbose": (bool,),
    "max_samples": (int,),
    "strategy": (str,),
    "fit_intercept": (bool,),
    "preconditioner_rows": (int, str, type(None)),  # None once "none" is read
}


class ConfigError(ValueError):
    """A configuration file or value is invalid."""


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a TOML config; return ``{"estimator": name, **params}``."""
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not a TOML file: it is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except IsADirectoryError:
        raise ConfigError(f"config {path} is a directory; pass the path of a .toml file") from None
    unknown = sorted(set(raw) - {"model"})
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {unknown}; only [model] is allowed")
    model = raw.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(f"{path}: 'model' must be a table")
    return check_model_config(model, where=str(path))


def check_model_config(model: dict[str, Any], where: str = "config") -> dict[str, Any]:
    """Check keys and types of a model config dict against the chosen estimator."""
    model = dict(model)
    name = model.pop("estimator", "falkon")
    if name not in ESTIMATORS:
        raise ConfigError(f"{where}: unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    accepted = set(ESTIMATORS[name]().get_params()) - {"client"}
    for key, value in model.items():
        if key not in accepted:
            raise ConfigError(f"{where}: unknown key {key!r} for estimator {name!r}; accepted: {sorted(accepted)}")
        types = _TYPES.get(key)
        if types and not (isinstance(value, types) and not (bool not in types and isinstance(value, bool))):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{where}: {key} must be {names}; got {value!r} ({type(value).__name__})")
    if isinstance(model.get("preconditioner_rows"), str):
        rows = model["preconditioner_rows"].lower()
        if rows not in ("auto", "none"):
            raise ConfigError(f"{where}: preconditioner_rows must be an integer, \"auto\" or \"none\" "
                              f"(FALKON's own preconditioner); got {model['preconditioner_rows']!r}")
        model["preconditioner_rows"] = None if rows == "none" else "auto"  # TOML has no null
    return {"estimator": name, **model}


def build_estimator(config: dict[str, Any], **overrides: Any) -> Any:
    """Instantiate the configured estimator; ``overrides`` that are not None win."""
    config = dict(config)
    name = config.pop("estimator", "falkon")
    params = {**config, **{k: v for k, v in overrides.items() if v is not None}}
    check_model_config({"estimator": name, **params}, where="parameters")
    return ESTIMATORS[name](**params)
