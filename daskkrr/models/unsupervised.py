"""Unsupervised estimators on the Nystrom embedding: kernel PCA and kernel k-means.

Both embed the data with the Nystrom feature map ``phi_M(x) = K_MM^{+1/2} k_M(x)``
of M centers chosen by daskkrr's samplers, the projection of the kernel feature
map that the FALKON slides use for unsupervised learning ("Nystrom projections
for unsupervised learning"), and fit out of core, one pass over the data at a time:

- :class:`NystromKernelPCA` (Sterge, Sriperumbudur, Rosasco and Rudi, AISTATS
  2020): one pass, then an ``M x M`` eigendecomposition on the client;
- :class:`NystromKernelKMeans` (Calandriello and Rosasco, NeurIPS 2018):
  k-means|| seeding in a few passes, then one pass per Lloyd iteration.

The papers show that ``M ~ sqrt(n)`` uniformly sampled centers match the
statistical accuracy of the exact methods, whose n x n kernel matrix does not fit
in memory beyond a few tens of thousands of rows.
"""

from __future__ import annotations

import textwrap
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClusterMixin, TransformerMixin
from sklearn.utils import Tags
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from daskkrr.data.inputs import is_in_memory
from daskkrr.data.predict_rows import check_extreme_rows, check_finite_rows
from daskkrr.models.kernel_model import (
    KernelModelBase,
    ParameterError,
    positive,
    store_params,
)
from daskkrr.models.regressors import PARAM_DOCS
from daskkrr.parallel import Executor
from daskkrr.pipeline import run_fit
from daskkrr.pipeline.unsupervised import kmeans_stages, kpca_stages
from daskkrr.sampling import SAMPLERS, CenterSampler
from daskkrr.solvers.kmeans import centroid_products, inertia_block, labels_block

UNSUPERVISED_DOCS = {
    "n_components": """n_components : int or None, default=None
    Number of principal components kept: at most ``n_centers`` (the Nystrom
    embedding has M dimensions). None keeps them all (the numerical rank of
    ``K_MM``).""",
    "n_clusters": """n_clusters : int, default=8
    Number of clusters k.""",
    "init": """init : {"k-means||", "random"} or (sparse) array of shape (n_clusters, n_features), default="k-means||"
    Initial centroids: "k-means||" (Bahmani et al. 2012: ``init_rounds``
    passes, each sampling about ``oversampling_factor * n_clusters`` rows,
    then weighted k-means++ on the candidates, on the client), "random"
    (``n_clusters`` distinct rows), or points in the input feature space
    (their embeddings start Lloyd's iterations).""",
    "n_init": """n_init : "auto" or int, default="auto"
    Number of initialisations, each followed by Lloyd's iterations; the run
    of least inertia is kept. "auto" makes 10 runs with ``init="random"`` and
    1 otherwise (scikit-learn's rule). Given centroids (``init`` an array)
    make one run. Each run costs its own seeding and Lloyd passes (less with
    ``strategy="cache"``); the first run is the one ``n_init=1`` makes.""",
    "kmeans_max_iter": """max_iter : int, default=100
    Maximum Lloyd iterations, each one pass over the data (or over the kernel
    rows kept in memory). A fit that stops at ``max_iter`` warns
    (``ConvergenceWarning``).""",
    "kmeans_tol": """tol : float, default=1e-4
    Stop when the squared move of the centroids is at most ``tol`` times the
    data's mean variance per coordinate of the embedding (scikit-learn's
    rule); they also stop when the labels no longer change.""",
    "init_rounds": """init_rounds : int, default=5
    Rounds (passes) of k-means|| sampling; Bahmani et al. find about 5 enough.""",
    "oversampling_factor": """oversampling_factor : float, default=2.0
    k-means|| samples about ``oversampling_factor * n_clusters`` rows per round
    (``l = 2k`` in Bahmani et al.).""",
    "kmeans_strategy": """strategy : {"auto", "recompute", "cache"}, default="auto"
    "cache" keeps the ``n x M`` kernel rows in the workers' memory after the
    first Lloyd pass, so iterations cost ``O(n M k)`` and read no data;
    "recompute" builds them on every pass (memory of a tile per task); "auto"
    caches when they take at most 1/8 of the workers' memory (the cost model
    of :mod:`daskkrr.parallel.cost`). Both give the same result.""",
    "unsup_penalty": """penalty : float, default=1e-6
    Only for the leverage-score samplers ("squeak", "bless", ...): their
    regularisation ``gamma = penalty * n``. Uniform sampling ignores it.""",
}


def _doc(*names: str) -> str:
    entries = "\n".join(textwrap.indent({**PARAM_DOCS, **UNSUPERVISED_DOCS}[name], "    ") for name in names)
    return f"""Parameters
    ----------
{entries}
"""


_COMMON_CONSTRAINTS: dict[str, Any] = {
    "kernel": KernelModelBase._parameter_constraints["kernel"],
    "sigma": KernelModelBase._parameter_constraints["sigma"],
    "n_centers": [positive(Integral)],
    "sampler": [StrOptions(set(SAMPLERS)), CenterSampler, np.ndarray],
    "penalty": [positive(Real)],
    "kernel_params": [dict, None],
    "standardize": ["boolean"],
    "chunks": [positive(Integral), None],
    "random_state": [Interval(Integral, 0, None, closed="left"), np.random.Generator, np.random.RandomState, None],
    "verbose": ["boolean"],
}


class NystromUnsupervisedBase(KernelModelBase):
    """Fit (no target), input checks and save shared by the Nystrom unsupervised estimators."""

    _parameter_constraints: ClassVar[dict[str, Any]] = dict(_COMMON_CONSTRAINTS)
    #: Fitted arrays a model file keeps (beyond the centers and the scaler).
    _saved_arrays: ClassVar[tuple[str, ...]] = ()
    _saved_scalars: ClassVar[tuple[str, ...]] = ()
    #: Sparse X (CSR/CSC, dask arrays of sparse blocks, sparse stores): the embedding's kernel blocks come from
    #: sparse dot products; the centers (and k-means' given ``init``) are dense rows.
    _sparse_input: ClassVar[bool] = True

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        return tags

    @property
    def n_centers_(self) -> int:
        """M, the number of centers (``n_centers``, or fewer on data with fewer rows)."""
        return int(self.centers_.shape[0])

    def _check_data_size(self, n: int) -> None:
        """Refusals that need only the number of rows (before any pass)."""

    def _stages(self) -> tuple:
        raise NotImplementedError

    def fit(self, X: Any, y: Any = None) -> Any:
        """Fit on ``X`` (numpy, scipy sparse, dask, xarray or a Zarr store); ``y`` is ignored.

        Parameters
        ----------
        X : array-like, scipy sparse matrix, dask array or store of shape (n_samples, n_features)
            Training features. Sparse rows (CSR/CSC, dask arrays of sparse blocks, a store from
            ``daskkrr convert --sparse``) stay sparse: their columns are scaled, not centred, and a
            dot-product kernel with ``standardize=True`` is refused.
        y : ignored
            Accepted for scikit-learn's API (pipelines) and not used.

        Returns
        -------
        self
        """
        self._validate_params()
        if is_in_memory(X):
            X = validate_data(self, X, accept_sparse=self._sparse_formats(), dtype="numeric", ensure_all_finite=False)
            self._check_data_size(X.shape[0])
        ctx = run_fit(self, X, None, self._stages(), iterative=isinstance(self, NystromKernelKMeans))
        for name, value in ctx.fitted.items():
            setattr(self, name, value)
        return self

    def save(self, path: Any, *, overwrite: bool = False, store: str = "auto") -> Any:
        """Save the fitted model (arrays + JSON metadata, no pickle); see :func:`daskkrr.load`.

        All its arrays go to ``arrays.npz``: ``store`` may be "auto" or "npz".
        """
        from daskkrr.models.persistence import check_store
        from daskkrr.models.unsupervised_persistence import save_unsupervised

        check_store(store, self, zarr_possible=False)
        return save_unsupervised(self, path, overwrite=overwrite)


class NystromKernelPCA(TransformerMixin, NystromUnsupervisedBase):
    __doc__ = f"""Kernel PCA on the Nystrom embedding of M centers, out of core.

    The fit is one pass over the data that tree-sums, on the workers, the
    second moments of the embedded rows (the whitened ``K_MN K_NM`` and the
    column sums ``K_MN 1`` that centre it in feature space), then the
    eigendecomposition of the centred ``K_MM^{{-1/2}} K_MN K_NM K_MM^{{-1/2}} / n``
    on the client (Sterge et al., AISTATS 2020). ``transform`` is blockwise and
    lazy for dask input: ``k(x, centers_) @ coef_ + intercept_``.

    With every row as a center it is scikit-learn's ``KernelPCA`` (centred, same
    kernel): ``eigenvalues_`` are KernelPCA's divided by n, and the projections
    agree up to sign.

    {_doc("n_components", "kernel", "sigma", "n_centers", "sampler", "unsup_penalty", "kernel_params",
          "standardize", "chunks", "random_state", "verbose")}
    Attributes
    ----------
    eigenvalues_ : ndarray of shape (n_components,)
        Variance of the data along each component in the Nystrom feature space:
        the eigenvalues of the centred covariance of the embedding (decreasing).
    explained_variance_ratio_ : ndarray of shape (n_components,)
        ``eigenvalues_`` over the *Nystrom trace*, the total variance of the
        embedded data (the sum of all ``rank_`` eigenvalues). It is relative to
        what the M centers capture, not to the exact kernel's total variance,
        which would need the n x n kernel matrix.
    coef_ : ndarray of shape (M, n_components)
        Coefficients of the components on the centers.
    intercept_ : ndarray of shape (n_components,)
        Minus the projection of the mean embedding (the centring).
    n_components_ : int
        Components kept.
    rank_ : int
        Numerical rank of ``K_MM``: the dimension of the embedding.
    centers_, center_indices_, center_weights_ : ndarrays
        The M centers (in standardised feature space), their training rows and weights.
    basis_ : ndarray of shape (M, r)
        ``K_MM^{{+1/2}}`` with ``r = rank_`` columns: the embedding is ``k(x, centers_) @ basis_``.
    kernel_, scaler_, n_features_in_, n_data_passes_, fit_time_
        As in :class:`daskkrr.FalkonRegressor`.

    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr import NystromKernelPCA
    >>> X = np.random.default_rng(0).normal(size=(500, 3))
    >>> Y = NystromKernelPCA(n_components=2, n_centers=100, random_state=0).fit_transform(X)
    >>> Y.shape
    (500, 2)
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "n_components": [positive(Integral), None], **_COMMON_CONSTRAINTS,
    }
    _saved_arrays = ("centers_", "center_indices_", "center_weights_", "basis_", "coef_", "intercept_",
                     "eigenvalues_", "explained_variance_ratio_")
    _saved_scalars = ("n_features_in_", "n_components_", "rank_", "n_data_passes_", "fit_time_")

    def __init__(self, n_components: int | None = None, kernel: Any = "gaussian", sigma: float | None = None,
                 n_centers: int = 1000, sampler: Any = "uniform", penalty: float = 1e-6,
                 kernel_params: dict | None = None, standardize: bool = True, chunks: int | None = None,
                 random_state: Any = None, verbose: bool = False):
        store_params(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        if self.n_components is not None and self.n_components > self.n_centers:
            raise ParameterError(
                f"n_components={self.n_components} is larger than n_centers={self.n_centers}: the Nystrom "
                f"embedding has at most n_centers dimensions; use n_components <= {self.n_centers} or more centers",
                parameter="n_components",
            )

    def _stages(self) -> tuple:
        return kpca_stages()

    def transform(self, X: Any) -> Any:
        """Scores on the components: numpy in, numpy out; dask, xarray or a store in, a lazy dask array out."""
        return self._raw_decision(X)

    def _check_fitted(self) -> None:
        check_is_fitted(self, "eigenvalues_")

    def fit_transform(self, X: Any, y: Any = None, **fit_params: Any) -> Any:
        """Fit on ``X``, then transform it (a second pass for dask input, lazily)."""
        return self.fit(X, y).transform(X)


class NystromKernelKMeans(ClusterMixin, NystromUnsupervisedBase):
    __doc__ = f"""Kernel k-means on the Nystrom embedding of M centers, out of core.

    k-means in the feature space of ``phi_M(x) = K_MM^{{+1/2}} k_M(x)``
    (Calandriello and Rosasco, NeurIPS 2018): its expected loss is within
    ``k / sqrt(n) + k / M`` of the exact kernel k-means', so ``M ~ sqrt(n)``
    centers suffice. Seeding is k-means|| (a few passes); each Lloyd iteration
    is one pass that assigns the rows block by block and tree-sums the clusters'
    sums and counts. The ``n x M`` kernel rows are kept in memory only when the
    cost model says they fit (``strategy``). With every row as a center it is
    exact kernel k-means.

    Lloyd's iterations run on daskkrr's execution layer, not on dask-ml's
    ``KMeans`` (see the user guide, "Unsupervised learning", for the measurement).

    {_doc("n_clusters", "kernel", "sigma", "n_centers", "sampler", "unsup_penalty", "init", "n_init", "kmeans_max_iter",
          "kmeans_tol", "init_rounds", "oversampling_factor", "kmeans_strategy", "kernel_params", "standardize",
          "chunks", "random_state", "verbose")}
    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, r)
        Centroids in the Nystrom embedding (``phi_M(x) = k(x, centers_) @ basis_``, r coordinates).
    labels_ : ndarray of shape (n_samples,) or dask array
        Cluster of every training row: numpy for in-memory input, a lazy dask
        array for dask, xarray or Zarr input (computing it reads the data again).
    inertia_ : float
        Sum of squared distances of the training rows to their centroid, in the
        Nystrom feature space.
    n_iter_ : int
        Lloyd iterations run.
    converged_ : bool
        Whether they stopped before ``max_iter``.
    strategy_ : str
        "cache" if the kernel rows were kept in memory, else "recompute".
    centers_, center_indices_, center_weights_, basis_, kernel_, scaler_, n_features_in_
        As in :class:`NystromKernelPCA`.

    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr import NystromKernelKMeans
    >>> X = np.random.default_rng(0).normal(size=(500, 2))
    >>> km = NystromKernelKMeans(n_clusters=3, n_centers=100, random_state=0).fit(X)
    >>> km.labels_.shape
    (500,)
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "n_clusters": [positive(Integral)],
        **_COMMON_CONSTRAINTS,
        "init": [StrOptions({"k-means||", "random"}), "array-like", "sparse matrix"],
        "n_init": [StrOptions({"auto"}), positive(Integral)],
        "max_iter": [positive(Integral)],
        "tol": [Interval(Real, 0, None, closed="left")],
        "init_rounds": [positive(Integral)],
        "oversampling_factor": [positive(Real)],
        "strategy": [StrOptions({"auto", "recompute", "cache"})],
    }
    _saved_arrays = ("centers_", "center_indices_", "center_weights_", "basis_", "cluster_centers_")
    _saved_scalars = ("n_features_in_", "inertia_", "n_iter_", "converged_", "n_data_passes_", "fit_time_")

    def __init__(self, n_clusters: int = 8, kernel: Any = "gaussian", sigma: float | None = None,
                 n_centers: int = 1000, sampler: Any = "uniform", penalty: float = 1e-6, init: Any = "k-means||",
                 n_init: int | str = "auto", max_iter: int = 100, tol: float = 1e-4, init_rounds: int = 5,
                 oversampling_factor: float = 2.0,
                 strategy: str = "auto", kernel_params: dict | None = None, standardize: bool = True,
                 chunks: int | None = None, random_state: Any = None, verbose: bool = False):
        store_params(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        if not isinstance(self.init, str):
            shape = np.shape(self.init)
            if len(shape) != 2 or shape[0] != self.n_clusters:
                raise ParameterError(
                    f"init must be 'k-means||', 'random' or an array of shape (n_clusters, n_features) = "
                    f"({self.n_clusters}, n_features); got an array of shape {shape}", parameter="init")

    def _check_data_size(self, n: int) -> None:
        if n < self.n_clusters:
            raise ValueError(f"n_samples={n} should be >= n_clusters={self.n_clusters}.")

    def _stages(self) -> tuple:
        return kmeans_stages()

    def _check_fitted(self) -> None:
        check_is_fitted(self, "cluster_centers_")

    def predict(self, X: Any) -> Any:
        """Nearest centroid: numpy in, numpy out; dask, xarray or a store in, a lazy dask array out."""
        self._check_fitted()
        Xs, in_memory = self._scaled(X, np.float64)
        A, c_sq = centroid_products(self.basis_, self.cluster_centers_)
        if in_memory:
            return labels_block(Xs, self.kernel_, self.centers_, A, c_sq)
        return Xs.map_blocks(_checked_labels, self.kernel_, self.centers_, A, c_sq, drop_axis=1, dtype=np.int64,
                             meta=np.empty(0, dtype=np.int64))

    def fit_predict(self, X: Any, y: Any = None, **kwargs: Any) -> Any:
        """Fit and return ``labels_``."""
        return self.fit(X).labels_

    def score(self, X: Any, y: Any = None) -> float:
        """Minus the inertia of ``X`` against the centroids (higher is better, as scikit-learn's KMeans)."""
        self._check_fitted()
        Xs, in_memory = self._scaled(X, np.float64)
        args = (self.kernel_, self.centers_, self.basis_, self.cluster_centers_)
        if in_memory:
            return -float(inertia_block(Xs, *args)[0])
        return -float(Executor().passes(Xs.rechunk({1: -1})).map_reduce(inertia_block, *args, name="score")[0])


def _checked_labels(Xb: np.ndarray, kernel: Any, Z: np.ndarray, A: np.ndarray, c_sq: np.ndarray,
                    block_info: dict | None = None) -> np.ndarray:
    start = block_info[0]["array-location"][0][0] if block_info and 0 in block_info else 0
    check_finite_rows(Xb, start)
    check_extreme_rows(Xb, start, np.float64)
    return labels_block(Xb, kernel, Z, A, c_sq)


__all__ = ["NystromKernelKMeans", "NystromKernelPCA", "NystromUnsupervisedBase"]
