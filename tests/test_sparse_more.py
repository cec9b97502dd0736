"""Sparse input for the estimators that refused it before (issue 40): kernel PCA, kernel k-means,
OnlineKernelRidge and exact KRR's PCG solver.

The data are tf-idf-like rows made here (:func:`tests.test_sparse_input.tfidf_like`: density 2%, unit rows).
Each test fits the same estimator on sparse rows (CSR, CSC, a dask array of CSR blocks or a sparse Zarr store)
and on the same rows densified, and compares the models.

Tolerances. The kernel entries of sparse rows differ from the dense ones by round-off only, at most
``KERNEL_ATOL = 1e-12`` (see tests/test_sparse_input.py). A model built from those entries moves by at most the
condition number of what it solves times that relative perturbation (first-order perturbation of a linear
system, Weyl's inequality for eigenvalues, Davis-Kahan for eigenvectors: divided by the eigengap); each test
computes that condition number on its data (small matrices: M or n <= 240) and states its bound.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

from daskkrr import ExactKernelRidge, NystromKernelKMeans, NystromKernelPCA
from daskkrr.kernels import make_kernel
from daskkrr.kernels.random_features import random_features
from daskkrr.models.online import OnlineKernelRidge
from tests.test_sparse_input import KERNEL_ATOL, tfidf_like

N, D = 240, 600


@pytest.fixture(scope="module")
def rows():
    X = tfidf_like(N, D, 0.02, seed=11)
    y = np.asarray(X @ np.random.default_rng(12).standard_normal(D)).ravel()
    return X, y


def lazy(X: sp.csr_matrix, rows: int = 90) -> da.Array:
    """A dask array of CSR row blocks (several blocks, a short last one)."""
    return da.from_array(sp.csr_matrix(X), chunks=(rows, X.shape[1]), asarray=False)


def cond(K: np.ndarray) -> float:
    """2-norm condition number of a symmetric positive (semi)definite matrix."""
    w = np.linalg.eigvalsh((K + K.T) / 2)
    return float(w[-1] / max(w[0], np.finfo(float).tiny))


def as_formats(X: sp.csr_matrix) -> dict:
    return {"csr": X, "csc": X.tocsc(), "dask": lazy(X)}


# --------------------------------------------------------------------------- kernel PCA
@pytest.mark.parametrize("fmt", ["csr", "csc", "dask"])
def test_kernel_pca_sparse_equals_dense(rows, fmt):
    X, _ = rows
    params = dict(n_components=4, n_centers=60, random_state=0)  # the 4th eigenvalue bounds the 3rd gap
    dense = NystromKernelPCA(**params).fit(X.toarray())
    Xs = as_formats(X)[fmt]
    sparse = NystromKernelPCA(**params).fit(Xs)
    np.testing.assert_array_equal(sparse.center_indices_, dense.center_indices_)
    assert isinstance(sparse.centers_, np.ndarray)  # centers are dense rows, as in the supervised fits
    # The centers (dense, the same rows) give the same K_MM and basis P; only k(X, Z) differs, by KERNEL_ATOL:
    # the whitened covariance moves by ~ cond(K_MM) KERNEL_ATOL relative (P = K_MM^{-1/2} amplifies by
    # ||P||^2 <= 1 / s_min and the entries are <= 1, s_max <= M), its eigenvalues by that times the largest
    # (Weyl), and its eigenvectors by that over the relative eigengap (Davis-Kahan).
    delta = cond(dense.kernel_(dense.centers_, dense.centers_)) * KERNEL_ATOL
    lam = dense.eigenvalues_
    np.testing.assert_allclose(sparse.eigenvalues_, lam, rtol=0, atol=delta * lam[0])
    padded = np.concatenate([[np.inf], lam])
    gaps = np.minimum(padded[:3] - padded[1:4], padded[1:4] - padded[2:5])  # of the first three components
    ref = dense.transform(X.toarray())[:, :3]
    got = sparse.transform(Xs)
    got = (got.compute() if isinstance(got, da.Array) else got)[:, :3]
    np.testing.assert_array_less(np.abs(got - ref).max(axis=0), delta * lam[0] / gaps * np.abs(ref).max(axis=0))


def test_kernel_pca_from_a_sparse_store(rows, tmp_path):
    """``daskkrr convert --sparse``'s store (CSR row blocks in Zarr) fits the unsupervised estimators too."""
    from sklearn.datasets import dump_svmlight_file

    from daskkrr import open_dataset
    from daskkrr.data.sparse_store import convert_svmlight

    X, y = rows
    dump_svmlight_file(X, y, str(tmp_path / "rows.svm"))
    convert_svmlight(tmp_path / "rows.svm", tmp_path / "rows.zarr", chunk_rows=100, n_features=D)
    params = dict(n_components=2, n_centers=60, random_state=0)
    from_store = NystromKernelPCA(**params).fit(tmp_path / "rows.zarr")
    stored = open_dataset(tmp_path / "rows.zarr")[0].compute()  # the values as written (16 digits)
    assert sp.issparse(stored)
    dense = NystromKernelPCA(**params).fit(stored.toarray())
    delta = cond(dense.kernel_(dense.centers_, dense.centers_)) * KERNEL_ATOL  # as in the test above
    np.testing.assert_allclose(from_store.eigenvalues_, dense.eigenvalues_, rtol=0,
                               atol=delta * dense.eigenvalues_[0])
    np.testing.assert_allclose(from_store.coef_, dense.coef_, rtol=0, atol=1e3 * delta * np.abs(dense.coef_).max())


# --------------------------------------------------------------------------- kernel k-means
@pytest.mark.parametrize("fmt", ["csr", "dask"])
@pytest.mark.parametrize("init", ["k-means||", "given"])
def test_kernel_kmeans_sparse_equals_dense(rows, fmt, init):
    X, _ = rows
    given = X[:4].toarray() * 1.5  # points in the input feature space (dense), scaled as X in fit
    params = dict(n_clusters=4, n_centers=60, random_state=0, init=given if init == "given" else init)
    dense = NystromKernelKMeans(**params).fit(X.toarray())
    Xs = as_formats(X)[fmt]
    if init == "given":  # the centroids given as a sparse matrix too
        params["init"] = sp.csr_matrix(given)
    sparse = NystromKernelKMeans(**params).fit(Xs)
    labels = sparse.labels_.compute() if isinstance(sparse.labels_, da.Array) else sparse.labels_
    # labels are discrete: the same unless a row is equidistant to two centroids within round-off
    np.testing.assert_array_equal(labels, dense.labels_)
    assert sparse.n_iter_ == dense.n_iter_
    # the same labels give centroids and inertia from the same sums of embedded rows, each moved by
    # ~ cond(K_MM) KERNEL_ATOL relative (the kernel rows' round-off through the whitening P)
    delta = cond(dense.kernel_(dense.centers_, dense.centers_)) * KERNEL_ATOL
    np.testing.assert_allclose(sparse.cluster_centers_, dense.cluster_centers_, rtol=0,
                               atol=delta * np.abs(dense.cluster_centers_).max())
    assert sparse.inertia_ == pytest.approx(dense.inertia_, rel=delta)
    pred = sparse.predict(Xs)
    np.testing.assert_array_equal(pred.compute() if isinstance(pred, da.Array) else pred, dense.labels_)
    assert sparse.score(Xs) == pytest.approx(dense.score(X.toarray()), rel=delta)


@pytest.mark.parametrize("cls", [NystromKernelPCA, NystromKernelKMeans, ExactKernelRidge],
                         ids=lambda c: c.__name__)
@pytest.mark.parametrize("kernel", ["linear", "polynomial"])
def test_dot_product_kernel_with_standardize_is_refused(rows, cls, kernel):
    X, y = rows
    model = cls(kernel=kernel, **({"solver": "pcg"} if cls is ExactKernelRidge else {"n_centers": 60}))
    with pytest.raises(TypeError, match=rf"{cls.__name__}: X is sparse and standardize=True.*standardize=False"):
        model.fit(lazy(X)) if cls is not ExactKernelRidge else model.fit(lazy(X), y)


@pytest.mark.parametrize("cls", [NystromKernelPCA, NystromKernelKMeans], ids=lambda c: c.__name__)
def test_unsupervised_dot_product_kernel_without_standardize(rows, cls):
    """standardize=False: the raw sparse rows, the dense model (polynomial kernel, its entries from X Z^T)."""
    X, _ = rows
    params = dict(kernel="polynomial", kernel_params={"degree": 2}, standardize=False, n_centers=60,
                  random_state=0, **({"n_components": 2} if cls is NystromKernelPCA else {"n_clusters": 3}))
    sparse, dense = cls(**params).fit(X), cls(**params).fit(X.toarray())
    delta = cond(dense.kernel_(dense.centers_, dense.centers_)) * KERNEL_ATOL
    if cls is NystromKernelPCA:
        np.testing.assert_allclose(sparse.eigenvalues_, dense.eigenvalues_, rtol=0,
                                   atol=delta * dense.eigenvalues_[0])
    else:
        np.testing.assert_array_equal(sparse.labels_, dense.labels_)


# --------------------------------------------------------------------------- exact KRR by PCG
def pcg_bound(model, X: np.ndarray, tol: float) -> float:
    """Relative change of the coefficients bounded by kappa (2 tol + KERNEL_ATOL): both fits stop at relative
    residual tol, and their operators K + lambda n I differ by the kernel's round-off (K of the scaled rows)."""
    Xs = model.scaler_.transform(X) if model.scaler_ is not None else X
    K = model.kernel_(Xs, Xs)
    return cond(K + model.penalty * X.shape[0] * np.eye(X.shape[0])) * (2 * tol + KERNEL_ATOL)


#: A fixed s (no adaptive probes) keeps the tests fast; two blocks of rows (three tiles).
PCG = dict(solver="pcg", penalty=1e-2, tol=1e-11, max_iter=500, chunks=120, n_features=64, random_state=0)


#: The default run keeps two cases (the feature maps of every kernel are checked on sparse rows below).
SLOW = pytest.mark.slow


@pytest.mark.parametrize(("extra", "fmt"), [
    ({}, "dask"),  # random Fourier features of the scaled sparse rows
    pytest.param({}, "csr", marks=SLOW),
    pytest.param({"preconditioner": "nystrom"}, "csc", marks=SLOW),
    ({"kernel": "polynomial", "standardize": False, "kernel_params": {"degree": 2}}, "csr"),  # TensorSketch
    pytest.param({"kernel": "linear", "standardize": False, "srht_features": 32}, "dask", marks=SLOW),
    pytest.param({"kernel": "laplacian", "sigma": 60.0}, "csr", marks=SLOW),  # dense pieces (no dot-product form)
])
def test_exact_krr_pcg_sparse_equals_dense(rows, extra, fmt):
    X, y = rows
    params = {**PCG, **extra}
    dense = ExactKernelRidge(**params).fit(X.toarray(), y)
    sparse = ExactKernelRidge(**params).fit(as_formats(X)[fmt], y)
    assert sparse.solver_ == "pcg" and sparse.converged_
    bound = pcg_bound(dense, X.toarray(), params["tol"])
    ref = dense.predict(X.toarray())
    np.testing.assert_allclose(sparse.predict(X), ref, rtol=0, atol=bound * np.abs(ref).max())
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=0, atol=bound * np.abs(dense.coef_).max())


@pytest.mark.parametrize(("name", "params"), [("gaussian", {"sigma": 2.0}), ("laplacian", {"sigma": 3.0}),
                                             ("polynomial", {"degree": 3, "gamma": 0.5}), ("linear", {})])
def test_random_features_of_sparse_rows_equal_the_dense_ones(name, params):
    """The preconditioner's feature maps take sparse rows: the same features to round-off (sums of the
    same products in another order, <= ~100 eps for unit rows and O(1) weights)."""
    X = tfidf_like(50, 300, 0.03, seed=13)
    fmap = random_features(make_kernel(name, **params), 128, 300, seed=0, srht_features=None)
    np.testing.assert_allclose(fmap(X), fmap(X.toarray()), rtol=0, atol=1e-13)
    np.testing.assert_allclose(fmap(X.tocsc()), fmap(X.toarray()), rtol=0, atol=1e-13)


# --------------------------------------------------------------------------- online KRR
ONLINE = dict(penalty=1e-3, gamma=1e-2, batch_size=70, random_state=0)


def online_bound(model) -> float:
    """The regression solves in the basis of K_BB (its Cholesky factor): relative change
    ~ cond(K_BB) KERNEL_ATOL under the kernel's round-off."""
    return cond(model.kernel_(model.centers_, model.centers_)) * KERNEL_ATOL


@pytest.mark.parametrize(("kernel", "window"), [
    ("gaussian", None), ("gaussian", 150),
    ("linear", None),  # linear with standardize=True: the raw rows, as for dense rows (nothing is centred)
    pytest.param("linear", 150, marks=pytest.mark.slow),
])
def test_online_partial_fit_on_sparse_batches_equals_dense(rows, window, kernel):
    X, y = rows
    sparse = OnlineKernelRidge(kernel=kernel, window=window, **ONLINE)
    dense = OnlineKernelRidge(kernel=kernel, window=window, **ONLINE)
    for start in range(0, N, 120):  # two calls, each several batches
        sparse.partial_fit(X[start:start + 120], y[start:start + 120])
        dense.partial_fit(X[start:start + 120].toarray(), y[start:start + 120])
    np.testing.assert_array_equal(sparse.center_indices_, dense.center_indices_)
    np.testing.assert_array_equal(sparse.centers_, dense.centers_)  # the landmarks: dense rows, exactly
    ref = dense.predict(X.toarray())
    np.testing.assert_allclose(sparse.predict(X), ref, rtol=0, atol=online_bound(dense) * np.abs(ref).max())
    if window is not None:
        assert sp.issparse(sparse.state_.window_X)  # the window keeps its rows sparse


@pytest.mark.parametrize("piece_bytes", [None, 0])
def test_the_online_sweep_densifies_a_small_sparse_block_once_and_keeps_a_large_one_sparse(
        rows, piece_bytes, monkeypatch):
    """The sweep asks for a kernel row per accepted candidate; a sparse block within the
    engines' dense piece is densified once (speed), one above it stays sparse (memory).
    Either way the decisions and factor rows equal the dense block's, to the kernel's round-off."""
    import daskkrr.solvers.online_rls as online_rls

    if piece_bytes is not None:
        monkeypatch.setattr(online_rls, "DENSE_PIECE_BYTES", piece_bytes)
    X = rows[0][:80]
    kernel = make_kernel("gaussian", sigma=3.0)
    seen = []

    def spy(A, B):
        seen.append(sp.issparse(A) or sp.issparse(B))
        return kernel(A, B)

    b = X.shape[0]
    decide = online_rls.SPAN_TOL  # accept every candidate that is not in the span so far

    def rule(i, r):
        return 1.0 if r > decide else 0.0

    got = online_rls.sweep(np.zeros((0, b)), np.ones(b), X, spy, 1e-3, rule)
    ref = online_rls.sweep(np.zeros((0, b)), np.ones(b), X.toarray(), kernel, 1e-3, rule)
    assert seen and all(seen) == (piece_bytes == 0) and any(seen) == (piece_bytes == 0)
    np.testing.assert_array_equal(got.accepted, ref.accepted)
    assert got.accepted.size > 10
    # The kernel's round-off (KERNEL_ATOL) through the factor's pivots, each at least sqrt(lam):
    # at most KERNEL_ATOL / lam.
    np.testing.assert_allclose(got.new_rows, ref.new_rows, rtol=0, atol=KERNEL_ATOL / 1e-3)


@pytest.mark.parametrize("source", ["dask", "store"])
def test_online_fit_on_dask_sparse_blocks_equals_dense(rows, source, tmp_path):
    from daskkrr.data.sparse_store import write_sparse_zarr

    X, y = rows
    if source == "store":  # CSR row blocks in Zarr (the layout of daskkrr convert --sparse), with y
        write_sparse_zarr(tmp_path / "rows.zarr", X, y, chunk_rows=90)
        sparse = OnlineKernelRidge(**ONLINE).fit(tmp_path / "rows.zarr")
    else:
        sparse = OnlineKernelRidge(**ONLINE).fit(lazy(X), da.from_array(y, chunks=90))
    dense = OnlineKernelRidge(**ONLINE).fit(X.toarray(), y)
    np.testing.assert_array_equal(sparse.center_indices_, dense.center_indices_)
    np.testing.assert_allclose(sparse.feature_scale_, dense.feature_scale_, rtol=1e-13)  # sums of N squares
    ref = dense.predict(X.toarray())
    np.testing.assert_allclose(sparse.predict(lazy(X)).compute(), ref, rtol=0,
                               atol=online_bound(dense) * np.abs(ref).max())


def test_online_sparse_window_is_saved_and_continues(rows, tmp_path):
    from daskkrr import load

    X, y = rows
    model = OnlineKernelRidge(window=60, **ONLINE).partial_fit(X[:100], y[:100])
    model.save(tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert sp.issparse(loaded.state_.window_X)
    np.testing.assert_array_equal(loaded.state_.window_X.toarray(), model.state_.window_X.toarray())
    model.partial_fit(X[100:160], y[100:160])
    loaded.partial_fit(X[100:160], y[100:160])
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))  # the same state: the same arithmetic


@pytest.mark.parametrize("lazy_input", [False, True])
def test_online_sparse_nan_is_refused_before_any_update(rows, lazy_input):
    X, y = rows
    model = OnlineKernelRidge(**ONLINE).partial_fit(X[:100], y[:100])
    before = model.predict(X)
    bad = X[100:200].copy()
    bad.data[bad.indptr[7]] = np.inf  # a stored entry of row 7 of the batch
    with pytest.raises(ValueError, match="NaN or inf" + ("" if lazy_input else ".*the first at row 7")):
        model.partial_fit(lazy(bad, 40) if lazy_input else bad, da.from_array(y[100:200], chunks=40)
                          if lazy_input else y[100:200])
    np.testing.assert_array_equal(model.predict(X), before)
