"""Row weights: ``fit(X, y, sample_weight=...)`` and ``class_weight``.

The defining property: an integer weight k is the same as k copies of the row
(the penalty is scaled by the sum of the weights as it is by n), for every
registered estimator, whatever the input (numpy, dask, a Zarr variable), the
strategy, the intercept and the standardisation. The Nystrom fits are given the
same centers (the rows named by :class:`RowsSampler`, the first copy of each in
the repeated data), so the two problems are exactly the same.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from sklearn.base import is_classifier
from sklearn.utils.class_weight import compute_class_weight

from daskkrr import FalkonRegressor
from daskkrr.data import Standardizer, write_zarr
from daskkrr.models.classifier import FalkonClassifier
from daskkrr.models.registry import ESTIMATORS
from daskkrr.models.weights import class_weights
from daskkrr.parallel.executor import gather_rows
from daskkrr.sampling.base import CenterDictionary, CenterSampler
from daskkrr.solvers import FalkonPreconditioner

N, D, M = 160, 3, 30

#: Registered estimators whose ``fit`` takes no ``sample_weight`` yet, with the reason. The test below
#: checks this list against the registry: an estimator added without weights must be named here.
WITHOUT_WEIGHTS = {
    "online": "OnlineKernelRidge (issue 15) streams rows through Ray and Musco's online sampler and "
              "statistics, outside the fit pipeline; they take no row weights yet",
}
WEIGHTED = sorted(name for name in ESTIMATORS if name not in WITHOUT_WEIGHTS)


def test_every_registered_estimator_takes_sample_weight_or_says_why_not():
    takes = {name for name, cls in ESTIMATORS.items() if "sample_weight" in inspect.signature(cls.fit).parameters}
    assert takes == set(ESTIMATORS) - set(WITHOUT_WEIGHTS), (takes, WITHOUT_WEIGHTS)


class RowsSampler(CenterSampler):
    """The centers are the rows ``indices`` (so two fits can be given the same centers)."""

    name = "rows"

    def __init__(self, indices: np.ndarray):
        self.indices = np.asarray(indices, dtype=np.int64)

    def select(self, X, kernel, *, n_centers, penalty, random_state, executor=None, client=None):
        return CenterDictionary(gather_rows(X, self.indices, executor), self.indices, np.ones(len(self.indices)))


def _data(classifier: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D))
    if classifier:
        y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])  # three classes
    else:
        y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=N)
    w = rng.integers(0, 4, size=N)  # zeros too: a zero weight removes the row
    return X, y, w


def _params(cls: type, **wanted: Any) -> dict[str, Any]:
    accepted = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in wanted.items() if k in accepted}


def _output(model: Any, X: np.ndarray) -> np.ndarray:
    method = getattr(model, "decision_function", None) or model.predict
    return np.asarray(method(X), dtype=np.float64)


def _pair(cls: type, w: np.ndarray, **extra: Any) -> tuple[Any, Any]:
    """The weighted and the repeated estimator, with the same centers (rows of positive weight)."""
    chosen = np.flatnonzero(w > 0)[:M]
    first_copy = np.cumsum(w) - w
    common = dict(penalty=1e-3, tol=1e-11, max_iter=300, random_state=0, **extra)
    weighted = cls(**_params(cls, sampler=RowsSampler(chosen), n_centers=M, **common))
    repeated = cls(**_params(cls, sampler=RowsSampler(first_copy[chosen]), n_centers=M, **common))
    return weighted, repeated


def _fit_quietly(model: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CG stagnating near tol=1e-11 warns; the test checks the result
        return model.fit(*args, **kwargs)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


SETTINGS = {"intercept-standardize": dict(fit_intercept=True, standardize=True),
            "plain": dict(fit_intercept=False, standardize=False)}
#: LogisticFalkonClassifier's Newton fits are the slowest cases (3-5 s each under load, the others below 1 s). The
#: default run keeps two of its four: numpy with intercept and standardisation, dask arrays (weights chunked
#: unlike the rows) without; slow: the other two, each setting and each input already covered by those.
SLOW_WEIGHT_CASES = {("logistic", "numpy", "plain"), ("logistic", "dask", "intercept-standardize")}
WEIGHT_CASES = [pytest.param(name, as_dask, settings, id=f"{name}-{kind}-{sid}",
                             marks=[pytest.mark.slow] if (name, kind, sid) in SLOW_WEIGHT_CASES else [])
                for sid, settings in SETTINGS.items() for as_dask, kind in ((False, "numpy"), (True, "dask"))
                for name in WEIGHTED]


@pytest.mark.parametrize("name, as_dask, settings", WEIGHT_CASES)
def test_integer_weights_equal_repeated_rows(name, as_dask, settings):
    cls = ESTIMATORS[name]
    X, y, w = _data(is_classifier(cls()))
    weighted, repeated = _pair(cls, w, **settings)
    Xw, yw, ww = X, y, w
    if as_dask:  # weights chunked unlike the rows: they are re-aligned with them
        Xw, yw, ww = da.from_array(X, chunks=50), da.from_array(y, chunks=50), da.from_array(w, chunks=70)
    _fit_quietly(weighted, Xw, yw, sample_weight=ww)
    _fit_quietly(repeated, np.repeat(X, w, axis=0), np.repeat(y, w))
    X_test = np.random.default_rng(1).normal(size=(40, D))
    assert _rel(_output(weighted, X_test), _output(repeated, X_test)) <= 1e-8


@pytest.mark.parametrize("strategy", ["recompute", "cache", "gram"])
def test_every_strategy_gives_the_weighted_solution(strategy):
    X, y, w = _data(False, seed=3)
    weighted, repeated = _pair(FalkonRegressor, w, strategy=strategy, preconditioner_rows="auto")
    _fit_quietly(weighted, X, y, sample_weight=w)
    _fit_quietly(repeated, np.repeat(X, w, axis=0), np.repeat(y, w))
    assert weighted.strategy_ == strategy
    np.testing.assert_allclose(weighted.intercept_, repeated.intercept_, rtol=1e-8)
    assert _rel(weighted.predict(X), repeated.predict(X)) <= 1e-8


def test_weights_from_a_zarr_variable_equal_numpy_weights(tmp_path):
    X, y, w = _data(False, seed=4)
    path = tmp_path / "train.zarr"
    write_zarr(X, y, path, chunk_rows=40)
    group = zarr.open_group(str(path), mode="r+")
    group.create_array("w", shape=(N,), chunks=(40,), dtype="float64")[:] = w
    from_store, in_memory = (FalkonRegressor(n_centers=M, penalty=1e-3, tol=1e-11, max_iter=100, random_state=0)
                             for _ in range(2))
    _fit_quietly(from_store, str(path), sample_weight="w")
    _fit_quietly(in_memory, X, y, sample_weight=w.astype(float))
    np.testing.assert_array_equal(from_store.center_indices_, in_memory.center_indices_)
    assert _rel(from_store.predict(X), in_memory.predict(X)) <= 1e-10
    with pytest.raises(KeyError, match="'weights'"):
        FalkonRegressor(n_centers=M).fit(str(path), sample_weight="weights")
    with pytest.raises(ValueError, match="not a store"):
        FalkonRegressor(n_centers=M).fit(X, y, sample_weight="w")


def test_unit_weights_are_the_unweighted_fit():
    X, y, _ = _data(False)
    params = dict(n_centers=M, penalty=1e-3, tol=1e-11, max_iter=200, random_state=0)
    plain = _fit_quietly(FalkonRegressor(**params), X, y)
    ones = _fit_quietly(FalkonRegressor(**params), X, y, sample_weight=np.ones(N))  # numpy ones: unweighted
    np.testing.assert_array_equal(plain.coef_, ones.coef_)
    # Lazy ones are a weighted fit (their values are seen by the passes only): the same solution on the same centers.
    params["sampler"] = RowsSampler(plain.center_indices_)
    lazy_ones = _fit_quietly(FalkonRegressor(**params), X, y, sample_weight=da.ones(N, chunks=64))
    assert _rel(lazy_ones.predict(X), plain.predict(X)) <= 1e-8


def test_weighted_score_of_lazy_input_is_scikit_learns():
    from sklearn.metrics import r2_score

    X, y, w = _data(False)
    model = FalkonRegressor(n_centers=M, random_state=0).fit(X, y)
    expected = r2_score(y, model.predict(X), sample_weight=w)
    lazy = model.score(da.from_array(X, chunks=50), da.from_array(y, chunks=50), sample_weight=da.from_array(w, 64))
    assert lazy == pytest.approx(expected, rel=1e-12)
    assert model.score(X, y, sample_weight=w) == pytest.approx(expected, rel=1e-12)


def test_zero_weight_rows_of_exact_krr_get_no_coefficient():
    X, y, w = _data(False)
    model = ESTIMATORS["exact"](penalty=1e-3).fit(X, y, sample_weight=w)
    assert np.all(model.coef_[w == 0] == 0)


def test_a_weighted_checkpoint_resumes_only_with_the_same_weights(tmp_path):
    from daskkrr.checkpoint import CheckpointError

    X, y, w = _data(False)
    params = dict(n_centers=M, penalty=1e-3, tol=1e-10, max_iter=60, random_state=0)
    first = _fit_quietly(FalkonRegressor(**params), X, y, sample_weight=w, checkpoint=tmp_path / "ck")
    again = _fit_quietly(FalkonRegressor(**params), X, y, sample_weight=w, checkpoint=tmp_path / "ck", resume=True)
    np.testing.assert_array_equal(again.coef_, first.coef_)
    other = np.where(np.arange(N) == 0, w + 1, w)  # one weight changed
    with pytest.raises(CheckpointError, match="sample_weight"):
        FalkonRegressor(**params).fit(X, y, sample_weight=other, checkpoint=tmp_path / "ck", resume=True)


# --------------------------------------------------------------------------- the uniform sampler
def test_weighted_uniform_sampler_draws_rows_in_proportion_to_their_weights():
    from daskkrr.sampling.weighted_rows import block_best_keys

    w = np.array([[1.0], [1.0], [0.0], [1.0], [2.0], [5.0]])
    draws = np.array([block_best_keys(w, 0, seed, 1)[0][0] for seed in range(3000)])
    freq = np.bincount(draws, minlength=6) / draws.size
    expected = w[:, 0] / w.sum()
    assert freq[2] == 0  # a zero weight is never drawn
    assert np.all(np.abs(freq - expected) <= 4 * np.sqrt(expected * (1 - expected) / draws.size))


def test_weighted_uniform_centers_skip_zero_weights_and_ignore_the_chunking():
    X, y, w = _data(False)
    fits = [_fit_quietly(FalkonRegressor(n_centers=M, random_state=3), da.from_array(X, chunks=c), y,
                         sample_weight=da.from_array(w, chunks=c)) for c in (40, 70)]
    np.testing.assert_array_equal(fits[0].center_indices_, fits[1].center_indices_)
    assert np.all(w[fits[0].center_indices_] > 0) and fits[0].sampler_info_["weighted"]
    assert all(f.sampler_info_["seconds"] > 0 for f in fits)  # the selection is timed, as every sampler's
    with pytest.warns(UserWarning, match="only 3 rows have a positive sample_weight"):
        few = FalkonRegressor(n_centers=10, random_state=0).fit(X, y, sample_weight=(np.arange(N) < 3) * 1.0)
    np.testing.assert_array_equal(few.center_indices_, [0, 1, 2])


# --------------------------------------------------------------------------- statistics and sketch
def test_weighted_standardizer_equals_repeated_rows():
    X, y, w = _data(False)
    weighted = Standardizer().fit(da.from_array(X, chunks=37), y, sample_weight=w)
    repeated = Standardizer().fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    np.testing.assert_allclose(weighted.mean_, repeated.mean_, rtol=1e-12)
    np.testing.assert_allclose(weighted.scale_, repeated.scale_, rtol=1e-12)
    assert weighted.y_mean_ == pytest.approx(repeated.y_mean_, rel=1e-12)
    assert weighted.weight_sum_ == w.sum() and weighted.n_samples_ == N


@pytest.mark.parametrize("center", [False, True])
def test_weighted_sketch_rows_equal_repeated_sketch_rows(center):
    rng = np.random.default_rng(5)
    Z = rng.normal(size=(8, 2))
    rows = rng.normal(size=(20, 2))
    c = rng.integers(0, 3, size=20)
    k = lambda A, B: np.exp(-((A[:, None, :] - B[None, :, :]) ** 2).sum(-1) / 2)  # noqa: E731
    weighted = FalkonPreconditioner.from_kernel_matrix(k(Z, Z), penalty=1e-3, n=50, sketch=[(k(rows, Z), c)],
                                                       center_sketch=center)
    repeated = FalkonPreconditioner.from_kernel_matrix(k(Z, Z), penalty=1e-3, n=50,
                                                       sketch=[k(np.repeat(rows, c, axis=0), Z)], center_sketch=center)
    np.testing.assert_allclose(weighted.A, repeated.A, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- class weights
@pytest.mark.parametrize("with_sample_weight", [False, True])
def test_balanced_class_weight_is_scikit_learns(with_sample_weight):
    X, y, w = _data(True)
    y = np.where(np.arange(N) < 100, 0, y)  # unbalanced
    sw = w.astype(float) if with_sample_weight else None
    params = dict(n_centers=M, penalty=1e-3, tol=1e-11, max_iter=200, random_state=0)
    model = _fit_quietly(FalkonClassifier(class_weight="balanced", **params), X, y, sample_weight=sw)
    expected = compute_class_weight("balanced", classes=np.unique(y), y=y, sample_weight=sw)
    np.testing.assert_allclose(model.class_weight_, expected, rtol=1e-12)
    # The same fit as sample weights class_weight[y] * sample_weight, from dask input too.
    rows = expected[np.searchsorted(np.unique(y), y)] * (1.0 if sw is None else sw)
    same = _fit_quietly(FalkonClassifier(**params), X, y, sample_weight=rows)
    lazy = _fit_quietly(
        FalkonClassifier(class_weight="balanced", **params), da.from_array(X, chunks=50), da.from_array(y, chunks=50),
        sample_weight=None if sw is None else da.from_array(sw, chunks=50))
    assert _rel(model.decision_function(X), same.decision_function(X)) <= 1e-10
    assert _rel(lazy.decision_function(X), same.decision_function(X)) <= 1e-8


def test_class_weight_dict_names_labels_text_too():
    X, y, _ = _data(True)
    labels = np.array(["low", "mid", "high"])[y]
    model = FalkonClassifier(n_centers=M, class_weight={"high": 3.0}, random_state=0).fit(X, labels)
    np.testing.assert_array_equal(model.classes_, ["high", "low", "mid"])
    np.testing.assert_array_equal(model.class_weight_, [3.0, 1.0, 1.0])
    assert class_weights({"2": 5.0}, np.array([0, 1, 2])).tolist() == [1.0, 1.0, 5.0]  # JSON keys are text
    with pytest.raises(ValueError, match="not in y"):
        FalkonClassifier(n_centers=M, class_weight={"none": 2.0}).fit(X, labels)
    with pytest.raises(ValueError, match="class_weight"):
        FalkonClassifier(n_centers=M, class_weight={"low": -1.0}).fit(X, labels)


# --------------------------------------------------------------------------- bad weights
BAD = {
    "negative": (lambda w: np.where(np.arange(N) == 7, -1.0, w), r"sample_weight .*negative.* row.? 7"),
    "nan": (lambda w: np.where(np.arange(N) == 7, np.nan, w), r"sample_weight .*NaN.* row.? 7"),
    "inf": (lambda w: np.where(np.arange(N) == 7, np.inf, w), r"sample_weight .*inf.* row.? 7"),
    "all-zero": (lambda w: np.zeros(N), "sample_weight has only zero weights"),
    "wrong-length": (lambda w: w[:-3], f"sample_weight .*{N - 3}.*{N}"),
}


@pytest.mark.parametrize("as_dask", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_weights_are_refused_before_anything_is_written(case, as_dask, tmp_path):
    X, y, w = _data(False)
    make, message = BAD[case]
    bad = make(w.astype(float))
    if as_dask:
        X, y, bad = da.from_array(X, chunks=50), da.from_array(y, chunks=50), da.from_array(bad, chunks=50)
    checkpoint = tmp_path / "ck"
    with pytest.raises(ValueError, match=message):
        FalkonRegressor(n_centers=M).fit(X, y, sample_weight=bad, checkpoint=checkpoint)
    assert not checkpoint.exists() or not any(checkpoint.iterdir())


@pytest.mark.parametrize("name", sorted(n for n, cls in ESTIMATORS.items()
                                         if "compute_std" in inspect.signature(cls.__init__).parameters))
def test_weights_with_compute_std_are_refused_before_any_work(name, tmp_path):
    cls = ESTIMATORS[name]
    X, y, w = _data(is_classifier(cls()))
    with pytest.raises(ValueError, match="compute_std=True is not supported with sample_weight"):
        cls(compute_std=True).fit(X, y, sample_weight=w)
    if "class_weight" in inspect.signature(cls.__init__).parameters:
        with pytest.raises(ValueError, match="compute_std=True is not supported"):
            cls(compute_std=True, class_weight="balanced").fit(X, y)


# --------------------------------------------------------------------------- cluster
def test_weighted_fit_from_zarr_on_a_cluster_equals_numpy(cluster2, tmp_path):
    X, y, w = _data(False, seed=6)
    path = tmp_path / "train.zarr"
    write_zarr(X, y, path, chunk_rows=40)
    zarr.open_group(str(path), mode="r+").create_array("w", shape=(N,), chunks=(40,), dtype="float64")[:] = w
    # "gram": the weighted Gram pass runs on the workers, the iterations on the client (a fast test).
    params = dict(n_centers=M, penalty=1e-3, tol=1e-11, max_iter=100, random_state=0, strategy="gram")
    with cluster2.as_current():
        on_cluster = _fit_quietly(FalkonRegressor(**params), str(path), sample_weight="w")
    in_memory = _fit_quietly(FalkonRegressor(**params), X, y, sample_weight=w)
    rel = np.linalg.norm(on_cluster.coef_ - in_memory.coef_) / np.linalg.norm(in_memory.coef_)
    assert rel <= 1e-8, rel


def test_cli_fit_reads_weights_from_the_store_and_class_weight_flag(cluster2, tmp_path):
    from daskkrr import load
    from daskkrr.cli import main

    X, y, w = _data(True, seed=7)
    path = tmp_path / "train.zarr"
    write_zarr(X, y, path, chunk_rows=40)
    zarr.open_group(str(path), mode="r+").create_array("w", shape=(N,), chunks=(40,), dtype="float64")[:] = w
    flags = ["--estimator", "classifier", "--centers", str(M), "--penalty", "1e-3", "--tol", "1e-11",
             "--max-iter", "100", "--seed", "0", "--no-progress", "--scheduler", cluster2.scheduler.address]
    out = tmp_path / "model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "--data", str(path), "--out", str(out), "--sample-weight", "w",
                     "--class-weight", "balanced", *flags]) == 0
    expected = _fit_quietly(FalkonClassifier(n_centers=M, penalty=1e-3, tol=1e-11, max_iter=100, random_state=0,
                                             class_weight="balanced"), X, y, sample_weight=w)
    loaded = load(out)
    assert _rel(loaded.decision_function(X), expected.decision_function(X)) <= 1e-8
    np.testing.assert_array_equal(loaded.class_weight_, expected.class_weight_)
    # A missing array or a dict of class weights: refused or taken before any cluster work.
    assert main(["fit", "--data", str(path), "--out", str(tmp_path / "m2"), "--sample-weight", "weights",
                 *flags]) == 1
    assert not (tmp_path / "m2").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 iterations: this fit checks how the flag is read, not the solution
        assert main(["fit", "--data", str(path), "--out", str(tmp_path / "m3"), "--class-weight", "0=1,1=2,2=3",
                     *flags, "--max-iter", "3"]) == 0
    assert load(tmp_path / "m3").class_weight == {"0": 1, "1": 2, "2": 3}


def test_workflow_reads_the_weights_named_in_its_data_table(cluster2, tmp_path):
    from daskkrr import load
    from daskkrr.workflow import WorkflowError, run_workflow
    from daskkrr.workflow.spec import resolve

    X, y, w = _data(False, seed=8)
    path = tmp_path / "train.zarr"
    write_zarr(X, y, path, chunk_rows=40)
    zarr.open_group(str(path), mode="r+").create_array("w", shape=(N,), chunks=(40,), dtype="float64")[:] = w
    model = dict(estimator="falkon", n_centers=M, penalty=1e-3, tol=1e-11, max_iter=100, random_state=0)
    workflow = {"workflow": {"name": "weighted", "runs_dir": str(tmp_path / "runs")},
                "data": {"store": str(path), "sample_weight": "w"}, "model": model,
                "evaluation": {"method": "holdout", "split": "tail", "test_fraction": 0.25, "metrics": ["rmse"]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_workflow(workflow, client=cluster2)
    params = {k: v for k, v in model.items() if k != "estimator"}
    expected = _fit_quietly(FalkonRegressor(**params), X[:120], y[:120], sample_weight=w[:120])
    assert _rel(load(result.run_dir / "model").predict(X), expected.predict(X)) <= 1e-8
    with pytest.raises(WorkflowError, match="sample_weight names an array of the store"):
        resolve({**workflow, "data": {"generate": {"n": 100, "d": 2}, "sample_weight": "w"}}, base_dir=tmp_path)
