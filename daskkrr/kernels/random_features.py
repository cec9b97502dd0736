"""Random feature maps ``z(x)`` with ``E[z(a)^T z(b)] = k(a, b)`` for daskkrr's kernels.

Avron, Clarkson and Woodruff precondition exact kernel ridge regression with
``Z Z^T + lambda_p I``, ``Z`` holding s random features of every row (see
:mod:`daskkrr.solvers.pcg`). The maps here, one per kernel family:

- **Gaussian** ``exp(-||a - b||^2 / (2 sigma^2))``: random Fourier features
  (Rahimi and Recht), ``z(x) = sqrt(2 / s) cos(W^T x + b)`` with ``W`` normal of
  scale ``1 / sigma`` and ``b`` uniform on ``[0, 2 pi)``;
- **Laplacian** ``exp(-||a - b||_1 / sigma)``: the same with ``W`` Cauchy of scale
  ``1 / sigma`` (the kernel is a product of one-dimensional ``exp(-|t| / sigma)``,
  whose spectral density is Cauchy);
- **Matern** (Euclidean ``r``, ``nu`` in {1/2, 3/2, 5/2}): the spectral density is
  a multivariate Student-t with ``2 nu`` degrees of freedom and scale ``1 / sigma``,
  sampled as ``g / (sigma sqrt(u / (2 nu)))`` with ``g`` standard normal and ``u``
  chi-square with ``2 nu`` degrees of freedom;
- **Polynomial** ``(gamma <a, b> + coef0)^q``: TensorSketch (Pagh; Pham and Pagh):
  ``x' = [sqrt(gamma) x, sqrt(coef0)]``, q independent CountSketches of ``x'`` into s
  buckets, multiplied in the Fourier domain (their circular convolution);
- **Linear** ``<a, b>``: a Gaussian sketch ``x W / sqrt(s)``.

:class:`SRHTFeatures` composes a map with a subsampled randomised Hadamard
transform to fewer features (the paper's multi-level sketching, Algorithm 2).

Every map draws its parameters once from its seed, so the features of a row
depend only on the seed and the row: the blocks of a dask array can be mapped
independently, in any chunking, on any worker. The maps are small frozen objects
(``O(s d)`` numbers) sent to the workers once.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from daskkrr.kernels.base import Kernel, as_block
from daskkrr.kernels.dot import LinearKernel, PolynomialKernel
from daskkrr.kernels.sparse import cast_rows, is_sparse
from daskkrr.kernels.stationary import GaussianKernel, LaplacianKernel, MaternKernel

__all__ = [
    "CountSketchTensor",
    "FeatureMap",
    "FourierFeatures",
    "GaussianSketch",
    "NystromFeatures",
    "SRHTFeatures",
    "has_random_features",
    "random_features",
]


class FeatureMap(abc.ABC):
    """``x -> z(x)`` in ``R^s``, with ``E[z(a)^T z(b)] = k(a, b)`` over the map's randomness."""

    #: Number of features.
    n_features: int

    def __call__(self, X: Any) -> np.ndarray:
        """Features of the rows of ``X`` (``(n, d)`` -> ``(n, s)``, float64); sparse ``X`` stays sparse (CSR)."""
        if is_sparse(X):
            return self._map(cast_rows(X, np.float64))
        return self._map(as_block(X, "X").astype(np.float64, copy=False))

    @abc.abstractmethod
    def _map(self, X: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True, eq=False)
class FourierFeatures(FeatureMap):
    """``sqrt(2 / s) cos(X W + b)`` (random Fourier features of a stationary kernel)."""

    W: np.ndarray
    b: np.ndarray

    @property
    def n_features(self) -> int:  # type: ignore[override]
        return int(self.W.shape[1])

    def _map(self, X: np.ndarray) -> np.ndarray:
        Z = X @ self.W
        Z += self.b
        np.cos(Z, out=Z)
        Z *= math.sqrt(2.0 / self.n_features)
        return Z


@dataclasses.dataclass(frozen=True, eq=False)
class GaussianSketch(FeatureMap):
    """``X W / sqrt(s)`` with standard normal ``W``: unbiased for the linear kernel."""

    W: np.ndarray

    @property
    def n_features(self) -> int:  # type: ignore[override]
        return int(self.W.shape[1])

    def _map(self, X: np.ndarray) -> np.ndarray:
        return (X @ self.W) / math.sqrt(self.n_features)


@dataclasses.dataclass(frozen=True, eq=False)
class CountSketchTensor(FeatureMap):
    """TensorSketch of ``(gamma <a, b> + coef0)^q``.

    ``buckets[k]`` and ``signs[k]`` (``(q, d + 1)``) are the k-th CountSketch's hash
    and sign of each coordinate of ``x' = [sqrt(gamma) x, sqrt(coef0)]``.
    """

    buckets: np.ndarray
    signs: np.ndarray
    s: int
    gamma: float
    coef0: float

    @property
    def n_features(self) -> int:  # type: ignore[override]
        return int(self.s)

    def _map(self, X: np.ndarray) -> np.ndarray:
        if is_sparse(X):
            return self._map_sparse(X)
        n = X.shape[0]
        Xa = np.empty((n, X.shape[1] + 1))
        Xa[:, :-1] = X * math.sqrt(self.gamma)
        Xa[:, -1] = math.sqrt(self.coef0)
        prod = np.ones((n, self.s // 2 + 1), dtype=np.complex128)
        for h, g in zip(self.buckets, self.signs):
            sketch = np.zeros((n, self.s))
            # CountSketch as a sparse product: column j of Xa goes, with sign g_j, to bucket h_j.
            np.add.at(sketch.T, h, (Xa * g).T)
            prod *= np.fft.rfft(sketch, axis=1)  # circular convolution of the q sketches
        return np.fft.irfft(prod, n=self.s, axis=1)

    def _map_sparse(self, X: Any) -> np.ndarray:
        """The same sketches of sparse rows, each a sparse product ``Xa C_k`` with the CountSketch matrix
        ``C_k[j, h_j] = g_j``: only the ``n x s`` sketches are dense, never the ``n x (d + 1)`` rows."""
        n, width = X.shape[0], X.shape[1] + 1
        Xa = sp.hstack([X * math.sqrt(self.gamma), np.full((n, 1), math.sqrt(self.coef0))], format="csr")
        prod = np.ones((n, self.s // 2 + 1), dtype=np.complex128)
        for h, g in zip(self.buckets, self.signs):
            C = sp.csr_matrix((np.asarray(g, dtype=np.float64), (np.arange(width), h)), shape=(width, self.s))
            prod *= np.fft.rfft(np.asarray((Xa @ C).toarray()), axis=1)
        return np.fft.irfft(prod, n=self.s, axis=1)


def _hadamard_rows(Z: np.ndarray) -> np.ndarray:
    """The (unnormalised) Walsh-Hadamard transform of every row; the width is a power of 2."""
    n, m = Z.shape
    H = Z.copy()
    h = 1
    while h < m:
        H = H.reshape(n, m // (2 * h), 2, h)
        a = H[:, :, 0, :].copy()
        H[:, :, 0, :] += H[:, :, 1, :]
        H[:, :, 1, :] = a - H[:, :, 1, :]
        H = H.reshape(n, m)
        h *= 2
    return H


@dataclasses.dataclass(frozen=True, eq=False)
class SRHTFeatures(FeatureMap):
    """``z(x) S^T`` with the SRHT ``S = sqrt(1 / s2) P H D`` (Algorithm 2, step 6).

    The base features are padded with zeros to a power of two ``m``; ``D`` are random
    signs, ``H`` the Walsh-Hadamard matrix (entries +-1), ``P`` keeps ``s2`` of the
    ``m`` coordinates uniformly at random; with ``H^T H = m I`` and ``E[P^T P] = (s2 / m) I``
    the factor ``1 / sqrt(s2)`` gives ``E[S^T S] = I``, so the map stays unbiased.
    """

    base: FeatureMap
    signs: np.ndarray
    keep: np.ndarray

    @property
    def n_features(self) -> int:  # type: ignore[override]
        return int(self.keep.size)

    def _map(self, X: np.ndarray) -> np.ndarray:
        Z1 = self.base._map(X)
        m = self.signs.size
        padded = np.zeros((Z1.shape[0], m))
        padded[:, : Z1.shape[1]] = Z1
        padded *= self.signs
        return _hadamard_rows(padded)[:, self.keep] / math.sqrt(self.keep.size)


@dataclasses.dataclass(frozen=True, eq=False)
class NystromFeatures(FeatureMap):
    """``k(x, C) K_CC^{-1/2}``: Nystrom features from centers ``C`` (``Z Z^T = K_nC K_CC^+ K_Cn``).

    Not random once the centers are chosen; the comparison preconditioner of the
    issue (``preconditioner="nystrom"``). Eigenvalues of ``K_CC`` below
    ``rcond * max`` are dropped, so ``n_features`` may be below the number of centers.
    """

    kernel: Kernel
    centers: np.ndarray
    T: np.ndarray

    @classmethod
    def from_centers(cls, kernel: Kernel, centers: np.ndarray, rcond: float = 1e-10) -> NystromFeatures:
        C = np.ascontiguousarray(centers, dtype=np.float64)
        w, V = np.linalg.eigh(kernel(C, C))
        keep = w > rcond * max(float(w.max(initial=0.0)), np.finfo(float).tiny)
        return cls(kernel, C, V[:, keep] / np.sqrt(w[keep]))

    @property
    def n_features(self) -> int:  # type: ignore[override]
        return int(self.T.shape[1])

    def _map(self, X: np.ndarray) -> np.ndarray:
        from daskkrr.kernels.engine import engine_for

        K = engine_for(self.kernel).kernel_block(self.kernel, X, self.centers)
        return np.asarray(K, dtype=np.float64) @ self.T


def _length_scales(kernel: Kernel, d: int) -> np.ndarray:
    """The kernel's length scales as a ``(d,)`` vector (an isotropic sigma repeated)."""
    scales = np.atleast_1d(np.asarray(getattr(kernel, "length_scales", kernel.sigma), dtype=np.float64))  # type: ignore[attr-defined]
    if scales.size == 1:
        return np.full(int(d), float(scales[0]))
    if scales.size != int(d):
        raise ValueError(f"{type(kernel).__name__} has {scales.size} length scales but the data have d={d} features")
    return scales


def has_random_features(kernel: Kernel) -> bool:
    """Whether :func:`random_features` knows a map for ``kernel``."""
    return isinstance(kernel, (GaussianKernel, LaplacianKernel, MaternKernel, PolynomialKernel, LinearKernel))


def random_features(kernel: Kernel, n_features: int, d: int, seed: int | None = None,
                    srht_features: int | None = None) -> FeatureMap:
    """The random feature map of ``kernel`` with ``n_features`` features on ``d`` inputs.

    Parameters
    ----------
    kernel : Kernel
        Gaussian, Laplacian, Matern, polynomial or linear.
    n_features : int
        s (> 0); the first level's s1 when ``srht_features`` is given.
    d : int
        Input dimension.
    seed : int or None
        Seed of the map's randomness; the same seed gives the same map.
    srht_features : int or None
        Compose with an SRHT down to this many features (``< n_features``).

    Raises
    ------
    ValueError
        For ``n_features < 1``, ``d < 1`` or ``srht_features`` not in ``[1, n_features)``.
    TypeError
        For a kernel without random features (a custom :class:`Kernel` subclass).
    """
    s = int(n_features)
    if s < 1:
        raise ValueError(f"the number of random features must be >= 1; got {n_features!r}")
    if int(d) < 1:
        raise ValueError(f"d must be >= 1; got {d!r}")
    rng = np.random.default_rng(seed)
    base: FeatureMap
    if isinstance(kernel, (GaussianKernel, LaplacianKernel, MaternKernel)):
        # k(a, b) = k_1(a / sigma, b / sigma) (one length scale, or one per feature: ARD), so the
        # frequencies of the unit kernel are divided, input by input, by the length scales.
        scales = _length_scales(kernel, d)
        if isinstance(kernel, GaussianKernel):
            W = rng.standard_normal((d, s))
        elif isinstance(kernel, LaplacianKernel):
            W = rng.standard_cauchy((d, s))
        else:
            dof = 2.0 * kernel.nu
            W = rng.standard_normal((d, s)) / np.sqrt(rng.chisquare(dof, s) / dof)
        base = FourierFeatures(W / scales[:, None], rng.uniform(0, 2 * np.pi, s))
    elif isinstance(kernel, PolynomialKernel):
        q = int(kernel.degree)
        base = CountSketchTensor(
            buckets=rng.integers(0, s, (q, d + 1)), signs=rng.choice([-1.0, 1.0], (q, d + 1)),
            s=s, gamma=float(kernel.gamma), coef0=float(kernel.coef0),
        )
    elif isinstance(kernel, LinearKernel):
        base = GaussianSketch(rng.standard_normal((d, s)))
    else:
        raise TypeError(
            f"{type(kernel).__name__} has no random feature map (there are maps for the gaussian, "
            f"laplacian, matern, polynomial and linear kernels); use preconditioner='nystrom' or None"
        )
    if srht_features is None:
        return base
    s2 = int(srht_features)
    if not 1 <= s2 < s:
        raise ValueError(f"srht_features must be in [1, n_features={s}); got {srht_features!r}")
    m = 1 << (s - 1).bit_length()
    return SRHTFeatures(base, rng.choice([-1.0, 1.0], m), np.sort(rng.choice(m, s2, replace=False)))
