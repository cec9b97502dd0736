"""Translation-invariant kernels: Gaussian, Laplacian, Matern."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
from scipy.spatial.distance import cdist

from daskkrr.kernels.base import Kernel, squared_distances


def _positive(kernel: Kernel, field: str) -> None:
    value = getattr(kernel, field)
    if value <= 0:
        raise ValueError(f"{type(kernel).__name__}: {field} must be > 0; got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Stationary(Kernel):
    sigma: float = 1.0

    def _validate(self) -> None:
        _positive(self, "sigma")

    def _diag(self, A: np.ndarray) -> np.ndarray:
        return np.ones(A.shape[0], dtype=A.dtype)

    @property
    def is_stationary(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class GaussianKernel(_Stationary):
    """``k(a, b) = exp(-||a - b||^2 / (2 sigma^2))`` (scikit-learn rbf with gamma = 1/(2 sigma^2))."""

    name: ClassVar[str] = "gaussian"

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        K = squared_distances(A, B)
        K *= A.dtype.type(-0.5 / self.sigma**2)
        np.exp(K, out=K)
        return K


@dataclasses.dataclass(frozen=True)
class LaplacianKernel(_Stationary):
    """``k(a, b) = exp(-||a - b||_1 / sigma)`` (scikit-learn laplacian with gamma = 1/sigma)."""

    name: ClassVar[str] = "laplacian"

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        K = cdist(A, B, metric="cityblock").astype(A.dtype, copy=False)
        K *= A.dtype.type(-1.0 / self.sigma)
        np.exp(K, out=K)
        return K


@dataclasses.dataclass(frozen=True)
class MaternKernel(_Stationary):
    """Matern kernel with Euclidean distance ``r`` and ``nu`` in {0.5, 1.5, 2.5}.

    - nu = 1/2: ``exp(-r/sigma)``
    - nu = 3/2: ``(1 + sqrt(3) r/sigma) exp(-sqrt(3) r/sigma)``
    - nu = 5/2: ``(1 + sqrt(5) r/sigma + 5 r^2/(3 sigma^2)) exp(-sqrt(5) r/sigma)``
    """

    name: ClassVar[str] = "matern"
    nu: float = 1.5

    def _validate(self) -> None:
        super()._validate()
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"MaternKernel: nu must be one of 0.5, 1.5, 2.5; got {self.nu!r}")

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        t = A.dtype.type
        # Exact differences: the GEMM expansion's round-off (~1e-16 |a|^2) becomes
        # ~1e-8 after the square root, too much near r = 0.
        r = cdist(A, B, metric="euclidean").astype(A.dtype, copy=False)
        if self.nu == 0.5:
            r *= t(-1.0 / self.sigma)
            return np.exp(r, out=r)
        c = np.sqrt(3.0) if self.nu == 1.5 else np.sqrt(5.0)
        s = r * t(c / self.sigma)  # scaled distance
        poly = 1 + s if self.nu == 1.5 else 1 + s + s * s / 3
        np.negative(s, out=s)
        np.exp(s, out=s)
        s *= poly
        return s
