"""Regression estimators: FALKON, direct Nystrom and exact kernel ridge regression."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import RegressorMixin, clone
from sklearn.utils import Tags
from sklearn.utils._param_validation import Interval, StrOptions

from daskkrr.data.feature_names import check_feature_names
from daskkrr.data.inputs import is_in_memory, load_training_data
from daskkrr.data.sample_weight import open_sample_weight
from daskkrr.models.base import NystromModelBase
from daskkrr.models.kernel_model import KernelModelBase, ParameterError, positive, store_params
from daskkrr.models.weights import check_sample_weight, refuse_weighted_std
from daskkrr.parallel import Executor
from daskkrr.pipeline import run_fit
from daskkrr.pipeline.exact_pcg import check_preconditioner, choose_solver, exact_krr_stages
from daskkrr.pipeline.stages import Stage, direct_solve, exact_solve, exact_stages, nystrom_stages, training_shape
from daskkrr.solvers.variance import noise_variance

#: numpydoc entry of every estimator parameter; each class lists those it takes (and
#: :mod:`daskkrr.models.schema` reads them back as the help of TOML keys and CLI flags).
PARAM_DOCS = {
    "kernel": """kernel : str, dict or Kernel, default="gaussian"
    "gaussian", "laplacian", "matern", "polynomial", "linear", a
    ``Kernel.to_dict()`` dict, or a :class:`daskkrr.kernels.Kernel`.""",
    "sigma": """sigma : float, array-like of shape (n_features,) or None, default=None
    Length scale of the Gaussian/Laplacian/Matern kernels, in standardised
    feature units: one number, or one per feature (automatic relevance
    determination, ``k(a, b) = k_1(a / sigma, b / sigma)``; ``[1, 2]`` in TOML,
    ``--sigma 1,2`` on the command line). None uses ``sqrt(n_features)``, a
    median-distance heuristic for standardised features.""",
    "penalty": """penalty : float, default=1e-6
    Ridge penalty lambda of the normalised objective
    ``(1/n) sum (f(x_i) - y_i)^2 + lambda ||f||^2``; the same as scikit-learn's
    ``KernelRidge(alpha=penalty * n)``.""",
    "n_centers": """n_centers : int, default=1000
    Number of Nystrom centers M (cost per pass is O(n M d)).""",
    "sampler": """sampler : str, CenterSampler or ndarray of shape (M, n_features), default="uniform"
    How centers are chosen (see :mod:`daskkrr.sampling`): "uniform", "rpcholesky"
    (randomly pivoted Cholesky), a leverage-score sampler, or the centers
    themselves, in X's units (used as given; ``n_centers`` is then not used). With ``fit``'s
    ``sample_weight``, "uniform" draws rows in proportion to their weights; the
    leverage-score samplers choose as if unweighted (the weighted problem is
    then solved exactly on their centers).""",
    "max_iter": """max_iter : int, default=50
    Maximum CG iterations (each is one pass over the data, or M x M work with
    the "gram" strategy). With the row-sketch preconditioner, ``tol=1e-4`` took
    11-25 iterations on 12 PMLB regression and classification sets
    (``workflows/benchmarks/convergence_defaults.py``); 50 leaves a margin for
    harder problems. A fit that stops above ``tol`` warns
    (``ConvergenceWarning``) and has ``converged_ = False``.""",
    "tol": """tol : float, default=1e-4
    Stop when the preconditioned relative residual falls below ``tol``. On the
    same 12 sets the test score at 1e-4 differed from the score at 1e-7 by at
    most 2e-6 (R^2) and not at all (accuracy); lower it for a solution closer to
    the exact Nystrom one (float32 blocks reach about 1e-6 at best).""",
    "kernel_params": """kernel_params : dict or None, default=None
    Extra kernel parameters, e.g. ``{"nu": 2.5}`` for Matern or
    ``{"degree": 2, "coef0": 1.0}`` for polynomial.""",
    "dtype": """dtype : {"float64", "float32"}, default="float64"
    Precision of the kernel blocks (accumulation is always float64), and so of
    ``centers_``, which enter every block. It is not the model's output
    precision: ``coef_``, ``intercept_`` and the predictions follow the input, as
    in scikit-learn (float32 features give float32, anything else float64; the
    solve runs in float64 and is rounded at the end), so ``dtype="float32"``
    fitted on float64 features keeps float64 ``coef_``. A saved model keeps each
    array in its own dtype and ``dtype`` with the parameters.""",
    "standardize": """standardize : bool, default=True
    Standardise features (mean 0, variance 1) and centre the targets, with
    statistics from one pass over the data; they are stored in the model.""",
    "chunks": """chunks : int or None, default=None
    Rows per block when the input is re-chunked (None keeps the input's chunks;
    numpy input gets blocks of about 64 MiB).""",
    "random_state": """random_state : int, numpy Generator or None, default=None
    Seed for center selection. The fit does not depend on the number of workers.""",
    "verbose": """verbose : bool, default=False
    Show a progress bar (passes, blocks, CG residuals) and log progress at INFO.""",
    "strategy": """strategy : {"auto", "recompute", "cache", "gram"}, default="auto"
    How each iteration's ``K_nM^T K_nM u`` is computed: "recompute" builds the
    kernel blocks anew on every pass (any n and M, memory of a tile per task);
    "cache" keeps every block's ``k(X_b, Z)`` in worker memory after one pass,
    so iterations cost two matrix-vector products per block; "gram"
    accumulates ``K_nM^T K_nM`` in one pass and iterates on the client
    (moderate M; two passes with SQUEAK, whatever the iterations). "auto"
    takes the cheapest that fits in memory by the cost model of
    :mod:`daskkrr.parallel.cost`. All give the same solution to round-off.""",
    "direct_strategy": """strategy : {"auto", "gram"}, default="auto"
    Accepted for symmetry with :class:`FalkonRegressor`: the direct solve
    always uses the one-pass "gram" strategy.""",
    "fit_intercept": """fit_intercept : bool, default=True
    Fit an unpenalised constant term, ``f(x) = k(x, Z) coef + b``, as
    scikit-learn's ``Ridge`` does on Nystroem features (see
    :mod:`daskkrr.solvers.intercept`). With False the targets are only centred
    (with ``standardize=True``) and the penalty also shrinks the mean level,
    as in ``KernelRidge`` and the FALKON papers. It costs nothing extra.""",
    "preconditioner_rows": """preconditioner_rows : int, "auto" or None, default="auto"
    Training rows sampled (uniformly) to build the preconditioner from
    ``K_sM^T K_sM`` instead of FALKON's ``K_MM^2`` (see
    :mod:`daskkrr.solvers.sketch`); None keeps FALKON's own preconditioner.
    More rows cost ``2 s M^2`` flops once on the client (in float32 for a
    float32 fit, where accurate) and save CG iterations, i.e. passes over the
    data. "auto" takes, among none and ``2, 4, 8, 16 * n_centers`` rows (at most
    n), the one of least expected time to ``tol`` by the cost model of
    :mod:`daskkrr.parallel.preconditioner_cost`: a sketch where ``tol`` stops CG
    early enough to repay it, none when ``max_iter`` iterations run anyway or
    the "gram" strategy makes iterations cheap. The choice and the expected
    times are ``preconditioner_rows_`` and ``preconditioner_costs_``.""",
    "preconditioner_route": """preconditioner_route : {"auto", "dense", "tiled"}, default="auto"
    Where the preconditioner's ``M x M`` factorisations run: "dense" in the
    client process (``3 x 8 M^2`` bytes: 2.4 GB at M = 10 000), "tiled" as
    ``2048 x 2048`` tiles on the Dask workers, kept in their memory or spilled
    to a Zarr store in a temporary folder when it cannot hold them, so that no
    process holds an ``M x M`` matrix (see :mod:`daskkrr.parallel.factor_cost`).
    "auto" takes "dense" whenever it fits in half the client's memory budget.
    The choice and why are ``preconditioner_route_``; the tiled route builds
    FALKON's own preconditioner (no row sketch) and cannot run
    ``strategy="gram"``; its ``compute_std`` posterior is tiled too, with the
    exact variance only (``std_method="fast"`` is refused). Both give the same
    solution.""",
    "memory_budget": """memory_budget : int or None, default=None
    Bytes the preconditioner may use: caps the client's memory for the dense
    route and the workers' memory for kept tiles (beyond it they are spilled to
    disk). None: the memory available to the client process and the workers'
    memory limits.""",
    "max_samples": """max_samples : int, default=20000
    Largest n the "direct" solver accepts (the kernel matrix takes 8 n^2 bytes).""",
    "exact_solver": """solver : {"auto", "direct", "pcg"}, default="auto"
    "direct" gathers the data on the client and factors ``K + lambda I``
    (memory 24 n^2 bytes, time n^3 / 3); "pcg" solves the same system by
    preconditioned CG on the Dask workers (Avron, Clarkson and Woodruff; see
    :mod:`daskkrr.pipeline.exact_pcg`): memory of the kept kernel tiles or of a
    tile per task, time n^2 d per iteration. "auto" factors directly up to
    10 000 rows when its matrices fit in memory, and uses "pcg" beyond.""",
    "exact_preconditioner": """preconditioner : {"random_features", "nystrom"} or None, default="random_features"
    PCG's preconditioner ``Z Z^T + lambda_p I``: "random_features" takes ``Z``
    from random features of the kernel (Fourier features for the
    Gaussian, Laplacian and Matern kernels, TensorSketch for the polynomial one;
    :mod:`daskkrr.kernels.random_features`), "nystrom" from ``n_features``
    uniformly sampled Nystrom centers, None runs plain CG.""",
    "exact_n_features": """n_features : int or "auto", default="auto"
    s, the number of features of the preconditioner. "auto" doubles s from 256
    until the preconditioned system's condition number, estimated by a few
    Lanczos steps, is small (see :mod:`daskkrr.pipeline.exact_pcg`); the chosen s
    is ``n_features_``.""",
    "preconditioner_penalty": """preconditioner_penalty : float, default=10.0
    ``lambda_p / lambda``: the preconditioner is ``Z Z^T + lambda_p I`` with
    ``lambda_p = preconditioner_penalty * penalty * n``. The paper's Table 2 found
    ``lambda_p = 10 lambda`` a good rule of thumb; 1.0 is its Algorithm 1.""",
    "srht_features": """srht_features : int or None, default=None
    Multi-level sketching (the paper's Algorithm 2): compress the
    ``n_features`` random features with a subsampled randomised Hadamard
    transform to this many (fewer) features. None: one level.""",
    "exact_tol": """tol : float, default=1e-5
    Stop when ``||y - (K + lambda I) c|| <= tol ||y||`` (the paper's criterion;
    it used 1e-5 for regression and 1e-3 for classification).""",
    "exact_max_iter": """max_iter : int, default=1000
    Maximum PCG iterations (each is one product with the n x n kernel matrix).""",
    "kernel_tiles": """kernel_tiles : {"auto", "keep", "recompute"}, default="auto"
    "keep" holds the upper-triangle kernel tiles in worker memory after one
    pass (n^2 / 2 entries of ``tile_dtype``); "recompute" builds them anew on
    every product (a tile per task: any n); "auto" keeps them when they take at
    most half the workers' memory.""",
    "tile_dtype": """tile_dtype : {"auto", "float32", "float64"}, default="auto"
    Precision of kept tiles: "auto" is float32 (half the memory) when
    ``tol >= 1e-5`` and float64 for smaller ``tol``. Recomputed tiles have the
    data's precision (float64).""",
    "exact_random_state": """random_state : int, numpy Generator or None, default=None
    Seed of the random features (or the Nystrom centers) and of the
    adaptive probe. The features of a row depend only on the seed and the row,
    not on the chunking or the workers.""",
    "class_weight": """class_weight : dict, "balanced" or None, default=None
    Weights of the classes, multiplied into ``fit``'s ``sample_weight``:
    None weighs every class 1, a dict ``{label: weight}`` names some classes
    (the others weigh 1), "balanced" takes scikit-learn's
    ``n_samples / (n_classes * np.bincount(y))`` (the counts weighted by
    ``sample_weight`` when there is one), at the cost of one pass over ``y``.""",
    "compute_std": """compute_std : bool, default=False
    Also compute what ``predict(X, return_std=True)`` needs: the posterior of
    the Gaussian process that matches the model (``fitted posterior_``, see the
    user guide, "Predictive uncertainty"), with the noise variance estimated
    from the training residuals (``noise_variance_``). The Nystrom estimators keep two
    ``M x M`` factors (``16 M^2`` bytes in memory and in saved models);
    FALKON with the "recompute" or "cache" strategy makes one more pass over the
    data for ``K_MN K_NM``, which the direct solve and the "gram" strategy
    already have. Exact KRR keeps its ``n x n`` factor (``8 n^2`` bytes).""",
    "std_method": """std_method : {"auto", "fast", "exact"}, default="auto"
    How ``return_std`` computes the variance (with ``compute_std=True``). "exact":
    the Nystrom posterior variance, two ``M x M`` triangular solves per row. "fast":
    a rank-``r`` factor built at fit time (``M x r``, saved with the model), never
    below the exact variance, its mean excess over rows like the training rows at
    most 5% of their mean variance (``posterior_.fast_variance_bound``); "auto": the
    fast one when its rank keeps ``return_std`` within about 3x ``predict``, else
    the exact one (see the user guide, "What it costs"). On the tiled
    preconditioner route (many centers) the fast variance would need an
    ``M x M`` eigenproblem: "auto" is exact there (``preconditioner_route_``
    says why) and "fast" is refused.""",
}


#: The ``sample_weight`` entry of every ``fit`` docstring.
SAMPLE_WEIGHT_DOC = """Row weights ``w_i >= 0``: the fit minimises
            ``sum_i w_i (y_i - f(x_i))^2 + penalty * sum(w) * ||f||^2``, so an integer
            weight k counts as k copies of the row. numpy or dask (read block by block
            with the rows), or, when ``X`` is a Zarr store, the name of one of its
            arrays. NaN, inf, negative weights, all zeros and a length other than
            the number of rows are refused before any work. The standardisation and
            the intercept use weighted means. The uniform sampler draws centers in
            proportion to the weights (never a row of weight 0); the leverage-score
            samplers ignore them (see the user guide, "Sample and class weights")."""


def params_doc(*names: str) -> str:
    """The numpydoc "Parameters" section listing ``names`` (keys of :data:`PARAM_DOCS`)."""
    entries = "\n".join(textwrap.indent(PARAM_DOCS[name], "    ") for name in names)
    return f"""Parameters
    ----------
{entries}
"""


#: FalkonRegressor's (and FalkonClassifier's) parameters, in ``__init__`` order.
FALKON_PARAMS = ("kernel", "sigma", "penalty", "n_centers", "sampler", "max_iter", "tol", "kernel_params",
                 "dtype", "standardize", "chunks", "random_state", "verbose", "strategy",
                 "fit_intercept", "preconditioner_rows", "compute_std", "std_method")
NYSTROM_PARAMS = ("kernel", "sigma", "penalty", "n_centers", "sampler", "kernel_params", "dtype", "standardize",
                  "chunks", "random_state", "verbose", "direct_strategy", "fit_intercept", "compute_std",
                  "std_method")
EXACT_PARAMS = ("kernel", "sigma", "penalty", "kernel_params", "standardize", "chunks", "max_samples", "verbose",
                "compute_std", "exact_solver", "exact_preconditioner", "exact_n_features", "preconditioner_penalty",
                "srht_features", "exact_tol", "exact_max_iter", "kernel_tiles", "tile_dtype", "exact_random_state")

_FITTED_DOC = """
    Attributes
    ----------
    centers_ : ndarray of shape (M, n_features)
        Centers, in standardised feature space.
    n_centers_ : int
        M, the number of centers: ``n_centers``, clamped (with a warning) to
        the number of training rows when it is larger.
    center_indices_ : ndarray of shape (M,)
        Rows of the training data the centers came from.
    center_weights_ : ndarray of shape (M,)
        Importance weights of the centers (all ones for uniform sampling).
    coef_ : ndarray of shape (M,) or (M, n_targets)
        Nystrom coefficients: ``f(x) = sum_j coef_j k(x, z_j) + intercept_``.
    intercept_ : ndarray of shape (n_targets,)
        The constant term: fitted (unpenalised) with ``fit_intercept=True``,
        otherwise ``y_mean_``.
    kernel_ : Kernel
        The kernel with resolved parameters.
    scaler_ : Standardizer or None
        Feature statistics (None when ``standardize=False``).
    y_mean_ : ndarray of shape (n_targets,)
        Target means subtracted before fitting (zeros without standardisation).
    n_iter_ : int
        CG iterations run (0 for the direct solve).
    residuals_ : ndarray of shape (``n_iter_ + 1``, n_targets)
        Relative residual of the preconditioned system after each iteration.
    converged_ : bool
        Whether CG reached ``tol`` (a fit that did not warns with a
        ``ConvergenceWarning``).
    n_data_passes_ : int
        Passes over the training data made by the fit.
    strategy_ : str
        Strategy that gave the solver its products: "recompute", "cache" or "gram".
    preconditioner_rows_ : int
        Rows the preconditioner was built from (0: FALKON's own, from the centers).
    preconditioner_dtype_ : str
        Arithmetic of the preconditioner: "float32" where its factorisations
        were (a float32 fit with at least 2048 centers) or its sketch Gram matrix
        was (a float32 fit, where it was accurate enough), else "float64". The
        solution does not depend on it.
    preconditioner_route_ : dict
        Where the preconditioner's ``M x M`` factorisations ran and why
        (:class:`daskkrr.parallel.factor_cost.FactorPlan`): ``route`` ("dense" or
        "tiled"), ``storage`` ("client", "memory" or "zarr"), ``tile``, the bytes
        each route needs and the budgets, the expected seconds, and ``reason``.
    preconditioner_costs_ : list of dict
        The cost model's expectation for each sketch size it weighed (and the
        one asked for): ``rows``, CG ``iterations``, ``strategy``, the
        seconds of the ``preconditioner_s``, the ``solve_s`` and both
        (``seconds``), and where the sketch is summed (``on``: "client", or
        "workers" on a cluster whose workers have more cores than the client,
        :mod:`daskkrr.parallel.sketch_pass`). Estimates from constant rates of the development machine:
        right in ratio, not in absolute time.
    fit_time_ : float
        Wall-clock seconds of the fit.
    posterior_ : PosteriorVariance or None
        What ``predict(X, return_std=True)`` needs (with ``compute_std=True``;
        None otherwise): see :class:`daskkrr.solvers.PosteriorVariance`.
        ``posterior_.prior_variance`` and ``posterior_.noise_variance`` are the
        GP's signal and noise variances per target, in squared units of ``y``.
    noise_variance_ : ndarray of shape (n_targets,) or None
        With ``compute_std=True``, the noise variance per target estimated from the
        training residuals, ``RSS / (n - d_eff)`` (``d_eff`` the trace of the hat
        matrix); ``return_std`` is scaled so the GP's noise variance is this one, and a
        new observation's std is ``sqrt(std**2 + noise_variance_)``. None otherwise.
    feature_names_in_ : ndarray of shape (n_features,) of str
        Names of the features seen in fit, when ``X`` carried them (DataFrame
        columns, an xarray feature coordinate, a converted Zarr store's header);
        predict then refuses columns renamed or in another order. Absent otherwise.
"""


class _RegressorMixin(RegressorMixin):
    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # a 2-D y fits one model per column, in one solve
        return tags

    def predict(self, X: Any, return_std: bool = False) -> Any:
        """Predict: numpy in, numpy out; a dask array, xarray or Zarr store in, a lazy dask array out.

        Parameters
        ----------
        X : array-like, dask array, xarray or Zarr store of shape (n, n_features)
            Rows to predict.
        return_std : bool, default=False
            Also return the standard deviation of the matching Gaussian process's
            posterior at each row, in units of ``y`` (the model must be fitted with
            ``compute_std=True``; see the user guide, "Predictive uncertainty"). It is
            the std of the latent function; a new observation's is
            ``sqrt(y_std**2 + noise_variance_)``.

        Returns
        -------
        y_pred : ndarray or dask array of shape (n,) or (n, n_targets)
        y_std : ndarray or dask array, shaped like ``y_pred``
            Only with ``return_std=True``; lazy for lazy input, computed block by
            block with the predictions.
        """
        if return_std:
            mean, std = self._decision_and_std(X)
            return (mean[:, 0], std[:, 0]) if self.coef_.ndim == 1 else (mean, std)
        out = self._raw_decision(X)
        if self.coef_.ndim == 1:
            return out[:, 0]
        return out

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Coefficient of determination R^2 (weighted by ``sample_weight``, as scikit-learn's
        ``r2_score``); computed blockwise for dask input, whose weights may also be a dask array
        or the name of an array of the store ``X``."""
        if is_in_memory(X) and (sample_weight is None or is_in_memory(sample_weight)):
            return super().score(X, y, sample_weight=sample_weight)
        check_feature_names(self, X)  # predict sees only the opened (nameless) dask array
        Xd, yd = load_training_data(X, y, self.chunks)
        pred = self.predict(Xd)
        Y = yd.astype(np.float64)
        w = open_sample_weight(check_sample_weight(sample_weight, X), X, Xd, self.chunks)
        if w is None:
            ss_res = ((Y - pred) ** 2).sum(axis=0)
            ss_tot = ((Y - Y.mean(axis=0)) ** 2).sum(axis=0)
        else:
            W = w[:, None] if Y.ndim == 2 else w
            mean = (W * Y).sum(axis=0) / w.sum()
            ss_res = (W * (Y - pred) ** 2).sum(axis=0)
            ss_tot = (W * (Y - mean) ** 2).sum(axis=0)
        res, tot = Executor().compute(ss_res, ss_tot)
        r2 = 1 - np.asarray(res) / np.where(np.asarray(tot) > 0, tot, 1.0)
        return float(np.mean(r2))


#: What a penalty path fits: the clone to fit, its stages, and fitted attributes set besides the stages'.
PathPlan = tuple[KernelModelBase, tuple[Stage, ...], dict[str, Any]]


#: Samplers whose centers do not depend on the penalty: uniform rows, and RPCholesky's pivots (drawn from
#: the kernel matrix's residual diagonal alone); the leverage-score samplers' do (their ridge is the penalty).
PENALTY_FREE_SAMPLERS = ("uniform", "rpcholesky")


class _NystromPenaltyPath:
    """The penalty path of a squared-loss Nystrom regressor (:mod:`daskkrr.pipeline.penalty_path` calls it).

    The estimator says whether and how it is fitted along a path, so the pipeline needs no
    list of estimator classes (it sits below :mod:`daskkrr.models`).
    """

    def _penalty_path_unsupported(self, n_rows: int | None = None, n_features: int | None = None) -> str | None:
        """Why this estimator has no penalty path (None: it has); the centers must not depend on the penalty."""
        sampler = self.get_params().get("sampler", "uniform")  # type: ignore[attr-defined]
        if isinstance(sampler, np.ndarray) or (isinstance(sampler, str) and sampler in PENALTY_FREE_SAMPLERS):
            return None  # given centers, or centers chosen from the kernel alone
        shown = sampler if isinstance(sampler, str) else type(sampler).__name__
        return (f"its centers depend on the penalty (sampler={shown!r}); only "
                f"{', '.join(map(repr, PENALTY_FREE_SAMPLERS))} or an array of centers do not")

    def _penalty_path_plan(self, penalties: np.ndarray) -> PathPlan:
        """NystromRegressor's stages, the solve along ``penalties``, in float64 whatever the estimator's dtype.

        A float32 fit factors with a jitter floor that keeps part of the penalty in a near-singular term
        (each penalty would need its own factorisation), and a float32 Gram pass loses eps_32 ||K||^2,
        which T^{-1} amplifies. In float64 the factor carries the round-off jitter only, so the path's
        inner matrix is C + lambda I for every penalty.
        """
        model = clone(self).set_params(penalty=float(penalties[0]), dtype="float64")
        *shared, _ = nystrom_stages("direct")
        return model, (*shared, Stage("solve", functools.partial(direct_solve, penalties=penalties))), {}


class FalkonRegressor(_NystromPenaltyPath, _RegressorMixin, NystromModelBase):
    __doc__ = f"""Nystrom kernel ridge regression solved by FALKON's preconditioned CG.

    Each CG iteration is one pass over the row blocks of the data, computed on the
    Dask workers; only ``M``-sized vectors reach the client, so ``n`` is bounded by
    disk, not memory.

    {params_doc(*FALKON_PARAMS, "preconditioner_route", "memory_budget")}{_FITTED_DOC}
    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr import FalkonRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(2000, 3)); y = np.sin(X[:, 0])
    >>> model = FalkonRegressor(n_centers=200, penalty=1e-6, random_state=0).fit(X, y)
    >>> model.score(X, y) > 0.99
    True
    """

    _solver = "falkon"
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **NystromModelBase._parameter_constraints,
        "max_iter": [positive(Integral)],
        "tol": [positive(Real)],
        "preconditioner_rows": [positive(Integral), StrOptions({"auto"}), None],
        "compute_std": ["boolean"],
        "preconditioner_route": [StrOptions({"auto", "dense", "tiled"})],
        "memory_budget": [positive(Integral), None],
        "std_method": [StrOptions({"auto", "fast", "exact"})],
    }

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
        preconditioner_route: str = "auto",
        memory_budget: int | None = None,
        std_method: str = "auto",
    ):
        store_params(self, locals())

    def fit(
        self,
        X: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        checkpoint: Any = None,
        checkpoint_every: int = 5,
        resume: bool = False,
    ) -> FalkonRegressor:
        """Fit on anything :func:`daskkrr.open_dataset` takes (arrays, dask, xarray, Zarr).

        Parameters
        ----------
        X, y
            Training data (``y`` may be omitted when ``X`` is a store holding it).
        sample_weight : array-like of shape (n,), dask array, str or None, default=None
            {SAMPLE_WEIGHT_DOC}
        checkpoint : str, os.PathLike or None
            Directory in which to save the fit's state as it goes (centers, the
            right-hand side, and the CG state every ``checkpoint_every``
            iterations); see :mod:`daskkrr.checkpoint`.
        checkpoint_every : int, default=5
            CG iterations between two saves.
        resume : bool, default=False
            Continue from the checkpoint in ``checkpoint`` (if there is one) after
            an interrupted fit; the result equals the uninterrupted fit's. The
            data and parameters must be those of the interrupted fit (``max_iter``,
            ``tol`` and ``compute_std`` may change). Without it an existing
            checkpoint is an error.
        """
        return self._fit_nystrom(X, y, checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
                                 sample_weight=sample_weight)

    fit.__doc__ = (fit.__doc__ or "").replace("{SAMPLE_WEIGHT_DOC}", SAMPLE_WEIGHT_DOC)


class NystromRegressor(_NystromPenaltyPath, _RegressorMixin, NystromModelBase):
    __doc__ = f"""Nystrom kernel ridge regression solved directly.

    One pass over the data accumulates ``K_MN K_NM`` and ``K_MN y`` (a tree sum of
    ``M x M`` partials); the ``M x M`` system is then solved on the client with the
    same preconditioned formulation FALKON iterates on. Memory on the client is
    O(M^2), so this suits moderate M; it is also the reference FALKON converges to.

    {params_doc(*NYSTROM_PARAMS)}{_FITTED_DOC}"""

    _solver = "direct"
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **NystromModelBase._parameter_constraints,
        "compute_std": ["boolean"],
        "std_method": [StrOptions({"auto", "fast", "exact"})],
    }

    def __init__(
        self,
        kernel: Any = "gaussian",
        sigma: float | Sequence[float] | np.ndarray | None = None,
        penalty: float = 1e-6,
        n_centers: int = 1000,
        sampler: Any = "uniform",
        kernel_params: dict | None = None,
        dtype: str = "float64",
        standardize: bool = True,
        chunks: int | None = None,
        random_state: Any = None,
        verbose: bool = False,
        strategy: str = "auto",
        fit_intercept: bool = True,
        compute_std: bool = False,
        std_method: str = "auto",
    ):
        store_params(self, locals())

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> NystromRegressor:
        """Fit on anything :func:`daskkrr.open_dataset` takes.

        Parameters
        ----------
        X, y
            Training data (``y`` may be omitted when ``X`` is a store holding it).
        sample_weight : array-like of shape (n,), dask array, str or None, default=None
            {SAMPLE_WEIGHT_DOC}
        """
        return self._fit_nystrom(X, y, sample_weight=sample_weight)

    fit.__doc__ = (fit.__doc__ or "").replace("{SAMPLE_WEIGHT_DOC}", SAMPLE_WEIGHT_DOC)


class ExactKernelRidge(_RegressorMixin, KernelModelBase):
    __doc__ = f"""Exact kernel ridge regression, ``(K + penalty * n I) c = y``.

    Equal to scikit-learn's ``KernelRidge(alpha=penalty * n)`` with the same kernel:
    every training point is a center (``centers_``, ``coef_``). Two solvers:

    - "direct" gathers the training data on the client and factors the ``n x n``
      matrix. It refuses ``n > max_samples``, and, before any pass over the data,
      an ``n`` whose three ``n x n`` matrices would not fit in this machine's or
      the workers' memory (the message gives the estimate; ``DASKKRR_FORCE_EXACT=1``
      runs it anyway, see :mod:`daskkrr.parallel.guards`).
    - "pcg" solves the same system on the Dask workers by CG preconditioned with
      random features (Avron, Clarkson and Woodruff, "Faster kernel ridge
      regression using sketching and preconditioning"): one product with the
      kernel matrix per iteration over upper-triangle tiles, kept in worker
      memory or recomputed. Its estimated time and memory are logged (printed
      with ``verbose``) before the work starts. See :mod:`daskkrr.pipeline.exact_pcg`.

    {params_doc(*EXACT_PARAMS)}
    Attributes
    ----------
    centers_ : ndarray of shape (n, n_features)
        The training rows, standardised.
    coef_ : ndarray of shape (n,) or (n, n_targets)
        ``f(x) = sum_i coef_i k(x, x_i) + intercept_``.
    solver_ : str
        The solver that ran: "direct" or "pcg".
    n_iter_ : int
        PCG iterations (1 for "direct": the factorisation).
    residuals_ : ndarray of shape (``n_iter_ + 1``, n_targets)
        ``||y - (K + lambda I) c|| / ||y||`` after each iteration.
    converged_ : bool
        Whether PCG reached ``tol``.
    n_features_ : int
        s, the preconditioner's features (0 without a preconditioner or for "direct").
    preconditioner_penalty_ : float
        ``lambda_p`` (absolute).
    kernel_tiles_ : str
        "keep" or "recompute" (PCG), "" for "direct".
    adaptive_trace_ : list of dict
        With ``n_features="auto"``: s, the Lanczos estimates of the extreme
        eigenvalues of the preconditioned system, its condition number and the
        predicted iterations, for every s tried.
    fit_time_ : float
        Wall-clock seconds of the fit.

    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr import ExactKernelRidge
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(500, 3)); y = np.sin(X[:, 0])
    >>> model = ExactKernelRidge(solver="pcg", penalty=1e-5, random_state=0).fit(X, y)
    >>> bool(model.converged_)
    True
    """

    _solver = "exact"
    #: Sparse X with both solvers: the n x n kernel (direct) or its tiles (PCG) from sparse dot products, and the
    #: PCG's random or Nystrom features of the sparse rows.
    _sparse_input: ClassVar[bool] = True
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **KernelModelBase._parameter_constraints,
        "max_samples": [positive(Integral)],
        "compute_std": ["boolean"],
        "solver": [StrOptions({"auto", "direct", "pcg"})],
        "preconditioner": [StrOptions({"random_features", "nystrom"}), None],
        "n_features": [positive(Integral), StrOptions({"auto"})],
        "preconditioner_penalty": [positive(Real)],
        "srht_features": [positive(Integral), None],
        "tol": [positive(Real)],
        "max_iter": [positive(Integral)],
        "kernel_tiles": [StrOptions({"auto", "keep", "recompute"})],
        "tile_dtype": [StrOptions({"auto", "float32", "float64"})],
        "random_state": [Interval(Integral, 0, None, closed="left"), np.random.Generator,
                         np.random.RandomState, None],
    }

    def __init__(
        self,
        kernel: Any = "gaussian",
        sigma: float | Sequence[float] | np.ndarray | None = None,
        penalty: float = 1e-6,
        kernel_params: dict | None = None,
        standardize: bool = True,
        chunks: int | None = None,
        max_samples: int = 20000,
        verbose: bool = False,
        compute_std: bool = False,
        solver: str = "auto",
        preconditioner: str | None = "random_features",
        n_features: int | str = "auto",
        preconditioner_penalty: float = 10.0,
        srht_features: int | None = None,
        tol: float = 1e-5,
        max_iter: int = 1000,
        kernel_tiles: str = "auto",
        tile_dtype: str = "auto",
        random_state: Any = None,
    ):
        store_params(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        if self.compute_std and self.solver == "pcg":
            raise ParameterError(
                "compute_std keeps the n x n Cholesky factor of the direct solve; use solver='direct' (or "
                "'auto', which factors directly when compute_std=True) for predictive standard deviations",
                parameter="compute_std")
        if self.preconditioner == "random_features":
            check_preconditioner(self._make_kernel(None), self.preconditioner)
        if self.srht_features is not None:
            if self.preconditioner != "random_features":
                raise ParameterError(
                    f"srht_features compresses random features; it needs preconditioner='random_features', "
                    f"got {self.preconditioner!r}", parameter="srht_features")
            if self.n_features != "auto" and int(self.srht_features) >= int(self.n_features):
                raise ParameterError(
                    f"srht_features must be smaller than n_features={self.n_features}; got {self.srht_features}",
                    parameter="srht_features")

    def _penalty_path_unsupported(self, n_rows: int | None = None, n_features: int | None = None) -> str | None:
        """Why this estimator has no penalty path (None: it has): the path is the direct solve's.

        Refused with ``solver="pcg"``, and with ``solver="auto"`` where ``n_rows`` (when given)
        would take PCG (:func:`~daskkrr.pipeline.exact_pcg.choose_solver`).
        """
        if self.solver == "pcg":
            return "solver='pcg' solves one penalty at a time; the path is the direct solve's"
        if self.solver == "auto" and n_rows is not None and choose_solver(self, int(n_rows),
                                                                          int(n_features or 1)) != "direct":
            return f"solver='auto' takes PCG for {n_rows} rows; the path is the direct solve's"
        return None

    def _penalty_path_plan(self, penalties: np.ndarray) -> PathPlan:
        """The direct solve's stages, solved along ``penalties`` (one eigendecomposition)."""
        model = clone(self).set_params(penalty=float(penalties[0]), solver="direct")
        statistics, _ = exact_stages()
        return model, (statistics, Stage("solve", functools.partial(exact_solve, penalties=penalties))), {
            "solver_": "direct"}

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None, *, checkpoint: Any = None,
            checkpoint_every: int = 5, resume: bool = False) -> ExactKernelRidge:
        """Fit on anything :func:`daskkrr.open_dataset` takes.

        Parameters
        ----------
        X, y
            Training data (arrays, dask, xarray, Zarr; ``y`` may be omitted when ``X`` is a store
            holding it).
        sample_weight : array-like of shape (n,), dask array, str or None, default=None
            {SAMPLE_WEIGHT_DOC} Solved in the symmetric form
            ``(W^1/2 K W^1/2 + penalty * sum(w) I) beta = W^1/2 y``, ``coef_ = W^1/2 beta``,
            so zero weights are allowed (their rows get ``coef_ = 0``), by both solvers.
        checkpoint : path or None
            Directory where the PCG state is saved every ``checkpoint_every``
            iterations (solver "pcg"); see :class:`daskkrr.checkpoint.FitCheckpoint`.
        checkpoint_every : int
            PCG iterations between saves.
        resume : bool
            Continue from the checkpoint in ``checkpoint``.
        """
        self._validate_params()
        X, y = self._check_fit_input(X, y)
        sample_weight = check_sample_weight(sample_weight, X)
        refuse_weighted_std(self, sample_weight)
        n, d = training_shape(X, y, self.chunks)
        solver = choose_solver(self, n, d)
        ctx = run_fit(self, X, y, exact_krr_stages(solver), checkpoint=checkpoint,
                      checkpoint_every=checkpoint_every, resume=resume, iterative=solver == "pcg",
                      sample_weight=sample_weight)
        fitted = {"solver_": solver, "n_features_": 0, "preconditioner_penalty_": 0.0, "kernel_tiles_": "",
                  "adaptive_trace_": [], **ctx.fitted, "noise_variance_": noise_variance(ctx.fitted.get("posterior_"))}
        if solver == "direct":
            fitted["n_iter_"] = 1  # the factorisation, one step (scikit-learn: n_iter_ >= 1 with max_iter)
        for name, value in fitted.items():
            setattr(self, name, value)
        return self

    fit.__doc__ = (fit.__doc__ or "").replace("{SAMPLE_WEIGHT_DOC}", SAMPLE_WEIGHT_DOC)
