"""One parameter declaration per estimator: TOML keys, CLI flags and checks all come from it."""

from __future__ import annotations

import inspect
from numbers import Integral
from typing import Any, ClassVar

import numpy as np
import pytest
import zarr
from sklearn.utils._param_validation import Interval

from daskkrr.cli import _parser, main
from daskkrr.config import ConfigError, build_estimator, read_config
from daskkrr.models import (
    ExactKernelRidge,
    FalkonRegressor,
    NystromModelBase,
    load_model,
    registry,
)
from daskkrr.models.schema import parameter_docs, union_specs


class KnobbedFalkon(FalkonRegressor):
    """FALKON with one more knob (only for these tests).

    Parameters
    ----------
    dummy_knob : int, default=3
        A knob added after the fact, to see it reach TOML and the CLI.
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **FalkonRegressor._parameter_constraints,
        "dummy_knob": [Interval(Integral, 0, None, closed="left")],
    }

    def __init__(self, dummy_knob: int = 3, **params: Any):
        super().__init__(**params)
        self.dummy_knob = dummy_knob


# Written out, __init__ would list every FALKON parameter and dummy_knob; scikit-learn and the
# schema both read this signature.
_base = inspect.signature(FalkonRegressor.__init__)
KnobbedFalkon.__init__.__signature__ = _base.replace(parameters=[
    *_base.parameters.values(),
    inspect.Parameter("dummy_knob", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=3, annotation=int),
])


@pytest.fixture
def knobbed(monkeypatch):
    monkeypatch.setitem(registry.ESTIMATORS, "knobbed", KnobbedFalkon)
    return KnobbedFalkon


def test_every_init_parameter_is_declared():
    """Each ``__init__`` parameter has constraints and a docstring entry, read from the class itself:
    param_specs is built from the signature, so comparing its names with the signature checked nothing."""
    problems = []
    for cls in registry.ESTIMATORS.values():
        docs = parameter_docs(cls)
        for name in inspect.signature(cls.__init__).parameters:
            if name == "self":
                continue
            if name not in cls._parameter_constraints:
                problems.append(f"{cls.__name__}.{name}: no _parameter_constraints entry")
            if not docs.get(name):
                problems.append(f"{cls.__name__}.{name}: no entry in the numpydoc Parameters section")
    assert not problems, "\n".join(problems)


def test_exact_kernel_ridge_has_no_nystrom_parameters():
    assert not issubclass(ExactKernelRidge, NystromModelBase)
    params = ExactKernelRidge().get_params()
    for name in ("n_centers", "sampler", "dtype", "strategy"):  # random_state seeds PCG's random features
        assert name not in params and not hasattr(ExactKernelRidge, name)


def test_exact_kernel_ridge_fits_predicts_saves(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = np.sin(X[:, 0])
    model = ExactKernelRidge(sigma=2.0, penalty=1e-6).fit(X, y)
    assert model.score(X, y) > 0.99
    loaded = load_model(model.save(tmp_path / "m"))
    np.testing.assert_allclose(loaded.predict(X), model.predict(X), rtol=1e-12)
    with pytest.raises(ValueError, match="max_samples must be an int in the range"):
        ExactKernelRidge(max_samples=0).fit(X, y)


def test_a_new_parameter_reaches_help_toml_and_set_params(knobbed, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["fit", "--estimator", "knobbed", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--dummy-knob INT" in help_text
    assert "A knob added after the fact, to see it reach TOML and the CLI. (default: 3)" in help_text

    args = _parser().parse_args(["fit", "--data", "d", "--out", "o", "--estimator", "knobbed", "--dummy-knob", "7"])
    assert args.dummy_knob == 7

    path = tmp_path / "knob.toml"
    path.write_text('[model]\nestimator = "knobbed"\ndummy_knob = 5\nn_centers = 10\n')
    config = read_config(path)
    assert config == {"estimator": "knobbed", "dummy_knob": 5, "n_centers": 10}
    model = build_estimator(config)
    assert isinstance(model, KnobbedFalkon) and model.dummy_knob == 5 and model.n_centers == 10
    assert model.set_params(dummy_knob=9).get_params()["dummy_knob"] == 9

    path.write_text('[model]\nestimator = "knobbed"\ndummy_knob = 1.5\n')
    with pytest.raises(ConfigError, match=r"dummy_knob must be int; got 1.5 \(float\)"):
        read_config(path)
    path.write_text('[model]\nestimator = "knobbed"\ndummy_knob = -1\n')
    with pytest.raises(ConfigError, match=r"dummy_knob must be an int in the range \[0, inf\); got -1"):
        read_config(path)
    path.write_text('[model]\nestimator = "falkon"\ndummy_knob = 1\n')
    with pytest.raises(ConfigError, match="unknown key 'dummy_knob' for estimator 'falkon'; accepted:"):
        read_config(path)


def test_every_parameter_has_a_flag():
    option_strings = {o for action in _parser()._subparsers._group_actions[0].choices["fit"]._actions
                      for o in action.option_strings}
    for name in union_specs(registry.ESTIMATORS):
        assert "--" + name.replace("_", "-") in option_strings
    assert {"--centers", "--seed", "--no-fit-intercept", "--no-standardize"} <= option_strings
    assert "--client" not in option_strings


def test_flags_parse_as_the_parameters_take_them():
    args = _parser().parse_args([
        "fit", "--data", "d", "--out", "o", "--kernel-params", "nu=1.5", "--kernel-params", "a=2,b=true,c=x",
        "--sigma", "none", "--preconditioner-rows", "auto", "--no-fit-intercept", "--seed", "3", "--centers", "50",
    ])
    assert args.kernel_params == {"nu": 1.5, "a": 2, "b": True, "c": "x"}
    assert args.sigma is None and args.preconditioner_rows == "auto" and args.fit_intercept is False
    assert args.random_state == 3 and args.n_centers == 50
    assert not hasattr(args, "max_iter")  # not given: the config's or estimator's value holds
    assert _parser().parse_args(["fit", "--data", "d", "--out", "o", "--preconditioner-rows", "200"]
                                ).preconditioner_rows == 200


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--strategy", "fast"],
         "argument --strategy: expected \"auto\", \"cache\", \"gram\" or \"recompute\"; got 'fast'"),
        (["--n-centers", "ten"], "argument --n-centers/--centers: expected int; got 'ten'"),
        (["--sigma", "wide"], "argument --sigma: expected int or float, list of numbers or \"none\"; got 'wide'"),
        (["--kernel-params", "nu"], "argument --kernel-params: expected KEY=VALUE, e.g. nu=1.5; got 'nu'"),
    ],
)
def test_bad_flag_values_name_the_flag(capsys, flags, message):
    assert main(["fit", "--data", "d", "--out", "o", *flags]) == 2  # a usage error
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-iter", "0"], "--max-iter 0: max_iter must be an int in the range [1, inf)"),
        (["--estimator", "exact", "--n-centers", "5"], "--n-centers does not apply to estimator 'exact'"),
        (["--preconditioner-rows", "0"], "--preconditioner-rows 0: preconditioner_rows must be"),
    ],
)
def test_bad_flag_values_are_refused_before_work(tmp_path, capsys, flags, message):
    out = tmp_path / "m"
    assert main(["fit", "--data", str(tmp_path / "missing.zarr"), "--out", str(out), *flags]) == 2  # usage
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_toml_none_for_every_nullable_parameter(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[model]\nsigma = "none"\nchunks = "None"\nrandom_state = "none"\nkernel_params = "none"\n')
    assert read_config(path) == {"estimator": "falkon", "sigma": None, "chunks": None, "random_state": None,
                                 "kernel_params": None}
    path.write_text('[model]\npenalty = "none"\n')
    with pytest.raises(ConfigError, match=r"penalty must be int or float; got 'none' \(str\)"):
        read_config(path)
    path.write_text('[model]\nstrategy = "fast"\n')
    with pytest.raises(ConfigError, match='strategy must be "auto", "cache", "gram" or "recompute"; got \'fast\''):
        read_config(path)
    path.write_text('[model]\nkernel = "matern"\nkernel_params = { nu = 3.0 }\n')
    with pytest.raises(ConfigError, match="nu must be one of 0.5, 1.5, 2.5"):
        read_config(path)


def test_config_value_is_overridden_by_a_flag_only_when_given(tmp_path, capsys):
    from daskkrr.cli import _build_from_flags

    config = {"estimator": "falkon", "n_centers": 40, "max_iter": 7}
    model = _build_from_flags(config, {"n_centers": 60}, verbose=False)
    assert (model.n_centers, model.max_iter, model.verbose) == (60, 7, False)


def test_the_estimator_flag_decides_the_keys_a_config_may_hold(tmp_path, capsys):
    """``--estimator logistic`` overrides the file's estimator (here falkon) before the file's keys are
    checked, so a logistic-only key is accepted; without the flag, or with another estimator, it is
    refused, naming the estimator and the file (issue 36: the CLI resume matrix's logistic config)."""
    path = tmp_path / "m.toml"
    path.write_text('[model]\nestimator = "falkon"\nnewton_iterations = 3\n')
    assert read_config(path, estimator="logistic") == {"estimator": "logistic", "newton_iterations": 3}
    with pytest.raises(ConfigError, match=r"m.toml: unknown key 'newton_iterations' for estimator 'falkon'"):
        read_config(path)
    fit = ["fit", "--data", str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "o"), "--config", str(path)]
    assert main([*fit, "--estimator", "logistic"]) == 1
    assert "no Zarr store at" in capsys.readouterr().err  # past the config: the data are checked next
    assert main([*fit, "--estimator", "classifier"]) == 1
    assert "unknown key 'newton_iterations' for estimator 'classifier'" in capsys.readouterr().err


def test_cli_fit_with_strategy_intercept_and_kernel_params(tmp_path, cluster2):
    store = tmp_path / "train.zarr"
    assert main(["generate", str(store), "--n", "1500", "--d", "3", "--chunk-rows", "500",
                 "--scheduler", cluster2.scheduler.address]) == 0
    out = tmp_path / "model"
    assert main(["fit", "--data", str(store), "--out", str(out), "--strategy", "cache", "--no-fit-intercept",
                 "--kernel-params", "nu=1.5", "--kernel", "matern", "--n-centers", "60", "--max-iter", "10",
                 "--preconditioner-rows", "none", "--seed", "1", "--scheduler", cluster2.scheduler.address,
                 "--no-progress"]) == 0
    model = load_model(out)
    assert model.strategy == "cache" and model.fit_intercept is False
    assert model.kernel == "matern" and model.kernel_params == {"nu": 1.5}
    assert model.kernel_.to_dict()["nu"] == 1.5 and model.preconditioner_rows is None
    assert model.n_centers == 60 and model.random_state == 1 and model.centers_.shape == (60, 3)
    y = zarr.open_group(str(store), mode="r")["y"][:]
    X = zarr.open_group(str(store), mode="r")["X"][:]
    assert 1 - np.mean((model.predict(X) - y) ** 2) / np.var(y) > 0.5
