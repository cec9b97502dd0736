"""Synthetic generators: determinism, block independence, learnability, Zarr writers."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np
import pytest
import zarr

from daskkrr.data import (
    make_blobs,
    make_classification,
    make_regression,
    open_dataset,
    write_blobs_zarr,
    write_classification_zarr,
    write_regression_zarr,
)
from daskkrr.data.synthetic import SmoothTarget


def test_regression_is_deterministic():
    X1, y1 = make_regression(500, 4, chunk_rows=128, random_state=7)
    X2, y2 = make_regression(500, 4, chunk_rows=128, random_state=7)
    np.testing.assert_array_equal(X1.compute(), X2.compute())
    np.testing.assert_array_equal(y1.compute(), y2.compute())
    X3, y3 = make_regression(500, 4, chunk_rows=128, random_state=8)
    assert not np.allclose(X1.compute(), X3.compute())


def test_layout_and_dtype():
    X, y = make_regression(1000, 6, chunk_rows=300, dtype="float32")
    assert X.chunks == ((300, 300, 300, 100), (6,))
    assert y.chunks == ((300, 300, 300, 100),)
    assert X.dtype == y.dtype == np.float32
    assert X.compute().dtype == y.compute().dtype == np.float32


def test_default_chunk_rows_about_64_mib():
    X, _ = make_regression(10**7, 16)
    assert X.chunks[0][0] == 2**19  # 64 MiB / (16 * 8 bytes)


def test_blocks_are_independent_and_graph_is_small():
    """Large lazy array: any block can be made alone, and the graph holds no data."""
    X, y = make_regression(10**8, 10, chunk_rows=100_000, random_state=3)
    assert X.nbytes == 8 * 10**9 and X.numblocks == (1000, 1)
    assert len(pickle.dumps(X.__dask_graph__())) < 2**20  # one block alone is 8 MB
    block = X.blocks[537].compute()
    again = X[53_700_000:53_800_000].compute()
    np.testing.assert_array_equal(block, again)
    assert y.blocks[537].compute().shape == (100_000,)


def test_blocks_do_not_repeat_streams():
    X, _ = make_regression(40, 3, chunk_rows=10)
    blocks = [X.blocks[i].compute() for i in range(4)]
    assert all(not np.allclose(blocks[0], b) for b in blocks[1:])


def test_regression_target_is_normalised_and_noisy():
    X, y = make_regression(20_000, 5, chunk_rows=5000, noise=0.5, random_state=2)
    target = SmoothTarget.draw(5, 2)
    yv, Xv = y.compute(), X.compute()
    residual = yv - target(Xv)
    assert abs(residual.std() - 0.5) < 0.02
    assert abs(target(Xv).mean()) < 0.05 and abs(target(Xv).std() - 1) < 0.05
    _, y0 = make_regression(100, 5, chunk_rows=50, noise=0.0, random_state=2)
    X0, _ = make_regression(100, 5, chunk_rows=50, noise=0.0, random_state=2)
    np.testing.assert_allclose(y0.compute(), target(X0.compute()))


def test_regression_target_is_learnable_by_gaussian_kernel():
    from sklearn.kernel_ridge import KernelRidge

    X, y = make_regression(1500, 4, chunk_rows=500, noise=0.1, random_state=0)
    X, y = X.compute(), y.compute()
    model = KernelRidge(kernel="rbf", gamma=0.125, alpha=1e-2).fit(X[:1000], y[:1000])
    assert model.score(X[1000:], y[1000:]) > 0.9


def test_one_feature_works():
    X, y = make_regression(50, 1, chunk_rows=20)
    assert X.shape == (50, 1) and np.all(np.isfinite(y.compute()))


@pytest.mark.parametrize("n_classes", [2, 3, 5])
def test_classification_labels(n_classes):
    X, y = make_classification(6000, 4, n_classes=n_classes, chunk_rows=1000, random_state=1)
    labels = y.compute()
    assert y.dtype == np.int64 and y.chunks == X.chunks[:1]
    counts = np.bincount(labels, minlength=n_classes)
    assert counts.size == n_classes
    np.testing.assert_allclose(counts / len(labels), 1 / n_classes, atol=0.04)  # balanced


def test_classification_is_deterministic_and_learnable():
    from sklearn.svm import SVC

    X1, y1 = make_classification(1500, 3, chunk_rows=256, random_state=4)
    X2, y2 = make_classification(1500, 3, chunk_rows=256, random_state=4)
    np.testing.assert_array_equal(y1.compute(), y2.compute())
    X, y = X1.compute(), y1.compute()
    assert SVC(gamma="scale").fit(X[:1000], y[:1000]).score(X[1000:], y[1000:]) > 0.85


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"n": 0}, ValueError, "n must be >= 1"),
        ({"d": 0}, ValueError, "d must be >= 1"),
        ({"chunk_rows": 0}, ValueError, "chunk_rows must be >= 1"),
        ({"dtype": "int32"}, TypeError, "dtype must be a floating type"),
        ({"noise": -1.0}, ValueError, "noise must be a finite number >= 0"),
        ({"random_state": None}, TypeError, "random_state must be an int"),
    ],
)
def test_invalid_arguments(kwargs, error, message):
    params = {"n": 10, "d": 2, **kwargs}
    with pytest.raises(error, match=message):
        make_regression(**params)


def test_invalid_n_classes():
    with pytest.raises(ValueError, match="n_classes must be an integer >= 2"):
        make_classification(10, 2, n_classes=1)


def test_write_regression_zarr(tmp_path):
    path = write_regression_zarr(tmp_path / "r.zarr", 1000, 3, chunk_rows=300, random_state=5)
    X, y = open_dataset(path)
    Xe, ye = make_regression(1000, 3, chunk_rows=300, random_state=5)
    assert X.chunks == Xe.chunks
    np.testing.assert_array_equal(X.compute(), Xe.compute())
    np.testing.assert_array_equal(y.compute(), ye.compute())
    attrs = dict(zarr.open_group(path, mode="r").attrs)
    assert attrs["daskkrr_format"] == 1
    assert attrs["synthetic"] == {
        "generator": "make_regression",
        "n": 1000,
        "d": 3,
        "chunk_rows": 300,
        "noise": 0.1,
        "random_state": 5,
        "dtype": "float64",
    }
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_regression_zarr(path, 10, 3)


def test_write_classification_zarr(tmp_path):
    path = write_classification_zarr(tmp_path / "c.zarr", 600, 2, n_classes=3, chunk_rows=250)
    X, y = open_dataset(path)
    _, ye = make_classification(600, 2, n_classes=3, chunk_rows=250)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y.compute(), ye.compute())
    assert zarr.open_group(path, mode="r").attrs["synthetic"]["n_classes"] == 3


def test_generated_data_is_lazy_dask():
    X, y = make_classification(100, 2, chunk_rows=10)
    assert isinstance(X, da.Array) and isinstance(y, da.Array)


def test_blobs_are_clusters_labelled_by_blob(tmp_path):
    X, y = make_blobs(6_000, 3, n_clusters=4, chunk_rows=1_000, cluster_std=0.1, random_state=3)
    Xn, yn = X.compute(), y.compute()
    assert Xn.shape == (6_000, 3) and set(np.unique(yn)) == {0, 1, 2, 3}
    for k in range(4):
        rows = Xn[yn == k]
        # Each blob is its center plus 0.1 N(0, I): the spread's relative error over m rows is
        # about 1/sqrt(2 m) (m >= 1 000 here: 2.2%); 5 of those leave a failure odds below 1e-6.
        np.testing.assert_allclose(rows.std(axis=0), 0.1, rtol=5 / np.sqrt(2 * len(rows)))
    # The blobs are apart: every row is nearer its own blob's mean than any other's (seed 3's
    # closest centers are 3.4 apart, 17 cluster std to the midpoint: no row crosses it).
    means = np.stack([Xn[yn == k].mean(axis=0) for k in range(4)])
    nearest = np.argmin(((Xn[:, None, :] - means[None]) ** 2).sum(axis=2), axis=1)
    np.testing.assert_array_equal(nearest, yn)
    again = make_blobs(6_000, 3, n_clusters=4, chunk_rows=1_000, cluster_std=0.1, random_state=3)
    np.testing.assert_array_equal(again[0].compute(), Xn)
    store = write_blobs_zarr(tmp_path / "blobs.zarr", 6_000, 3, n_clusters=4, chunk_rows=1_000, cluster_std=0.1,
                             random_state=3)
    Xs, ys = open_dataset(store)
    np.testing.assert_array_equal(ys.compute(), yn)
    assert zarr.open_group(store, mode="r").attrs["synthetic"]["n_clusters"] == 4


@pytest.mark.parametrize("kwargs, message", [({"n_clusters": 1}, "n_clusters"), ({"cluster_std": 0.0}, "cluster_std")])
def test_invalid_blob_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_blobs(100, 2, **kwargs)


def test_a_workflow_generates_blobs_or_classes_not_both(tmp_path):
    from daskkrr.workflow.data import generated_store
    from daskkrr.workflow.spec import WorkflowError, _check_data

    data = {"store": None, "table": None, "target": None, "sep": None, "cache": None, "sample_weight": None,
            "categorical": None, "generate": {"n": 50, "d": 2, "classes": 3, "clusters": 3}}
    with pytest.raises(WorkflowError, match="classes .* or clusters .*not both"):
        _check_data(data, tmp_path, "w.toml")
    store = generated_store({"n": 600, "d": 2, "clusters": 3, "seed": 0, "chunk_rows": 200}, tmp_path)
    assert zarr.open_group(store, mode="r").attrs["synthetic"]["generator"] == "make_blobs"
