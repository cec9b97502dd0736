"""Bad input to the Python API is refused at the boundary: the error says what, where and
how to fix it, and nothing is written (a requested checkpoint directory is not even created)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from daskkrr import FalkonClassifier, FalkonRegressor, NystromRegressor
from daskkrr.checkpoint import FitCheckpoint


@pytest.fixture
def Xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    return X, np.sin(X[:, 0]) + 0.1 * X[:, 1]


def _refused(tmp_path, model, X, y, error, match):
    """``fit`` raises ``error`` matching ``match`` and writes nothing (no checkpoint dir)."""
    ckpt = tmp_path / "ckpt"
    with pytest.raises(error, match=match):
        model.fit(X, y, checkpoint=ckpt)
    assert not ckpt.exists(), "a refused fit must not write anything"
    assert not hasattr(model, "coef_")


# ---------------------------------------------------------------- non-finite values


@pytest.mark.parametrize("standardize", [True, False])
def test_nan_in_X_names_the_row_range(tmp_path, Xy, standardize):
    X, y = Xy
    X = X.copy()
    X[250, 1] = np.nan
    model = FalkonRegressor(n_centers=20, standardize=standardize, chunks=100)
    _refused(tmp_path, model, X, y, ValueError,
             r"X has NaN or inf in rows 200-299 \(block 2, first at row 250\); clean or impute")


def test_inf_in_y_names_the_row_range(tmp_path, Xy):
    X, y = Xy
    y = y.copy()
    y[7] = -np.inf
    _refused(tmp_path, FalkonRegressor(n_centers=20, standardize=False, chunks=100), X, y,
             ValueError, r"y has NaN or inf in rows 0-99 \(block 0, first at row 7\)")


def test_nan_in_dask_input_found_in_the_statistics_pass(tmp_path, Xy):
    X, y = Xy
    X = X.copy()
    X[399, 0] = np.inf
    _refused(tmp_path, FalkonRegressor(n_centers=20), da.from_array(X, chunks=(150, 3)),
             da.from_array(y, chunks=150), ValueError, r"X has NaN or inf in rows 300-399")


# ---------------------------------------------------------------- shapes and dtypes


def _object_with_text(X):
    X = X.astype(object)
    X[5, 1] = "a"
    return X


#: (make, ids, in-memory error, its message (scikit-learn's), lazy error, its message (daskkrr's)).
SHAPES_AND_DTYPES = [
    (lambda X, y: (X, y[:-1]), "length",
     ValueError, "y has 399 rows but X has 400", ValueError, "y has 399 rows but X has 400"),
    (lambda X, y: (X[:, 0], y), "X-1d", ValueError, r"(?s)Expected 2D array, got 1D array instead.*Reshape your data",
     ValueError, r"X must be 2-D .* reshape a single feature"),
    (lambda X, y: (X[:, :, None], y), "X-3d", ValueError, r"Found array with dim 3",
     ValueError, r"X must be 2-D .*got 3-D"),
    (lambda X, y: (X, y[:, None, None]), "y-3d", ValueError, r"Found array with dim 3",
     ValueError, r"y must be 1-D .*or 2-D .*got 3-D"),
    (lambda X, y: (_object_with_text(X), y), "object", ValueError, r"could not convert string to float: 'a'",
     TypeError, r"X has dtype object; expected bool, integer or float"),
    (lambda X, y: (X.astype(str), y), "text", ValueError, r"dtype='numeric' is not compatible with arrays of "
     "bytes/strings", TypeError, r"X has dtype <U.*encode categorical/text columns"),
    (lambda X, y: (X + 1j, y), "complex", ValueError, r"Complex data not supported",
     TypeError, r"X has dtype complex128.*np.real"),
    (lambda X, y: (X, y.astype(str)), "y-text", ValueError, r"dtype='numeric' is not compatible with arrays of "
     "bytes/strings", TypeError, r"y has dtype <U"),
    (lambda X, y: (X[:0], y[:0]), "no-rows", ValueError, r"Found array with 0 sample\(s\) \(shape=\(0, 3\)\)",
     ValueError, r"X has shape \(0, 3\); at least 1 row and 1 column"),
    (lambda X, y: (X[:, :0], y), "no-columns", ValueError,
     r"Found array with 0 feature\(s\) \(shape=\(400, 0\)\)",
     ValueError, r"X has shape \(400, 0\); at least 1 row and 1 column"),
]


@pytest.mark.parametrize("make, in_memory_error, in_memory_match, lazy_error, lazy_match",
                         [case[:1] + case[2:] for case in SHAPES_AND_DTYPES],
                         ids=[case[1] for case in SHAPES_AND_DTYPES])
@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_bad_shapes_and_dtypes(tmp_path, Xy, make, in_memory_error, in_memory_match, lazy_error, lazy_match, lazy):
    """numpy input gets scikit-learn's checks and messages; dask input daskkrr's own."""
    X, y = make(*Xy)
    if lazy:
        X, y = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
        _refused(tmp_path, FalkonRegressor(n_centers=10), X, y, lazy_error, lazy_match)
    else:
        _refused(tmp_path, FalkonRegressor(n_centers=10), X, y, in_memory_error, in_memory_match)


def test_fewer_rows_than_centers_clamps_with_a_warning(Xy):
    X, y = Xy
    with pytest.warns(UserWarning, match=r"n_centers=401 is larger than the number of training rows \(400\); "
                                         r"using n_centers=400"):
        model = FalkonRegressor(n_centers=401, max_iter=2).fit(X, y)
    assert model.n_centers_ == 400


def test_array_without_target(tmp_path, Xy):
    _refused(tmp_path, FalkonRegressor(n_centers=10), Xy[0], None, ValueError,
             r"This FalkonRegressor estimator requires y to be passed, but the target y is None")
    _refused(tmp_path, FalkonRegressor(n_centers=10), da.from_array(Xy[0]), None, ValueError,
             r"y is required.*fit\(X, y\)")


def test_classifier_with_one_class(tmp_path, Xy):
    X, _ = Xy
    _refused(tmp_path, FalkonClassifier(n_centers=10), X, np.ones(400), ValueError,
             r"y has only one class \(\[1.0\]\); a classifier needs at least two")


def test_column_split_chunks_are_rechunked(Xy):
    """Blocks that split the columns are merged (one block across the columns), not refused."""
    X, y = Xy
    params = dict(n_centers=40, penalty=1e-3, tol=1e-11, max_iter=60, random_state=0)
    split = FalkonRegressor(**params).fit(da.from_array(X, chunks=(100, 1)), da.from_array(y, chunks=100))
    rows = FalkonRegressor(**params).fit(da.from_array(X, chunks=(100, 3)), da.from_array(y, chunks=100))
    np.testing.assert_allclose(split.coef_, rows.coef_, rtol=1e-10, atol=1e-12)
    pred = split.predict(da.from_array(X, chunks=(100, 1)))
    np.testing.assert_allclose(pred.compute(), rows.predict(X), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- parameters


#: What sigma accepts, as the message of a refused value says it.
_SIGMA = r"sigma must be a float in the range \(0.0, inf\), an array-like or None"


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"sigma": 0}, ValueError, _SIGMA + r"; got 0 \(int\); the kernel length scale, e.g. sigma=1.0, one per "
                                   r"feature"),
        ({"sigma": -1.0}, ValueError, _SIGMA + r"; got -1.0"),
        ({"sigma": float("inf")}, ValueError, _SIGMA + r"; got inf"),
        ({"penalty": 0}, ValueError, r"penalty must be a float in the range \(0.0, inf\); got 0 \(int\); the ridge "
                                     r"penalty"),
        ({"penalty": -1e-6}, ValueError, r"penalty must be a float in the range \(0.0, inf\)"),
        ({"tol": 0.0}, ValueError, r"tol must be a float in the range \(0.0, inf\); got 0.0 \(float\); the relative "
                                   r"residual"),
        ({"max_iter": 0}, ValueError, r"max_iter must be an int in the range \[1, inf\); got 0"),
        ({"n_centers": 0}, ValueError, r"n_centers must be an int in the range \[1, inf\); got 0"),
        ({"kernel": "polynomial", "kernel_params": {"gamma": 0}}, ValueError,
         "PolynomialKernel: gamma must be > 0; got 0"),
        ({"kernel": "polynomial", "kernel_params": {"gamma": -2.0}}, ValueError, "gamma must be > 0"),
        ({"kernel": "matern", "kernel_params": {"nu": 3.0}}, ValueError, "nu must be one of 0.5, 1.5, 2.5"),
        ({"kernel": "nope"}, ValueError, r"unknown kernel 'nope'; choose one of \['gaussian'"),
        # A misspelt name is unknown (not "takes no sigma"), with the closest known name suggested.
        ({"kernel": "gausian", "sigma": 1.0}, ValueError, r"unknown kernel 'gausian'; choose one of \['gaussian', "
                                                        r"'laplacian', .*\]; did you mean 'gaussian'\?"),
        ({"kernel": "gaussian", "kernel_params": {"degree": 2}}, ValueError,
         r"kernel 'gaussian' does not take parameter\(s\) \['degree'\]"),
        ({"kernel": "linear", "sigma": 1.0}, ValueError, r"kernel 'linear' takes no sigma; pass sigma=None"),
        ({"kernel": 3}, TypeError, r"kernel must be an instance of 'str', an instance of 'dict' or an instance of "
                                   r"'daskkrr.kernels.base.Kernel'; got 3"),
        ({"sampler": "nope"}, ValueError, r"sampler must be one of 'bless', .*'uniform', an instance of "
                                          r".*CenterSampler' or an instance of 'numpy.ndarray'; got 'nope'"),
        ({"sampler": 3}, TypeError,
         r"sampler must be one of .*CenterSampler' or an instance of 'numpy.ndarray'; got 3 \(int\)"),
        ({"sigma": "1.0"}, TypeError, _SIGMA + r"; got '1.0' \(str\)"),
        ({"penalty": None}, TypeError, r"penalty must be a float in the range \(0.0, inf\); got None"),
        ({"n_centers": 10.5}, TypeError, r"n_centers must be an int in the range \[1, inf\); got 10.5 \(float\)"),
        ({"n_centers": True}, TypeError, r"n_centers must be an int in the range \[1, inf\); got True \(bool\)"),
        ({"standardize": "yes"}, TypeError, r"standardize must be an instance of 'bool' or an instance of "
                                            r"'numpy.bool'; got 'yes'"),
        ({"random_state": "a"}, TypeError, r"random_state must be an int in the range \[0, inf\), an instance of "
                                           r"'numpy.random._generator.Generator', an instance of "
                                           r"'numpy.random.mtrand.RandomState' or None; got 'a'"),
        ({"random_state": -1}, ValueError, r"random_state must be an int in the range \[0, inf\), .* or None; got -1 "
                                           r"\(int\); a seed"),
        ({"dtype": "float16"}, ValueError, r"dtype must be one of 'float32', 'float64'; got 'float16'"),
        ({"kernel_params": [1]}, TypeError, r"kernel_params must be an instance of 'dict' or None; got \[1\]"),
        ({"chunks": 0}, ValueError, r"chunks must be an int in the range \[1, inf\) or None; got 0"),
    ],
)
def test_bad_parameters_are_refused_before_any_work(tmp_path, Xy, params, error, match, monkeypatch):
    from daskkrr.data import Standardizer

    def no_pass(*args, **kwargs):  # the parameters are checked before the statistics pass
        raise AssertionError("a pass over the data ran before the parameters were checked")

    monkeypatch.setattr(Standardizer, "fit", no_pass)
    _refused(tmp_path, FalkonRegressor(**{"n_centers": 10, **params}), *Xy, error, match)


def test_bad_client_is_refused():
    from daskkrr.parallel import Executor

    with pytest.raises(TypeError, match="client must be a distributed.Client or None; got str"):
        Executor("tcp://127.0.0.1:8786")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"checkpoint_every": 0}, ValueError, "checkpoint_every must be a positive integer"),
        ({"checkpoint_every": 2.5}, ValueError, "checkpoint_every must be a positive integer"),
        ({"resume": "yes"}, TypeError, "resume must be True or False"),
    ],
)
def test_bad_checkpoint_arguments(tmp_path, Xy, kwargs, error, match):
    with pytest.raises(error, match=match):
        FalkonRegressor(n_centers=10).fit(*Xy, checkpoint=tmp_path / "ck", **kwargs)
    assert not (tmp_path / "ck").exists()


def test_checkpoint_path_that_is_a_file(tmp_path, Xy):
    path = tmp_path / "file"
    path.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="is a file; pass a directory path"):
        FalkonRegressor(n_centers=10).fit(*Xy, checkpoint=path)
    assert path.read_text() == "not a directory"


def test_checkpoint_object_type():
    with pytest.raises(TypeError, match="checkpoint must be a directory path or None; got int"):
        FitCheckpoint(3)


# ---------------------------------------------------------------- predict


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4))
    return FalkonRegressor(n_centers=30, random_state=0).fit(X, X[:, 0]), X


def test_predict_with_other_number_of_features(fitted):
    model, X = fitted
    with pytest.raises(ValueError, match="X has 3 features, but FalkonRegressor is expecting 4 features as input"):
        model.predict(X[:, :3])
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array instead"):
        model.predict(X[0])  # one row must be passed as X[:1]: a 1-D X is not guessed into a shape
    fix = r"X has shape \(300, 3\) but this model was fitted on 4 features; pass the same 4 columns"
    with pytest.raises(ValueError, match=fix):
        model.predict(da.from_array(X[:, :3], chunks=100))


def test_predict_refuses_non_finite_rows(fitted):
    model, X = fitted
    X = X.copy()
    X[123, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\) of rows 0-299, the first at row 123"):
        model.predict(X)
    lazy = model.predict(da.from_array(X, chunks=(100, 4)))  # lazy: found when the block is computed
    with pytest.raises(ValueError, match=r"NaN or inf in 1 row\(s\) of rows 100-199, the first at row 123"):
        lazy.compute()


def test_predict_non_numeric_and_unfitted(fitted):
    model, X = fitted
    with pytest.raises(ValueError, match="dtype='numeric' is not compatible with arrays of bytes/strings"):
        model.predict(X.astype(str))
    with pytest.raises(NotFittedError, match="This NystromRegressor instance is not fitted yet"):
        NystromRegressor().predict(X)
