"""Classification by one-vs-all regularised least squares on FALKON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import dask.array as da
import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import column_or_1d

from daskkrr.data.inputs import is_in_memory
from daskkrr.models.base import NystromModelBase
from daskkrr.models.kernel_model import store_params
from daskkrr.models.regressors import FALKON_PARAMS, SAMPLE_WEIGHT_DOC, FalkonRegressor, params_doc
from daskkrr.models.weights import check_class_weight, check_sample_weight, class_row_weights, refuse_weighted_std


def _one_vs_all(yb: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Targets in {-1, +1}: one column per class, or one column for two classes."""
    yb = np.asarray(yb).reshape(-1)
    if len(classes) == 2:
        return np.where(yb == classes[1], 1.0, -1.0)[:, None]
    return np.where(yb[:, None] == classes[None, :], 1.0, -1.0)


def _refuse_missing_labels(labels: np.ndarray, start: int) -> None:
    """ValueError naming the first row (``start`` + index) whose label is NaN or None, if any."""
    if labels.dtype.kind == "f":
        missing = np.isnan(labels)
    elif labels.dtype.kind == "O":
        missing = np.fromiter((v is None or (isinstance(v, float) and math.isnan(v)) for v in labels), bool,
                              count=labels.size)
    else:
        return
    if missing.any():
        rows = np.flatnonzero(missing)
        raise ValueError(
            f"y has a missing label (NaN or None) in row {start + int(rows[0])}"
            + (f" and {rows.size - 1} more row(s)" if rows.size > 1 else "")
            + "; every row needs a class label: drop those rows or label them before fit"
        )


def _labels(scores: np.ndarray, classes: np.ndarray) -> np.ndarray:
    idx = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
    return classes[idx]


class FalkonClassifier(ClassifierMixin, NystromModelBase):
    __doc__ = f"""Kernel classifier: FALKON regression on +-1 one-vs-all targets.

    The least-squares ("regularised least squares") classifier of the FALKON papers:
    each class gets a column of targets, +1 for its rows and -1 for the others (a
    single column for two classes), all columns are solved in one CG run, and the
    predicted class is the one with the largest decision value.

    {params_doc(*FALKON_PARAMS, "class_weight", "preconditioner_route", "memory_budget")}
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels, sorted.
    class_weight_ : ndarray of shape (n_classes,)
        The weight of each class in the fit (all ones with ``class_weight=None``).
    coef_ : ndarray of shape (M, 1) for two classes, else (M, n_classes)
    feature_names_in_ : ndarray of shape (n_features,) of str
        Names of the features seen in fit, when ``X`` carried them; checked at predict.
    Other fitted attributes as for :class:`FalkonRegressor`.

    Notes
    -----
    There is deliberately no ``predict_proba``: the decision values are
    least-squares fits of the ``+-1`` codes, not log-odds, and a calibration
    (Platt's sigmoid or a softmax temperature) fitted on the training rows'
    own scores would inherit their optimism (a kernel fit is closer to its
    training codes than to new rows), so an honest one needs held-out scores,
    i.e. further fits on splits. scikit-learn's ``CalibratedClassifierCV``
    does exactly that on in-memory data (see the user guide, "Calibrated
    least squares"); :class:`LogisticFalkonClassifier` gives probabilities
    from one out-of-core fit.
    """

    _solver = "falkon"
    _squeeze_single_target = False

    # FalkonRegressor's parameters and class_weight (scikit-learn reads them from __init__'s signature).
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **FalkonRegressor._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }
    classes_: np.ndarray  # fitted: the sorted class labels (set by _encode_targets and fit)

    def __init__(
        self,
        kernel: Any = "gaussian",
        sigma: float | Sequence[float] | np.ndarray | None = None,
        penalty: float = 1e-6,
        n_centers: int = 1000,
        sampler: Any = "uniform",
        max_iter: int = 50,
        tol: float = 1e-4,
        kernel_params: dict | None = None,
        dtype: str = "float64",
        standardize: bool = True,
        chunks: int | None = None,
        random_state: Any = None,
        verbose: bool = False,
        strategy: str = "auto",
        fit_intercept: bool = True,
        preconditioner_rows: int | str | None = "auto",
        compute_std: bool = False,
        std_method: str = "auto",
        class_weight: dict | str | None = None,
        preconditioner_route: str = "auto",
        memory_budget: int | None = None,
    ):
        store_params(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        check_class_weight(self.class_weight)

    def fit(
        self,
        X: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        checkpoint: Any = None,
        checkpoint_every: int = 5,
        resume: bool = False,
    ) -> FalkonClassifier:
        """Fit on anything :func:`daskkrr.open_dataset` takes; y holds class labels.

        Labels may be any sortable values (strings too) when ``y`` is in memory;
        labels in a dask array or Zarr store must be numeric. ``checkpoint``,
        ``checkpoint_every`` and ``resume`` are as for :meth:`FalkonRegressor.fit`.

        Parameters
        ----------
        X, y
            Training data (``y`` may be omitted when ``X`` is a store holding it).
        sample_weight : array-like of shape (n,), dask array, str or None, default=None
            {SAMPLE_WEIGHT_DOC} ``class_weight`` multiplies them.
        """
        self._validate_params()
        X, y = self._check_fit_input(X, y)
        sample_weight = check_sample_weight(sample_weight, X)
        refuse_weighted_std(self, sample_weight)
        self._labels = None
        if y is not None and is_in_memory(y):
            _refuse_missing_labels(np.asarray(y).reshape(-1), 0)
        if y is not None and is_in_memory(y) and np.asarray(y).dtype.kind not in "biuf":
            # Text labels become integer codes; classes_ maps them back.
            self._labels, y = np.unique(np.asarray(y).reshape(-1), return_inverse=True)
        try:
            self._run_nystrom(X, y, checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
                              sample_weight=sample_weight)
        finally:
            labels = self.__dict__.pop("_labels", None)
        if labels is not None:
            self.classes_ = labels[self.classes_.astype(np.int64)]
        return self

    fit.__doc__ = (fit.__doc__ or "").replace("{SAMPLE_WEIGHT_DOC}", SAMPLE_WEIGHT_DOC)

    def _row_weights(self, y: da.Array, sample_weight: da.Array | None) -> da.Array | None:
        """The fit's row weights: ``sample_weight`` times the weight of each row's class.

        Called by the statistics stage after :meth:`_encode_targets` (which sets
        ``classes_``); sets ``class_weight_``.
        """
        labels = getattr(self, "_labels", None)
        rows, weights = class_row_weights(self.class_weight, y, self.classes_, sample_weight, labels=labels)
        self.class_weight_ = np.ones(len(self.classes_)) if weights is None else weights
        return rows

    #: Class labels are kept as they are (strings too), not made numeric.
    _target_dtype = None

    def _check_fit_input(self, X: Any, y: Any) -> tuple[Any, Any]:
        """As for regressors, then an in-memory ``y`` of shape (n, 1) is raveled with
        scikit-learn's ``DataConversionWarning``; its label type is checked with the classes."""
        X, y = super()._check_fit_input(X, y)
        if is_in_memory(X) and is_in_memory(y):
            y = column_or_1d(y, warn=True)
        return X, y

    def _encode_targets(self, y: da.Array) -> da.Array:
        if y.ndim != 1 and not (y.ndim == 2 and y.shape[1] == 1):
            raise ValueError(f"y must hold one label per row; got shape {y.shape}")
        y = y.reshape(-1) if y.ndim == 2 else y
        classes = np.unique(np.asarray(da.unique(y).compute()))
        if classes.dtype.kind == "f" and np.isnan(classes).any():  # a lazy target: find the rows (error path only)
            first = int(da.argmax(da.isnan(y)).compute())
            _refuse_missing_labels(np.asarray(y[first:first + 1].compute()), first)
        # scikit-learn's type_of_target on the distinct labels: a continuous target (e.g. a
        # regression target) is refused with its message, not fitted as thousands of classes.
        check_classification_targets(classes)
        if len(classes) < 2:
            raise ValueError(f"y has only one class ({classes.tolist()}); a classifier needs at least two")
        self.classes_ = classes
        t = 1 if len(classes) == 2 else len(classes)
        return da.map_blocks(_one_vs_all, y, classes, dtype=np.float64, chunks=(y.chunks[0], (t,)), new_axis=1)

    def decision_function(self, X: Any, return_std: bool = False) -> Any:
        """Decision values: shape (n,) for two classes (positive means ``classes_[1]``), else (n, n_classes).

        With ``return_std=True`` (a model fitted with ``compute_std=True``), also the
        posterior standard deviation of each decision value, shaped alike: the
        regression on the +-1 codes as a Gaussian process (see the user guide,
        "Predictive uncertainty").
        """
        if return_std:
            mean, std = self._decision_and_std(X)
            return (mean[:, 0], std[:, 0]) if len(self.classes_) == 2 else (mean, std)
        out = self._raw_decision(X)
        return out[:, 0] if len(self.classes_) == 2 else out

    def predict(self, X: Any) -> Any:
        """Predicted class labels (numpy for numpy input, a lazy dask array otherwise)."""
        scores = self.decision_function(X)
        if isinstance(scores, np.ndarray):
            return _labels(scores, self.classes_)
        return scores.map_blocks(_labels, self.classes_, dtype=self.classes_.dtype,
                                 drop_axis=1 if scores.ndim == 2 else None)
