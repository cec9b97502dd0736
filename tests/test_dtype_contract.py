"""The ``dtype`` parameter against the fitted arrays (issues 36-38 follow-up): ``dtype`` is the
precision of the kernel blocks and of ``centers_``; ``coef_``, ``intercept_`` and the outputs follow
the input's precision (issue 37, scikit-learn's rule); a saved model keeps both, as its metadata says.
Every estimator that takes ``dtype``, both ways round."""

from __future__ import annotations

import numpy as np
import pytest

import daskkrr
from daskkrr import FalkonClassifier, FalkonRegressor, LogisticFalkonClassifier, NystromRegressor

ESTIMATORS = {
    "falkon": (FalkonRegressor, "predict"),
    "nystrom": (NystromRegressor, "predict"),
    "falkon_classifier": (FalkonClassifier, "decision_function"),
    "logistic": (LogisticFalkonClassifier, "predict_proba"),
}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(90, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    return X, y


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize(("dtype", "input_dtype"), [("float32", np.float64), ("float64", np.float32)])
def test_dtype_sets_the_centers_and_the_input_sets_the_coefficients(data, tmp_path, name, dtype, input_dtype):
    cls, method = ESTIMATORS[name]
    X, y = data[0].astype(input_dtype), data[1]
    target = y if cls in (FalkonRegressor, NystromRegressor) else (y > 0).astype(int)
    model = cls(n_centers=20, random_state=0, dtype=dtype).fit(X, target)
    assert model.centers_.dtype == np.dtype(dtype)
    assert model.coef_.dtype == input_dtype and np.asarray(model.intercept_).dtype == input_dtype
    out = np.asarray(getattr(model, method)(X))
    assert out.dtype == input_dtype
    loaded = daskkrr.load(model.save(tmp_path / "m"))
    assert loaded.dtype == dtype  # the metadata's parameter, beside arrays that keep their own dtypes
    assert loaded.centers_.dtype == np.dtype(dtype) and loaded.coef_.dtype == input_dtype
    np.testing.assert_array_equal(np.asarray(getattr(loaded, method)(X)), out)
