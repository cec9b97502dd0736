"""Finite but extreme inputs (issue 36, item 5): each gives the model of the rescaled problem or an
:class:`~daskkrr.data.extremes.ExtremeValueError` naming the column or target, raised by the statistics
pass before any kernel is evaluated. Never an all-zero or NaN model, never a bare
OverflowError/LinAlgError/FloatingPointError.

Scalings by a power of two are exact and commute with every floating-point operation (barring over- and
underflow), so a model refitted on ``X * 2**k`` must equal the original up to the order of BLAS reductions;
where the data are scaled by a decimal factor, each value carries one rounding (relative eps) and the
model moves by at most ``cond * eps`` (the tolerances below say which applies).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from daskkrr import (
    ExactKernelRidge,
    FalkonClassifier,
    FalkonRegressor,
    LogisticFalkonClassifier,
    NystromKernelKMeans,
    NystromKernelPCA,
    NystromRegressor,
    OnlineKernelRidge,
)
from daskkrr.data import Standardizer
from daskkrr.data.extremes import ExtremeValueError
from daskkrr.data.scaling import Moments, merge_moments
from daskkrr.events import StageStarted, subscribe

EPS = np.finfo(np.float64).eps
N, D = 80, 3


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N, D))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1]
    return X, y


REGRESSORS = {
    "falkon": lambda **kw: FalkonRegressor(n_centers=20, random_state=0, penalty=1e-3, tol=1e-10, max_iter=200, **kw),
    "nystrom": lambda **kw: NystromRegressor(n_centers=20, random_state=0, penalty=1e-3, **kw),
    "exact": lambda **kw: ExactKernelRidge(penalty=1e-3, **kw),
}
CLASSIFIERS = {
    "falkon_classifier": lambda **kw: FalkonClassifier(n_centers=20, random_state=0, penalty=1e-3, **kw),
    "logistic": lambda **kw: LogisticFalkonClassifier(n_centers=20, random_state=0, penalty=1e-3, **kw),
}
UNSUPERVISED = {
    "kpca": lambda **kw: NystromKernelPCA(n_components=2, n_centers=20, random_state=0, **kw),
    "kmeans": lambda **kw: NystromKernelKMeans(n_clusters=2, n_centers=20, random_state=0, **kw),
}


def _fit(model, X, y=None, **kw):
    """Fit ``model`` and return the stages it started (a refusal must come from 'statistics')."""
    stages: list[str] = []
    with subscribe(lambda e: stages.append(e.stage) if isinstance(e, StageStarted) else None):
        try:
            model.fit(X, **({} if y is None else {"y": y}), **kw)
        finally:
            _fit.stages = stages
    return model


def _refused(model, X, y=None, match="", **kw):
    """The fit raises ExtremeValueError matching ``match`` in the statistics stage."""
    with pytest.raises(ExtremeValueError, match=match):
        _fit(model, X, y, **kw)
    assert _fit.stages in ([], ["statistics"]), f"refused after the stages {_fit.stages}"


def _one_column(X, j, factor):
    out = X.copy()
    out[:, j] = out[:, j] * factor
    return out


# --------------------------------------------------------------------------- statistics pass


def test_moments_of_extreme_columns_are_exact():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    big = Moments.of(np.ldexp(X, 900))
    tiny = Moments.of(np.ldexp(X, -1000))  # values down to the subnormal range
    ref = Moments.of(X)
    # a power-of-two unit commutes with every operation: the same mantissas, bit for bit
    np.testing.assert_array_equal(np.ldexp(big.true_mean(), -900), ref.mean)
    np.testing.assert_array_equal(np.ldexp(tiny.true_mean(), 1000), ref.mean)
    assert np.all(np.isfinite(big.m2)) and np.all(big.m2 > 0) and np.all(tiny.m2 > 0)


def test_merge_across_units_keeps_the_small_values():
    # an all-zero block merged with one of values ~1e-200: the zero block must not impose its unit
    rng = np.random.default_rng(1)
    a = np.zeros((10, 2))
    b = rng.normal(size=(10, 2)) * 1e-200
    merged = merge_moments(Moments.of(a), Moments.of(b))
    direct = Moments.of(np.vstack([a, b]))
    # both in the unit of b's exponent; the merge formula adds O(eps) relative rounding
    np.testing.assert_allclose(merged.true_mean(), direct.true_mean(), rtol=1e-13)
    np.testing.assert_allclose(np.ldexp(merged.m2, 2 * merged.shift), np.ldexp(direct.m2, 2 * direct.shift),
                               rtol=1e-13)


@pytest.mark.parametrize("factor", [1e200, 1e-200, 2.0**1000])
def test_standardizer_scales_any_finite_magnitude(data, factor):
    X, _ = data
    ref = Standardizer().fit(X)
    s = Standardizer().fit(da.from_array(X * factor, chunks=(20, D)))
    # X * factor rounds each value once (relative eps); mean and std then move by O(n eps) relatively
    np.testing.assert_allclose(s.scale_, ref.scale_ * factor, rtol=N * EPS)
    np.testing.assert_allclose(s.mean_, ref.mean_ * factor, rtol=N * EPS, atol=N * EPS * factor)
    np.testing.assert_allclose(s.transform(X * factor), ref.transform(X), atol=N * EPS * 10)


def test_weighted_scale_of_huge_weights_is_not_constant(data):
    X, _ = data
    # the constant-column test used the weight sum as a row count: weights ~1e300 made every column "constant"
    s = Standardizer().fit(X, sample_weight=np.full(N, 1e300))
    np.testing.assert_allclose(s.scale_, Standardizer().fit(X).scale_, rtol=N * EPS)


# --------------------------------------------------------------------------- features


@pytest.mark.parametrize("name", list(REGRESSORS))
@pytest.mark.parametrize("exponent", [600, -600])
def test_huge_or_tiny_features_with_standardize_give_the_rescaled_model(data, name, exponent):
    X, y = data
    ref = _fit(REGRESSORS[name](), X, y)
    scaled = _fit(REGRESSORS[name](), np.ldexp(X, exponent), y)
    # a power-of-two factor is exact and standardisation removes it: the same model up to reduction order
    np.testing.assert_allclose(scaled.predict(np.ldexp(X, exponent)), ref.predict(X), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(REGRESSORS))
def test_one_huge_column_with_standardize_gives_the_rescaled_model(data, name):
    X, y = data
    ref = _fit(REGRESSORS[name](), X, y)
    Xh = _one_column(X, 1, 2.0**800)
    model = _fit(REGRESSORS[name](), Xh, y)
    pred = model.predict(Xh)
    assert np.all(np.isfinite(pred)) and np.abs(pred).max() > 0.1  # not an all-zero model
    np.testing.assert_allclose(pred, ref.predict(X), rtol=1e-9, atol=1e-9)


def test_decimal_huge_column_with_exact_kernel_ridge(data):
    X, y = data
    ref = ExactKernelRidge(penalty=1e-1).fit(X, y)
    Xh = _one_column(X, 2, 1e200)
    model = ExactKernelRidge(penalty=1e-1).fit(Xh, y)
    # each value rounded once (eps) -> standardised features move by O(n eps); with penalty 0.1 the system
    # K + 0.1 n I has condition <= 1 + 1/0.1 = 11, so predictions move by about 11 * n * eps
    np.testing.assert_allclose(model.predict(Xh), ref.predict(X), atol=11 * N * EPS * 10)


@pytest.mark.parametrize("name", list(REGRESSORS) + list(CLASSIFIERS))
def test_constant_huge_column_is_harmless_with_standardize(data, name):
    X, y = data
    make = {**REGRESSORS, **CLASSIFIERS}[name]
    target = y if name in REGRESSORS else (y > 0).astype(int)
    Xc = np.hstack([X, np.full((N, 1), 1e300)])
    model = _fit(make(sigma=np.sqrt(D)), Xc, target)
    ref = _fit(make(sigma=np.sqrt(D)), X, target)
    # the centred constant column is exactly 0, so every kernel value is the one without it
    if name in REGRESSORS:
        np.testing.assert_allclose(model.predict(Xc), ref.predict(X), rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_array_equal(model.predict(Xc), ref.predict(X))


@pytest.mark.parametrize("name", list(REGRESSORS) + list(CLASSIFIERS) + list(UNSUPERVISED))
def test_huge_column_without_standardize_is_refused_naming_it(data, name):
    X, y = data
    make = {**REGRESSORS, **CLASSIFIERS, **UNSUPERVISED}[name]
    target = None if name in UNSUPERVISED else (y if name in REGRESSORS else (y > 0).astype(int))
    _refused(make(standardize=False), _one_column(X, 2, 1e160), target,
             match=r"X column 2 has \|x\| up to .*e\+16.*standardize=True")


@pytest.mark.parametrize("name", list(UNSUPERVISED))
def test_unsupervised_huge_features_with_standardize_are_fitted(data, name):
    X, _ = data
    ref = _fit(UNSUPERVISED[name](), X)
    model = _fit(UNSUPERVISED[name](), np.ldexp(X, 700))
    if name == "kpca":  # the exact factor is removed by the standardisation: the same embedding
        np.testing.assert_allclose(model.transform(np.ldexp(X, 700)), ref.transform(X), rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_array_equal(model.predict(np.ldexp(X, 700)), ref.predict(X))


def test_float32_square_overflow_is_refused_for_a_float32_fit(data):
    X, y = data
    X32 = _one_column(X, 0, 1e19).astype(np.float32)  # 1e19 fits float32 (3.4e38) but its square does not
    _refused(FalkonRegressor(n_centers=20, dtype="float32", standardize=False), X32, y,
             match=r"X column 0 .*overflow float32")
    # in float64 blocks the same squares are finite: the fit goes through and is finite
    model = FalkonRegressor(n_centers=20, standardize=False, random_state=0).fit(X32, y)
    assert np.all(np.isfinite(model.predict(X32)))


def test_subnormal_column_is_refused_with_standardize_and_harmless_without(data):
    X, y = data
    Xs = _one_column(X, 1, 2.0**-1060)  # subnormal values (below 2.2e-308): only ~14 significant bits left
    assert np.abs(Xs[:, 1]).max() < np.finfo(np.float64).tiny
    _refused(ExactKernelRidge(penalty=1e-3), Xs, y, match=r"X column 1 has a standard deviation of .*subnormal")
    # unscaled, the column adds < 1e-600 to squared distances of order 1: the model without it, bit for bit
    model = ExactKernelRidge(penalty=1e-3, standardize=False).fit(Xs, y)
    ref = ExactKernelRidge(penalty=1e-3, standardize=False).fit(_one_column(X, 1, 0.0), y)
    np.testing.assert_allclose(model.predict(Xs), ref.predict(_one_column(X, 1, 0.0)), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize("name", list(REGRESSORS))
@pytest.mark.parametrize("factor, match", [(1e300, r"y has \|y\| up to 1.*e\+300 > 1e\+150"),
                                           (1e-300, r"y has \|y\| at most .*e-300 < 1e-150")])
def test_extreme_targets_are_refused_naming_the_target(data, name, factor, match):
    X, y = data
    _refused(REGRESSORS[name](), X, y * factor, match=match)


def test_multi_target_names_the_target_column(data):
    X, y = data
    Y = np.column_stack([y, y * 1e200])
    _refused(REGRESSORS["nystrom"](), X, Y, match=r"y target column 1 has \|y\| up to")


@pytest.mark.parametrize("name", list(REGRESSORS))
def test_large_but_safe_targets_give_the_scaled_model(data, name):
    X, y = data
    ref = _fit(REGRESSORS[name](), X, y)
    model = _fit(REGRESSORS[name](), X, np.ldexp(y, 400))  # ~2.6e120, below the 1e150 limit
    # linear in y, power-of-two factor: the same model times the factor
    np.testing.assert_allclose(np.ldexp(model.predict(X), -400), ref.predict(X), rtol=1e-9, atol=1e-9)


def test_online_refuses_extreme_targets_and_features_before_any_update(data):
    X, y = data
    model = OnlineKernelRidge(penalty=1e-3, random_state=0).fit(X[:40], y[:40])
    coef = model.coef_.copy()
    with pytest.raises(ExtremeValueError, match=r"y has \|y\| up to"):
        model.partial_fit(X[40:], y[40:] * 1e300)
    with pytest.raises(ExtremeValueError, match=r"X column 1 has \|x\| up to"):
        model.partial_fit(_one_column(X[40:], 1, 1e200), y[40:])
    with pytest.raises(ExtremeValueError, match=r"X column 0 has \|x\| up to"):  # the lazy path too
        model.partial_fit(da.from_array(_one_column(X[40:], 0, 1e200), chunks=(20, D)), da.from_array(y[40:]))
    np.testing.assert_array_equal(model.coef_, coef)  # refused calls left the model as it was
    assert model.n_rows_seen_ == 40


# --------------------------------------------------------------------------- weights


@pytest.mark.parametrize("name", list(REGRESSORS) + ["falkon_classifier"])
@pytest.mark.parametrize("factor", [2.0**1000, 1e300, 1e-300])
def test_uniformly_scaled_weights_give_the_same_model(data, name, factor):
    X, y = data
    make = {**REGRESSORS, **CLASSIFIERS}[name]
    target = y if name in REGRESSORS else (y > 0).astype(int)
    w = np.random.default_rng(3).uniform(0.5, 2.0, N)
    ref = _fit(make(), X, target, sample_weight=w)
    model = _fit(make(), X, target, sample_weight=w * factor)
    # the fit depends on weight ratios only; w * 1e300 rounds each weight once (relative eps), which moves
    # the model by cond * eps: with penalty 1e-3, cond(K + 1e-3 n I) <= 1 + 1/1e-3 ~ 1e3, so 1e3 * 1e3 eps
    np.testing.assert_allclose(model.decision_function(X) if name not in REGRESSORS else model.predict(X),
                               ref.decision_function(X) if name not in REGRESSORS else ref.predict(X),
                               rtol=1e6 * EPS, atol=1e6 * EPS)


def test_subnormal_weights_give_the_same_model(data):
    X, y = data
    ref = ExactKernelRidge(penalty=1e-3).fit(X, y)
    model = ExactKernelRidge(penalty=1e-3).fit(X, y, sample_weight=np.full(N, 5e-324 * 4))  # subnormal
    np.testing.assert_allclose(model.predict(X), ref.predict(X), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(REGRESSORS))
def test_all_zero_and_overflowing_weights_are_refused(data, name):
    X, y = data
    with pytest.raises(ValueError, match="only zero weights"):
        REGRESSORS[name]().fit(X, y, sample_weight=np.zeros(N))
    _refused(REGRESSORS[name](), X, y, match="sample_weight sums to more than float64",
             sample_weight=np.full(N, np.finfo(np.float64).max / 2))


# --------------------------------------------------------------------------- predict


@pytest.mark.parametrize("lazy", [False, True])
def test_predict_on_extreme_rows_names_column_and_row(data, lazy):
    X, y = data
    model = REGRESSORS["nystrom"]().fit(X, y)
    Xp = X.copy()
    Xp[13, 2] = 1e300
    Xin = da.from_array(Xp, chunks=(10, D)) if lazy else Xp
    with pytest.raises(ExtremeValueError, match=r"X column 2 has \|x\| = .* at row 13"):
        np.asarray(model.predict(Xin))


@pytest.mark.parametrize("name", list(UNSUPERVISED))
def test_unsupervised_output_on_extreme_rows_is_refused(data, name):
    X, _ = data
    model = UNSUPERVISED[name]().fit(X)
    Xp = X.copy()
    Xp[5, 0] = -1e300
    with pytest.raises(ExtremeValueError, match=r"X column 0 .* at row 5"):
        model.transform(Xp) if name == "kpca" else model.predict(Xp)


def test_a_spread_below_the_smallest_subnormal_is_refused_too(data):
    X, y = data
    Xs = _one_column(X, 1, 0.0)
    Xs[::2, 1] = 5e-324  # the column's standard deviation underflows to 0 in float64, yet it is not constant
    _refused(ExactKernelRidge(penalty=1e-3), Xs, y, match=r"X column 1 has a standard deviation of .*subnormal")
