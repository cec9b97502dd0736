"""Online and sliding-window kernel ridge regression (Ray and Musco): ``partial_fit`` on a stream.

The sampling is :mod:`daskkrr.solvers.online_rls`, the regression and its
statistics :mod:`daskkrr.solvers.online`; this module is the estimator: input
checks (all before any update, so a refused batch leaves the model as it was),
batching, reading only the new rows of a growing Zarr store, and the fitted
attributes every daskkrr model has (``centers_``, ``coef_``: ``predict`` and
``save`` are those of the other estimators).

Where the work runs
    A batch of ``batch_size`` rows is scored against the current dictionary in
    one blockwise computation (:func:`daskkrr.solvers.online.batch_projections`
    over the batch's row blocks; for a Zarr store or a dask array it is a
    :meth:`~daskkrr.parallel.executor.BlockPasses.map` on the Dask workers):
    ``O(b m (d + m))`` flops for ``m`` landmarks, two triangular solves per row --
    the dominant cost once the dictionary has a few thousand landmarks. The
    sequential part -- accept or reject each row, in arrival order, and the
    rank-``b`` update of the statistics -- runs on the client. It holds the
    batch's rows and its coordinates against the dictionary: about
    ``8 b (d + m + r + k)`` bytes for ``m`` landmarks, ``r`` basis vectors and
    ``k`` rows kept from the batch, plus ``O(k b (d + m))`` flops for the
    rows kept. Batches of 1 000 to 100 000 rows suit dictionaries of up to a few
    thousand landmarks. With a window the sweep of Algorithm 1 runs over the
    batch and the surviving landmarks on the client (``O(s (b + s)(d + s))``)
    and the statistics are rebuilt from the kept window rows
    (``O(W s (d + s))``); see :mod:`daskkrr.solvers.online`.
"""

from __future__ import annotations

import dataclasses
import logging
import textwrap
import time
import warnings
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.utils import Tags
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import validate_data

from daskkrr.data.extremes import check_feature_magnitudes, check_target_magnitudes
from daskkrr.data.feature_names import check_feature_names, fitted_feature_names
from daskkrr.data.inputs import is_in_memory, is_store, load_training_data
from daskkrr.data.scaling import Standardizer
from daskkrr.data.sparse import column_absmax
from daskkrr.kernels.sparse import cast_rows, is_sparse
from daskkrr.models.kernel_model import KernelModelBase, positive, store_params
from daskkrr.models.regressors import PARAM_DOCS, _RegressorMixin
from daskkrr.parallel import Executor
from daskkrr.solvers.online import (
    OnlineState,
    Projections,
    batch_projections,
    normalise_saved_scalars,
    online_step,
    ridge_coefficients,
    stack_rows,
    window_step,
)

logger = logging.getLogger("daskkrr")

_ONLINE_DOCS = {
    "penalty": """penalty : float, default=1e-6
    Ridge penalty lambda of the normalised objective
    ``(1/n) sum_i (y_i - f(x_i))^2 + lambda ||f||^2`` over the ``n`` rows seen (or
    the window's ``n``), as for every daskkrr estimator: after ``n`` rows the
    model equals ``ExactKernelRidge(penalty=penalty, standardize=False)`` on them
    when every point is kept. The regression's ridge ``penalty * n`` grows with
    the stream; the sampler keeps its own fixed ridge ``gamma``.""",
    "gamma": """gamma : float, default=10.0
    Ridge of the leverage-score sampler in kernel-matrix units (as SQUEAK's
    ``gamma``), fixed for the whole stream as in Ray and Musco: the scores,
    the spectral guarantee and the dictionary size
    ``O(d_eff(gamma) log n log(||K|| / gamma))`` use it. A smaller ``gamma``
    keeps more landmarks (a closer approximation, more time and memory). The
    guarantee at ``gamma`` also holds at every larger ridge, so the model is
    well approximated while ``penalty * n >= gamma``. The default keeps about
    1 700 landmarks for 20 000 rows of 564_fried (10 standardised features),
    where the model's R2 matches ``FalkonRegressor``'s defaults; 1.0 (the
    ridge of the old unnormalised default) kept 5 400 for the same R2.""",
    "standardize": """standardize : bool, default=True
    Measure the length scales of the stationary kernels (Gaussian, Laplacian,
    Matern) in standardised feature units, as every daskkrr estimator does:
    ``sigma`` (or its default ``sqrt(n_features)``) is multiplied, feature by
    feature, by the standard deviation of the rows of the first ``fit`` or
    ``partial_fit`` call (one pass), fixed for the stream since the dictionary
    lives in those coordinates (``feature_scale_``). For a shift-invariant
    kernel this is standardising the features; other kernels see the raw
    features, and the targets are not centred (no intercept). False: raw units.""",
    "window": """window : int or None, default=None
    Keep only the last ``window`` rows (counted in rows, not batches): the
    sliding-window Algorithm 1 with reverse online leverage scores. None: the
    unbounded online model.""",
    "c": """c : float, default=4.0
    Oversampling constant: a row is kept with probability
    ``min(c * l~, 1)``. Larger keeps more landmarks and makes the spectral
    guarantee hold for more streams (the theory takes ``c = O(log n)``).""",
    "batch_size": """batch_size : int, default=1000
    Rows scored together against the dictionary (one blockwise computation);
    ``fit`` and ``partial_fit`` split their input into batches of this size.
    The unbounded model does not depend on it; the window model runs
    Algorithm 1 once per batch (per row with ``batch_size=1``).""",
    "random_state": """random_state : int or None, default=None
    Seed of the sampling; the generator's state is saved with the model, so
    a resumed stream continues exactly.""",
}

_FITTED = """
    Attributes
    ----------
    centers_ : ndarray of shape (r, n_features)
        The landmarks spanning the model (the dictionary, without those already
        in the span of earlier ones).
    coef_ : ndarray of shape (r,) or (r, n_targets)
        ``f(x) = sum_j coef_j k(x, centers_j)``.
    center_indices_ : ndarray of shape (r,)
        Stream row numbers of the centers.
    center_weights_ : ndarray of shape (r,)
        ``1 / p`` of the centers (their weight in the leverage-score estimates).
    n_landmarks_ : int
        Size of the sampled dictionary.
    feature_scale_ : ndarray of shape (n_features,)
        Per-feature standard deviations of the first call's rows that multiply
        the stationary kernel's length scales (ones with ``standardize=False``
        or another kernel).
    n_rows_seen_ : int
        Rows of the stream processed; a Zarr store passed to ``partial_fit`` is
        read from this row on.
    state_ : OnlineState
        Dictionary, factors and sufficient statistics (see :mod:`daskkrr.solvers.online`).
    intercept_ : ndarray of shape (n_targets,)
        Zeros: the model has no intercept (centre the targets if needed).
"""


ONLINE_PARAMS = ("kernel", "sigma", "penalty", "gamma", "standardize", "window", "c", "batch_size", "kernel_params",
                 "chunks", "random_state", "verbose")


def _params_doc() -> str:
    entries = "\n".join(textwrap.indent({**PARAM_DOCS, **_ONLINE_DOCS}[name], "    ") for name in ONLINE_PARAMS)
    return f"""Parameters
    ----------
{entries}
"""


class OnlineKernelRidge(_RegressorMixin, KernelModelBase):
    __doc__ = f"""Online (or sliding-window) kernel ridge regression on sampled landmarks.

    ``partial_fit`` processes rows in arrival order: each is kept as a landmark
    with probability ``min(c l~, 1)`` (its approximate online ridge leverage
    score, Ray and Musco; the window variant runs their Algorithm 1), then the
    ridge regression in the span of the landmarks is updated from sufficient
    statistics; past rows are never stored (except the last ``window`` rows of
    a window model). ``fit`` is ``partial_fit`` over the rows in order from a
    fresh state. ``predict`` works after any batch.

    {_params_doc()}{_FITTED}
    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr.models.online import OnlineKernelRidge
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(600, 2)); y = np.sin(X[:, 0])
    >>> model = OnlineKernelRidge(penalty=1e-3, random_state=0)
    >>> for start in range(0, 600, 200):
    ...     model = model.partial_fit(X[start:start + 200], y[start:start + 200])
    >>> model.n_rows_seen_
    600
    >>> bool(model.score(X, y) > 0.95)
    True
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "kernel": KernelModelBase._parameter_constraints["kernel"],
        "sigma": KernelModelBase._parameter_constraints["sigma"],
        "penalty": [positive(Real)],
        "gamma": [positive(Real)],
        "standardize": ["boolean"],
        "window": [positive(Integral), None],
        "c": [positive(Real)],
        "batch_size": [positive(Integral)],
        "kernel_params": [dict, None],
        "chunks": [positive(Integral), None],
        "random_state": [Interval(Integral, 0, None, closed="left"), None],
        "verbose": ["boolean"],
    }

    def __init__(
        self,
        kernel: Any = "gaussian",
        sigma: float | None = None,
        penalty: float = 1e-6,
        gamma: float = 10.0,
        standardize: bool = True,
        window: int | None = None,
        c: float = 4.0,
        batch_size: int = 1000,
        kernel_params: dict | None = None,
        chunks: int | None = None,
        random_state: int | None = None,
        verbose: bool = False,
    ):
        store_params(self, locals())

    #: Sparse batches (CSR/CSC, dask arrays of sparse blocks, sparse stores): their kernel blocks come from sparse
    #: products; the landmarks kept are dense rows, and a window model keeps its window rows sparse.
    _sparse_input: ClassVar[bool] = True

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any = None) -> OnlineKernelRidge:
        """Start a new stream and process ``X`` in row order (``partial_fit`` from scratch)."""
        self._validate_params()
        return self._process(X, y, restart=True)

    def partial_fit(self, X: Any, y: Any = None) -> OnlineKernelRidge:
        """Process the next rows of the stream, in order.

        Parameters
        ----------
        X : array or scipy sparse matrix of shape (b, n_features), dask array, or a Zarr store path
            The new rows (sparse rows, in memory or as dask blocks of CSR matrices,
            stay sparse). A store (path, zarr group, xarray Dataset) is the whole
            stream so far: only its rows after ``n_rows_seen_`` are read, so a
            store that grows by appending is consumed incrementally; a store with
            fewer rows than were already seen is refused.
        y : array of shape (b,) or (b, n_targets), or None
            Targets (None for a store holding ``y``).

        Every check (features, targets, NaN and inf, parameters changed since
        the stream began, a shrunk store) is done before anything changes: a
        refused call leaves the model as it was. With ``standardize=True`` the
        first call's rows fix the feature scale, so a stream equals ``fit`` over
        the same rows when its first call holds the same rows.
        """
        self._validate_params()
        return self._process(X, y, restart=not hasattr(self, "state_"))

    def _process(self, X: Any, y: Any, restart: bool) -> OnlineKernelRidge:
        self._refuse_sparse(X)
        # The input checks may set n_features_in_/feature_names_in_: put them back if anything is refused.
        saved = {k: getattr(self, k) for k in ("n_features_in_", "feature_names_in_") if hasattr(self, k)}
        try:
            return self._update(X, y, restart)
        except BaseException:
            for key in ("n_features_in_", "feature_names_in_"):
                if key in saved:
                    setattr(self, key, saved[key])
                elif hasattr(self, key):
                    delattr(self, key)
            raise

    def _update(self, X: Any, y: Any, restart: bool) -> OnlineKernelRidge:
        started = time.perf_counter()
        executor = Executor()
        first_row = 0 if restart else int(self.state_.n_seen)
        source = _Source.open(self, X, y, first_row, restart, executor)
        if restart:
            scale = self._feature_scale(source.X, source.n_features)
            kernel = _scaled_kernel(self._make_kernel(source.n_features), scale)
            state = OnlineState.empty(self.gamma, self.c, self.penalty, self.window, source.n_features,
                                      source.n_targets)
            rng = np.random.default_rng(self.random_state)
        else:
            if not is_in_memory(X):
                check_feature_names(self, X)  # in-memory input met validate_data(reset=False) already
            self._check_same_stream(source)
            kernel, state, rng = self.kernel_, self.state_, _copy_rng(self.rng_)
        for start in range(0, source.n_rows, int(self.batch_size)):
            stop = min(start + int(self.batch_size), source.n_rows)
            Xb, Yb, proj = source.batch(start, stop, kernel, state)
            if self.window is None:
                state, _ = online_step(state, Xb, Yb, proj, kernel, rng)  # type: ignore[arg-type]
            else:
                state, _ = window_step(state, Xb, Yb, kernel, rng)
            if self.verbose:
                logger.info("online KRR: %d rows seen, %d landmarks", state.n_seen, state.landmarks.shape[0])
        if restart:
            self.feature_scale_ = scale
            # float32 features give float32 coefficients and predictions, as in scikit-learn
            in_memory = isinstance(source.X, np.ndarray) or is_sparse(source.X)
            self._input_dtype = getattr(X, "dtype", None) if in_memory else source.X.dtype
            self.n_features_in_ = source.n_features
            # validate_data set the names of in-memory input; a lazy one (dask DataFrame, store) carries its own
            self.__dict__.update(fitted_feature_names(self, X, source.n_features))
        self._set_fitted(kernel, state, rng, source.one_d if restart else self._one_d)
        self.fit_time_ = float(time.perf_counter() - started)
        return self

    def _check_same_stream(self, source: _Source) -> None:
        state = self.state_
        if source.n_targets != state.n_targets:
            raise ValueError(f"y has {source.n_targets} target column(s) but the stream so far has "
                             f"{state.n_targets}; pass the same targets as before, or call fit to restart")
        changed = [name for name, now, then in (("penalty", float(self.penalty), state.penalty),
                                                 ("gamma", float(self.gamma), state.lam), ("c", float(self.c), state.c),
                                                 ("window", self.window, state.window))
                   if now != then]
        if (_scaled_kernel(self._make_kernel(state.n_features), self.feature_scale_).to_dict()
                != self.kernel_.to_dict()):
            changed.append("kernel")
        if changed:
            raise ValueError(f"{', '.join(changed)} changed since the stream began; partial_fit continues the "
                             "stream with its parameters: set them back, or call fit to start a new stream")

    def _feature_scale(self, X: Any, n_features: int) -> np.ndarray:
        """Standard deviations of the first call's features (one pass), or ones when nothing is scaled."""
        if not (self.standardize and self._make_kernel(n_features).is_stationary) or X.shape[0] < 2:
            return np.ones(n_features)
        return np.asarray(Standardizer(with_mean=False).fit(X).scale_, dtype=np.float64)

    def _set_fitted(self, kernel: Any, state: OnlineState, rng: np.random.Generator, one_d: bool) -> None:
        coef = ridge_coefficients(state)
        basis = state.basis
        self.kernel_ = kernel
        self.state_ = state
        self.rng_ = rng
        self._one_d = one_d
        self.scaler_ = None
        self.centers_ = np.ascontiguousarray(state.landmarks[basis])
        self.coef_ = coef[:, 0] if one_d else coef
        if getattr(self, "_input_dtype", None) == np.float32:
            self.coef_ = self.coef_.astype(np.float32)
        self.center_indices_ = state.landmark_rows[basis]
        self.center_weights_ = 1.0 / state.landmark_probs[basis] if basis.size else np.zeros(0)
        t = state.n_targets
        self.y_mean_ = np.zeros(t)
        self.intercept_ = np.zeros(t)
        self.residuals_ = np.zeros((1, t))
        self.n_iter_, self.converged_, self.jitter_ = 0, True, 0.0
        self.n_rows_seen_ = int(state.n_seen)
        self.n_landmarks_ = int(state.landmarks.shape[0])

    # ----------------------------------------------------------- persistence
    def _saved_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """JSON scalars and arrays that let a loaded model continue the stream exactly."""
        meta = {**self.state_.scalars(), "rng": self.rng_.bit_generator.state, "one_d": self._one_d,
                "feature_scale": self.feature_scale_.tolist()}
        return meta, self.state_.arrays()

    def _expected_saved_kernel(self, n_features: int, meta: dict[str, Any]) -> Any:
        """The kernel a saved stream must hold (checked by :func:`daskkrr.load`): the parameters' kernel
        with its length scales in the first call's feature units (``state.feature_scale``)."""
        state = meta.get("state")
        if not isinstance(state, dict):
            raise _field_error("state", f"{type(self).__name__} needs its stream 'state' (a JSON object)")
        saved = state.get("feature_scale")
        if saved is None:  # saved before standardize existed: the kernel is in raw units
            return self._make_kernel(n_features)
        try:
            scale = np.asarray(saved, dtype=np.float64)
        except (TypeError, ValueError):
            scale = np.zeros(0)
        if scale.shape != (n_features,) or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise _field_error("state.feature_scale", f"must be {n_features} finite, positive feature scales; "
                               f"got {saved!r}")
        return _scaled_kernel(self._make_kernel(n_features), scale)

    def _restore_saved_state(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`_saved_state` (called by :func:`daskkrr.load`).

        A state saved in the unnormalised penalty convention is converted with a
        ``FutureWarning`` naming the conversion (:func:`normalise_saved_scalars`);
        ``penalty`` and ``gamma`` are then those of the converted state.
        """
        meta, note = normalise_saved_scalars(meta)
        if note is not None:
            warnings.warn(note, FutureWarning, stacklevel=3)
            self.penalty_converted_from_ = float(meta["lam"])
        state = OnlineState.from_saved(meta, arrays)
        self.penalty, self.gamma = state.penalty, state.lam
        if "feature_scale" not in meta:  # saved before standardize existed: the kernel is in raw units
            self.standardize = False
        self.feature_scale_ = np.asarray(meta.get("feature_scale", np.ones(state.n_features)), dtype=np.float64)
        rng = np.random.default_rng()
        rng.bit_generator.state = meta["rng"]
        self._set_fitted(self.kernel_, state, rng, bool(meta["one_d"]))


def _field_error(field: str, message: str) -> ValueError:
    """A ValueError that names the model file's field (read by :func:`daskkrr.load`)."""
    error = ValueError(message)
    error.field = field  # type: ignore[attr-defined]
    return error


def _scaled_kernel(kernel: Any, scale: np.ndarray) -> Any:
    """A stationary kernel with its length scales multiplied by ``scale`` (per feature); others unchanged."""
    if not kernel.is_stationary or np.all(scale == 1.0):
        return kernel
    return dataclasses.replace(kernel, sigma=tuple(float(v) for v in kernel.length_scales * scale))


def _copy_rng(rng: np.random.Generator) -> np.random.Generator:
    """An independent generator in the same state (the model's is untouched until the update succeeds)."""
    out = np.random.default_rng()
    out.bit_generator.state = rng.bit_generator.state
    return out


@dataclasses.dataclass
class _Source:
    """The new rows of one ``partial_fit`` call, checked, read batch by batch."""

    X: Any
    Y: Any
    n_rows: int
    n_features: int
    n_targets: int
    one_d: bool
    executor: Executor

    @classmethod
    def open(cls, model: OnlineKernelRidge, X: Any, y: Any, first_row: int, restart: bool,
             executor: Executor) -> _Source:
        if is_in_memory(X):
            return cls._in_memory(model, X, y, restart, executor)
        Xd, yd = load_training_data(X, y, model.chunks)
        total = int(Xd.shape[0])
        if is_store(X):
            if total < first_row:
                raise ValueError(
                    f"the store has {total} rows but this model has already seen {first_row}: it shrank, or it "
                    "is another store. partial_fit reads only rows appended since the last call; call fit to "
                    "start a new stream"
                )
            Xd, yd = Xd[first_row:], yd[first_row:]
        if Xd.ndim != 2 or (not restart and Xd.shape[1] != model.n_features_in_):
            raise ValueError(f"X has shape {tuple(Xd.shape)} but this model was fitted on {model.n_features_in_} "
                             "features; pass the same columns, in the same order")
        Y = yd[:, None] if yd.ndim == 1 else yd
        if Xd.shape[0]:  # one pass: NaN/inf rows and the magnitudes, per block (sparse blocks by their entries)
            checks = executor.passes(Xd, Y).map(_block_checks, name="onlinecheck", with_y=True, with_offsets=False)
            bad = [bool(c[0]) for c in checks]
            if any(bad):
                raise ValueError(f"X or y has NaN or inf in the new rows (first in block {_first(bad)}); the "
                                 "batch was refused before any update: clean or impute the rows")
            x_absmax, y_absmax = (np.max([c[k] for c in checks], axis=0) for k in (1, 2))
            _check_stream_magnitudes(x_absmax, y_absmax, Xd.dtype)
        return cls(Xd, Y, int(Xd.shape[0]), int(Xd.shape[1]), int(Y.shape[1]), yd.ndim == 1, executor)

    @classmethod
    def _in_memory(cls, model: OnlineKernelRidge, X: Any, y: Any, restart: bool, executor: Executor) -> _Source:
        x_checks = dict(accept_sparse=model._sparse_formats(), dtype="numeric", ensure_all_finite=False)
        y_checks = dict(ensure_2d=False, dtype="numeric", ensure_all_finite=False)
        Xn, yn = validate_data(model, X, y, reset=restart, validate_separately=(x_checks, y_checks))
        Xn = cast_rows(Xn, np.float64)  # sparse rows stay sparse (CSR)
        yn = np.asarray(yn, dtype=np.float64)
        if yn.ndim not in (1, 2) or yn.shape[0] != Xn.shape[0]:
            raise ValueError(f"y has shape {yn.shape}; expected ({Xn.shape[0]},) or ({Xn.shape[0]}, t)")
        Y = yn.reshape(len(yn), -1)
        bad = np.flatnonzero(_bad_rows(Xn, Y))
        if bad.size:
            raise ValueError(f"X or y has NaN or inf in {bad.size} row(s) of the batch, the first at row "
                             f"{int(bad[0])}; the batch was refused before any update: clean or impute the rows")
        if Xn.shape[0]:
            _check_stream_magnitudes(_column_absmax(Xn), np.abs(Y).max(axis=0), Xn.dtype)
        return cls(Xn, Y, Xn.shape[0], Xn.shape[1], Y.shape[1], yn.ndim == 1, executor)

    def batch(self, start: int, stop: int, kernel: Any, state: OnlineState) -> tuple[np.ndarray, np.ndarray,
                                                                                         Projections | None]:
        """Rows ``start:stop`` and (unbounded stream) their projections on the current dictionary."""
        args = (kernel, state.landmarks, state.landmark_probs, state.sampler_factor, state.basis, state.basis_factor)
        unbounded = state.window is None
        if isinstance(self.X, np.ndarray) or is_sparse(self.X):
            Xb, Yb = self.X[start:stop], self.Y[start:stop]
            return Xb, Yb, batch_projections(Xb, *args) if unbounded else None
        # The dictionary and its factors (m x m, growing with the stream) go to the workers once
        # per batch: as task arguments they were pickled into every block task of the graph.
        parts = self.executor.passes(self.X[start:stop], self.Y[start:stop]).map(
            _block_with_projections, unbounded, *[self.executor.broadcast(a) for a in args], name="onlinescores",
            with_y=True)
        Xb = stack_rows([p[0] for p in parts])
        Yb = np.concatenate([p[1] for p in parts]).astype(np.float64)
        return Xb, Yb.reshape(len(Yb), -1), Projections.concat([p[2] for p in parts]) if unbounded else None


def _check_stream_magnitudes(x_absmax: np.ndarray, y_absmax: np.ndarray, dtype: Any) -> None:
    """Refuse a batch whose raw features (the stream has no standardisation) or targets have
    magnitudes the kernel or the ridge solve cannot represent, before any update."""
    check_feature_magnitudes(np.asarray(x_absmax, dtype=np.float64), standardize=False, fit_dtype=np.float64,
                             input_dtype=dtype)
    check_target_magnitudes(np.asarray(y_absmax, dtype=np.float64))


def _block_with_projections(Xb: Any, Yb: np.ndarray, unbounded: bool, *args: Any) -> tuple[Any, Any, Any]:
    Xb = cast_rows(Xb, np.float64)
    return Xb, np.asarray(Yb), batch_projections(Xb, *args) if unbounded else None


def _bad_rows(Xb: Any, Yb: np.ndarray) -> np.ndarray:
    """Rows with a NaN or inf feature (a stored entry of a sparse row) or target."""
    Y2 = np.asarray(Yb).reshape(len(Yb), -1)
    if is_sparse(Xb):
        csr = cast_rows(Xb, Xb.dtype)
        x_bad = np.zeros(csr.shape[0], dtype=bool)
        x_bad[np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))[~np.isfinite(csr.data)]] = True
    else:
        x_bad = ~np.isfinite(Xb).all(axis=1)
    return x_bad | ~np.isfinite(Y2).all(axis=1)


def _column_absmax(Xb: Any) -> np.ndarray:
    """``max |x_ij|`` per column (of the stored entries of sparse rows), float64."""
    return column_absmax(Xb) if is_sparse(Xb) else np.abs(Xb).max(axis=0).astype(np.float64)


def _block_checks(Xb: Any, Yb: np.ndarray) -> tuple[bool, np.ndarray, np.ndarray]:
    """A block's NaN/inf flag and its feature and target magnitudes per column (empty blocks: zeros)."""
    Y2 = np.asarray(Yb).reshape(len(Yb), -1)
    if not Xb.shape[0]:
        return False, np.zeros(Xb.shape[1]), np.zeros(Y2.shape[1])
    return bool(_bad_rows(Xb, Y2).any()), _column_absmax(Xb), np.abs(Y2).max(axis=0).astype(np.float64)


def _first(flags: list[bool]) -> int:
    return next(i for i, flag in enumerate(flags) if flag)


__all__ = ["OnlineKernelRidge"]
