"""What every daskkrr estimator shares: parameter checks, the kernel, standardisation, predict, save.

A fitted model is ``f(x) = k(scale(x), centers_) @ coef_ + intercept_`` whatever
solved for ``coef_`` (FALKON's CG, the direct Nystrom solve or exact kernel ridge).
Each estimator declares its parameters once, in scikit-learn's
``_parameter_constraints``; :meth:`KernelModelBase._validate_params` checks them
(with a hint of what each parameter means) and then runs :meth:`_check_params`
for what a constraint cannot say. :mod:`daskkrr.models.schema` derives the TOML
keys and command-line flags from the same declarations.
"""

from __future__ import annotations

import logging
import math
import re
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import Tags
from sklearn.utils._param_validation import (
    Interval,
    InvalidParameterError,
    Options,
    make_constraint,
)
from sklearn.utils.validation import check_is_fitted, validate_data

from daskkrr.data.feature_names import check_feature_names
from daskkrr.data.inputs import is_in_memory, load_features

# predict's block functions live apart from the estimators: a worker unpickling them imports no scikit-learn
from daskkrr.data.predict_rows import (
    check_extreme_rows,
    check_finite_rows,
    checked_rows,
    predict_block,
    predict_std_block,
)
from daskkrr.data.sparse import is_sparse_array
from daskkrr.kernels import Kernel, kernel_key, make_kernel
from daskkrr.kernels.engine import engine_for
from daskkrr.kernels.sparse import cast_rows
from daskkrr.parallel.center_chunks import chunked_decision, chunked_matvec
from daskkrr.solvers.variance import posterior_from_model, predict_with_std

if TYPE_CHECKING:  # annotations only: the estimators build no dask graph here
    import dask.array as da

logger = logging.getLogger("daskkrr")

#: What a parameter means, appended to the message when its value is refused.
HINTS = {
    "sigma": ("the kernel length scale, e.g. sigma=1.0, one per feature (a vector of length n_features, "
              "gaussian/laplacian/matern only), or sigma=None for sqrt(n_features)"),
    "penalty": "the ridge penalty lambda, e.g. penalty=1e-6",
    "n_centers": "the number of Nystrom centers, e.g. n_centers=1000",
    "max_iter": "the number of CG iterations, e.g. max_iter=50",
    "tol": "the relative residual at which CG stops, e.g. tol=1e-4",
    "chunks": "rows per block, or chunks=None to keep the input's",
    "preconditioner_rows": "rows sampled for the preconditioner, 'auto' (by expected time) or None (FALKON's own)",
    "random_state": "a seed, e.g. random_state=0",
    "max_samples": "the largest n for the n x n kernel matrix, e.g. max_samples=20000",
}


class ParameterError(InvalidParameterError):
    """An estimator parameter has a value its constraints refuse; ``parameter`` names it."""

    def __init__(self, message: str, parameter: str | None = None):
        super().__init__(message)
        self.parameter = parameter


def positive(kind: type) -> Interval:
    """``kind`` (Integral or Real) > 0; also refuses inf and NaN."""
    if kind is Integral:
        return Interval(Integral, 1, None, closed="left")
    return Interval(Real, 0, None, closed="neither")


def store_params(estimator: BaseEstimator, params: dict[str, Any]) -> None:
    """The whole body of an estimator's ``__init__``: ``store_params(self, locals())``.

    scikit-learn's contract is that ``__init__`` stores every parameter, unchanged,
    under its own name and does nothing else (``clone``, ``get_params`` and
    ``set_params`` rely on it); checks and conversions happen in ``fit``.

    Parameters
    ----------
    estimator : BaseEstimator
        The estimator being constructed (``self``).
    params : dict
        ``locals()`` at the top of ``__init__``: ``self`` and the parameters.
    """
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


def describe_constraints(constraints: list[Any]) -> str:
    """Constraints in words, as scikit-learn's messages write them (options sorted)."""
    words = []
    for constraint in (make_constraint(c) for c in constraints):
        if constraint.hidden:
            continue
        if isinstance(constraint, Options):
            words.append("one of " + ", ".join(repr(o) for o in sorted(constraint.options, key=str)))
        else:
            words.append(str(constraint))
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def accepts_bool(constraints: Any) -> bool:
    """Whether True/False is a meaningful value (scikit-learn counts bools as integers)."""
    if constraints == "no_validation":
        return True
    return any(c in ("boolean", "verbose", bool, np.bool_, object) for c in constraints)


class KernelModelBase(BaseEstimator):
    """Parameter checks, kernel, standardisation, predict and save shared by all estimators.

    Not used directly; subclasses set ``__init__`` and ``_parameter_constraints``.
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "kernel": [str, dict, Kernel],
        "sigma": [positive(Real), "array-like", None],
        "penalty": [positive(Real)],
        "kernel_params": [dict, None],
        "standardize": ["boolean"],
        "chunks": [positive(Integral), None],
        "verbose": ["boolean"],
    }
    #: Return 1-D coefficients/predictions for a 1-D target (regressors).
    _squeeze_single_target = True
    #: Whether fit and predict take scipy sparse X (CSR/CSC in memory, or a dask array of sparse blocks).
    _sparse_input: ClassVar[bool] = False
    #: What to use instead, said when sparse X is refused.
    _sparse_alternative: ClassVar[str] = (
        "FalkonRegressor or FalkonClassifier, which take sparse X, or pass X.toarray() if it fits in memory"
    )

    # ----------------------------------------------------------------- checks
    def _validate_params(self) -> None:
        """Check every parameter against ``_parameter_constraints``, then :meth:`_check_params`."""
        params = self.get_params(deep=False)
        for name, constraints in self._parameter_constraints.items():
            value = params.get(name)
            if isinstance(value, (bool, np.bool_)) and not accepts_bool(constraints):
                raise self._parameter_error(name, value)
        try:
            super()._validate_params()
        except InvalidParameterError as exc:
            found = re.match(r"The '(\w+)' parameter of", str(exc))
            if found is None or found.group(1) not in params:
                raise
            raise self._parameter_error(found.group(1), params[found.group(1)]) from None
        self._check_params()

    def _parameter_error(self, name: str, value: Any) -> ParameterError:
        hint = HINTS.get(name, "")
        return ParameterError(
            f"{name} must be {describe_constraints(self._parameter_constraints[name])}; got {value!r} "
            f"({type(value).__name__})" + (f"; {hint}" if hint else ""),
            parameter=name,
        )

    def _check_params(self) -> None:
        """Checks a constraint cannot express; subclasses extend it."""
        # Kernel name and parameters (e.g. polynomial gamma > 0), before any pass over the data;
        # the length of a per-feature sigma is checked once the number of features is known.
        self._make_kernel(None)

    def _make_kernel(self, n_features: int | None) -> Kernel:
        """The kernel with resolved parameters for ``n_features`` features (None: not known yet)."""
        kernel = self._unchecked_kernel(n_features)
        scales = getattr(kernel, "sigma", None)
        if isinstance(scales, tuple) and n_features is not None and len(scales) != n_features:
            raise ParameterError(
                f"sigma has {len(scales)} length scales but X has d={n_features} features; pass one "
                f"length scale per feature (a vector of length {n_features}) or a single number",
                parameter="sigma",
            )
        return kernel

    def _unchecked_kernel(self, n_features: int | None) -> Kernel:
        params = dict(self.kernel_params or {})
        name = self.kernel if isinstance(self.kernel, str) else None
        if isinstance(self.kernel, Kernel):
            return self.kernel
        if name is not None:
            kernel_key(name)  # an unknown (misspelt) name is named as such, not as a kernel taking no sigma
        if name is not None and name.lower() in ("gaussian", "rbf", "laplacian", "laplace", "matern"):
            # None: the median-distance heuristic for standardised features (squared distances ~ 2 d).
            params.setdefault("sigma", length_scale(self.sigma, n_features))
        elif self.sigma is not None and name is not None:
            per_feature = " (per-feature length scales apply to the stationary kernels)" if np.ndim(self.sigma) else ""
            raise ValueError(f"kernel {self.kernel!r} takes no sigma{per_feature}; pass sigma=None")
        return make_kernel(self.kernel, **params)

    def _feature_dtype(self) -> str:
        """Precision of the kernel blocks; estimators with a ``dtype`` parameter override it."""
        return "float64"

    # ------------------------------------------------------------ input checks
    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False  # a fixed random_state gives the same model
        tags.input_tags.sparse = self._sparse_input
        tags.input_tags.allow_nan = False
        tags.target_tags.required = True
        return tags

    #: dtype scikit-learn's ``check_array`` gives an in-memory target ("numeric": float for
    #: object arrays of numbers; None keeps class labels as they are).
    _target_dtype: ClassVar[str | None] = "numeric"

    def _check_fit_input(self, X: Any, y: Any) -> tuple[Any, Any]:
        """In-memory ``X`` and ``y`` through scikit-learn's ``validate_data``; others as they are.

        numpy arrays, lists and pandas objects get scikit-learn's checks and messages
        (sparse, empty, complex, object dtypes, ``y=None``) and set ``n_features_in_``.
        NaN and inf are left to the statistics pass, whose message names the rows.
        Dask arrays, xarray and Zarr inputs are checked lazily by the fit's passes.
        """
        self._refuse_sparse(X)
        if not is_in_memory(X):
            return X, y
        x_checks = dict(accept_sparse=self._sparse_formats(), dtype="numeric", ensure_all_finite=False)
        if y is not None and not is_in_memory(y):  # a lazy target: checked by the passes
            return validate_data(self, X, **x_checks), y
        y_checks = dict(ensure_2d=False, dtype=self._target_dtype, ensure_all_finite=False)
        return validate_data(self, X, y, validate_separately=(x_checks, y_checks))

    def _sparse_formats(self) -> tuple[str, ...] | bool:
        """``accept_sparse`` for scikit-learn's checks: CSR (other formats converted to it) or none."""
        return ("csr", "csc") if self._sparse_input else False

    def _refuse_sparse(self, X: Any) -> None:
        """TypeError naming this estimator and the alternatives for sparse ``X`` it cannot take."""
        if is_sparse_array(X) and not self._sparse_input:
            raise TypeError(
                f"{type(self).__name__} does not take sparse X (got {type(X).__name__} of shape {X.shape}); use "
                f"{self._sparse_alternative}"
            )

    def _check_predict_input(self, X: Any) -> Any:
        """In-memory ``X`` for predict through scikit-learn's checks, then NaN/inf rows refused and scaled as
        in fit; sparse ``X`` stays sparse (CSR)."""
        self._refuse_sparse(X)
        Xn = validate_data(self, X, reset=False, accept_sparse=self._sparse_formats(), dtype="numeric",
                           ensure_all_finite=False)
        check_finite_rows(Xn, 0)
        return self.scaler_.transform(Xn) if self.scaler_ is not None else Xn

    # --------------------------------------------------------------- targets
    def _encode_targets(self, y: da.Array) -> da.Array:
        """Regression: targets as float64 of shape (n, t)."""
        Y = y.astype(np.float64)
        return Y[:, None] if Y.ndim == 1 else Y.rechunk({1: -1}, method="tasks")

    # --------------------------------------------------------------- predict
    def _check_fitted(self) -> None:
        """``NotFittedError`` (scikit-learn's) unless the model is fitted."""
        check_is_fitted(self, "coef_")

    def _raw_decision(self, X: Any) -> Any:
        """``k(scale(X), Z) coef + intercept``: in-memory in, numpy out; anything else, a lazy dask array."""
        self._check_fitted()
        Xs, in_memory = self._scaled(X, self._feature_dtype())
        coef2 = self.coef_.reshape(self.coef_.shape[0], -1)
        if in_memory:
            if self._centers_in_chunks():
                out = chunked_matvec(Xs, self.kernel_, self.centers_, coef2)
            else:
                out = engine_for(self.kernel_).matvec(self.kernel_, Xs, self.centers_, coef2)
            return (out + self.intercept_).astype(self._output_dtype(), copy=False)
        t = coef2.shape[1]
        if self._centers_in_chunks():  # each task reads one chunk of the centers; no process holds them all
            streamed = chunked_decision(Xs.map_blocks(checked_rows, dtype=Xs.dtype), self.kernel_, self.centers_,
                                        coef2) + self.intercept_
            return streamed.astype(self._output_dtype(), copy=False)
        out = Xs.map_blocks(
            predict_block, self.kernel_, self.centers_, coef2, self.intercept_,
            dtype=np.float64, chunks=(Xs.chunks[0], (t,)),
        )
        return out.astype(self._output_dtype(), copy=False)

    def _scaled(self, X: Any, dtype: Any) -> tuple[Any, bool]:
        """``X`` checked and scaled as in fit, in ``dtype``: numpy or CSR (True), or a lazy dask array (False).

        In-memory ``X`` gets scikit-learn's checks (2-D, numeric, sparse if taken, ``n_features_in_``) and
        its NaN, inf and extreme rows named; a lazy one is checked by the passes that read it.
        """
        check_feature_names(self, X)
        if is_in_memory(X):
            Xs = self._check_predict_input(X)
            check_extreme_rows(Xs, 0, dtype)
            return cast_rows(Xs, dtype), True
        self._refuse_sparse(X)
        Xd = load_features(X, self.chunks)
        self._check_n_features(Xd.shape)
        return (self.scaler_.transform(Xd) if self.scaler_ is not None else Xd).astype(dtype), False

    def _centers_in_chunks(self) -> bool:
        """True when ``centers_`` is a lazy array (read from a model's Zarr store, chunked by rows)."""
        return not is_in_memory(self.centers_)

    def _decision_and_std(self, X: Any) -> tuple[Any, Any]:
        """``(k(scale(X), Z) coef + intercept, posterior std)``, both ``(n, t)``: numpy for in-memory
        input, two lazy dask arrays of one blockwise computation otherwise (each kernel block built once).

        The posterior holds ``M x M`` factors, so the centers of a model that has one are read whole here."""
        self._check_fitted()
        post = posterior_from_model(self)
        exact = getattr(self, "std_method", "exact") == "exact"  # the fast variance unless asked for the exact one
        Xs, in_memory = self._scaled(X, self._feature_dtype())
        centers = np.asarray(self.centers_)
        coef2 = np.asarray(self.coef_).reshape(self.coef_.shape[0], -1)
        t = coef2.shape[1]
        if in_memory:
            out = predict_with_std(Xs, self.kernel_, centers, coef2,
                                   self.intercept_, post, exact=exact).astype(self._output_dtype(), copy=False)
            return out[:, :t], out[:, t:]
        both = Xs.map_blocks(
            predict_std_block, self.kernel_, centers, coef2, self.intercept_, post, exact,
            dtype=np.float64, chunks=(Xs.chunks[0], (2 * t,)),
        ).astype(self._output_dtype(), copy=False)
        return both[:, :t], both[:, t:]

    def _output_dtype(self) -> np.dtype:
        """float32 for a model fitted on float32 features (its ``coef_`` is float32), float64 otherwise."""
        return np.dtype(np.float32) if self.coef_.dtype == np.float32 else np.dtype(np.float64)

    def _check_n_features(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 2 or shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has shape {tuple(shape)} but this model was fitted on {self.n_features_in_} features; "
                f"pass the same {self.n_features_in_} columns, in the same order, as in fit"
            )

    # ------------------------------------------------------------ persistence
    def save(self, path: Any, *, overwrite: bool = False, store: str = "auto") -> Any:
        """Save the fitted model (arrays + JSON metadata, no pickle); see :func:`daskkrr.load`.

        ``store`` says where the centers and coefficients go: "npz" (with the other arrays),
        "zarr" (a chunked Zarr store in the folder, read lazily by the loaded model's predict) or
        "auto" (Zarr from :data:`~daskkrr.models.persistence.ZARR_MIN_BYTES`; see :func:`save_model`)."""
        from daskkrr.models.persistence import save_model

        return save_model(self, path, overwrite=overwrite, store=store)


def length_scale(sigma: Any, n_features: int | None) -> float | tuple[float, ...]:
    """The ``sigma`` parameter as a stationary kernel takes it: a float, or a tuple (one per feature).

    None gives ``sqrt(n_features)`` (1 while the number of features is unknown). A
    vector must be 1-D, non-empty, finite and positive; :class:`ParameterError` otherwise.
    """
    if sigma is None:
        return math.sqrt(n_features) if n_features else 1.0
    if isinstance(sigma, Real):
        return float(sigma)
    try:
        scales = np.asarray(sigma, dtype=np.float64)
    except (TypeError, ValueError):  # a dict, strings, ragged lists
        scales = np.asarray([np.nan])
    if scales.ndim == 0 and np.isfinite(scales) and scales > 0:
        return float(scales)
    if scales.ndim != 1 or not scales.size or not np.all(np.isfinite(scales)) or not np.all(scales > 0):
        raise ParameterError(
            f"sigma must be a positive number or a 1-D vector of positive, finite length scales (one per "
            f"feature); got {sigma!r}; {HINTS['sigma']}",
            parameter="sigma",
        )
    return tuple(float(v) for v in scales)


__all__ = ["HINTS", "KernelModelBase", "ParameterError", "accepts_bool", "describe_constraints", "length_scale",
           "positive"]
