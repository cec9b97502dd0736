"""Sparse input (issue 40): scipy CSR/CSC and dask arrays of sparse blocks, kernels from sparse dot products.

The data are 20-newsgroups-like: tf-idf-like rows (density ~1%, d = 2000, exponential term weights,
each row of unit L2 norm) made here. Sparse and dense fits must give the same model to round-off.

Tolerances. A kernel entry from sparse rows differs from the dense one only by the order of the sums
in ``|a|^2 + |b|^2 - 2 a.b`` (and the dense path's shift by the centers' mean): for rows of norm <= ~10
(unit rows after scaling by column standard deviations of ~0.1), each sum is exact to
``~ nnz eps |a| |b|`` with nnz ~ 20-40 terms, so entries agree to ``KERNEL_ATOL = 1e-12`` (about 100 eps
times the largest squared norm of the test rows). A model solves a system of condition ``kappa`` with
penalty 1e-3 (``kappa`` below ~1e3 after FALKON's preconditioner, which is exact here: the sketch holds
every row) and CG run to tol 1e-12 in both fits: its predictions then agree to ``kappa * 1e-13 + tol``,
within ``MODEL_RTOL = 1e-10`` relative to their largest magnitude.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import normalize

from daskkrr import ExactKernelRidge, FalkonClassifier, FalkonRegressor, LogisticFalkonClassifier, NystromRegressor
from daskkrr.data.sparse import sparse_moments, sparse_to_dask
from daskkrr.kernels import engine_for, make_kernel
from daskkrr.models.registry import ESTIMATORS, UNSUPERVISED
from daskkrr.sampling import SAMPLERS

#: See the module docstring: round-off of sparse vs dense dot products (~100 eps x |a|^2).
KERNEL_ATOL = 1e-12
#: See the module docstring: kappa x kernel round-off + CG tol, relative to the largest prediction.
MODEL_RTOL = 1e-10

N_ROWS, N_FEATURES, DENSITY = 400, 2000, 0.01


def tfidf_like(n: int = N_ROWS, d: int = N_FEATURES, density: float = DENSITY, seed: int = 0) -> sp.csr_matrix:
    """Rows like tf-idf vectors: a few exponential term weights per row, unit L2 norm, CSR."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=seed)
    X.data = rng.exponential(size=X.nnz)
    return sp.csr_matrix(normalize(X))


@pytest.fixture(scope="module")
def text_data():
    X = tfidf_like()
    rng = np.random.default_rng(1)
    y = np.asarray(X @ rng.standard_normal(N_FEATURES)).ravel() + 0.01 * rng.standard_normal(N_ROWS)
    return X, y


KERNELS = [
    ("gaussian", {"sigma": 1.0}),
    ("gaussian", {"sigma": tuple(np.linspace(0.5, 2.0, N_FEATURES))}),
    ("laplacian", {"sigma": 2.0}),
    ("matern", {"sigma": 1.0, "nu": 2.5}),
    ("linear", {}),
    ("polynomial", {"degree": 3, "gamma": 0.5}),
]


@pytest.mark.parametrize(("name", "params"), KERNELS, ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("formats", [("csr", "csr"), ("csc", "dense"), ("dense", "csc")])
def test_kernel_blocks_of_sparse_rows_equal_the_dense_ones(name, params, formats):
    A = tfidf_like(60, seed=2)
    B = tfidf_like(25, seed=3)
    kernel = make_kernel(name, **params)
    dense = kernel(A.toarray(), B.toarray())
    a, b = (M.toarray() if f == "dense" else M.asformat(f) for M, f in zip((A, B), formats))
    np.testing.assert_allclose(kernel(a, b), dense, rtol=0, atol=KERNEL_ATOL)
    np.testing.assert_allclose(kernel.diag(A), kernel.diag(A.toarray()), rtol=0, atol=KERNEL_ATOL)


@pytest.mark.parametrize("engine", ["numpy", "blas", "fused"])
def test_engine_products_on_sparse_blocks(engine):
    """Every product of every engine takes sparse rows, tiled (a small tile: several tiles per block)."""
    A, Z = tfidf_like(90, seed=4), tfidf_like(30, seed=5).toarray()
    kernel = make_kernel("gaussian", sigma=1.0)
    eng = engine_for(kernel, engine)
    rng = np.random.default_rng(0)
    U, V = rng.standard_normal((30, 2)), rng.standard_normal((90, 2))
    tile = 30 * 8 * 16  # 16 rows a tile
    pairs = [
        (eng.gram_matvec(kernel, A, Z, U, max_tile_bytes=tile), eng.gram_matvec(kernel, A.toarray(), Z, U)),
        (eng.t_matvec(kernel, A, Z, V, max_tile_bytes=tile), eng.t_matvec(kernel, A.toarray(), Z, V)),
        (eng.matvec(kernel, A, Z, U, max_tile_bytes=tile), eng.matvec(kernel, A.toarray(), Z, U)),
        (eng.gram_and_rhs(kernel, A, V, Z, max_tile_bytes=tile), eng.gram_and_rhs(kernel, A.toarray(), V, Z)),
        (eng.kernel_block(kernel, A, Z), eng.kernel_block(kernel, A.toarray(), Z)),
    ]
    for sparse_out, dense_out in pairs:
        # sums of up to 90 kernel entries (each within KERNEL_ATOL) times |U|, |V| <= ~4
        np.testing.assert_allclose(sparse_out, dense_out, rtol=0, atol=90 * 4 * 4 * KERNEL_ATOL)


def test_sparse_moments_equal_the_dense_ones():
    X = tfidf_like(300, 500, 0.02, seed=6)
    w = np.random.default_rng(0).uniform(0.5, 2.0, 300)
    for weights in (None, w):
        count, mean, m2 = sparse_moments(X, weights)
        D = X.toarray()
        ww = np.ones(300) if weights is None else weights
        ref_mean = ww @ D / ww.sum()
        assert count == pytest.approx(ww.sum(), rel=1e-15)
        # the same sums in another order: ~ n eps relative
        np.testing.assert_allclose(mean, ref_mean, rtol=300 * 2.2e-16, atol=1e-300)
        np.testing.assert_allclose(m2, ww @ np.square(D - ref_mean), rtol=1e-12, atol=1e-300)


def test_sparse_to_dask_keeps_csr_row_blocks():
    X = tfidf_like(100, 50, 0.1, seed=7).tocsc()
    Xd = sparse_to_dask(X, chunk_rows=30)
    assert Xd.chunks == ((30, 30, 30, 10), (50,))
    block = Xd.blocks[1].compute()
    assert sp.issparse(block) and block.format == "csr"
    np.testing.assert_array_equal(block.toarray(), X.toarray()[30:60])


def _fit_both(cls, params, X, y):
    sparse = cls(**params).fit(X, y)
    dense = cls(**params).fit(X.toarray(), y)
    return sparse, dense


def _assert_same_predictions(a, b):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=0, atol=MODEL_RTOL * np.max(np.abs(b)))


#: sigma=None (the default): sqrt(d), the scale of the distances between scaled rows (|a - b|^2 ~ 2 d), so that
#: the kernel entries spread over (0, 1) and the model depends on the scaling (a sigma far below the distances
#: would give K ~ I and hide a wrong scale).
FALKON = dict(penalty=1e-3, n_centers=80, random_state=0, tol=1e-12, max_iter=100)


@pytest.mark.parametrize(("kernel", "extra", "fmt"), [
    ("gaussian", {}, "csr"),           # standardize=True: scaled, not centred (the same model)
    ("gaussian", {}, "csc"),
    ("laplacian", {"sigma": 300.0}, "csr"),  # L1 distances of the scaled rows ~ 300
    ("linear", {"standardize": False}, "csc"),
    ("polynomial", {"standardize": False, "kernel_params": {"degree": 2}}, "csr"),
])
def test_falkon_regressor_sparse_equals_dense(text_data, kernel, extra, fmt):
    X, y = text_data
    sparse, dense = _fit_both(FalkonRegressor, {**FALKON, "kernel": kernel, **extra}, X.asformat(fmt), y)
    np.testing.assert_array_equal(sparse.center_indices_, dense.center_indices_)
    _assert_same_predictions(sparse.predict(X.asformat(fmt)), dense.predict(X.toarray()))
    _assert_same_predictions(sparse.coef_, dense.coef_)


@pytest.mark.parametrize("strategy", ["recompute", "cache", "gram"])
def test_every_strategy_takes_sparse_blocks(text_data, strategy):
    X, y = text_data
    sparse, dense = _fit_both(FalkonRegressor, {**FALKON, "strategy": strategy, "chunks": 150}, X, y)
    _assert_same_predictions(sparse.predict(X), dense.predict(X.toarray()))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_every_sampler_picks_the_same_centers_from_sparse_rows(text_data, sampler):
    """Several blocks (chunks=150): the streaming samplers fold sparse blocks (SQUEAK a dense piece at a time)."""
    X, y = text_data
    sparse, dense = _fit_both(FalkonRegressor, {**FALKON, "sampler": sampler, "chunks": 150}, X, y)
    np.testing.assert_array_equal(sparse.center_indices_, dense.center_indices_)
    _assert_same_predictions(sparse.predict(X), dense.predict(X.toarray()))


def test_falkon_classifier_sparse_equals_dense(text_data):
    X, y = text_data
    labels = np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))  # three classes
    sparse, dense = _fit_both(FalkonClassifier, FALKON, X, labels)
    _assert_same_predictions(sparse.decision_function(X), dense.decision_function(X.toarray()))
    np.testing.assert_array_equal(sparse.predict(X), dense.predict(X.toarray()))


def test_logistic_classifier_sparse_equals_dense(text_data):
    X, y = text_data
    labels = (y > np.median(y)).astype(int)
    params = {"penalty": 1e-3, "n_centers": 80, "random_state": 0, "tol": 1e-10}
    sparse, dense = _fit_both(LogisticFalkonClassifier, params, X, labels)
    # Newton steps, each a CG to tol: the same iterates to round-off (kappa x 1e-15 per step, as above)
    _assert_same_predictions(sparse.decision_function(X), dense.decision_function(X.toarray()))


@pytest.mark.parametrize("extra", [{"compute_std": True}, {"kernel": "linear", "standardize": False}])
def test_exact_krr_direct_sparse_equals_dense(text_data, extra):
    X, y = text_data
    sparse, dense = _fit_both(ExactKernelRidge, {"penalty": 1e-3, **extra}, X, y)
    assert sparse.solver_ == "direct"
    _assert_same_predictions(sparse.predict(X), dense.predict(X.toarray()))
    if extra.get("compute_std"):
        _assert_same_predictions(sparse.predict(X, return_std=True)[1], dense.predict(X.toarray(), return_std=True)[1])


def test_nystrom_return_std_sparse_equals_dense(text_data):
    X, y = text_data
    params = {**FALKON, "compute_std": True}
    params.pop("tol"), params.pop("max_iter")
    sparse, dense = _fit_both(NystromRegressor, params, X, y)
    (mean_s, std_s), (mean_d, std_d) = sparse.predict(X, return_std=True), dense.predict(X.toarray(), return_std=True)
    _assert_same_predictions(mean_s, mean_d)
    _assert_same_predictions(std_s, std_d)


def test_dask_array_of_sparse_blocks_fits_and_predicts(text_data):
    X, y = text_data
    Xd = da.from_array(X, chunks=(130, N_FEATURES), asarray=False)
    lazy = FalkonRegressor(**FALKON).fit(Xd, da.from_array(y, chunks=130))
    dense = FalkonRegressor(**FALKON).fit(X.toarray(), y)
    pred = lazy.predict(Xd)
    assert isinstance(pred, da.Array)
    _assert_same_predictions(pred.compute(), dense.predict(X.toarray()))


def test_sparse_nan_rows_are_named(text_data):
    X, y = text_data
    bad = X.copy()
    bad.data[bad.indptr[7]] = np.nan  # the first stored entry of row 7
    with pytest.raises(ValueError, match=r"X has NaN or inf in rows 0-399 \(block 0, first at row 7\)"):
        FalkonRegressor(**FALKON).fit(bad, y)
    model = FalkonRegressor(**FALKON).fit(X, y)
    with pytest.raises(ValueError, match="the first at row 7"):
        model.predict(bad)


def test_dot_product_kernel_with_standardize_is_refused_on_sparse_input(text_data):
    X, y = text_data
    with pytest.raises(TypeError, match=r"FalkonRegressor: X is sparse and standardize=True.*standardize=False"):
        FalkonRegressor(kernel="linear").fit(X, y)


def test_sparse_predict_on_a_model_fitted_on_centred_dense_data_is_refused(text_data):
    X, y = text_data
    model = FalkonRegressor(**FALKON).fit(X.toarray(), y)
    with pytest.raises(TypeError, match=r"with_mean=True.*X.toarray\(\)"):
        model.predict(X)


class _DenseOnly(FalkonRegressor):
    """An estimator that declares no sparse support (every registered one takes sparse X now)."""

    _sparse_input = False


@pytest.mark.parametrize("lazy", [False, True])
def test_an_estimator_without_sparse_support_refuses_it_by_name(lazy, text_data):
    X, y = text_data
    X = da.from_array(X, chunks=(200, N_FEATURES), asarray=False) if lazy else X
    with pytest.raises(TypeError, match=r"_DenseOnly does not take sparse X .*FalkonRegressor"):
        _DenseOnly().fit(X, y)


@pytest.mark.parametrize("cls", [*ESTIMATORS.values(), *UNSUPERVISED.values()], ids=lambda c: c.__name__)
def test_every_estimator_takes_sparse_input_and_says_so(cls):
    assert cls()._sparse_input and cls().__sklearn_tags__().input_tags.sparse
    assert not _DenseOnly().__sklearn_tags__().input_tags.sparse


def test_svmlight_file_to_sparse_store_and_back(text_data, tmp_path):
    """LIBSVM rows (scikit-learn's dumper) -> CSR row blocks in Zarr -> a dask array of the same blocks."""
    from sklearn.datasets import dump_svmlight_file

    from daskkrr import open_dataset
    from daskkrr.data.sparse_store import convert_svmlight

    X, y = text_data
    dump_svmlight_file(X, y, str(tmp_path / "train.svm"))
    summary = convert_svmlight(tmp_path / "train.svm", tmp_path / "train.zarr", chunk_rows=150,
                               n_features=N_FEATURES)
    assert summary == {"rows": N_ROWS, "features": N_FEATURES, "stored": X.nnz}
    Xd, yd = open_dataset(tmp_path / "train.zarr")
    assert Xd.chunks == ((150, 150, 100), (N_FEATURES,))
    assert sp.issparse(Xd.blocks[2].compute())
    # the dumper writes 16 significant digits ("%.16g"): each value comes back within half a unit of the
    # 16th digit, at most 5e-16 relative (a leading digit 1), plus the rounding of reading it back (eps)
    np.testing.assert_allclose(Xd.compute().toarray(), X.toarray(), rtol=5e-16 + 2.3e-16, atol=0)
    np.testing.assert_allclose(yd.compute(), y, rtol=5e-16 + 2.3e-16, atol=0)
    from_store = FalkonRegressor(**FALKON).fit(tmp_path / "train.zarr")
    dense = FalkonRegressor(**FALKON).fit(Xd.compute().toarray(), yd.compute())
    _assert_same_predictions(from_store.predict(X), dense.predict(X.toarray()))


@pytest.mark.slow  # starts a local cluster for `daskkrr fit` (about 30 s on 2 shared cores)
def test_cli_convert_sparse_then_fit_and_predict(text_data, tmp_path):
    from sklearn.datasets import dump_svmlight_file

    from daskkrr import load, open_dataset
    from daskkrr.cli import main

    X, y = text_data
    dump_svmlight_file(X, y, str(tmp_path / "train.svm"))
    assert main(["convert", "--sparse", str(tmp_path / "train.svm"), str(tmp_path / "train.zarr"),
                 "--chunk-rows", "200"]) == 0
    assert main(["fit", "--data", str(tmp_path / "train.zarr"), "--out", str(tmp_path / "model"),
                 "--n-centers", "60", "--workers", "1"]) == 0
    Xd, yd = open_dataset(tmp_path / "train.zarr")
    model = load(tmp_path / "model")
    # the CLI's parameters and its centers (drawn with no fixed seed), given as rows of X
    params = {**model.get_params(), "sampler": X.toarray()[model.center_indices_]}
    reference = FalkonRegressor(**params).fit(Xd.compute().toarray(), yd.compute())
    _assert_same_predictions(model.predict(X), reference.predict(X.toarray()))


def test_cli_convert_without_target_or_sparse_says_which(tmp_path, capsys):
    from daskkrr.cli import main

    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    assert main(["convert", str(tmp_path / "t.csv"), str(tmp_path / "t.zarr")]) == 2
    assert "convert needs --target NAME" in capsys.readouterr().err
