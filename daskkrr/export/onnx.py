"""ONNX models of fitted daskkrr estimators, through converters registered with skl2onnx.

Every exported estimator computes ``f(x) = k(scale(x), centers_) @ coef_ + intercept_``
(:mod:`daskkrr.models.kernel_model`); the graph is that formula in standard ONNX
operators, with the model's arrays as constants:

- the standardisation ``(x - mean) / scale``, for the stationary kernels fused with
  the length scales and a shift by the centers' mean (distances do not change; it
  keeps the distance expansion's cancellation small, as daskkrr's own engines do);
- the kernel block between the input rows and the M centers: gaussian by
  ``|z|^2 - 2 z.c + |c|^2`` clipped at 0, then ``Exp``; laplacian (L1 distance) and
  matern (L2 distance, ``nu`` 0.5, 1.5 or 2.5) from the exact differences, an
  ``(n_rows, M, n_features)`` array (the square root of an expanded distance would
  turn its round-off near 0 into ``sqrt(eps)``); linear and polynomial by ``MatMul``;
- ``MatMul`` with the coefficients and ``Add`` of the intercept; then what the
  estimator's prediction method does with the decision values.

The outputs are shaped as daskkrr's own methods return them:

- regressors (``FalkonRegressor``, ``NystromRegressor``, ``ExactKernelRidge``,
  ``OnlineKernelRidge``): ``variable``, ``predict(X)``;
- ``NystromKernelPCA``: ``variable``, ``transform(X)``;
- ``NystromKernelKMeans``: ``label``, ``predict(X)`` (the nearest centroid in the
  Nystrom embedding: ``argmin_j |c_j|^2 - 2 k(x, centers_) @ basis_ @ c_j``);
- ``FalkonClassifier``: ``label`` (``predict``) and ``scores`` (``decision_function``);
- ``LogisticFalkonClassifier``: ``label`` and ``probabilities`` (``predict_proba``).

Not in the graph: the checks daskkrr's ``predict`` makes on its input (NaN rows,
column names, features too far out for the dtype) and the predictive standard
deviation (``return_std``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.utils.validation import check_is_fitted

from daskkrr.kernels import GaussianKernel, Kernel, LaplacianKernel, LinearKernel, MaternKernel, PolynomialKernel
from daskkrr.models import (
    ExactKernelRidge,
    FalkonClassifier,
    FalkonRegressor,
    LogisticFalkonClassifier,
    NystromKernelKMeans,
    NystromKernelPCA,
    NystromRegressor,
    OnlineKernelRidge,
)
from daskkrr.utils.atomic import atomic_write_bytes
from daskkrr.utils.output_paths import check_paths

if TYPE_CHECKING:
    import onnx

#: The oldest opset the graphs are written for (``ReduceSum``/``Unsqueeze`` take their axes as an input).
MIN_OPSET = 13

#: The exportable estimators and what their ONNX model outputs (see the module's docstring).
_ROLES: dict[type, str] = {
    FalkonRegressor: "regressor",
    NystromRegressor: "regressor",
    ExactKernelRidge: "regressor",
    OnlineKernelRidge: "regressor",
    NystromKernelPCA: "transformer",
    NystromKernelKMeans: "clusters",
    FalkonClassifier: "scores",
    LogisticFalkonClassifier: "probabilities",
}
_KERNELS = (GaussianKernel, LaplacianKernel, MaternKernel, LinearKernel, PolynomialKernel)


class OnnxExportError(ValueError):
    """A model, kernel or setting the ONNX export does not support; the message names it and the way out."""


# --------------------------------------------------------------------------- public functions
def to_onnx(model: Any, X: Any = None, dtype: Any = np.float32, *, target_opset: int | None = None) -> onnx.ModelProto:
    """The ONNX model of a fitted daskkrr estimator.

    The model takes one input, ``X`` (rows by ``n_features_in_`` columns, of
    ``dtype``), and computes what the estimator's prediction methods do (see
    :mod:`daskkrr.export.onnx`); serve it with onnxruntime:
    ``InferenceSession(onx.SerializeToString()).run(None, {"X": X.astype(np.float32)})``.

    Parameters
    ----------
    model : estimator
        A fitted ``FalkonRegressor``, ``NystromRegressor``, ``ExactKernelRidge``,
        ``OnlineKernelRidge``, ``FalkonClassifier``, ``LogisticFalkonClassifier``,
        ``NystromKernelPCA`` or ``NystromKernelKMeans``, with a gaussian, laplacian,
        matern, linear or polynomial kernel.
    X : array-like of shape (n_rows, n_features), int or None, default=None
        A sample of the input or the number of features, checked against the
        model's ``n_features_in_``; None takes the model's.
    dtype : {numpy.float32, numpy.float64}, default=numpy.float32
        The input's and the computation's floating type.
    target_opset : int or None, default=None
        The ONNX opset; None lets skl2onnx pick its default. At least 13.

    Returns
    -------
    onnx.ModelProto
        The model; ``SerializeToString()`` gives the bytes of an ``.onnx`` file.

    Raises
    ------
    OnnxExportError
        An estimator or kernel the export does not support, or an opset below 13.
    sklearn.exceptions.NotFittedError
        The model is not fitted.
    ImportError
        skl2onnx or onnx is not installed.
    """
    check_exportable(model)
    n_features = _n_features(model, X)
    float_type = _float_dtype(dtype)
    if target_opset is not None and int(target_opset) < MIN_OPSET:
        raise OnnxExportError(f"target_opset={target_opset}: the daskkrr graphs need opset {MIN_OPSET} or later "
                              f"(ReduceSum and Unsqueeze with their axes as an input); pass target_opset >= "
                              f"{MIN_OPSET} or None")
    register_converters()
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType

    tensor = FloatTensorType if float_type == np.float32 else DoubleTensorType
    return convert_sklearn(model, initial_types=[("X", tensor([None, n_features]))], target_opset=target_opset)


def save_onnx(model: Any, path: str | os.PathLike, X: Any = None, dtype: Any = np.float32, *,
              overwrite: bool = False, target_opset: int | None = None) -> Path:
    """Write the ONNX model of a fitted estimator to ``path`` (see :func:`to_onnx`), atomically.

    The path is checked before the model is built: an existing file is refused
    unless ``overwrite``, and so is a place that cannot be written.

    Parameters
    ----------
    model : estimator
        A fitted estimator that :func:`to_onnx` takes.
    path : str or os.PathLike
        The ``.onnx`` file to write.
    X : array-like, int or None, default=None
        As for :func:`to_onnx`.
    dtype : {numpy.float32, numpy.float64}, default=numpy.float32
        As for :func:`to_onnx`.
    overwrite : bool, default=False
        Replace an existing file.
    target_opset : int or None, default=None
        As for :func:`to_onnx`.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    check_paths(outputs={"path": path}, overwrite=overwrite)
    onx = to_onnx(model, X, dtype, target_opset=target_opset)
    return atomic_write_bytes(path, onx.SerializeToString())


def check_exportable(model: Any) -> None:
    """Refuse, before any work, an estimator the export does not support, an unfitted one, or its kernel.

    Parameters
    ----------
    model : estimator
        The estimator to export.
    """
    if type(model) not in _ROLES:
        raise OnnxExportError(
            f"{type(model).__name__} cannot be exported to ONNX; the export supports "
            f"{', '.join(sorted(cls.__name__ for cls in _ROLES))} (exactly these classes: a subclass may "
            "change what predict computes)")
    check_is_fitted(model, "cluster_centers_" if _ROLES[type(model)] == "clusters" else "coef_")
    kernel = model.kernel_
    if type(kernel) not in _KERNELS:
        raise OnnxExportError(
            f"{type(model).__name__} has the kernel {type(kernel).__name__}, which the ONNX export does not "
            f"support; it supports the built-in {', '.join(cls.name for cls in _KERNELS)} kernels: refit with one")
    labels = getattr(model, "classes_", None)
    if labels is not None:
        _label_values(labels)


def register_converters() -> None:
    """Register daskkrr's converters with skl2onnx, so that ``skl2onnx.to_onnx`` also converts the
    estimators, alone or as the last step of a scikit-learn ``Pipeline``.

    :func:`to_onnx` calls it; calling it again is harmless.
    """
    _require_onnx()
    from skl2onnx import update_registered_converter

    for cls, role in _ROLES.items():
        parser = _parse_labels if role in ("scores", "probabilities", "clusters") else None
        update_registered_converter(cls, f"Daskkrr{cls.__name__}", _shapes, _convert, parser=parser)


# --------------------------------------------------------------------------- checks
def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import skl2onnx  # noqa: F401
    except ImportError as exc:
        raise ImportError(f'the ONNX export needs skl2onnx and onnx ({exc}): pip install "daskkrr[onnx]"') from None


def _n_features(model: Any, X: Any) -> int:
    expected = int(model.n_features_in_)
    if X is None:
        return expected
    given = int(X) if isinstance(X, (int, np.integer)) else int(np.shape(X)[-1]) if np.ndim(X) == 2 else None
    if given is None:
        raise ValueError(f"X must be a sample of rows of shape (n_rows, n_features), a number of features or None; "
                         f"got shape {np.shape(X)}")
    if given != expected:
        raise ValueError(f"X has {given} features but {type(model).__name__} was fitted on {expected}; pass the "
                         f"model's {expected} features (or X=None)")
    return expected


def _float_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise OnnxExportError(f"dtype must be numpy.float32 or numpy.float64; got {dtype!r}")
    return dt


def _label_values(classes: np.ndarray) -> np.ndarray:
    """The class labels as the ONNX model outputs them: int64, float64 or strings."""
    classes = np.asarray(classes)
    if classes.dtype.kind in "biu":
        return classes.astype(np.int64)
    if classes.dtype.kind == "f":
        return classes.astype(np.float64)
    if classes.dtype.kind in "US" or all(isinstance(c, str) for c in classes):
        return classes.astype(str)
    raise OnnxExportError(f"the class labels {classes.tolist()!r} are of dtype {classes.dtype}; ONNX labels are "
                          "integers, floats or strings: refit with labels of one of these types")


# --------------------------------------------------------------------------- skl2onnx hooks
def _tensor_type(variable: Any) -> type:
    return type(variable.type)


def _label_type(classes: np.ndarray) -> Any:
    from skl2onnx.common.data_types import DoubleTensorType, Int64TensorType, StringTensorType

    kind = _label_values(classes).dtype.kind
    return {"i": Int64TensorType, "f": DoubleTensorType}.get(kind, StringTensorType)


def _parse_labels(scope: Any, model: Any, inputs: list[Any], custom_parsers: Any = None) -> list[Any]:
    """The outputs of the models that label rows: ``label``, and for the classifiers ``scores`` or
    ``probabilities`` (a plain tensor, no ZipMap)."""
    from skl2onnx._supported_operators import sklearn_operator_name_map
    from skl2onnx.common.data_types import Int64TensorType

    operator = scope.declare_local_operator(sklearn_operator_name_map[type(model)], model)
    operator.inputs = inputs
    role = _ROLES[type(model)]
    label_type = Int64TensorType if role == "clusters" else _label_type(model.classes_)
    operator.outputs.append(scope.declare_local_variable("label", label_type()))
    if role != "clusters":
        operator.outputs.append(scope.declare_local_variable(role, _tensor_type(inputs[0])()))
    return list(operator.outputs)


def _shapes(operator: Any) -> None:
    """The outputs' types and shapes, as daskkrr's methods return them (see the module's docstring)."""
    model = operator.raw_operator
    n = operator.inputs[0].get_first_dimension()
    tensor = _tensor_type(operator.inputs[0])
    role = _ROLES[type(model)]
    if role in ("regressor", "transformer"):
        width = model.coef_.shape[1] if model.coef_.ndim == 2 else None
        operator.outputs[0].type = tensor([n] if width is None else [n, width])
        return
    if role == "clusters":
        from skl2onnx.common.data_types import Int64TensorType

        operator.outputs[0].type = Int64TensorType([n])
        return
    k = len(model.classes_)
    operator.outputs[0].type = _label_type(model.classes_)([n])
    binary_scores = role == "scores" and k == 2
    operator.outputs[1].type = tensor([n] if binary_scores else [n, k])


def _convert(scope: Any, operator: Any, container: Any) -> None:
    """The graph of ``operator.raw_operator`` (see the module's docstring)."""
    model = operator.raw_operator
    dtype = np.float64 if "Double" in _tensor_type(operator.inputs[0]).__name__ else np.float32
    if container.target_opset < MIN_OPSET:
        raise OnnxExportError(f"opset {container.target_opset}: the daskkrr graphs need opset {MIN_OPSET} or later")
    g = _Graph(scope, container, dtype)
    outputs = [v.full_name for v in operator.outputs]
    role = _ROLES[type(model)]
    if role == "clusters":
        _nearest_centroid(g, model, operator.inputs[0].full_name, outputs[0])
        return
    scores = _decision(g, model, operator.inputs[0].full_name)
    if role in ("regressor", "transformer"):
        _as_returned(g, scores, outputs[0], flat=model.coef_.ndim == 1)
        return
    _classifier_outputs(g, model, scores, outputs, role)


def _as_returned(g: _Graph, values: str, out: str, flat: bool) -> None:
    """``values`` (n_rows, t) as the output ``out``: flattened to (n_rows,) where daskkrr returns 1-D."""
    if flat:
        g.op("Reshape", values, g.ints([-1]), out=out)
    else:
        g.op("Identity", values, out=out)


# --------------------------------------------------------------------------- the graph
class _Graph:
    """Nodes and constants added to skl2onnx's container, named uniquely in its scope."""

    def __init__(self, scope: Any, container: Any, dtype: Any) -> None:
        self.scope = scope
        self.container = container
        self.dtype = np.dtype(dtype)

    def const(self, value: Any, hint: str = "c") -> str:
        """A float constant, in the graph's dtype."""
        return self._initializer(np.asarray(value, dtype=np.float64).astype(self.dtype), hint)

    def ints(self, values: list[int]) -> str:
        """An int64 vector constant (axes, shapes)."""
        return self._initializer(np.asarray(values, dtype=np.int64), "axes")

    def _initializer(self, array: np.ndarray, hint: str) -> str:
        from onnx import TensorProto, numpy_helper

        name = self.scope.get_unique_variable_name(hint)
        if array.dtype.kind in "US":
            self.container.add_initializer(name, TensorProto.STRING, list(array.shape),
                                           [str(v).encode("utf-8") for v in array.ravel()])
        else:
            self.container.add_initializer(name, None, None, numpy_helper.from_array(np.ascontiguousarray(array)))
        return name

    def labels(self, values: np.ndarray) -> str:
        """The class labels as a constant of their own type."""
        return self._initializer(values, "classes")

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        """Add one node; its output's name."""
        out = out or self.scope.get_unique_variable_name(op_type.lower())
        self.container.add_node(op_type, list(inputs), [out], name=self.scope.get_unique_operator_name(op_type),
                                **attrs)
        return out


def _decision(g: _Graph, model: Any, X: str) -> str:
    """``k(scale(X), centers_) @ coef_ + intercept_``, of shape (n_rows, n_targets)."""
    K = _kernel_block(g, model, X)
    coef = np.asarray(model.coef_).reshape(model.coef_.shape[0], -1)  # a Zarr model's lazy coef_: read here
    intercept = np.asarray(model.intercept_, dtype=np.float64).reshape(-1)
    return g.op("Add", g.op("MatMul", K, g.const(coef, "coef")), g.const(intercept, "intercept"))


def _nearest_centroid(g: _Graph, model: Any, X: str, out: str) -> None:
    """k-means' ``predict``: ``argmin_j |c_j|^2 - 2 k(x, Z) @ basis_ @ c_j`` (the squared distance in the
    embedding less the row's own norm, which does not change the argmin; the first of equal ones)."""
    centroids = np.asarray(model.cluster_centers_, dtype=np.float64)
    products = np.asarray(model.basis_, dtype=np.float64) @ centroids.T
    K = _kernel_block(g, model, X)
    partial = g.op("Add", g.op("MatMul", K, g.const(-2.0 * products, "products")),
                   g.const((centroids**2).sum(axis=1), "centroid_sq"))
    g.op("ArgMin", partial, axis=1, keepdims=0, out=out)


def _scaling(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """The standardisation's ``(mean, scale)`` (zeros and ones where the model has none)."""
    d = int(model.n_features_in_)
    scaler = model.scaler_
    mean = getattr(scaler, "mean_", None)
    scale = getattr(scaler, "scale_", None)
    return (np.zeros(d) if mean is None else np.asarray(mean, dtype=np.float64),
            np.ones(d) if scale is None else np.asarray(scale, dtype=np.float64))


def _affine(g: _Graph, X: str, offset: np.ndarray, factor: np.ndarray) -> str:
    """``(X - offset) * factor``, leaving out a zero offset and a unit factor."""
    z = X if not offset.any() else g.op("Sub", X, g.const(offset, "offset"))
    return z if np.all(factor == 1.0) else g.op("Mul", z, g.const(factor, "factor"))


def _kernel_block(g: _Graph, model: Any, X: str) -> str:
    kernel = model.kernel_
    if isinstance(kernel, (LinearKernel, PolynomialKernel)):
        return _dot_block(g, model, X, kernel)
    return _stationary_block(g, model, X, kernel)


def _dot_block(g: _Graph, model: Any, X: str, kernel: Kernel) -> str:
    mean, scale = _scaling(model)
    z = _affine(g, X, mean, 1.0 / scale)
    centers = np.asarray(model.centers_, dtype=np.float64)
    if isinstance(kernel, LinearKernel):
        return g.op("MatMul", z, g.const(centers.T, "centers_t"))
    assert isinstance(kernel, PolynomialKernel)  # noqa: S101 - _kernel_block's dispatch
    base = g.op("Add", g.op("MatMul", z, g.const(float(kernel.gamma) * centers.T, "centers_t")),
                g.const(float(kernel.coef0)))
    return base if int(kernel.degree) == 1 else g.op("Pow", base, g.const(float(kernel.degree)))


def _stationary_block(g: _Graph, model: Any, X: str, kernel: Any) -> str:
    """A gaussian, laplacian or matern block on inputs divided by the length scales, shifted by the
    centers' mean (fused into the standardisation: ``z = (x - mean') / (scale * sigma)``)."""
    mean, scale = _scaling(model)
    sigma = np.broadcast_to(kernel.length_scales, mean.shape)
    centers = np.asarray(model.centers_, dtype=np.float64) / sigma
    shift = centers.mean(axis=0) if len(centers) else np.zeros_like(mean)
    centers = centers - shift
    z = _affine(g, X, mean + shift * scale * sigma, 1.0 / (scale * sigma))
    if type(kernel) is GaussianKernel:
        cross = g.op("MatMul", z, g.const(-2.0 * centers.T, "centers_t"))
        z_sq = g.op("ReduceSum", g.op("Mul", z, z), g.ints([1]), keepdims=1)
        d2 = g.op("Relu", g.op("Add", g.op("Add", cross, z_sq), g.const((centers**2).sum(axis=1)[None, :], "c_sq")))
        return g.op("Exp", g.op("Mul", d2, g.const(-0.5)))
    diff = g.op("Sub", g.op("Unsqueeze", z, g.ints([1])), g.const(centers[None, :, :], "centers"))
    if type(kernel) is LaplacianKernel:
        r = g.op("ReduceSum", g.op("Abs", diff), g.ints([2]), keepdims=0)
        return g.op("Exp", g.op("Neg", r))
    r = g.op("Sqrt", g.op("ReduceSum", g.op("Mul", diff, diff), g.ints([2]), keepdims=0))
    return _matern(g, r, float(kernel.nu))


def _matern(g: _Graph, r: str, nu: float) -> str:
    """Matern of the scaled distance ``r`` (``MaternKernel``'s three formulas)."""
    if nu == 0.5:
        return g.op("Exp", g.op("Neg", r))
    s = g.op("Mul", r, g.const(math.sqrt(3.0) if nu == 1.5 else math.sqrt(5.0)))
    poly = g.op("Add", s, g.const(1.0))
    if nu == 2.5:
        poly = g.op("Add", poly, g.op("Mul", g.op("Mul", s, s), g.const(1.0 / 3.0)))
    return g.op("Mul", poly, g.op("Exp", g.op("Neg", s)))


def _classifier_outputs(g: _Graph, model: Any, scores: str, outputs: list[str], role: str) -> None:
    """``label`` (``predict``: the positive side of one score, or the largest score) and the scores or
    the probabilities."""
    from onnx import TensorProto

    classes = _label_values(model.classes_)
    binary = len(classes) == 2
    if binary:
        positive = g.op("Cast", g.op("Greater", scores, g.const(0.0)), to=TensorProto.INT64)
        index = g.op("Reshape", positive, g.ints([-1]))
    else:
        index = g.op("ArgMax", scores, axis=1, keepdims=0)
    g.op("Gather", g.labels(classes), index, axis=0, out=outputs[0])
    if role == "scores":
        _as_returned(g, scores, outputs[1], flat=binary)
        return
    if binary:  # [1 - sigmoid(f), sigmoid(f)]
        p = g.op("Sigmoid", scores)
        g.op("Concat", g.op("Sub", g.const(1.0), p), p, axis=1, out=outputs[1])
    elif model.multi_class == "multinomial":
        g.op("Softmax", scores, axis=1, out=outputs[1])
    else:  # one-vs-rest: the sigmoids normalised by their row sum, as scikit-learn's
        p = g.op("Sigmoid", scores)
        g.op("Div", p, g.op("ReduceSum", p, g.ints([1]), keepdims=1), out=outputs[1])


__all__ = ["MIN_OPSET", "OnnxExportError", "check_exportable", "register_converters", "save_onnx", "to_onnx"]
