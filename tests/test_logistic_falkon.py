"""Logistic FALKON: the optimum of scikit-learn's LogisticRegression on the same Nystrom
features (one-vs-rest and multinomial), probabilities, a cluster fit from Zarr, resume
after a crash, bad input, and the calibrated path of the least-squares classifier."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import eigh
from scipy.special import log_softmax
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from daskkrr import FalkonClassifier, LogisticFalkonClassifier
from daskkrr.checkpoint import FitCheckpoint
from daskkrr.solvers import softmax
from daskkrr.solvers.logistic import (
    CenterFactor,
    gradient_block,
    hessian_block,
    log1pexp,
    newton_solve,
    penalty_path,
)

EXACT = dict(n_centers=30, sigma=1.0, penalty=1e-3, tol=1e-12, max_iter=200, newton_iterations=40,
             random_state=0, standardize=False)


def _data(n: int = 400, classes: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    score = X[:, 0] + 0.7 * np.sin(2 * X[:, 1]) + 0.5 * rng.normal(size=n)
    if classes == 2:
        return X, (score > 0).astype(int)
    return X, np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))


def _nystrom_features(model: LogisticFalkonClassifier, X: np.ndarray) -> np.ndarray:
    """``Phi = K_nM K_MM^(-1/2)``: LogisticRegression on Phi is the same problem."""
    Z = model.centers_
    k = model.kernel_
    w, Q = eigh(k(Z, Z))
    return k(X, Z) @ (Q / np.sqrt(w)) @ Q.T


def _objective(scores: np.ndarray, y: np.ndarray, w: np.ndarray, penalty: float) -> float:
    """Our objective for one binary problem: mean logistic loss + penalty / 2 ||w||^2."""
    return float(np.mean(log1pexp(-y * scores)) + 0.5 * penalty * w @ w)


@pytest.mark.parametrize("classes", [2, 3])
def test_objective_equals_logistic_regression_on_nystrom_features(classes):
    X, y = _data(classes=classes)
    n = len(y)
    model = LogisticFalkonClassifier(**EXACT, multi_class="ovr").fit(X, y)
    assert model.converged_
    Phi = _nystrom_features(model, X)
    C = 1.0 / (EXACT["penalty"] * n)  # the docstring's C
    lr = LogisticRegression(C=C, tol=1e-12, max_iter=10000, solver="newton-cholesky")
    ref = lr if classes == 2 else OneVsRestClassifier(lr)
    ref.fit(Phi, y)
    fitted = [ref] if classes == 2 else ref.estimators_
    ours = model.decision_function(X).reshape(n, -1)
    for j, est in enumerate(fitted):
        codes = np.where(y == model.classes_[1 if classes == 2 else j], 1.0, -1.0)
        theirs = est.decision_function(Phi)
        best = _objective(theirs, codes, est.coef_.ravel(), EXACT["penalty"])
        assert abs(model.objective_[j] - best) <= 1e-6 * best, (model.objective_[j], best)
        # and the model is the same function (and coefficients, in the features' basis)
        np.testing.assert_allclose(ours[:, j], theirs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(model.predict_proba(X), ref.predict_proba(Phi), atol=1e-5)
    np.testing.assert_allclose(model.predict_log_proba(X), np.log(model.predict_proba(X)), atol=1e-10)


@pytest.mark.parametrize("multi_class", ["ovr", "multinomial"])
def test_probabilities_numpy_and_dask(multi_class):
    import dask.array as da

    X, y = _data(classes=3)
    model = LogisticFalkonClassifier(n_centers=40, penalty=1e-4, random_state=0, multi_class=multi_class).fit(X, y)
    P = model.predict_proba(X)
    assert P.shape == (len(y), 3) and np.allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(model.classes_[P.argmax(axis=1)], model.predict(X))
    lazy = model.predict_proba(da.from_array(X, chunks=100))
    assert isinstance(lazy, da.Array) and lazy.shape == (len(y), 3)
    np.testing.assert_allclose(lazy.compute(), P, rtol=1e-12, atol=1e-14)
    log_lazy = model.predict_log_proba(da.from_array(X, chunks=100))
    assert isinstance(log_lazy, da.Array)
    np.testing.assert_allclose(np.exp(log_lazy.compute()), P, rtol=1e-10)


def test_text_labels_and_save_load(tmp_path):
    from daskkrr import load

    X, y = _data()
    labels = np.array(["no", "yes"])[y]
    model = LogisticFalkonClassifier(n_centers=30, penalty=1e-4, random_state=0).fit(X, labels)
    assert list(model.classes_) == ["no", "yes"]
    back = load(model.save(tmp_path / "m"))
    assert type(back) is LogisticFalkonClassifier
    np.testing.assert_array_equal(back.predict_proba(X), model.predict_proba(X))
    np.testing.assert_array_equal(back.predict(X), model.predict(X))


def test_sample_weights_equal_duplicated_rows():
    """The Newton loop's per-row weights (a last column of the targets): integer weights
    give the model of the duplicated rows (the fit(sample_weight) plumbing passes them)."""
    rng = np.random.default_rng(3)
    X, y = _data(n=150)
    codes = np.where(y == 1, 1.0, -1.0)[:, None]
    s = rng.integers(0, 4, size=len(y)).astype(float)
    from daskkrr.kernels import make_kernel

    kernel = make_kernel("gaussian", sigma=1.0)
    Z = X[:20]
    factor = CenterFactor.from_kernel_matrix(kernel(Z, Z))
    path = penalty_path(1e-3, "auto", 30)

    def solve(Xr, Yr, total):
        return newton_solve(
            factor, lambda c, b: gradient_block(Xr, Yr, kernel, Z, c, b),
            lambda c, b, U: hessian_block(Xr, Yr, kernel, Z, c, b, U), path=path, weight_sum=total,
            intercept0=np.zeros(1), fit_intercept=True, tol=1e-13, max_iter=100)

    weighted = solve(X, np.column_stack([codes, s]), s.sum())
    rep = np.repeat(np.arange(len(y)), s.astype(int))
    duplicated = solve(X[rep], codes[rep], float(len(rep)))
    assert weighted.converged and duplicated.converged
    np.testing.assert_allclose(weighted.coef, duplicated.coef, rtol=1e-8, atol=1e-8 * np.abs(duplicated.coef).max())
    np.testing.assert_allclose(weighted.intercept, duplicated.intercept, rtol=1e-8)


# ---------------------------------------------------------------- multinomial
def _softmax_objective(F: np.ndarray, y: np.ndarray, norm2: float, penalty: float,
                       s: np.ndarray | None = None) -> float:
    """Our multinomial objective: weighted mean cross-entropy + penalty / 2 sum_c ||w_c||^2."""
    s = np.ones(len(y)) if s is None else s
    ce = -log_softmax(F, axis=1)[np.arange(len(y)), y]
    return float(s @ ce / s.sum() + 0.5 * penalty * norm2)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_multinomial_objective_equals_logistic_regression_on_nystrom_features(fit_intercept, weighted):
    X, y = _data(classes=4)
    n = len(y)
    s = np.random.default_rng(1).integers(0, 4, size=n).astype(float) if weighted else None
    model = LogisticFalkonClassifier(**EXACT, fit_intercept=fit_intercept).fit(X, y, sample_weight=s)
    assert model.converged_ and model.objective_.shape == (1,) and model.coef_.shape == (30, 4)
    Phi = _nystrom_features(model, X)
    C = 1.0 / (EXACT["penalty"] * (n if s is None else s.sum()))  # the docstring's C, n the weight sum
    lr = LogisticRegression(C=C, tol=1e-12, max_iter=10000, fit_intercept=fit_intercept).fit(Phi, y, sample_weight=s)
    best = _softmax_objective(lr.decision_function(Phi), y, float(np.sum(lr.coef_ ** 2)), EXACT["penalty"], s)
    assert abs(model.objective_[0] - best) <= 1e-6 * best, (model.objective_[0], best)
    ours = _softmax_objective(model.decision_function(X), y, float(np.sum(model.coef_ * (model.kernel_(
        model.centers_, model.centers_) @ model.coef_))), EXACT["penalty"], s)
    np.testing.assert_allclose(ours, model.objective_[0], rtol=1e-12)
    # the same probabilities; the functions sum to zero over the classes (softmax ignores a common shift)
    np.testing.assert_allclose(model.predict_proba(X), lr.predict_proba(Phi), atol=1e-5)
    np.testing.assert_allclose(model.predict_log_proba(X), np.log(model.predict_proba(X)), atol=1e-10)
    assert np.abs(model.coef_.sum(axis=1)).max() <= 1e-9 * np.abs(model.coef_).max()
    assert abs(model.intercept_.sum()) <= 1e-9 * max(1.0, np.abs(model.intercept_).max())


def test_softmax_hessian_pass_is_the_derivative_of_the_gradient_pass():
    rng = np.random.default_rng(4)
    K = rng.uniform(size=(50, 6))
    codes = np.where(rng.integers(0, 3, size=50)[:, None] == np.arange(3)[None, :], 1.0, -1.0)
    Y = np.column_stack([codes, rng.uniform(0.5, 2.0, size=50)])  # with row weights
    coef, b, U = rng.normal(size=(6, 3)), rng.normal(size=3), rng.normal(size=(6, 3))
    eps = 1e-6
    diff = (softmax.gradient_terms(K, Y, coef + eps * U, b)
            - softmax.gradient_terms(K, Y, coef - eps * U, b)) / (2 * eps)
    np.testing.assert_allclose(softmax.hessian_terms(K, Y, coef, b, U), diff[:6, :3], rtol=1e-7, atol=1e-9)
    # the intercepts' blocks: H_ab U summed over centers and classes, and H_bb (rows sum to zero)
    G = softmax.gradient_terms(K, Y, coef, b)
    H_ab, H_bb = G[:6, 3:].reshape(6, 3, 3), G[6, 3:].reshape(3, 3)
    np.testing.assert_allclose(np.einsum("mcd,mc->d", H_ab, U), diff[6, :3], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(H_bb.sum(axis=1), 0.0, atol=1e-12)


def test_multinomial_sample_weights_equal_duplicated_rows():
    rng = np.random.default_rng(3)
    X, y = _data(n=150, classes=3)
    codes = np.where(y[:, None] == np.arange(3)[None, :], 1.0, -1.0)
    s = rng.integers(0, 4, size=len(y)).astype(float)
    from daskkrr.kernels import make_kernel

    kernel = make_kernel("gaussian", sigma=1.0)
    Z = X[:20]
    factor = CenterFactor.from_kernel_matrix(kernel(Z, Z))
    path = penalty_path(1e-3, "auto", 30)

    def solve(Xr, Yr, total, fractions):
        return newton_solve(
            factor, lambda c, b: softmax.gradient_block(Xr, Yr, kernel, Z, c, b),
            lambda c, b, U: softmax.hessian_block(Xr, Yr, kernel, Z, c, b, U), path=path, weight_sum=total,
            intercept0=softmax.start_intercept(fractions), fit_intercept=True, tol=1e-13, max_iter=100,
            loss=softmax.Multinomial())

    weighted = solve(X, np.column_stack([codes, s]), s.sum(), np.bincount(y, weights=s) / s.sum())
    rep = np.repeat(np.arange(len(y)), s.astype(int))
    duplicated = solve(X[rep], codes[rep], float(len(rep)), np.bincount(y[rep]) / len(rep))
    assert weighted.converged and duplicated.converged
    np.testing.assert_allclose(weighted.coef, duplicated.coef, rtol=1e-8, atol=1e-8 * np.abs(duplicated.coef).max())
    np.testing.assert_allclose(weighted.intercept, duplicated.intercept, rtol=1e-8, atol=1e-10)


def test_two_classes_are_the_same_model_for_both_multi_class():
    X, y = _data()
    fits = [LogisticFalkonClassifier(n_centers=30, penalty=1e-4, random_state=0, multi_class=m).fit(X, y)
            for m in ("ovr", "multinomial")]
    np.testing.assert_array_equal(fits[0].coef_, fits[1].coef_)
    np.testing.assert_array_equal(fits[0].intercept_, fits[1].intercept_)
    np.testing.assert_array_equal(fits[0].predict_proba(X), fits[1].predict_proba(X))


def test_multinomial_save_load_and_files_from_before_multi_class(tmp_path):
    import json

    from daskkrr import load
    from daskkrr.models.persistence import METADATA_FILE

    X, y = _data(classes=3)
    model = LogisticFalkonClassifier(n_centers=30, penalty=1e-4, random_state=0).fit(X, y)
    assert model.multi_class == "multinomial"
    back = load(model.save(tmp_path / "m"))
    assert back.multi_class == "multinomial"
    np.testing.assert_array_equal(back.predict_proba(X), model.predict_proba(X))
    meta_file = tmp_path / "m" / METADATA_FILE
    meta = json.loads(meta_file.read_text())
    del meta["params"]["multi_class"]  # as written before the parameter existed (one-vs-rest models)
    meta_file.write_text(json.dumps(meta))
    assert load(tmp_path / "m").multi_class == "ovr"


def test_bad_multi_class_is_refused():
    X, y = _data(n=50, classes=3)
    with pytest.raises(ValueError, match="multi_class"):
        LogisticFalkonClassifier(n_centers=10, multi_class="softmax").fit(X, y)


# ---------------------------------------------------------------- resume and cluster
class Stop(Exception):
    """Stands in for a crash right after a checkpoint was saved."""


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # the same warning in both fits
@pytest.mark.parametrize("multi_class", ["ovr", "multinomial"])
def test_resumed_fit_equals_the_uninterrupted_fit(tmp_path, monkeypatch, multi_class):
    X, y = _data(n=600, classes=3, seed=1)
    params = dict(n_centers=50, penalty=1e-5, tol=1e-8, max_iter=30, random_state=0, chunks=200,
                  multi_class=multi_class)
    full = LogisticFalkonClassifier(**params).fit(X, y)
    save_state = FitCheckpoint.save_state

    def save_then_crash(self, prefix, state):
        save_state(self, prefix, state)
        if state.iteration >= 3:
            raise Stop

    monkeypatch.setattr(FitCheckpoint, "save_state", save_then_crash)
    with pytest.raises(Stop):
        LogisticFalkonClassifier(**params).fit(X, y, checkpoint=tmp_path / "ck")
    monkeypatch.undo()
    resumed = LogisticFalkonClassifier(**params).fit(X, y, checkpoint=tmp_path / "ck", resume=True)
    assert resumed.n_iter_ == full.n_iter_ > 3
    np.testing.assert_array_equal(resumed.coef_, full.coef_)
    np.testing.assert_array_equal(resumed.intercept_, full.intercept_)
    np.testing.assert_array_equal(resumed.objective_history_, full.objective_history_)


@pytest.mark.parametrize("multi_class", ["ovr", "multinomial"])
def test_zarr_on_a_two_process_cluster_equals_numpy(tmp_path, cluster2, multi_class):
    from daskkrr.data import write_zarr

    # 5 features: K_MM well conditioned, so converged coefficients are determined to round-off
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2000, 5))
    score = X[:, 0] + np.sin(2 * X[:, 1]) + 0.5 * X[:, 2] * X[:, 3] + 0.5 * rng.normal(size=2000)
    y = np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    write_zarr(X, y.astype(np.float64), tmp_path / "t.zarr", chunk_rows=500)
    params = dict(n_centers=40, penalty=1e-1, tol=1e-10, max_iter=100, newton_iterations=30, random_state=0,
                  multi_class=multi_class)
    with cluster2.as_current():
        on_cluster = LogisticFalkonClassifier(**params).fit(tmp_path / "t.zarr")
    in_memory = LogisticFalkonClassifier(**params).fit(X, y)
    assert on_cluster.converged_ and in_memory.converged_, (on_cluster.residuals_, in_memory.residuals_)
    np.testing.assert_array_equal(on_cluster.center_indices_, in_memory.center_indices_)
    rel = np.linalg.norm(on_cluster.coef_ - in_memory.coef_) / np.linalg.norm(in_memory.coef_)
    # Both converged (inner CG tol = 1e-10) with products summed in other orders: <= kappa * tol,
    # kappa near 1 at penalty 1e-1, so 1e-8 holds whatever round-off the CPU's kernels make.
    assert rel <= 1e-8, rel


@pytest.mark.slow
def test_client_killed_mid_newton_resumes_to_the_same_model(tmp_path, cluster2, capsys):
    """``daskkrr fit --estimator logistic --checkpoint`` on its own local cluster gets SIGKILL
    after a few Newton steps (no clean-up at all); resumed on another cluster, the model equals
    the fit that was never interrupted."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import daskkrr
    from daskkrr.checkpoint import CHECKPOINT_FILE
    from daskkrr.cli import main
    from daskkrr.data import write_zarr

    rng = np.random.default_rng(5)
    X = rng.normal(size=(2000, 5))
    y = (X[:, 0] + np.sin(2 * X[:, 1]) + 0.5 * rng.normal(size=2000) > 0).astype(np.float64)
    store = write_zarr(X, y, tmp_path / "t.zarr", chunk_rows=500)
    flags = ["--n-centers", "40", "--penalty", "1e-2", "--tol", "1e-9", "--max-iter", "60",
             "--newton-iterations", "20", "--random-state", "0"]
    uninterrupted = LogisticFalkonClassifier(n_centers=40, penalty=1e-2, tol=1e-9, max_iter=60,
                                             newton_iterations=20, random_state=0).fit(store)
    assert uninterrupted.converged_ and uninterrupted.n_iter_ > 3
    ckpt, out = tmp_path / "ck", tmp_path / "model"
    fit = ["fit", "--data", str(store), "--out", str(out), "--estimator", "logistic", *flags,
           "--checkpoint", str(ckpt)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "daskkrr.cli", *fit, "--workers", "1", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    step = -1
    while step < 1:
        assert proc.poll() is None, f"the fit ended before Newton step 1: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "timed out waiting for a checkpoint"
        if (ckpt / CHECKPOINT_FILE).exists():
            with np.load(ckpt / CHECKPOINT_FILE, allow_pickle=False) as npz:
                meta = json.loads(str(npz["meta"]))
            step = meta.get("iteration", -1) if meta.get("stage") == "newton" else -1
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not out.exists()
    assert main([*fit, "--resume", "--scheduler", cluster2.scheduler.address, "-q"]) == 0, capsys.readouterr().err
    model = daskkrr.load(out)
    assert model.converged_ and model.n_iter_ == uninterrupted.n_iter_
    rel = np.linalg.norm(model.coef_ - uninterrupted.coef_) / np.linalg.norm(uninterrupted.coef_)
    # Newton steps whose inner CGs stop at relative residual tol = 1e-9 with products summed by other
    # workers: the converged coefficients differ by about kappa * tol (kappa: the preconditioned
    # Hessian's condition, near 1 at penalty 1e-2), and the summation order adds ~blocks * eps.
    assert rel <= 1e-9, rel


# ---------------------------------------------------------------- bad input
def test_one_class_is_refused():
    X, _ = _data(n=50)
    with pytest.raises(ValueError, match="only one class"):
        LogisticFalkonClassifier(n_centers=10).fit(X, np.zeros(50))


def test_continuous_target_is_refused():
    X, _ = _data(n=50)
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        LogisticFalkonClassifier(n_centers=10).fit(X, np.random.default_rng(0).normal(size=50))


def test_predict_proba_before_fit_is_refused():
    with pytest.raises(NotFittedError):
        LogisticFalkonClassifier().predict_proba(np.zeros((2, 2)))


@pytest.mark.parametrize("schedule, match", [([1e-2, 1e-9], "larger than penalty"),
                                             ([1e-4, 1e-2], "decreasing"),
                                             ("geometric", "penalty_schedule must be")])
def test_bad_penalty_schedule_is_refused(schedule, match):
    X, y = _data(n=50)
    with pytest.raises(ValueError, match=match):
        LogisticFalkonClassifier(n_centers=10, penalty=1e-6, penalty_schedule=schedule).fit(X, y)


def test_penalty_path_follows_falkon_rule():
    assert penalty_path(1e-6, "auto", 2) == [(1e-2, False), (1e-4, False), (1e-6, True), (1e-6, True)]
    assert penalty_path(0.1, "auto", 1) == [(0.1, True)]


# ---------------------------------------------------------------- the least-squares classifier
def test_falkon_classifier_calibrated_probabilities():
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.metrics import log_loss

    X, y = _data(n=600, classes=3)
    calibrated = CalibratedClassifierCV(FalkonClassifier(n_centers=40, penalty=1e-4, random_state=0),
                                        cv=3, method="sigmoid").fit(X, y)
    P = calibrated.predict_proba(X)
    assert P.shape == (600, 3) and np.allclose(P.sum(axis=1), 1.0)
    assert log_loss(y, P) < log_loss(y, np.full((600, 3), 1 / 3))
    assert not hasattr(FalkonClassifier(), "predict_proba")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # a fit of a few steps, on purpose
def test_cli_fit_and_predict_probabilities(tmp_path, cluster2, capsys):
    import zarr

    from daskkrr import load
    from daskkrr.cli import main
    from daskkrr.data import write_zarr

    X, y = _data(n=400, classes=3)
    write_zarr(X, y.astype(np.float64), tmp_path / "d.zarr", chunk_rows=200)
    address = cluster2.scheduler.address
    # 2 Newton steps of at most 5 CG iterations: predict's probabilities are checked against the saved model's,
    # not the solution (each step and CG iteration is a round trip to the workers).
    assert main(["fit", "--data", str(tmp_path / "d.zarr"), "--out", str(tmp_path / "m"), "--estimator",
                 "logistic", "--n-centers", "30", "--penalty", "1e-2", "--random-state", "0", "-q",
                 "--newton-iterations", "2", "--max-iter", "5", "--scheduler", address]) == 0
    out = tmp_path / "p.zarr"
    assert main(["predict", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.zarr"), "--out", str(out),
                 "--output", "proba", "--scheduler", address]) == 0
    proba = zarr.open_group(str(out), mode="r")["proba"][:]
    np.testing.assert_allclose(proba, load(tmp_path / "m").predict_proba(X), rtol=1e-10, atol=1e-12)
    assert "class probabilities" in capsys.readouterr().out


@pytest.mark.slow  # two fits of M = 800 to a tight tol: 10 s
def test_a_float32_fit_on_repeated_centers_solves_like_float64():
    """float32 products ``K_nM u`` with the round-off jitter's ``T^{-1}`` cost CG iterations and
    moved the answer; the float32 jitter (``T`` only preconditions here) keeps both."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(8000, 8)).astype(np.float64)
    f = X @ rng.standard_normal(8) / 3 + np.sin(2 * X[:, 0])
    y = (f + 0.5 * rng.standard_normal(len(X)) > np.median(f)).astype(int)
    fits = {dtype: LogisticFalkonClassifier(n_centers=800, sigma=2.0, penalty=1e-7, dtype=dtype, random_state=0,
                                            standardize=False).fit(X, y) for dtype in ("float64", "float32")}

    def log_loss(model: LogisticFalkonClassifier) -> float:
        p = np.clip(model.predict_proba(X)[:, 1], 1e-12, 1 - 1e-12)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    f64, f32 = fits["float64"], fits["float32"]
    assert f32.converged_ and f64.converged_
    assert abs(log_loss(f32) - log_loss(f64)) <= 2e-5 * log_loss(f64)  # the round-off jitter: 5e-4
    assert f32.cg_iterations_ <= 1.1 * f64.cg_iterations_ + 5  # the round-off jitter: 137 against 108
