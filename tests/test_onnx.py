"""ONNX export: onnxruntime's outputs against daskkrr's own, for every exportable estimator and kernel.

Tolerances. Every output is a sum ``f(x) = sum_j coef_j k(x, c_j) + b`` computed in float32.
With ``kappa_j`` the magnitude of the arithmetic that makes ``k(x, c_j)`` (the kernel value
itself for the stationary kernels, whose factors are all positive; ``(gamma |z|.|c| + coef0)^p``
for the dot products), the float32 error is at most ``B u (|b| + sum_j |coef_j| kappa_j)``,
u = 2^-24 the unit round-off, by Higham's bounds for sums and dot products, with
``B = M + e + 8``: ``M`` terms in the product with the coefficients, ``e`` the relative error
of one kernel value, and a few operations more (standardisation, intercept, Exp). ``e`` is
``(d + 2) R^2 / 2`` for the gaussian (the distance expansion's absolute error
``(d + 2) u R^2``, ``R = |z| + |c|`` on the shifted, length-scaled inputs, is a relative
error of ``exp(-D / 2)``), ``(d + 2) s`` for laplacian and matern (the error of the
exponent ``s``, a sum of ``d`` positive terms), ``p (d + 2) + 1`` for the dot products.
:func:`_worst_case` computes ``B u`` for each model and query set, and every comparison
first checks that it is within the tolerance used: here (M <= 60, d = 3, standardised
features) ``B`` stays below 168, so the tests check
``|onnx - daskkrr| <= 1e-5 * (|b| + sum_j |coef_j| kappa_j)``, the issue's 1e-5 relative
measured against the size of the terms rather than of their sum (which may cancel to ~0).
Measured: at most 3 u.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

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
from daskkrr.cli import main
from daskkrr.export import OnnxExportError, save_onnx, to_onnx
from daskkrr.kernels import GaussianKernel, LaplacianKernel, LinearKernel, PolynomialKernel

pytest.importorskip("skl2onnx", reason='the ONNX export needs skl2onnx: pip install "daskkrr[onnx]"')
rt = pytest.importorskip("onnxruntime", reason='running exported models needs onnxruntime: pip install "daskkrr[onnx]"')

#: float32 round-off of M <= 60 terms and d = 3 features (see the module docstring); float64: the same
#: bound with u = 2^-53, twice (daskkrr's own float64 predict rounds as much again), is ~3e-14.
RTOL32 = 1e-5
RTOL64 = 1e-13
M = 40

KERNELS = {
    "gaussian": dict(kernel="gaussian"),
    "gaussian-ard": dict(kernel="gaussian", sigma=[1.0, 2.0, 3.0]),
    "laplacian": dict(kernel="laplacian"),
    "matern-0.5": dict(kernel="matern", kernel_params={"nu": 0.5}),
    "matern-1.5": dict(kernel="matern", kernel_params={"nu": 1.5}),
    "matern-2.5-ard": dict(kernel="matern", sigma=[2.0, 1.0, 1.5], kernel_params={"nu": 2.5}),
    "linear": dict(kernel="linear"),
    "polynomial": dict(kernel="polynomial", kernel_params={"degree": 3, "gamma": 0.5, "coef0": 1.0}),
}

ESTIMATORS = {
    "falkon": lambda kw: FalkonRegressor(n_centers=M, penalty=1e-3, random_state=0, **kw),
    "nystrom": lambda kw: NystromRegressor(n_centers=M, penalty=1e-3, random_state=0, **kw),
    "exact": lambda kw: ExactKernelRidge(penalty=1e-3, solver="direct", **kw),
    "online": lambda kw: OnlineKernelRidge(penalty=1e-3, random_state=0, **kw),
    "classifier": lambda kw: FalkonClassifier(n_centers=M, penalty=1e-3, random_state=0, **kw),
    "logistic": lambda kw: LogisticFalkonClassifier(n_centers=M, penalty=1e-3, random_state=0, **kw),
    "kpca": lambda kw: NystromKernelPCA(n_components=3, n_centers=M, random_state=0, **kw),
    "kmeans": lambda kw: NystromKernelKMeans(n_clusters=3, n_centers=M, random_state=0, **kw),
}
#: Estimators whose centers are the training rows (all of them, or a leverage-score subset): fitted on
#: 60 rows so that M stays within the bound's 60.
SMALL = ("exact", "online")

#: The default run: every kernel (on the fastest estimator), every estimator (gaussian, and one other
#: kernel each); the whole product is marked slow.
DEFAULT_CASES = {("exact", k) for k in KERNELS} | {(e, "gaussian") for e in ESTIMATORS} | {
    ("falkon", "laplacian"), ("nystrom", "matern-1.5"), ("online", "polynomial"), ("classifier", "matern-0.5"),
    ("logistic", "linear"), ("kpca", "matern-2.5-ard"), ("kmeans", "gaussian-ard")}


def _data(n: int, seed: int) -> np.ndarray:
    """Features with means and scales of their own (the standardisation is part of the graph)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)) * np.array([1.0, 3.0, 0.5]) + np.array([1.0, -2.0, 0.5])


X_TRAIN = _data(200, 0)
#: Query rows as float32, and the same values in float64 for daskkrr: both sides see the same input.
X_TEST = _data(100, 1).astype(np.float32)
X_TEST64 = X_TEST.astype(np.float64)


def _target(name: str, X: np.ndarray) -> np.ndarray | None:
    z = (X - X.mean(axis=0)) / X.std(axis=0)
    if name in ("classifier", "logistic"):
        return (z[:, 0] > 0.3).astype(np.int64) + (z[:, 1] * z[:, 2] > 0)
    if name in ("kpca", "kmeans"):
        return None
    return np.sin(z[:, 0]) + 0.5 * z[:, 1] * z[:, 2]


def _fit(name: str, kernel: str) -> object:
    X = X_TRAIN[:60] if name in SMALL else X_TRAIN
    model = ESTIMATORS[name](KERNELS[kernel])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence notes of the small fits: not what is tested
        return model.fit(X) if _target(name, X) is None else model.fit(X, _target(name, X))


def _run(onx: object, X: np.ndarray) -> dict[str, np.ndarray]:
    session = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"X": X})))


# --------------------------------------------------------------------------- the reference's scale
def _kappa(model: object, X: np.ndarray) -> np.ndarray:
    """``kappa_j(x)`` of the module docstring, in float64: (n_rows, M)."""
    Xs = model.scaler_.transform(X) if model.scaler_ is not None else X
    kernel, C = model.kernel_, model.centers_
    if type(kernel) is LinearKernel:
        return np.abs(Xs) @ np.abs(C).T
    if type(kernel) is PolynomialKernel:
        return (kernel.gamma * (np.abs(Xs) @ np.abs(C).T) + kernel.coef0) ** kernel.degree
    return kernel(Xs, C)


def _term_scale(model: object, X: np.ndarray, weights: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``|offset| + sum_j |weights_j| kappa_j(x)``: (n_rows, t)."""
    return _kappa(model, X) @ np.abs(weights.reshape(weights.shape[0], -1)) + np.abs(offset).reshape(-1)


def _decision_scale(model: object, X: np.ndarray) -> np.ndarray:
    return _term_scale(model, X, model.coef_, np.asarray(model.intercept_))


def _worst_case(model: object, X: np.ndarray, u: float) -> float:
    """``B u`` of the module docstring: the float32 (or float64) error bound over the terms' size."""
    d, m = X.shape[1], model.centers_.shape[0]
    kernel = model.kernel_
    if type(kernel) in (LinearKernel, PolynomialKernel):
        per_value = getattr(kernel, "degree", 1) * (d + 2) + 1
    else:
        Xs = model.scaler_.transform(X) if model.scaler_ is not None else X
        C = model.centers_ / kernel.length_scales
        shift = C.mean(axis=0)
        z, C = Xs / kernel.length_scales - shift, C - shift
        if type(kernel) is GaussianKernel:
            reach = np.linalg.norm(z, axis=1).max() + np.linalg.norm(C, axis=1).max()
            per_value = (d + 2) * reach**2 / 2
        else:
            order = 1 if type(kernel) is LaplacianKernel else 2
            reach = np.linalg.norm(z, order, axis=1).max() + np.linalg.norm(C, order, axis=1).max()
            per_value = (d + 2) * reach * (1.0 if order == 1 else np.sqrt(5.0))  # the largest matern exponent
    return float((m + per_value + 8) * u)


def _assert_close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, rtol: float) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    excess = np.abs(got - want).reshape(scale.shape) / scale
    assert excess.max() <= rtol, f"largest error {excess.max():.3g} of the terms' size, allowed {rtol:g}"


def _decided(scores: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """Rows whose largest score (or, one column, its sign) leads by more than the rounding can move."""
    if scores.ndim == 1 or scores.shape[1] == 1:
        return np.abs(scores.reshape(-1)) > tol.reshape(-1)
    top2 = np.sort(scores, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] > 2 * tol.max(axis=1)


# --------------------------------------------------------------------------- the checks by role
def _check(model: object, out: dict[str, np.ndarray], rtol: float, X32: np.ndarray, X64: np.ndarray) -> None:
    u = np.finfo(X32.dtype).eps / 2
    assert _worst_case(model, X64, u) * (1 if X32.dtype == np.float32 else 2) <= rtol  # the tolerance's premise
    if isinstance(model, NystromKernelKMeans):
        _check_clusters(model, out, rtol, X64)
        return
    scale = _decision_scale(model, X64)
    if isinstance(model, (FalkonClassifier, LogisticFalkonClassifier)):
        scores = model.decision_function(X64)
        tol = rtol * scale
        decided = _decided(scores, tol)
        assert decided.mean() > 0.9  # the comparison of labels is not empty
        assert np.array_equal(out["label"][decided], model.predict(X64)[decided])
        if isinstance(model, LogisticFalkonClassifier):
            # Sigmoid and softmax move a probability by at most half the largest change of a score.
            row_tol = tol.max(axis=1, keepdims=True) + 8 * np.finfo(X32.dtype).eps
            assert np.all(np.abs(out["probabilities"] - model.predict_proba(X64)) <= row_tol)
        else:
            _assert_close(out["scores"], scores, scale, rtol)
        return
    want = model.transform(X64) if isinstance(model, NystromKernelPCA) else model.predict(X64)
    _assert_close(out["variable"], want, scale, rtol)


def _check_clusters(model: object, out: dict[str, np.ndarray], rtol: float, X64: np.ndarray) -> None:
    products = model.basis_ @ model.cluster_centers_.T
    c_sq = (model.cluster_centers_**2).sum(axis=1)
    partial = _kappa(model, X64) @ (-2 * products) + c_sq  # the quantity whose argmin is the label
    tol = rtol * _term_scale(model, X64, 2 * products, c_sq)
    decided = _decided(-partial, tol)
    assert decided.mean() > 0.9
    assert np.array_equal(out["label"][decided], model.predict(X64)[decided])


def _cases():
    for name in ESTIMATORS:
        for kernel in KERNELS:
            marks = () if (name, kernel) in DEFAULT_CASES else (pytest.mark.slow,)
            yield pytest.param(name, kernel, id=f"{name}-{kernel}", marks=marks)


@pytest.mark.parametrize("name, kernel", _cases())
def test_onnxruntime_equals_daskkrr(name, kernel):
    model = _fit(name, kernel)
    _check(model, _run(to_onnx(model), X_TEST), RTOL32, X_TEST, X_TEST64)


def test_float64_export_equals_daskkrr_to_float64_round_off():
    model = _fit("falkon", "matern-2.5-ard")
    out = _run(to_onnx(model, X_TEST64[:1], dtype=np.float64), X_TEST64)
    _check(model, out, RTOL64, X_TEST64, X_TEST64)


def test_a_float32_model_and_a_scikit_learn_pipeline():
    """A model fitted in float32 (float32 coefficients; daskkrr's predict then rounds as the graph does, so
    the two may differ by twice the bound), and skl2onnx's own ``to_onnx`` of a Pipeline ending in daskkrr."""
    import skl2onnx
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from daskkrr.export import register_converters

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FalkonRegressor(n_centers=M, penalty=1e-3, dtype="float32", random_state=0).fit(
            X_TRAIN.astype(np.float32), _target("falkon", X_TRAIN))
        pipe = make_pipeline(StandardScaler(), NystromRegressor(n_centers=M, penalty=1e-3, random_state=0)).fit(
            X_TRAIN, _target("nystrom", X_TRAIN))
    assert model.coef_.dtype == np.float32
    out = _run(to_onnx(model), X_TEST)["variable"]
    _assert_close(out, model.predict(X_TEST), _decision_scale(model, X_TEST64), 2 * RTOL32)

    register_converters()
    out = _run(skl2onnx.to_onnx(pipe, X_TEST[:1]), X_TEST)["variable"]
    final, Z = pipe[-1], pipe[0].transform(X_TEST64)  # the scaler's float32 round-off: a few u more per feature
    assert _worst_case(final, Z, 2.0**-24) + 4 * 2.0**-24 <= RTOL32
    _assert_close(out, pipe.predict(X_TEST64), _decision_scale(final, Z), RTOL32)


def test_two_targets_give_two_columns():
    y = _target("nystrom", X_TRAIN)
    model = NystromRegressor(n_centers=M, penalty=1e-3, random_state=0).fit(X_TRAIN, np.column_stack([y, -2 * y]))
    out = _run(to_onnx(model), X_TEST)
    assert out["variable"].shape == (len(X_TEST), 2)
    _check(model, out, RTOL32, X_TEST, X_TEST64)


@pytest.mark.parametrize("estimator, multi_class", [(FalkonClassifier, None), (LogisticFalkonClassifier, None),
                                                    (LogisticFalkonClassifier, "ovr")])
def test_classifier_labels_and_outputs_by_number_of_classes(estimator, multi_class):
    """Two classes (one score column), string labels, and one-vs-rest probabilities."""
    codes = _target("classifier", X_TRAIN)
    if multi_class is None:  # two classes named by strings
        y = np.array(["no", "yes"])[(codes > 0).astype(int)]
        kwargs = {}
    else:
        y, kwargs = codes, {"multi_class": multi_class}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = estimator(n_centers=M, penalty=1e-3, random_state=0, **kwargs).fit(X_TRAIN, y)
    out = _run(to_onnx(model), X_TEST)
    assert out["label"].shape == (len(X_TEST),)
    second = "probabilities" if estimator is LogisticFalkonClassifier else "scores"
    assert out[second].shape == (model.predict_proba(X_TEST64) if second == "probabilities"
                                 else model.decision_function(X_TEST64)).shape
    _check(model, out, RTOL32, X_TEST, X_TEST64)


# --------------------------------------------------------------------------- errors
def test_unfitted_and_unsupported_models_are_refused_by_name():
    with pytest.raises(NotFittedError):
        to_onnx(FalkonRegressor())
    with pytest.raises(NotFittedError):
        to_onnx(NystromKernelKMeans())

    class Shifted(FalkonRegressor):  # a subclass may change what predict computes
        pass

    with pytest.raises(OnnxExportError, match="Shifted cannot be exported to ONNX; the export supports"):
        to_onnx(Shifted())
    with pytest.raises(OnnxExportError, match="LinearRegression cannot be exported"):
        from sklearn.linear_model import LinearRegression

        to_onnx(LinearRegression().fit(X_TRAIN, X_TRAIN[:, 0]))


def test_a_kernel_of_its_own_is_refused_by_name():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class WideGaussian(GaussianKernel):  # exact types only: a subclass may change the formula
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FalkonRegressor(kernel=WideGaussian(sigma=2.0), n_centers=M, random_state=0).fit(
            X_TRAIN, _target("falkon", X_TRAIN))
    with pytest.raises(OnnxExportError, match="has the kernel WideGaussian, which the ONNX export does not support"):
        to_onnx(model)


def test_wrong_features_dtype_and_opset_are_refused():
    model = _fit("exact", "gaussian")
    with pytest.raises(ValueError, match="X has 2 features but ExactKernelRidge was fitted on 3"):
        to_onnx(model, X_TEST[:, :2])
    with pytest.raises(ValueError, match="X has 4 features"):
        to_onnx(model, 4)
    with pytest.raises(OnnxExportError, match="dtype must be numpy.float32 or numpy.float64"):
        to_onnx(model, dtype=np.float16)
    with pytest.raises(OnnxExportError, match="need opset 13 or later"):
        to_onnx(model, target_opset=12)


# --------------------------------------------------------------------------- files and the command line
def test_save_onnx_refuses_an_existing_file_without_overwrite(tmp_path):
    model = _fit("exact", "laplacian")
    path = tmp_path / "m.onnx"
    save_onnx(model, path)
    first = path.read_bytes()
    with pytest.raises(FileExistsError, match="already exists"):
        save_onnx(model, path, dtype=np.float64)
    assert path.read_bytes() == first
    save_onnx(model, path, dtype=np.float64, overwrite=True)
    _check(model, _run(_load(path), X_TEST64), RTOL64, X_TEST64, X_TEST64)
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temporary file left


def _load(path: Path) -> object:
    import onnx

    return onnx.load(str(path))


def test_cli_export_onnx_end_to_end(tmp_path, capsys):
    model = _fit("logistic", "gaussian")
    model_dir, out = tmp_path / "model", tmp_path / "model.onnx"
    model.save(model_dir)
    assert main(["export-onnx", str(model_dir), str(out)]) == 0
    assert f"wrote {out}: LogisticFalkonClassifier" in capsys.readouterr().out
    _check(model, _run(_load(out), X_TEST), RTOL32, X_TEST, X_TEST64)

    first = out.read_bytes()
    assert main(["export-onnx", str(model_dir), str(out), "--dtype", "float64"]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "--overwrite" in err
    assert out.read_bytes() == first
    assert main(["export-onnx", str(model_dir), str(out), "--dtype", "float64", "--overwrite"]) == 0
    _check(model, _run(_load(out), X_TEST64), RTOL64, X_TEST64, X_TEST64)

    assert main(["export-onnx", str(model_dir), str(model_dir / "inside.onnx")]) == 1  # inside the model it reads
    assert "is inside model" in capsys.readouterr().err
    assert main(["export-onnx", str(tmp_path / "absent"), str(tmp_path / "x.onnx")]) == 1
    assert not (tmp_path / "x.onnx").exists()


def _python_block(rst: str) -> str:
    """The first ``.. code-block:: python`` of a reStructuredText text, unindented."""
    lines = rst.split(".. code-block:: python\n", 1)[1].splitlines()[1:]
    block = []
    for line in lines:
        if line.strip() and not line.startswith("   "):
            break
        block.append(line[3:])
    return "\n".join(block).strip() + "\n"


def test_the_guides_snippet_runs(tmp_path, monkeypatch, capsys):
    """docs/guide/export.rst's Python block, as a user would paste it (in an empty folder)."""
    code = _python_block((Path(__file__).resolve().parents[1] / "docs" / "guide" / "export.rst").read_text())
    assert "save_onnx(model, \"model.onnx\")" in code
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "export.rst", "exec"), namespace)  # noqa: S102 - the documentation's own example
    assert (tmp_path / "model.onnx").is_file()
    model, X_new = namespace["model"], namespace["X_new"].astype(np.float64)
    rtol = _worst_case(model, X_new, 2.0**-24)  # M = 200 centers, d = 4: its own bound
    _assert_close(namespace["y_onnx"], model.predict(X_new), _decision_scale(model, X_new), rtol)
    assert 0 <= float(capsys.readouterr().out) < 1e-2  # it prints the largest difference
