"""Kernel logistic regression on Nystrom centers: logistic FALKON, with class probabilities."""

from __future__ import annotations

import textwrap
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from scipy.special import log_softmax
from sklearn.utils._param_validation import StrOptions

from daskkrr.models.classifier import FalkonClassifier
from daskkrr.models.kernel_model import positive, store_params
from daskkrr.models.regressors import PARAM_DOCS
from daskkrr.pipeline import Stage
from daskkrr.pipeline.logistic import LOGISTIC_STRATEGIES, logistic_stages
from daskkrr.solvers.logistic import log1pexp, penalty_path, sigmoid
from daskkrr.solvers.softmax import softmax

#: Parameter docs that differ from FalkonClassifier's, and the new ones.
LOGISTIC_PARAM_DOCS = {
    "penalty": """penalty : float, default=1e-6
    The target penalty lambda of the objective (see above): the last penalty of
    the schedule, at which the Newton steps run to convergence.""",
    "max_iter": """max_iter : int, default=20
    Most CG iterations per Newton step at the target penalty (a warm-up step
    makes 3, FALKON's rule). Each is one pass over the data.""",
    "tol": """tol : float, default=1e-4
    Each Newton system is solved by CG to this relative residual, and a binary
    problem stops once its squared Newton decrement ``g^T H^-1 g`` (twice a
    bound on its distance to the optimal objective, near the optimum) falls
    below ``2 * tol * objective``.""",
    "strategy": """strategy : {"auto", "recompute", "cache"}, default="auto"
    How the kernel blocks of the passes are obtained: recomputed on every pass
    ("recompute": any n and M) or kept in worker memory after the first one
    ("cache"). "auto" caches when the cost model says the blocks fit in memory.
    The "gram" strategy of FalkonRegressor does not apply: the Hessian's
    weights change at every Newton step.""",
    "penalty_schedule": """penalty_schedule : "auto" or list of float, default="auto"
    The decreasing penalties before the target ``penalty``, one Newton step
    each (Marteau-Ferey, Bach and Rudi's globally convergent scheme). "auto"
    is FALKON's rule of thumb: from 1e-2, divided by 100 while above
    ``penalty`` (``[1e-2, 1e-4]`` for ``penalty=1e-6``; none for
    ``penalty >= 1e-2``).""",
    "newton_iterations": """newton_iterations : int, default=8
    Most Newton steps at the target penalty (they stop earlier at ``tol``).""",
    "multi_class": """multi_class : {"multinomial", "ovr"}, default="multinomial"
    The model for more than two classes: "multinomial", one softmax model
    (cross-entropy loss, scikit-learn's ``LogisticRegression`` default), or
    "ovr", one binary problem per class against the rest. Two classes are the
    same single-logit model either way.""",
}

LOGISTIC_PARAMS = ("kernel", "sigma", "penalty", "n_centers", "sampler", "max_iter", "tol", "kernel_params",
                   "dtype", "standardize", "chunks", "random_state", "verbose", "strategy", "fit_intercept",
                   "class_weight", "penalty_schedule", "newton_iterations", "multi_class")


def _params_doc() -> str:
    entries = "\n".join(textwrap.indent(LOGISTIC_PARAM_DOCS.get(n) or PARAM_DOCS[n], "    ")
                        for n in LOGISTIC_PARAMS)
    return f"""Parameters
    ----------
{entries}
"""


def ovr_proba(scores: np.ndarray) -> np.ndarray:
    """Class probabilities from decision values, as scikit-learn's one-vs-rest.

    Two classes (``scores`` 1-D): ``[1 - sigmoid(f), sigmoid(f)]``. More: ``sigmoid(f_j)``
    divided by the row sum (scikit-learn's ``OneVsRestClassifier`` and
    ``LogisticRegression`` in its one-vs-rest mode).
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        p = sigmoid(scores)
        return np.column_stack([1.0 - p, p])
    P = sigmoid(scores)
    return P / P.sum(axis=1, keepdims=True)


def ovr_log_proba(scores: np.ndarray) -> np.ndarray:
    """``log(ovr_proba(scores))`` without underflow (``log sigmoid(f) = -log(1 + exp(-f))``)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        return np.column_stack([-log1pexp(scores), -log1pexp(-scores)])
    L = -log1pexp(-scores)
    top = L.max(axis=1, keepdims=True)
    return L - (top + np.log(np.exp(L - top).sum(axis=1, keepdims=True)))


def softmax_proba(scores: np.ndarray) -> np.ndarray:
    """Class probabilities of the multinomial model: the softmax of each row's decision values."""
    return softmax(scores)


def softmax_log_proba(scores: np.ndarray) -> np.ndarray:
    """``log(softmax_proba(scores))`` without underflow."""
    return log_softmax(np.asarray(scores, dtype=np.float64), axis=1)


class LogisticFalkonClassifier(FalkonClassifier):
    __doc__ = f"""Kernel logistic regression on Nystrom centers (logistic FALKON), with probabilities.

    Two classes: one binary problem,

        (1/n) sum_i log(1 + exp(-y_i f(x_i))) + (penalty / 2) ||f||^2,

    over ``f(x) = sum_j coef_j k(x, z_j) + b`` with ``y_i = +-1``, ``||f||^2 =
    coef^T K_MM coef`` and ``b`` unpenalised (``fit_intercept=True``). More
    classes, ``multi_class="multinomial"`` (the default): one function per
    class, ``f_c(x) = sum_j coef_jc k(x, z_j) + b_c``, and the cross-entropy of
    their softmax,

        (1/n) sum_i -log softmax(f(x_i))[y_i] + (penalty / 2) sum_c ||f_c||^2;

    ``multi_class="ovr"``: the binary problem of each class against the rest.
    With row weights ``s_i`` (``fit(X, y, sample_weight)`` times the weight of
    the row's class, ``class_weight``) the mean becomes ``sum_i s_i l_i / sum_i
    s_i``; integer weights give the model of the duplicated rows.

    It is scikit-learn's ``LogisticRegression(C=1 / (penalty * n))`` (``n``: the
    sum of the weights; its multinomial loss, or ``OneVsRestClassifier`` of it for
    "ovr") on the Nystrom features ``Phi = K_nM K_MM^(-1/2)`` of the same centers:
    with ``w_c = K_MM^(1/2) coef_c``, ``Phi w_c = K_nM coef_c`` and ``||w_c||^2 =
    ||f_c||^2``, and ``C sum_i l_i + sum_c ||w_c||^2 / 2`` is ``C n`` times the
    objective above. Probabilities are the softmax of the decision values
    (multinomial), or, one-vs-rest, normalised as scikit-learn's one-vs-rest:
    ``sigmoid(f_j)`` divided by the row sum. The multinomial model is the
    default because it is the maximum-likelihood model of the class
    probabilities; its test log-loss is the better one at full size (connect_4,
    54 045 rows, ``n_centers=1000, penalty=1e-6``: 0.567 against 0.587
    one-vs-rest, in about the same fit time). The one-vs-rest problems are
    independent, each with its own preconditioner, and cost less per CG
    iteration when there are many classes (the multinomial gradient pass sums
    ``C^2`` columns, for the intercepts' coupling).

    The solver is Marteau-Ferey, Bach and Rudi's (2019) globally convergent
    Newton method for generalised self-concordant losses, as FALKON's
    ``LogisticFalkon``: the penalty falls from ``penalty_schedule`` to
    ``penalty`` with one Newton step per warm-up penalty, then up to
    ``newton_iterations`` steps at ``penalty``; each Newton system is solved by
    CG preconditioned with FALKON's factors weighted by the loss's second
    derivative at the centers (:mod:`daskkrr.solvers.logistic`; for the
    multinomial model one CG on the ``M x C`` coefficients, preconditioned per
    class, :mod:`daskkrr.solvers.softmax`). Every gradient
    and Hessian-vector product is one pass over the row blocks; only
    ``M``-sized sums reach the client.

    Unlike :class:`FalkonClassifier` there is no row-sketch preconditioner
    (``preconditioner_rows``): the weighted preconditioner is rebuilt from the
    centers at every Newton step; nor predictive variances (``compute_std``).
    ``fit(..., checkpoint=DIR)`` saves the Newton state after every Newton step
    (``checkpoint_every`` is not used) and
    ``resume=True`` continues from it to the model of the uninterrupted fit.

    {_params_doc()}
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels, sorted.
    coef_ : ndarray of shape (M, 1) for two classes, else (M, n_classes)
        Nystrom coefficients of each binary problem, or of each class's function
        (multinomial; their sum over the classes is zero).
    intercept_ : ndarray of shape (1,) or (n_classes,)
        The unpenalised constants (zeros with ``fit_intercept=False``; multinomial:
        centred, since adding a constant to every class changes nothing).
    objective_ : ndarray of shape (n_problems,)
        The objective of each problem at the fitted model: one per class for
        one-vs-rest, a single one for two classes or the multinomial model.
    objective_history_ : ndarray of shape (``n_iter_``, n_problems)
        The objective at the start of every Newton step (each at its own penalty).
    penalty_path_ : ndarray of shape (``n_iter_``,)
        The penalty of every Newton step made.
    n_iter_ : int
        Newton steps made.
    cg_iterations_ : int
        CG iterations over all Newton steps (each one pass over the data).
    residuals_ : ndarray of shape (``n_iter_``, n_problems)
        The squared Newton decrement of every Newton step.
    converged_ : bool
        Whether every problem reached ``tol`` (otherwise a ``ConvergenceWarning``).
    Other fitted attributes as for :class:`FalkonClassifier`.

    See Also
    --------
    FalkonClassifier : least squares on +-1 targets (no probabilities; calibrate
        it with scikit-learn's ``CalibratedClassifierCV``).

    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr import LogisticFalkonClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(1000, 2)); y = (X[:, 0] * X[:, 1] > 0).astype(int)
    >>> model = LogisticFalkonClassifier(n_centers=100, penalty=1e-4, random_state=0).fit(X, y)
    >>> model.predict_proba(X[:2]).shape
    (2, 2)
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in FalkonClassifier._parameter_constraints.items()
           if k not in ("preconditioner_rows", "compute_std", "std_method")},
        "strategy": [StrOptions(set(LOGISTIC_STRATEGIES))],
        "penalty_schedule": [StrOptions({"auto"}), list],
        "newton_iterations": [positive(Integral)],
        "tol": [positive(Real)],
        "multi_class": [StrOptions({"multinomial", "ovr"})],
    }

    def __init__(
        self,
        kernel: Any = "gaussian",
        sigma: float | None = None,
        penalty: float = 1e-6,
        n_centers: int = 1000,
        sampler: Any = "uniform",
        max_iter: int = 20,
        tol: float = 1e-4,
        kernel_params: dict | None = None,
        dtype: str = "float64",
        standardize: bool = True,
        chunks: int | None = None,
        random_state: Any = None,
        verbose: bool = False,
        strategy: str = "auto",
        fit_intercept: bool = True,
        class_weight: dict | str | None = None,
        penalty_schedule: Any = "auto",
        newton_iterations: int = 8,
        multi_class: str = "multinomial",
    ):
        store_params(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        penalty_path(float(self.penalty), self.penalty_schedule, int(self.newton_iterations))

    def _fit_stages(self) -> tuple[Stage, ...]:
        return logistic_stages()

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities, columns in the order of ``classes_`` (numpy in, numpy out;
        a dask array, xarray or Zarr store in, a lazy dask array out)."""
        return self._apply_to_scores(X, softmax_proba if self._is_multinomial() else ovr_proba)

    def predict_log_proba(self, X: Any) -> Any:
        """Logarithms of :meth:`predict_proba`, computed without underflow."""
        return self._apply_to_scores(X, softmax_log_proba if self._is_multinomial() else ovr_log_proba)

    def _is_multinomial(self) -> bool:
        """Whether the fitted model is the softmax one (more than two classes, "multinomial")."""
        self._check_fitted()
        return self.multi_class == "multinomial" and len(self.classes_) > 2

    def _apply_to_scores(self, X: Any, fn: Any) -> Any:
        scores = self.decision_function(X)
        dtype = scores.dtype  # float32 for a model fitted on float32 features, as its scores
        if isinstance(scores, np.ndarray):
            return fn(scores).astype(dtype, copy=False)
        k = len(self.classes_)
        if scores.ndim == 1:
            out = scores.map_blocks(fn, dtype=np.float64, chunks=(scores.chunks[0], (k,)), new_axis=1)
        else:
            out = scores.map_blocks(fn, dtype=np.float64, chunks=(scores.chunks[0], (k,)))
        return out.astype(dtype, copy=False)
