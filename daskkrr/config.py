"""Model configuration from TOML files and command-line flags.

A config file holds one ``[model]`` table whose keys are estimator parameters::

    [model]
    estimator = "falkon"          # falkon | nystrom | exact | classifier
    kernel = "gaussian"
    sigma = 3.0
    penalty = 1e-6
    n_centers = 2000
    max_iter = 50
    random_state = 0

The accepted keys are the parameters of the chosen estimator (its
``_parameter_constraints``, see :mod:`daskkrr.models.schema`). Unknown tables or keys, and values of the wrong type, are
errors naming the key. TOML has no null: ``"none"`` stands for None wherever a
parameter accepts None (e.g. ``sigma = "none"``, ``preconditioner_rows = "none"``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from daskkrr.models.online import OnlineKernelRidge
from daskkrr.models.registry import DEFAULT_ESTIMATOR, ESTIMATORS
from daskkrr.models.schema import config_specs
from daskkrr.utils.toml_file import read_toml, unknown_keys


class ConfigError(ValueError):
    """A configuration file or value is invalid."""


def read_config(path: str | os.PathLike, estimator: str | None = None) -> dict[str, Any]:
    """Read and validate a TOML config; return ``{"estimator": name, **params}``.

    ``estimator`` (``daskkrr fit --estimator``) replaces the file's ``estimator`` before its keys are
    checked: a flag overrides the file, so the file's keys are those of the flag's estimator (a
    ``newton_iterations`` with ``--estimator logistic`` is not refused as unknown to the default).
    """
    raw = read_toml(path, error=ConfigError, what="config file")
    unknown = unknown_keys(raw, {"model"}, where=str(path), what="table")
    if unknown:
        raise ConfigError(unknown)
    model = raw.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(f"{path}: 'model' must be a table")
    if estimator is not None:
        model = {**model, "estimator": estimator}
    return check_model_config(model, where=str(path), from_file=True)


#: ``[model]`` key of an online table that says how its ``penalty`` is read.
PENALTY_CONVENTION_KEY = "penalty_convention"


def _convert_online_penalty(model: dict[str, Any], where: str) -> dict[str, Any]:
    """An online ``[model]`` table in the normalised penalty convention (FutureWarning if converted).

    Files written before the convention changed have ``penalty`` as the fixed
    ridge ``lam`` of ``sum_i (y_i - f(x_i))^2 + lam ||f||^2`` (of both sampler and
    regression) and no ``penalty_convention`` key. That ``lam`` becomes the
    sampler's ``gamma`` (the same dictionary), and ``penalty`` the normalised
    default, since the row count that would convert it is not known here.
    """
    model = dict(model)
    convention = model.pop(PENALTY_CONVENTION_KEY, None)
    if convention == "normalised" or (convention is None and "penalty" not in model):
        return model
    if convention not in (None, "unnormalised"):
        raise ConfigError(f"{where}: {PENALTY_CONVENTION_KEY} must be \"normalised\" or \"unnormalised\"; got "
                          f"{convention!r}")
    if "gamma" in model:
        raise ConfigError(f"{where}: an unnormalised online penalty is also the sampler's ridge, so it cannot be "
                          f"given with gamma; write {PENALTY_CONVENTION_KEY} = \"normalised\" with penalty and gamma")
    lam = model.pop("penalty")
    model["gamma"] = lam
    warnings.warn(
        f"{where}: online penalty = {lam!r} is read in the old unnormalised convention (the ridge lam of "
        "sum_i (y_i - f(x_i))^2 + lam ||f||^2), because the table has no "
        f"{PENALTY_CONVENTION_KEY} = \"normalised\": converted to gamma = {lam!r} (the sampler's ridge, the same "
        "dictionary) and the default normalised penalty of every daskkrr estimator, (1/n) sum_i (y_i - f(x_i))^2 + "
        f"penalty ||f||^2. Write {PENALTY_CONVENTION_KEY} = \"normalised\", penalty and gamma to silence this",
        FutureWarning, stacklevel=3,
    )
    return model


#: A config file names a sampler; an array of centers cannot be written in TOML.
CENTERS_HINT = (". Centers of your own (an array, e.g. from a .npy file) can be passed from Python only: "
                "FalkonRegressor(sampler=np.load('centers.npy'))")


def check_model_config(model: dict[str, Any], where: str = "config", from_file: bool = False) -> dict[str, Any]:
    """Check keys, types and values of a model config dict against the chosen estimator.

    The keys and types come from the estimator's parameter declarations (see
    :mod:`daskkrr.models.schema`); ``"none"`` stands for None wherever None is
    accepted. Values are then checked by the estimator's own parameter checks.
    Returns ``{"estimator": name, **params}`` with the values converted.
    With ``from_file``, an online table's ``penalty`` is read by its
    ``penalty_convention`` key (see :func:`_convert_online_penalty`).
    """
    model = dict(model)
    name = model.pop("estimator", DEFAULT_ESTIMATOR)
    if not isinstance(name, str) or name not in ESTIMATORS:
        raise ConfigError(f"{where}: unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    if from_file and ESTIMATORS[name] is OnlineKernelRidge:
        model = _convert_online_penalty(model, where)
    specs = config_specs(ESTIMATORS[name], exclude=frozenset())
    unknown = unknown_keys(model, specs, where=where, context=f" for estimator {name!r}")
    if unknown:
        raise ConfigError(unknown)
    params = {}
    for key, value in model.items():
        try:
            params[key] = specs[key].convert(value)
        except ValueError as exc:
            hint = CENTERS_HINT if key == "sampler" else ""
            raise ConfigError(f"{where}: {exc}{hint}") from None
    try:  # values (n_centers >= 1, kernel names, ...) by the estimator's checks, before any work
        ESTIMATORS[name](**params)._validate_params()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return {"estimator": name, **params}


def build_estimator(config: dict[str, Any], **overrides: Any) -> Any:
    """Instantiate the configured estimator; ``overrides`` (e.g. command-line flags) win."""
    config = dict(config)
    name = config.pop("estimator", DEFAULT_ESTIMATOR)
    params = {**config, **overrides}
    checked = check_model_config({"estimator": name, **params}, where="parameters")
    checked.pop("estimator")
    return ESTIMATORS[name](**checked)
