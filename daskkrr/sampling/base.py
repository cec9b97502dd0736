"""Center-selection interface shared by every sampler, the registry and the input checks.

A sampler looks at the (row-chunked, already scaled) training data and returns a
:class:`CenterDictionary`: the centers ``Z`` that the Nystrom/FALKON solvers use,
where each came from, and the importance weights the weighted FALKON
preconditioner needs. Samplers schedule their passes over the data through
:class:`~daskkrr.parallel.executor.Executor` only (see :func:`resolve_executor`).

The regularisation ``gamma`` of leverage-score sampling is in kernel-matrix units,
``tau_i(gamma) = (K (K + gamma I)^{-1})_ii``. FALKON writes its penalty per sample,
minimising ``(1/n) ||y - K_nM a||^2 + lambda a^T K_MM a``, whose ridge in kernel-matrix
units is ``gamma = lambda * n``: samplers take ``gamma=None`` to mean exactly that
(:func:`resolve_gamma`). A dictionary sampled at ``gamma`` approximates ``K`` up to
``gamma / (1 - eps)`` in operator norm; its size grows like ``qbar * d_eff(gamma)``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import dask.array as da
import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.parallel.executor import Executor


@dataclasses.dataclass
class CenterDictionary:
    """A set of unique Nystrom centers.

    Attributes
    ----------
    centers : ndarray of shape (m, d)
        The center points, in the (scaled) feature space the model is fitted in.
    indices : ndarray of shape (m,), int64
        Row index of each center in the training data.
    weights : ndarray of shape (m,), float64
        Importance weight of each center, normalised so that uniform sampling gives
        all ones: ``w_j = 1 / (n p_j)`` for a center drawn with per-draw probability
        ``p_j`` (for a SQUEAK dictionary the copies ``q_j`` enter as well). FALKON's
        preconditioner uses ``D = diag(sqrt(w))`` around ``K_MM``.
    counts : ndarray of shape (m,), int64 or None
        Number of copies of each center (SQUEAK/DISQUEAK), or None.
    probabilities : ndarray of shape (m,), float64 or None
        Inclusion probability of each center when it was kept, or None.
    info : dict
        Sampler-specific diagnostics (history, d_eff estimates, ...), JSON-ready.
    """

    centers: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    counts: np.ndarray | None = None
    probabilities: np.ndarray | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.centers = np.ascontiguousarray(np.atleast_2d(self.centers))
        self.indices = np.asarray(self.indices, dtype=np.int64).ravel()
        self.weights = np.asarray(self.weights, dtype=np.float64).ravel()
        m = self.centers.shape[0]
        if self.indices.shape != (m,) or self.weights.shape != (m,):
            raise ValueError(
                f"CenterDictionary: centers {self.centers.shape}, indices {self.indices.shape} and "
                f"weights {self.weights.shape} must agree on the number of centers"
            )
        if np.any(~np.isfinite(self.weights)) or np.any(self.weights <= 0):
            raise ValueError("CenterDictionary: weights must be finite and > 0")

    @property
    def size(self) -> int:
        return int(self.centers.shape[0])

    @property
    def is_uniform(self) -> bool:
        return bool(np.allclose(self.weights, 1.0))


class CenterSampler:
    """Chooses Nystrom centers from row-chunked data.

    Implementations keep their own parameters (set in ``__init__``) and implement
    :meth:`_select` (the built-in samplers), or override :meth:`select` itself. They
    must be deterministic for a given ``random_state`` and must not depend on the
    number of workers or on how ``X`` is chunked unless they say so in their docstring.
    """

    #: Registry name, used by ``FalkonRegressor(sampler=<name>)``.
    name: str = ""

    def select(
        self,
        X: da.Array,
        kernel: Kernel,
        *,
        n_centers: int | None = None,
        penalty: float | None = None,
        random_state: int | None = None,
        executor: Any = None,
        client: Any = None,
    ) -> CenterDictionary:
        """Return the centers for data ``X`` (n, d), a row-chunked dask array.

        Parameters
        ----------
        X : dask array of shape (n, d)
            Training features, already standardised, one chunk across the columns.
        kernel : Kernel
            The kernel of the model (leverage-score samplers need it).
        n_centers : int or None
            Requested number of centers. Samplers that size their dictionary
            themselves (SQUEAK) may treat it as a budget or ignore it.
        penalty : float
            FALKON's lambda; RLS samplers default to ``gamma = penalty * n``.
        random_state : int or None
            Seed. The result must not depend on the number of workers.
        executor : Executor, distributed.Client or None
            Where the passes over ``X`` run (:meth:`Executor.coerce`); None: Dask's
            current context (the current distributed client, else the local scheduler).
        client : distributed.Client or None
            Alias of ``executor`` (pass one or the other).

        Returns
        -------
        CenterDictionary
            The centers; ``info["seconds"]`` is the selection's wall-clock time.
        """
        return self._timed_select(X, kernel, executor, client, n_centers=n_centers, penalty=penalty,
                                  random_state=random_state)

    def _timed_select(self, X: Any, kernel: Kernel, executor: Any, client: Any, **arguments: Any) -> CenterDictionary:
        """:meth:`_select` on the resolved executor, its wall-clock seconds added to ``info``."""
        t0 = time.perf_counter()
        out = self._select(X, kernel, executor=resolve_executor(executor, client), **arguments)
        out.info.setdefault("seconds", time.perf_counter() - t0)
        return out

    def _select(self, X: Any, kernel: Kernel, *, n_centers: int | None, penalty: float | None,
                random_state: int | None, executor: Executor) -> CenterDictionary:
        """The selection itself, on ``select``'s arguments with ``executor`` resolved."""
        raise NotImplementedError(f"{type(self).__name__} implements neither _select nor select")

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


#: Registered samplers by name, in registration order (``make_sampler`` looks names up here).
SAMPLERS: dict[str, type[CenterSampler]] = {}

S = TypeVar("S", bound=type[CenterSampler])


def register(cls: S) -> S:
    """Class decorator: make ``cls`` available to :func:`make_sampler` under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no registry name")
    SAMPLERS[cls.name] = cls
    return cls


#: The sampler an array of centers becomes (:class:`~daskkrr.sampling.fixed.FixedCenters`, which sets
#: it on import: a registration like :func:`register`'s, so that this module need not import its subclass).
ARRAY_SAMPLER: Callable[[np.ndarray], CenterSampler] | None = None


def make_sampler(sampler: str | CenterSampler | np.ndarray, **params: Any) -> CenterSampler:
    """Return a sampler object from a registry name or pass one through.

    An array (the centers themselves) gives :class:`~daskkrr.sampling.fixed.FixedCenters`.

    Parameters
    ----------
    sampler : str, CenterSampler or ndarray of shape (n_centers, n_features)
        A name in :data:`SAMPLERS` (``"uniform"``, ``"rls"``, ``"squeak"``,
        ``"disqueak"``, ``"bless"``, ``"rpcholesky"``), a sampler object (returned
        as is), or the centers themselves.
    **params
        Passed to the sampler's constructor.

    Returns
    -------
    CenterSampler
        The sampler object.
    """
    if isinstance(sampler, CenterSampler):
        return sampler
    if isinstance(sampler, np.ndarray):
        if ARRAY_SAMPLER is None:  # set when daskkrr.sampling (hence sampling.fixed) is imported
            raise RuntimeError("import daskkrr.sampling before passing an array of centers")
        return ARRAY_SAMPLER(sampler)
    if not isinstance(sampler, str):
        raise TypeError(
            f"sampler must be a name, a CenterSampler or an array of centers; got {type(sampler).__name__}"
        )
    key = sampler.lower()
    if key not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {sorted(SAMPLERS)}")
    return SAMPLERS[key](**params)


def resolve_executor(executor: Any = None, client: Any = None) -> Executor:
    """The executor of a ``select`` call: ``executor`` or its alias ``client`` (not both)."""
    if executor is not None and client is not None:
        raise TypeError("pass executor= or client=, not both (client is an alias of executor)")
    return Executor.coerce(executor if executor is not None else client)


def as_row_chunked(X: Any, *, default_rows: int = 8192) -> da.Array:
    """Return ``X`` as a 2-D dask array with one chunk across the columns.

    numpy inputs are wrapped with blocks of ``default_rows`` rows.
    """
    if not isinstance(X, da.Array):
        arr = np.asarray(X)
        if arr.ndim != 2:
            raise ValueError(f"X must be 2-D (rows, features); got shape {arr.shape}")
        return da.from_array(arr, chunks=(min(default_rows, max(1, arr.shape[0])), arr.shape[1]))
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D dask array (rows, features); got shape {X.shape}")
    if X.numblocks[1] != 1:
        raise ValueError(
            f"X has {X.numblocks[1]} chunks across its {X.shape[1]} columns; samplers need each "
            "block to hold all columns: X = X.rechunk({1: -1})"
        )
    if any(np.isnan(c) for c in X.chunks[0]):
        raise ValueError(
            "X has unknown chunk sizes along the rows; call X.compute_chunk_sizes() first"
        )
    if X.shape[0] == 0:
        raise ValueError("X has no rows")
    return X


def resolve_gamma(gamma: float | None, penalty: float | None, n: int) -> float:
    """``gamma`` if given, else ``penalty * n``; checked to be finite and > 0.

    Parameters
    ----------
    gamma : float or None
        Explicit regularisation in kernel-matrix units.
    penalty : float or None
        FALKON's per-sample penalty ``lambda``.
    n : int
        Number of rows the dictionary is built on.
    """
    if gamma is None:
        if penalty is None:
            raise ValueError("gamma is None and no penalty was given: pass gamma= or penalty=")
        value = float(penalty) * int(n)
        source = f"penalty * n = {penalty!r} * {n}"
    else:
        value = float(gamma)
        source = f"gamma = {gamma!r}"
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the leverage-score regularisation must be finite and > 0; got {source}")
    return value
