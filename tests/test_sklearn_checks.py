"""scikit-learn's own estimator checks, over every registered estimator.

The estimators are taken from :data:`daskkrr.models.registry.ESTIMATORS`, so one
registered later is checked without editing this file. They run with small
settings (few centers and iterations) to keep the checks fast; what is checked
is the contract (validation, messages, cloning, shapes), not accuracy.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from daskkrr.models.registry import ESTIMATORS, UNSUPERVISED

#: Small settings, for the parameters each class takes. LogisticFalkonClassifier's Newton steps at the
#: target penalty: 3 after the 2 warm-up steps instead of up to 8 (its checks were the slowest third of
#: this file); check_classifiers_train's accuracy bound on its blobs holds after a few steps.
SMALL = {"n_centers": 20, "max_iter": 10, "random_state": 0, "newton_iterations": 3}


def small(cls: type) -> Any:
    """``cls`` with the :data:`SMALL` settings it accepts."""
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{name: value for name, value in SMALL.items() if name in accepted})


#: Checks an estimator cannot pass by construction, with the reason (scikit-learn >= 1.6 has no
#: estimator tag for this: parametrize_with_checks takes them).
WEIGHT_EQUIVALENCE_REASON = (
    "fits with integer sample_weight and with repeated rows draw different Nystrom centers (rows drawn in "
    "proportion to their weights are not the rows drawn from the repeated data, where a row can be drawn "
    "twice) and CG stops at tol, so the two models agree to about tol, not to 1e-7; "
    "tests/test_sample_weight.py checks the equivalence to 1e-8 with the same centers for every estimator"
)


def expected_failures(estimator: Any) -> dict[str, str]:
    """The checks that ``estimator`` is expected to fail, with the reason."""
    # An iterative solver on sampled centers (ExactKernelRidge's PCG uses every row: no centers to differ).
    if "max_iter" in estimator.get_params() and "n_centers" in estimator.get_params():
        # the same on sparse data, for the estimators that take it (the input tag input_tags.sparse)
        return {"check_sample_weight_equivalence_on_dense_data": WEIGHT_EQUIVALENCE_REASON,
                "check_sample_weight_equivalence_on_sparse_data": WEIGHT_EQUIVALENCE_REASON}
    return {}


@parametrize_with_checks([small(cls) for cls in ESTIMATORS.values()], expected_failed_checks=expected_failures)
def test_sklearn_compatible(estimator, check):
    check(estimator)


@parametrize_with_checks([small(cls) for cls in UNSUPERVISED.values()])
def test_sklearn_compatible_unsupervised(estimator, check):
    check(estimator)


@pytest.mark.parametrize("name", [n for n, cls in ESTIMATORS.items() if "n_centers" in
                                  inspect.signature(cls.__init__).parameters])
def test_n_centers_above_rows_is_clamped_with_a_warning(name):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(15, 2))
    y = np.arange(15) % 2 if name in ("classifier", "logistic") else X[:, 0]
    model = ESTIMATORS[name](n_centers=50, random_state=0)
    with pytest.warns(UserWarning, match=r"n_centers=50 is larger than the number of training rows \(15\)"):
        model.fit(X, y)
    assert model.n_centers_ == 15
    assert model.centers_.shape == (15, 2)
    assert model.n_centers == 50  # the parameter itself is left as given


@pytest.mark.parametrize("as_dask", [False, True])
def test_classifier_refuses_a_continuous_target(as_dask):
    import dask.array as da

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = rng.normal(size=40)
    if as_dask:
        X, y = da.from_array(X, chunks=10), da.from_array(y, chunks=10)
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        ESTIMATORS["classifier"](n_centers=10).fit(X, y)
