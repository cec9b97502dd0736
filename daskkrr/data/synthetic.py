"""Synthetic regression and classification data, generated block by block.

Every row block is drawn from its own random stream,
``SeedSequence(random_state, spawn_key=(1, block_index))``, so blocks are
generated independently (in parallel, on any worker) and nothing ever holds the
whole array. Features are iid standard normal. The target is a fixed smooth
function of at most five randomly chosen features (see :class:`SmoothTarget`)
whose parameters come from ``SeedSequence(random_state, spawn_key=(0,))``; a
Gaussian-kernel model can learn it.

The output is deterministic for a given ``random_state`` and ``chunk_rows``
(changing ``chunk_rows`` changes which stream produces which row).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import dask.array as da
import numpy as np

from daskkrr.data.chunking import auto_chunk_rows
from daskkrr.data.validation import check_chunk_rows
from daskkrr.data.writing import write_zarr

__all__ = [
    "SmoothTarget",
    "make_blobs",
    "make_classification",
    "make_regression",
    "write_blobs_zarr",
    "write_classification_zarr",
    "write_regression_zarr",
]

#: Number of features the target depends on (at most).
N_ACTIVE = 5
#: Number of sine terms in the target function.
N_SINES = 4
#: Weight of the pairwise product term (before normalisation).
PRODUCT_WEIGHT = 0.5
#: Size of the fixed sample that normalises the target and places class thresholds.
N_CALIBRATION = 20_000

#: Blob centers are uniform in [-CENTER_BOX, CENTER_BOX]^d: with the default cluster_std 1, two
#: centers are on average about sqrt(2 d / 3) CENTER_BOX apart, 8 sqrt(d) cluster std.
CENTER_BOX = 10.0

#: A function, typed as itself through a decorator.
F = TypeVar("F", bound=Callable[..., Any])

_PARAMS_KEY = 0
_BLOCKS_KEY = 1
_CENTERS_KEY = 2


@dataclasses.dataclass(frozen=True, eq=False)
class SmoothTarget:
    """A fixed smooth nonlinear function of a few features, with mean 0 and variance 1.

    ``f(x) = (sum_j a_j sin(x_A . w_j + b_j) + c x_A0 x_A1 - offset) / scale``
    on the active features ``A``; ``offset`` and ``scale`` are the mean and
    standard deviation of the raw function on a fixed calibration sample, so
    that for standard normal features ``f`` has mean about 0 and variance about 1.

    Attributes
    ----------
    active : ndarray of int
        Sorted indices of the features the function depends on.
    weights : ndarray of shape (len(active), N_SINES)
        Projection vectors ``w_j`` (columns).
    phases, amplitudes : ndarray of shape (N_SINES,)
        ``b_j`` and ``a_j``.
    product_scale : float
        ``c``, the weight of the product of the first two active features
        (0 when there is only one feature).
    offset, scale : float
        Normalisation constants.
    """

    active: np.ndarray
    weights: np.ndarray
    phases: np.ndarray
    amplitudes: np.ndarray
    product_scale: float
    offset: float = 0.0
    scale: float = 1.0

    @classmethod
    def draw(cls, n_features: int, random_state: int) -> SmoothTarget:
        """Draw the function's parameters for ``n_features`` inputs and normalise it."""
        rng = np.random.default_rng(np.random.SeedSequence(random_state, spawn_key=(_PARAMS_KEY,)))
        k = min(N_ACTIVE, n_features)
        active = np.sort(rng.choice(n_features, size=k, replace=False))
        # Features are N(0, 1): projections of norm ~1 give wavelengths of a few units.
        weights = rng.standard_normal((k, N_SINES)) / np.sqrt(k)
        phases = rng.uniform(0.0, 2.0 * np.pi, N_SINES)
        amplitudes = rng.uniform(0.5, 1.5, N_SINES)
        raw = cls(active, weights, phases, amplitudes, PRODUCT_WEIGHT if k >= 2 else 0.0)
        values = raw.on_active(calibration_sample(random_state, k)[0])
        scale = float(values.std())
        return dataclasses.replace(
            raw, offset=float(values.mean()), scale=scale if scale > 0 else 1.0
        )

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """Evaluate on a block ``X`` (rows, d); returns float64 of shape (rows,)."""
        return self.on_active(np.asarray(X)[:, self.active])

    def on_active(self, Xa: np.ndarray) -> np.ndarray:
        """Evaluate on the active columns only, ``Xa = X[:, active]``."""
        Xa = np.asarray(Xa, dtype=np.float64)
        f = np.sin(Xa @ self.weights + self.phases) @ self.amplitudes
        if self.product_scale:
            f = f + self.product_scale * Xa[:, 0] * Xa[:, 1]
        return (f - self.offset) / self.scale


def calibration_sample(random_state: int, n_active: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed ``(N_CALIBRATION, n_active)`` standard normal sample and noise draws.

    Features are iid, so the active columns alone describe the target's distribution.
    """
    rng = np.random.default_rng(np.random.SeedSequence(random_state, spawn_key=(_PARAMS_KEY, 1)))
    return rng.standard_normal((N_CALIBRATION, n_active)), rng.standard_normal(N_CALIBRATION)


def make_regression(
    n: int,
    d: int,
    chunk_rows: int | None = None,
    noise: float = 0.1,
    random_state: int = 0,
    dtype: Any = "float64",
) -> tuple[da.Array, da.Array]:
    """Lazy synthetic regression data with a smooth nonlinear target.

    Parameters
    ----------
    n, d : int
        Number of rows and features (both >= 1).
    chunk_rows : int or None, default=None
        Rows per block; None picks about 64 MiB per block of ``X``.
    noise : float, default=0.1
        Standard deviation of the Gaussian noise added to the target; the
        noiseless target has mean about 0 and variance about 1, so this is the
        noise-to-signal ratio.
    random_state : int, default=0
        Seed; the data are a deterministic function of it and of ``chunk_rows``.
    dtype : dtype-like, default="float64"
        Floating dtype of ``X`` and ``y``.

    Returns
    -------
    X : dask array of shape (n, d)
        Standard normal features, one chunk across the columns.
    y : dask array of shape (n,)
        ``f(X) + noise * N(0, 1)`` with ``f`` a :class:`SmoothTarget`.
    """
    X, target, _ = _features(n, d, chunk_rows, noise, random_state, dtype)
    y = da.map_blocks(  # the module function: dask's stubs mistype the Array.map_blocks method
        _regression_block,
        X,
        target=target,
        noise=float(noise),
        random_state=random_state,
        out_dtype=X.dtype,
        drop_axis=1,
        dtype=X.dtype,
        meta=np.empty((0,), dtype=X.dtype),
    )
    return X, y


def make_classification(
    n: int,
    d: int,
    n_classes: int = 2,
    chunk_rows: int | None = None,
    noise: float = 0.1,
    random_state: int = 0,
    dtype: Any = "float64",
) -> tuple[da.Array, da.Array]:
    """Lazy synthetic classification data with nonlinear class boundaries.

    A latent score ``f(x) + noise * N(0, 1)`` (``f`` as in :func:`make_regression`)
    is cut at fixed thresholds, its quantiles on a calibration sample, so the
    ``n_classes`` classes are about equally frequent.

    Parameters
    ----------
    n, d : int
        Number of rows and features (both >= 1).
    n_classes : int, default=2
        Number of classes (>= 2); labels are ``0 .. n_classes - 1``.
    chunk_rows, noise, random_state, dtype
        As in :func:`make_regression`; ``noise`` blurs the class boundaries.

    Returns
    -------
    X : dask array of shape (n, d)
    y : dask array of shape (n,), int64
    """
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
        raise ValueError(f"n_classes must be an integer >= 2; got {n_classes!r}")
    X, target, _ = _features(n, d, chunk_rows, noise, random_state, dtype)
    thresholds = _class_thresholds(target, int(n_classes), float(noise), random_state)
    y = da.map_blocks(
        _classification_block,
        X,
        target=target,
        thresholds=thresholds,
        noise=float(noise),
        random_state=random_state,
        drop_axis=1,
        dtype=np.int64,
        meta=np.empty((0,), dtype=np.int64),
    )
    return X, y


def make_blobs(
    n: int,
    d: int,
    n_clusters: int = 3,
    chunk_rows: int | None = None,
    cluster_std: float = 1.0,
    random_state: int = 0,
    dtype: Any = "float64",
) -> tuple[da.Array, da.Array]:
    """Lazy synthetic data made of ``n_clusters`` Gaussian blobs, with each row's blob as ``y``.

    The data for the unsupervised estimators (k-means, kernel PCA) and their scores
    (ARI, NMI against ``y``): every row picks a blob uniformly at random and is its
    center plus ``cluster_std * N(0, I)``; the centers are uniform in
    ``[-CENTER_BOX, CENTER_BOX]^d``, drawn from ``SeedSequence(random_state, spawn_key=(2,))``.
    (:func:`make_classification`'s classes are level sets of a smooth function of
    standard-normal features, which have no cluster structure.)

    Parameters
    ----------
    n, d : int
        Number of rows and features (both >= 1).
    n_clusters : int, default=3
        Number of blobs (>= 2); labels are ``0 .. n_clusters - 1``.
    chunk_rows, random_state, dtype
        As in :func:`make_regression`.
    cluster_std : float, default=1.0
        Standard deviation of each blob along every feature (> 0).

    Returns
    -------
    X : dask array of shape (n, d)
    y : dask array of shape (n,), int64
    """
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)) or n_clusters < 2:
        raise ValueError(f"n_clusters must be an integer >= 2; got {n_clusters!r}")
    if not np.isfinite(cluster_std) or cluster_std <= 0:
        raise ValueError(f"cluster_std must be a finite number > 0; got {cluster_std!r}")
    Z, _, _ = _features(n, d, chunk_rows, 0.0, random_state, dtype)
    rng = np.random.default_rng(np.random.SeedSequence(random_state, spawn_key=(_CENTERS_KEY,)))
    centers = rng.uniform(-CENTER_BOX, CENTER_BOX, size=(int(n_clusters), Z.shape[1]))
    y = da.map_blocks(_blob_label_block, Z, n_clusters=int(n_clusters), random_state=random_state,
                      drop_axis=1, dtype=np.int64, meta=np.empty((0,), dtype=np.int64))
    X = da.map_blocks(_blob_block, Z, centers=centers, cluster_std=float(cluster_std), random_state=random_state,
                      dtype=Z.dtype, meta=np.empty((0, 0), dtype=Z.dtype))
    return X, y


def _writes(generator: str, parameters: str) -> Callable[[F], F]:
    """Decorator of a ``write_*_zarr`` function: its docstring, ``parameters`` being those of ``generator``."""
    def document(writer: F) -> F:
        writer.__doc__ = f"""Generate :func:`{generator}` data straight into a Zarr store, block by block.

    The generator settings are stored in the group attribute ``"synthetic"``.

    Parameters
    ----------
    path : str or os.PathLike
        Directory of the new store.
    n, d, {parameters}
        As in :func:`{generator}`.
    overwrite : bool, default=False
        Replace an existing ``path``.

    Returns
    -------
    pathlib.Path
        The store's path.
    """
        return writer

    return document


@_writes("make_blobs", "n_clusters, chunk_rows, cluster_std, random_state, dtype")
def write_blobs_zarr(
    path: str | os.PathLike,
    n: int,
    d: int,
    n_clusters: int = 3,
    chunk_rows: int | None = None,
    cluster_std: float = 1.0,
    random_state: int = 0,
    dtype: Any = "float64",
    overwrite: bool = False,
) -> Path:
    X, y = make_blobs(n, d, n_clusters, chunk_rows, cluster_std, random_state, dtype)
    return _write(path, overwrite, "make_blobs", X, y, None, random_state,  # the blobs' spread is cluster_std
                  n_clusters=int(n_clusters), cluster_std=float(cluster_std))


@_writes("make_regression", "chunk_rows, noise, random_state, dtype")
def write_regression_zarr(
    path: str | os.PathLike,
    n: int,
    d: int,
    chunk_rows: int | None = None,
    noise: float = 0.1,
    random_state: int = 0,
    dtype: Any = "float64",
    overwrite: bool = False,
) -> Path:
    X, y = make_regression(n, d, chunk_rows, noise, random_state, dtype)
    return _write(path, overwrite, "make_regression", X, y, noise, random_state)


@_writes("make_classification", "n_classes, chunk_rows, noise, random_state, dtype")
def write_classification_zarr(
    path: str | os.PathLike,
    n: int,
    d: int,
    n_classes: int = 2,
    chunk_rows: int | None = None,
    noise: float = 0.1,
    random_state: int = 0,
    dtype: Any = "float64",
    overwrite: bool = False,
) -> Path:
    X, y = make_classification(n, d, n_classes, chunk_rows, noise, random_state, dtype)
    return _write(path, overwrite, "make_classification", X, y, noise, random_state, n_classes=int(n_classes))


# --------------------------------------------------------------------------- blocks


def _features(
    n: int, d: int, chunk_rows: int | None, noise: float, random_state: int, dtype: Any
) -> tuple[da.Array, SmoothTarget, int]:
    """Lazy standard-normal ``X`` with one random stream per block, and the target function."""
    n = check_chunk_rows(n, "n")
    d = check_chunk_rows(d, "d")
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"dtype must be a floating type such as 'float64'; got {dtype}")
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite number >= 0; got {noise!r}")
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)):
        raise TypeError(f"random_state must be an int; got {random_state!r}")
    if random_state < 0:
        raise ValueError(f"random_state must be >= 0; got {random_state}")
    rows = auto_chunk_rows(d, dtype.itemsize, n_rows=n) if chunk_rows is None else chunk_rows
    rows = min(check_chunk_rows(rows), n)
    row_chunks = (rows,) * (n // rows) + ((n % rows,) if n % rows else ())
    X = da.map_blocks(
        _feature_block,
        random_state=int(random_state),
        out_dtype=dtype,
        chunks=(row_chunks, (d,)),
        dtype=dtype,
        meta=np.empty((0, 0), dtype=dtype),
    )
    return X, SmoothTarget.draw(d, int(random_state)), rows


def _block_streams(random_state: int, block: int) -> list[np.random.SeedSequence]:
    """Independent (features, noise) seed sequences of one row block."""
    return np.random.SeedSequence(random_state, spawn_key=(_BLOCKS_KEY, block)).spawn(2)


def _block_info(block_info: dict | None, key: int | None) -> dict:
    """One entry of dask's ``block_info`` (by argument position; None: the output block)."""
    if block_info is None:
        raise TypeError("block functions need block_info, which dask.array.map_blocks passes")
    return block_info[key]


def _feature_block(
    random_state: int, out_dtype: np.dtype, block_info: dict | None = None
) -> np.ndarray:
    info = _block_info(block_info, None)
    block = info["chunk-location"][0]
    shape = info["chunk-shape"]
    rng = np.random.default_rng(_block_streams(random_state, block)[0])
    return rng.standard_normal(shape).astype(out_dtype, copy=False)


def _blob_labels(rows: int, n_clusters: int, random_state: int, block: int) -> np.ndarray:
    """The blob of every row of one block (its second stream: the first draws the offsets)."""
    rng = np.random.default_rng(_block_streams(random_state, block)[1])
    return rng.integers(0, n_clusters, size=rows)


def _blob_label_block(Z: np.ndarray, n_clusters: int, random_state: int,
                      block_info: dict | None = None) -> np.ndarray:
    block = _block_info(block_info, 0)["chunk-location"][0]
    return _blob_labels(Z.shape[0], n_clusters, random_state, block).astype(np.int64)


def _blob_block(Z: np.ndarray, centers: np.ndarray, cluster_std: float, random_state: int,
                block_info: dict | None = None) -> np.ndarray:
    """Rows of one block: their blob's center plus ``cluster_std`` times the block's normal draws ``Z``."""
    block = _block_info(block_info, 0)["chunk-location"][0]
    labels = _blob_labels(Z.shape[0], centers.shape[0], random_state, block)
    return (centers[labels] + cluster_std * Z).astype(Z.dtype, copy=False)


def _latent_block(
    X: np.ndarray, target: SmoothTarget, noise: float, random_state: int, block: int
) -> np.ndarray:
    rng = np.random.default_rng(_block_streams(random_state, block)[1])
    return target(X) + noise * rng.standard_normal(X.shape[0])


def _regression_block(
    X: np.ndarray,
    target: SmoothTarget,
    noise: float,
    random_state: int,
    out_dtype: np.dtype,
    block_info: dict | None = None,
) -> np.ndarray:
    block = _block_info(block_info, 0)["chunk-location"][0]
    return _latent_block(X, target, noise, random_state, block).astype(out_dtype, copy=False)


def _classification_block(
    X: np.ndarray,
    target: SmoothTarget,
    thresholds: np.ndarray,
    noise: float,
    random_state: int,
    block_info: dict | None = None,
) -> np.ndarray:
    block = _block_info(block_info, 0)["chunk-location"][0]
    latent = _latent_block(X, target, noise, random_state, block)
    return np.searchsorted(thresholds, latent).astype(np.int64)


def _class_thresholds(
    target: SmoothTarget, n_classes: int, noise: float, random_state: int
) -> np.ndarray:
    """Quantiles of the latent score on the calibration sample (balanced classes)."""
    sample, noise_draws = calibration_sample(random_state, len(target.active))
    latent = target.on_active(sample) + noise * noise_draws
    return np.quantile(latent, np.arange(1, n_classes) / n_classes)


def _write(path: str | os.PathLike, overwrite: bool, generator: str, X: da.Array, y: da.Array, noise: float | None,
           random_state: int, **extra: Any) -> Path:
    """Write a generator's data with its settings (group attribute ``"synthetic"``); ``noise=None``: a
    generator without one; ``extra``: the settings only that generator has."""
    settings: dict[str, Any] = {
        "generator": generator,
        "n": int(X.shape[0]),
        "d": int(X.shape[1]),
        "chunk_rows": int(X.chunks[0][0]),
        "noise": None if noise is None else float(noise),
        "random_state": int(random_state),
        "dtype": str(X.dtype),
        **extra,
    }
    attrs = {"synthetic": {k: v for k, v in settings.items() if v is not None}}
    return write_zarr(X, y, path, overwrite=overwrite, attrs=attrs)
