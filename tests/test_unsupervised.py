"""Nystrom kernel PCA and kernel k-means: exactness against the exact methods, cluster runs, bad input."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_circles
from sklearn.decomposition import KernelPCA
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.metrics import adjusted_rand_score
from sklearn.pipeline import make_pipeline

from daskkrr import FalkonRegressor, NystromKernelKMeans, NystromKernelPCA, load, write_zarr
from daskkrr.models.kernel_model import ParameterError

SIGMA = 2.0


def gaussian_gram(A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
    d2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2 * A @ B.T
    return np.exp(-np.maximum(d2, 0) / (2 * sigma**2))


@pytest.fixture(scope="module")
def kpca_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(1000, 5)), rng.normal(size=(50, 5))


# --------------------------------------------------------------------------- kernel PCA
def test_kpca_with_every_point_a_center_is_sklearn_kernel_pca(kpca_data):
    X, X_new = kpca_data
    n = X.shape[0]
    ours = NystromKernelPCA(n_components=10, sigma=SIGMA, n_centers=n, standardize=False, random_state=0).fit(X)
    exact = KernelPCA(n_components=10, kernel="rbf", gamma=1 / (2 * SIGMA**2), eigen_solver="dense").fit(X)
    # scikit-learn's eigenvalues are those of the centred n x n kernel; ours of the covariance (1/n).
    np.testing.assert_allclose(ours.eigenvalues_ * n, exact.eigenvalues_, rtol=1e-8)
    A, B = ours.transform(X), exact.transform(X)
    signs = np.sign((A * B).sum(axis=0))
    np.testing.assert_allclose(A * signs, B, atol=1e-6)
    np.testing.assert_allclose(ours.transform(X_new) * signs, exact.transform(X_new), atol=1e-6)
    assert ours.rank_ == n and ours.n_centers_ == n
    # The ratio is relative to the Nystrom trace, which is here the exact centred trace / n.
    K = gaussian_gram(X, X, SIGMA)
    H = np.eye(n) - 1.0 / n
    np.testing.assert_allclose(ours.explained_variance_ratio_, exact.eigenvalues_ / np.trace(H @ K @ H), rtol=1e-8)


def test_kpca_fit_transform_lazy_for_dask_and_equal_to_numpy(kpca_data):
    X, _ = kpca_data
    Xd = da.from_array(X, chunks=(170, -1))
    kw = dict(n_components=3, n_centers=80, random_state=1)
    a = NystromKernelPCA(**kw).fit(X)
    b = NystromKernelPCA(**kw).fit(Xd)
    out = b.transform(Xd)
    assert isinstance(out, da.Array) and out.shape == (1000, 3)
    np.testing.assert_allclose(out.compute(), a.transform(X), atol=1e-10)
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(a.fit_transform(X), a.transform(X))


def test_kpca_in_a_pipeline_in_front_of_a_regressor_and_saved(tmp_path, kpca_data):
    X, _ = kpca_data
    y = np.sin(X[:, 0]) + X[:, 1] ** 2
    pipe = make_pipeline(NystromKernelPCA(n_components=20, n_centers=200, random_state=0),
                         FalkonRegressor(n_centers=200, random_state=0)).fit(X, y)
    assert pipe.score(X, y) > 0.5
    kpca = pipe[0]
    kpca.save(tmp_path / "kpca")
    loaded = load(tmp_path / "kpca")
    assert isinstance(loaded, NystromKernelPCA)
    np.testing.assert_array_equal(loaded.transform(X[:20]), kpca.transform(X[:20]))
    np.testing.assert_array_equal(loaded.eigenvalues_, kpca.eigenvalues_)


# --------------------------------------------------------------------------- kernel k-means
def exact_kernel_kmeans(K: np.ndarray, labels: np.ndarray, k: int, max_iter: int = 300) -> tuple[np.ndarray, float]:
    """Lloyd on the full n x n kernel: d(i, c) = K_ii - 2 mean_{j in c} K_ij + mean_{j,l in c} K_jl."""
    for _ in range(max_iter):
        D = np.empty((K.shape[0], k))
        for c in range(k):
            m = labels == c
            D[:, c] = np.diag(K) - 2 * K[:, m].mean(axis=1) + K[np.ix_(m, m)].mean()
        new = np.argmin(D, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels, float(D[np.arange(K.shape[0]), labels].sum())


def test_kmeans_with_every_point_a_center_is_exact_kernel_kmeans():
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(size=(100, 3)) + shift for shift in (0, 2, 4)])
    n, k, sigma = X.shape[0], 4, 1.5
    start = rng.choice(n, size=k, replace=False)
    K = gaussian_gram(X, X, sigma)
    # the same initial assignment: the nearest initial point in feature space
    first = np.argmin(np.diag(K)[:, None] - 2 * K[:, start] + np.diag(K)[start][None, :], axis=1)
    labels, objective = exact_kernel_kmeans(K, first, k)
    km = NystromKernelKMeans(n_clusters=k, sigma=sigma, n_centers=n, init=X[start], tol=0, standardize=False,
                             random_state=0).fit(X)
    np.testing.assert_array_equal(km.labels_, labels)
    np.testing.assert_allclose(km.inertia_, objective, rtol=1e-8)
    assert km.converged_ and -km.score(X) == pytest.approx(objective, rel=1e-8)


def test_kmeans_separates_nested_rings_where_linear_kmeans_fails():
    X, y = make_circles(n_samples=600, factor=0.2, noise=0.05, random_state=0)
    linear = adjusted_rand_score(y, KMeans(2, n_init=10, random_state=0).fit_predict(X))
    for seed in range(3):
        km = NystromKernelKMeans(n_clusters=2, sigma=0.3, n_centers=100, standardize=False, random_state=seed)
        assert adjusted_rand_score(y, km.fit(X).labels_) > 0.95
    assert linear < 0.3  # 0.16: a straight cut through both rings


def test_kmeans_dask_input_lazy_labels_predict_score_and_save(tmp_path):
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(150, 2)) + c for c in ((0, 0), (5, 0), (0, 5))])
    Xd = da.from_array(X, chunks=(100, -1))
    a = NystromKernelKMeans(n_clusters=3, n_centers=60, random_state=0).fit(X)
    b = NystromKernelKMeans(n_clusters=3, n_centers=60, random_state=0, strategy="recompute").fit(Xd)
    assert isinstance(b.labels_, da.Array)
    np.testing.assert_array_equal(b.labels_.compute(), a.labels_)
    np.testing.assert_allclose(b.inertia_, a.inertia_, rtol=1e-7)
    assert a.strategy_ == "cache" and b.strategy_ == "recompute"
    np.testing.assert_array_equal(b.predict(Xd).compute(), a.predict(X))
    assert b.score(Xd) == pytest.approx(a.score(X), rel=1e-7) == pytest.approx(-a.inertia_, rel=1e-7)
    a.save(tmp_path / "km")
    loaded = load(tmp_path / "km")
    np.testing.assert_array_equal(loaded.predict(X), a.labels_)


def test_kmeans_warns_when_max_iter_stops_it():
    X, _ = make_circles(n_samples=300, factor=0.5, noise=0.1, random_state=0)
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        km = NystromKernelKMeans(n_clusters=5, n_centers=50, max_iter=1, init="random", random_state=0).fit(X)
    assert km.n_iter_ == 1 and not km.converged_


# --------------------------------------------------------------------------- cluster
@pytest.fixture(scope="module")
def many_blobs():
    """15 blobs: one random initialisation often merges two and splits another."""
    rng = np.random.default_rng(0)
    return np.vstack([rng.normal(c, 0.6, size=(60, 2)) for c in rng.uniform(-10, 10, size=(15, 2))])


def test_kmeans_n_init_keeps_the_run_of_least_inertia(many_blobs):
    from daskkrr.pipeline.unsupervised import kmeans_runs, run_seed

    kw = dict(n_clusters=15, n_centers=150, init="random", random_state=3)
    one = NystromKernelKMeans(n_init=1, **kw).fit(many_blobs)
    four = NystromKernelKMeans(n_init=4, **kw).fit(many_blobs)
    auto = NystromKernelKMeans(**kw).fit(many_blobs)  # "auto": 10 runs for random centroids
    # run 0 is n_init=1's: more runs can only lower the inertia, and here they do
    assert four.inertia_ < 0.5 * one.inertia_, (one.inertia_, four.inertia_)
    assert auto.inertia_ <= four.inertia_ + 1e-9
    for model in (one, four, auto):  # the model is one consistent run: labels, centroids, inertia
        np.testing.assert_array_equal(model.predict(many_blobs), model.labels_)
        assert np.isclose(-model.score(many_blobs), model.inertia_, rtol=1e-8)
    assert kmeans_runs("random", "auto") == 10 and kmeans_runs("k-means||", "auto") == 1
    assert kmeans_runs("k-means||", 3) == 3 and run_seed(7, 0) == 7
    assert len({run_seed(7, r) for r in range(10)}) == 10


def test_kmeans_n_init_auto_and_given_centroids_make_one_run(many_blobs):
    kw = dict(n_clusters=15, n_centers=150, random_state=0)
    auto = NystromKernelKMeans(**kw).fit(many_blobs)
    one = NystromKernelKMeans(n_init=1, **kw).fit(many_blobs)
    np.testing.assert_array_equal(auto.cluster_centers_, one.cluster_centers_)  # k-means||: one run
    start = many_blobs[:: len(many_blobs) // 15][:15]
    given = NystromKernelKMeans(init=start, **kw).fit(many_blobs)
    with pytest.warns(RuntimeWarning, match="one run is made, not n_init=3"):
        again = NystromKernelKMeans(init=start, n_init=3, **kw).fit(many_blobs)
    np.testing.assert_array_equal(given.cluster_centers_, again.cluster_centers_)
    for bad in (0, -1, "many", 1.5):
        with pytest.raises(ValueError, match="n_init"):
            NystromKernelKMeans(n_init=bad, **kw).fit(many_blobs)


def test_two_process_cluster_from_zarr_equals_numpy(tmp_path, cluster2):
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(size=(200, 4)) + 3 * c for c in range(3)])
    store = write_zarr(X, None, tmp_path / "x.zarr", chunk_rows=128)
    kp = dict(n_components=4, n_centers=100, random_state=2)
    kk = dict(n_clusters=3, n_centers=100, random_state=2, init_rounds=2)
    pca_np, km_np = NystromKernelPCA(**kp).fit(X), NystromKernelKMeans(**kk).fit(X)
    from distributed import Client

    assert isinstance(cluster2, Client)
    with cluster2.as_current():
        pca_cl, km_cl = NystromKernelPCA(**kp).fit(str(store)), NystromKernelKMeans(**kk).fit(str(store))
        projected = pca_cl.transform(str(store)).compute()
        labels = km_cl.labels_.compute()
    # The same components up to round-off: K_MM's smallest eigenvalues amplify the order of the sums.
    np.testing.assert_allclose(pca_cl.eigenvalues_, pca_np.eigenvalues_, rtol=1e-8)
    np.testing.assert_allclose(projected, pca_np.transform(X), atol=1e-6)
    np.testing.assert_array_equal(labels, km_np.labels_)
    np.testing.assert_allclose(km_cl.inertia_, km_np.inertia_, rtol=1e-8)


def test_cli_embed_and_cluster_write_stores_and_nothing_on_errors(tmp_path, cluster2):
    import zarr

    from daskkrr.cli import main

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(size=(150, 3)) + 4 * c for c in range(2)])
    store = write_zarr(X, X[:, 0], tmp_path / "in.zarr", chunk_rows=100)
    at = ["--scheduler", cluster2.scheduler.address, "--no-progress"]
    emb, lab, model = tmp_path / "emb.zarr", tmp_path / "lab.zarr", tmp_path / "kpca"
    assert main(["embed", "--data", str(store), "--out", str(emb), "--n-components", "2", "--n-centers", "50",
                 "--random-state", "0", "--save-model", str(model), *at]) == 0
    group = zarr.open_group(str(emb), mode="r")
    expected = NystromKernelPCA(n_components=2, n_centers=50, random_state=0).fit(X).transform(X)
    np.testing.assert_allclose(group["X"][:], expected, atol=1e-8)
    np.testing.assert_array_equal(group["y"][:], X[:, 0])
    assert main(["cluster", "--data", str(emb), "--out", str(lab), "--n-clusters", "2", "--n-centers", "50",
                 "--random-state", "0", *at]) == 0
    labels = zarr.open_group(str(lab), mode="r")["labels"][:]
    assert adjusted_rand_score(np.repeat([0, 1], 150), labels) == 1.0
    # errors: a clear line, exit 1, nothing written
    for argv in (["cluster", "--data", str(store), "--out", str(tmp_path / "a.zarr"), "--n-clusters", "301"],
                 ["embed", "--data", str(store), "--out", str(tmp_path / "b.zarr"), "--n-components", "60",
                  "--n-centers", "50"],
                 ["embed", "--data", str(store), "--out", str(tmp_path / "c.zarr"), "--model", str(tmp_path)]):
        assert main([*argv, *at]) != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.zarr", "in.zarr", "kpca", "lab.zarr"]


def test_unsupervised_workflow_file_runs_both_models(tmp_path, cluster2):
    """The example runs both models into its run directory through the fit workflows' driver
    (``runner.execute_run``): a run a dead process left 'running' is marked failed, the run records
    its dashboard and its workflow file."""
    import json
    from pathlib import Path

    from daskkrr.workflow.rundir import read_status
    from daskkrr.workflow.spec import WorkflowError
    from daskkrr.workflow.unsupervised import run_unsupervised_workflow

    example = Path(__file__).resolve().parents[1] / "workflows" / "examples" / "unsupervised.toml"
    text = example.read_text().replace("n = 20_000", "n = 600").replace("chunk_rows = 5_000", "chunk_rows = 200")
    wf = tmp_path / "wf.toml"
    wf.write_text(text.replace('runs_dir = "../../runs/unsupervised"', 'runs_dir = "runs"'))
    dead = tmp_path / "runs" / "20200101T000000Z-dead00"
    dead.mkdir(parents=True)
    (dead / "status.json").write_text(json.dumps({"status": "running", "run_id": dead.name}))
    result = run_unsupervised_workflow(wf, client=cluster2, overrides=["kmeans.n_centers=100", "kpca.n_centers=100"])
    assert result.status == "succeeded" and read_status(result.run_dir)["status"] == "succeeded"
    assert read_status(dead)["status"] == "failed" and "interrupted" in read_status(dead)["error"]
    m = result.metrics
    assert m["kpca"]["n_components"] == 8 and m["kmeans"]["n_centers"] == 100 and 0 <= m["kmeans"]["nmi"] <= 1
    assert "dashboard" in m
    assert json.loads((result.run_dir / "config.json").read_text())["source"] == str(wf.resolve())
    for name in ("embedding.zarr", "labels.zarr", "kpca", "kmeans", "metrics.json"):
        assert (result.run_dir / name).exists()
    with pytest.raises(WorkflowError, match=r"\[kmeans\].*n_clusters"):
        run_unsupervised_workflow(wf, client=cluster2, overrides=["kmeans.n_clusters=0"])


# --------------------------------------------------------------------------- bad input
def test_bad_input_gives_clear_errors():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    with pytest.raises(ParameterError, match="n_components=30 is larger than n_centers=20"):
        NystromKernelPCA(n_components=30, n_centers=20).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # n_centers clamped to the 40 rows
        with pytest.raises(ValueError, match="n_components=45 is larger than the dimension of the Nystrom"):
            NystromKernelPCA(n_components=45, n_centers=50).fit(X)
    with pytest.raises(ValueError, match="n_samples=40 should be >= n_clusters=41"):
        NystromKernelKMeans(n_clusters=41, n_centers=20).fit(X)
    with pytest.raises(ValueError, match="n_samples=40 should be >= n_clusters=41"):
        NystromKernelKMeans(n_clusters=41, n_centers=20).fit(da.from_array(X, chunks=10))
    bad = X.copy()
    bad[7, 1] = np.nan
    for est in (NystromKernelPCA(n_components=2, n_centers=20), NystromKernelKMeans(n_clusters=2, n_centers=20)):
        with pytest.raises(ValueError, match="NaN.*row 7"):
            est.fit(bad)
        with pytest.raises(NotFittedError):
            est.transform(X) if isinstance(est, NystromKernelPCA) else est.predict(X)
    fitted = NystromKernelPCA(n_components=2, n_centers=20, random_state=0).fit(X)
    with pytest.raises(ValueError, match="row 7"):
        fitted.transform(bad)
    # a target is accepted and ignored
    with_y = NystromKernelPCA(n_components=2, n_centers=20, random_state=0).fit(X, rng.normal(size=40))
    np.testing.assert_array_equal(with_y.transform(X), fitted.transform(X))
    km = NystromKernelKMeans(n_clusters=2, n_centers=20, random_state=0)
    np.testing.assert_array_equal(km.fit(X, np.arange(40)).labels_, km.fit(X).labels_)
    with pytest.raises(ParameterError, match="init"):
        NystromKernelKMeans(n_clusters=2, init=np.zeros((3, 3))).fit(X)
