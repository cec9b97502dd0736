"""The input precision is kept (issue 37): float32 features give float32 ``coef_`` and float32
outputs, as scikit-learn's KernelRidge/Ridge do; float64 stays float64. The solve itself runs in
float64 (or the estimator's ``dtype``) either way, so the float32 model is the float64 one rounded.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import daskkrr
from daskkrr import (
    ExactKernelRidge,
    FalkonClassifier,
    FalkonRegressor,
    LogisticFalkonClassifier,
    NystromKernelPCA,
    NystromRegressor,
    OnlineKernelRidge,
)

EPS32 = float(np.finfo(np.float32).eps)

ESTIMATORS = {
    "falkon": (lambda: FalkonRegressor(n_centers=20, random_state=0), "predict"),
    "nystrom": (lambda: NystromRegressor(n_centers=20, random_state=0), "predict"),
    "exact": (lambda: ExactKernelRidge(), "predict"),
    "online": (lambda: OnlineKernelRidge(random_state=0), "predict"),
    "falkon_classifier": (lambda: FalkonClassifier(n_centers=20, random_state=0), "decision_function"),
    "logistic": (lambda: LogisticFalkonClassifier(n_centers=20, random_state=0), "predict_proba"),
    "kpca": (lambda: NystromKernelPCA(n_components=2, n_centers=20, random_state=0), "transform"),
}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(90, 3)).astype(np.float32)  # float32 values: exactly the same data in float64
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    return X, y


def _fit(name, X, y):
    make, method = ESTIMATORS[name]
    model = make()
    if name == "kpca":
        return model.fit(X), method
    target = (y > 0).astype(int) if "classifier" in name or name == "logistic" else y
    return model.fit(X, target), method


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_float32_input_gives_float32_model_and_outputs(data, name):
    X, y = data
    m32, method = _fit(name, X, y)
    m64, _ = _fit(name, X.astype(np.float64), y)
    assert m32.coef_.dtype == np.float32 and m64.coef_.dtype == np.float64
    out32 = np.asarray(getattr(m32, method)(X))
    out64 = np.asarray(getattr(m64, method)(X.astype(np.float64)))
    assert out32.dtype == np.float32 and out64.dtype == np.float64
    # same data, same float64 solve: the float32 model is the float64 one with coef_ rounded to float32
    # (relative eps32/2 each); with kernel values in [0, 1] an output moves by at most
    # eps32 * (sum |coef| + |intercept|), plus the final rounding to float32 (eps32 |out|)
    bound = EPS32 * (np.abs(m64.coef_).sum(axis=0).max() + np.abs(np.asarray(m64.intercept_)).max()
                     + np.abs(out64).max())
    np.testing.assert_allclose(out32, out64, rtol=0, atol=bound)


def test_lazy_float32_predictions_are_float32(data):
    X, y = data
    model = FalkonRegressor(n_centers=20, random_state=0).fit(da.from_array(X, chunks=(30, 3)), y)
    assert model.coef_.dtype == np.float32
    lazy = model.predict(da.from_array(X, chunks=(30, 3)))
    assert lazy.dtype == np.float32 and lazy.compute().dtype == np.float32
    with_std = NystromRegressor(n_centers=20, random_state=0, compute_std=True).fit(X, y)
    mean, std = with_std.predict(X, return_std=True)
    assert mean.dtype == np.float32 and std.dtype == np.float32


def test_float32_model_survives_save_and_load(data, tmp_path):
    X, y = data
    model = NystromRegressor(n_centers=20, random_state=0).fit(X, y)
    loaded = daskkrr.load(model.save(tmp_path / "m"))
    assert loaded.coef_.dtype == np.float32
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
