"""Parameters, fitted state and predict shared by the Nystrom estimators.

``fit`` runs the stages of :mod:`daskkrr.pipeline` (statistics -> centers ->
preconditioner -> operator -> solve) and keeps the small fitted model they
produce: centers, coefficients, kernel, scaling. The per-block arithmetic lives
in :mod:`daskkrr.kernels`; the scheduling of blocks in :mod:`daskkrr.parallel`.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator

from daskkrr.kernels import Kernel, make_kernel
from daskkrr.data.inputs import is_in_memory, load_features
from daskkrr.kernels.engine import engine_for
from daskkrr.parallel.strategies import check_strategy
from daskkrr.pipeline import Stage, nystrom_stages, run_fit
from daskkrr.sampling import CenterSampler, make_sampler
from daskkrr.solvers.sketch import auto_sketch_rows

logger = logging.getLogger("daskkrr")

_DTYPES = ("float32", "float64")


def _check_positive(name: str, value: Any, *, allow_none: bool = False, integer: bool = False) -> None:
    if value is None and allow_none:
        return
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an integer" if integer else "a number"
        raise TypeError(f"{name} must be {what}; got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and value > 0):
        hint = _HINTS.get(name, "")
        raise ValueError(f"{name} must be > 0; got {value!r}" + (f" ({hint})" if hint else ""))


#: What each positive parameter means, for error messages.
_HINTS = {
    "sigma": "the kernel length scale, e.g. sigma=1.0, or sigma=None for sqrt(n_features)",
    "penalty": "the ridge penalty lambda, e.g. penalty=1e-6",
    "n_centers": "the number of Nystrom centers, e.g. n_centers=1000",
    "max_iter": "the number of CG iterations, e.g. max_iter=20",
    "tol": "the relative residual at which CG stops, e.g. tol=1e-7",
    "chunks": "rows per block, or chunks=None to keep the input's",
    "preconditioner_rows": "rows sampled for the preconditioner, 'auto' (4 per center) or None (FALKON's own)",
}


class NystromModelBase(BaseEstimator):
    """Parameters and fitted state shared by the Nystrom estimators (not used directly)."""

    #: "falkon" (preconditioned CG) or "direct" (one Gram pass, M x M solve).
    _solver = "falkon"
    #: Return 1-D coefficients/predictions for a 1-D target (regressors).
    _squeeze_single_target = True

    # ----------------------------------------------------------------- checks
    def _validate_params(self) -> None:
        if self.sigma is not None:
            _check_positive("sigma", self.sigma)
        _check_positive("penalty", self.penalty)
        _check_positive("n_centers", self.n_centers, integer=True)
        if getattr(self, "max_iter", 1) is not None:
            _check_positive("max_iter", getattr(self, "max_iter", 1), integer=True)
        if getattr(self, "tol", 1.0) is not None:
            _check_positive("tol", getattr(self, "tol", 1.0))
        check_strategy(getattr(self, "strategy", "auto"))
        rows = getattr(self, "preconditioner_rows", None)
        if not (rows is None or rows == "auto"):
            _check_positive("preconditioner_rows", rows, integer=True)
        if not isinstance(getattr(self, "fit_intercept", False), (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be True or False; got {self.fit_intercept!r}")
        if self._solver == "direct" and getattr(self, "strategy", "auto") not in ("auto", "gram"):
            raise ValueError(
                f"{type(self).__name__} solves directly from one Gram pass; strategy must be 'auto' or "
                f"'gram', got {self.strategy!r}. Use FalkonRegressor(strategy=...) for the CG strategies"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}; got {self.dtype!r}")
        if self.chunks is not None:
            _check_positive("chunks", self.chunks, integer=True)
        if self.kernel_params is not None and not isinstance(self.kernel_params, dict):
            raise TypeError(f"kernel_params must be a dict or None; got {type(self.kernel_params).__name__}")
        make_sampler(self.sampler) if isinstance(self.sampler, str) else None
        if not isinstance(self.sampler, (str, CenterSampler)):
            raise TypeError(
                f"sampler must be a name or a CenterSampler; got {type(self.sampler).__name__}"
            )
        for flag in ("standardize", "verbose"):
            if not isinstance(getattr(self, flag, False), (bool, np.bool_)):
                raise TypeError(f"{flag} must be True or False; got {getattr(self, flag)!r}")
        if isinstance(self.random_state, bool) or (
            isinstance(self.random_state, numbers.Integral) and self.random_state < 0
        ):
            raise ValueError(f"random_state must be None or an integer >= 0; got {self.random_state!r}")
        if not (self.random_state is None or isinstance(
                self.random_state, (numbers.Integral, np.random.Generator, np.random.RandomState))):
            raise TypeError(
                f"random_state must be None, an integer >= 0 or a numpy Generator; got {self.random_state!r}"
            )
        # Kernel name and parameters (e.g. polynomial gamma > 0), before any pass over the data.
        self._make_kernel(1)

    def _make_kernel(self, n_features: int) -> Kernel:
        params = dict(self.kernel_params or {})
        name = self.kernel if isinstance(self.kernel, str) else None
        if isinstance(self.kernel, Kernel):
            return self.kernel
        if name is not None and name.lower() in ("gaussian", "rbf", "laplacian", "laplace", "matern"):
            # Median-distance heuristic for standardised features: squared distances ~ 2 d.
            params.setdefault("sigma", float(self.sigma) if self.sigma is not None else math.sqrt(n_features))
        elif self.sigma is not None and name is not None:
            raise ValueError(f"kernel {self.kernel!r} takes no sigma; pass sigma=None")
        return make_kernel(self.kernel, **params)

    def _fits_intercept(self) -> bool:
        return bool(getattr(self, "fit_intercept", False))

    def _sketch_rows(self, n: int, n_centers: int) -> int:
        """Rows of the preconditioner's sketch (0: FALKON's own, from the centers)."""
        rows = getattr(self, "preconditioner_rows", None)
        if rows is None:
            return 0
        if rows == "auto":
            return auto_sketch_rows(n, n_centers)
        return min(int(rows), n)

    # --------------------------------------------------------------- the fit
    def _encode_targets(self, y: da.Array) -> da.Array:
        """Regression: targets as float64 of shape (n, t)."""
        Y = y.astype(np.float64)
        return Y[:, None] if Y.ndim == 1 else Y.rechunk({1: -1}, method="tasks")

    def _fit_stages(self) -> tuple[Stage, ...]:
        """The pipeline stages of this estimator's fit (see :mod:`daskkrr.pipeline`)."""
        return nystrom_stages(self._solver)

    def _fit_nystrom(
        self, X: Any, y: Any, checkpoint: Any = None, checkpoint_every: int = 5, resume: bool = False
    ) -> "NystromModelBase":
        self._validate_params()
        ctx = run_fit(self, X, y, self._fit_stages(), checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                      resume=resume, iterative=self._solver == "falkon")
        for name, value in ctx.fitted.items():
            setattr(self, name, value)
        return self

    # --------------------------------------------------------------- predict
    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")

    def _raw_decision(self, X: Any) -> Any:
        """``k(scale(X), Z) coef + y_mean``: numpy in, numpy out; anything else, a lazy dask array."""
        self._check_fitted()
        coef2 = self.coef_.reshape(self.coef_.shape[0], -1)
        if is_in_memory(X):
            Xn = np.asarray(X)
            if Xn.ndim == 1:
                Xn = Xn[None, :] if Xn.shape[0] == self.n_features_in_ else Xn[:, None]
            self._check_n_features(Xn.shape)
            if not np.issubdtype(Xn.dtype, np.number):
                raise TypeError(f"X must be numeric; got dtype {Xn.dtype}")
            _check_finite_rows(Xn, 0)
            Xs = self.scaler_.transform(Xn) if self.scaler_ is not None else Xn
            out = engine_for(self.kernel_).matvec(self.kernel_, np.asarray(Xs, dtype=self.dtype), self.centers_, coef2)
            return out + self.intercept_
        Xd = load_features(X, self.chunks)
        self._check_n_features(Xd.shape)
        Xs = self.scaler_.transform(Xd) if self.scaler_ is not None else Xd
        Xs = Xs.astype(self.dtype)
        t = coef2.shape[1]
        out = Xs.map_blocks(
            _predict_block, self.kernel_, self.centers_, coef2, self.intercept_,
            dtype=np.float64, chunks=(Xs.chunks[0], (t,)),
        )
        return out

    def _check_n_features(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 2 or shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has shape {tuple(shape)} but this model was fitted on {self.n_features_in_} features; "
                f"pass the same {self.n_features_in_} columns, in the same order, as in fit"
            )

    # ------------------------------------------------------------ persistence
    def save(self, path: Any, *, overwrite: bool = False) -> Any:
        """Save the fitted model (arrays + JSON metadata, no pickle); see :func:`daskkrr.load`."""
        from daskkrr.models.persistence import save_model

        return save_model(self, path, overwrite=overwrite)


def _predict_block(
    Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, coef: np.ndarray, y_mean: np.ndarray,
    block_info: dict | None = None,
) -> np.ndarray:
    start = block_info[0]["array-location"][0][0] if block_info and 0 in block_info else 0
    _check_finite_rows(Xb, start)
    return engine_for(kernel).matvec(kernel, Xb, Z, coef) + y_mean


def _check_finite_rows(Xb: np.ndarray, start: int) -> None:
    """Refuse NaN/inf features (their predictions would be NaN), naming the first bad row."""
    if Xb.dtype.kind not in "fc" or np.isfinite(Xb).all():
        return
    bad = np.flatnonzero(~np.isfinite(Xb).reshape(len(Xb), -1).all(axis=1))
    raise ValueError(
        f"X has NaN or inf in {bad.size} row(s) of rows {start}-{start + len(Xb) - 1}, the first at "
        f"row {start + int(bad[0])}; their predictions would be NaN: clean or impute them before predicting"
    )
