"""Translation-invariant kernels: Gaussian, Laplacian, Matern.

``sigma`` is one length scale, or one per feature (automatic relevance
determination, ARD): a tuple ``(sigma_1, ..., sigma_d)``. A kernel with per-feature
length scales is the isotropic kernel with ``sigma = 1`` on the inputs divided
column by column by them, ``k(a, b) = k_1(a / sigma, b / sigma)``; that is how it is
evaluated here and by the fused engine, so no formula has a second version.

>>> import numpy as np
>>> k = GaussianKernel(sigma=(1.0, 2.0))
>>> float(k(np.array([[0.0, 0.0]]), np.array([[1.0, 2.0]]))[0, 0]) == float(np.exp(-1.0))
True
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
from scipy.spatial.distance import cdist

from daskkrr.kernels.base import Kernel, squared_distances
from daskkrr.kernels.sparse import is_sparse, scale_columns, squared_distances_sparse


def _positive(kernel: Kernel, field: str) -> None:
    value = getattr(kernel, field)
    values = value if isinstance(value, tuple) else (value,)
    if any(v <= 0 for v in values):
        raise ValueError(f"{type(kernel).__name__}: {field} must be > 0; got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Stationary(Kernel):
    #: One length scale, or a tuple of one per feature (ARD; lists and arrays become tuples).
    sigma: float | tuple[float, ...] = 1.0

    _vector_fields: ClassVar[tuple[str, ...]] = ("sigma",)

    def _validate(self) -> None:
        _positive(self, "sigma")

    def _diag(self, A: np.ndarray) -> np.ndarray:
        return np.ones(A.shape[0], dtype=A.dtype)

    @property
    def is_stationary(self) -> bool:
        return True

    @property
    def is_ard(self) -> bool:
        """Whether ``sigma`` holds one length scale per feature."""
        return isinstance(self.sigma, tuple)

    @property
    def length_scales(self) -> np.ndarray:
        """``sigma`` as a float64 vector (one entry for an isotropic kernel)."""
        return np.atleast_1d(np.asarray(self.sigma, dtype=np.float64))

    def scale_inputs(self, A: Any) -> np.ndarray:
        """``A / sigma`` column by column, in ``A``'s float dtype; ValueError unless ``A`` has one column
        per length scale. A sparse ``A`` stays sparse (CSR)."""
        A = A if is_sparse(A) else np.asarray(A)
        scales = self.length_scales
        if A.ndim != 2 or A.shape[1] != scales.size:
            raise ValueError(
                f"{type(self).__name__} has {scales.size} length scales (sigma, one per feature) but the "
                f"input has shape {A.shape}: pass sigma as a number or a vector of length d={A.shape[-1]}"
            )
        dtype = A.dtype if A.dtype in (np.float32, np.float64) else np.float64
        if is_sparse(A):
            return scale_columns(A.astype(dtype), 1.0 / scales)
        return np.ascontiguousarray(A * (1.0 / scales).astype(dtype), dtype=dtype)

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        if self.is_ard:
            return self._scaled_block(self.scale_inputs(A), self.scale_inputs(B), 1.0)
        return self._scaled_block(A, B, float(self.length_scales[0]))

    @abstractmethod
    def _scaled_block(self, A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
        """The kernel matrix for one (isotropic) length scale ``sigma``."""


@dataclasses.dataclass(frozen=True)
class GaussianKernel(_Stationary):
    """``k(a, b) = exp(-||a - b||^2 / (2 sigma^2))`` (scikit-learn rbf with gamma = 1/(2 sigma^2)).

    Parameters
    ----------
    sigma : float or tuple of float, default=1.0
        Length scale; a tuple gives one per feature (ARD).
    """

    name: ClassVar[str] = "gaussian"

    def _scaled_block(self, A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
        return self._from_squared(squared_distances(A, B), sigma)

    def _sparse_block(self, A, B):
        """From the sparse rows' norms and dot products; ARD scales divide the columns (still sparse)."""
        if self.is_ard:
            return self._from_squared(squared_distances_sparse(self.scale_inputs(A), self.scale_inputs(B)), 1.0)
        return self._from_squared(squared_distances_sparse(A, B), float(self.length_scales[0]))

    @staticmethod
    def _from_squared(K: np.ndarray, sigma: float) -> np.ndarray:
        """``exp(-K / (2 sigma^2))`` in place, for squared distances ``K``."""
        K *= K.dtype.type(-0.5 / sigma**2)
        np.exp(K, out=K)
        return K


@dataclasses.dataclass(frozen=True)
class LaplacianKernel(_Stationary):
    """``k(a, b) = exp(-||a - b||_1 / sigma)`` (scikit-learn laplacian with gamma = 1/sigma).

    Parameters
    ----------
    sigma : float or tuple of float, default=1.0
        Length scale; a tuple gives one per feature (ARD).
    """

    name: ClassVar[str] = "laplacian"

    def _scaled_block(self, A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
        K = cdist(A, B, metric="cityblock").astype(A.dtype, copy=False)
        K *= A.dtype.type(-1.0 / sigma)
        np.exp(K, out=K)
        return K


@dataclasses.dataclass(frozen=True)
class MaternKernel(_Stationary):
    """Matern kernel with Euclidean distance ``r`` and ``nu`` in {0.5, 1.5, 2.5}.

    - nu = 1/2: ``exp(-r/sigma)``
    - nu = 3/2: ``(1 + sqrt(3) r/sigma) exp(-sqrt(3) r/sigma)``
    - nu = 5/2: ``(1 + sqrt(5) r/sigma + 5 r^2/(3 sigma^2)) exp(-sqrt(5) r/sigma)``

    Parameters
    ----------
    sigma : float or tuple of float, default=1.0
        Length scale; a tuple gives one per feature (ARD).
    nu : {0.5, 1.5, 2.5}, default=1.5
        Smoothness: the kernel's functions are ``ceil(nu) - 1`` times differentiable.
    """

    name: ClassVar[str] = "matern"
    nu: float = 1.5

    def _validate(self) -> None:
        super()._validate()
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"MaternKernel: nu must be one of 0.5, 1.5, 2.5; got {self.nu!r}")

    def _scaled_block(self, A: np.ndarray, B: np.ndarray, sigma: float) -> np.ndarray:
        t = A.dtype.type
        # Exact differences: the GEMM expansion's round-off (~1e-16 |a|^2) becomes
        # ~1e-8 after the square root, too much near r = 0.
        r = cdist(A, B, metric="euclidean").astype(A.dtype, copy=False)
        if self.nu == 0.5:
            r *= t(-1.0 / sigma)
            return np.exp(r, out=r)
        c = np.sqrt(3.0) if self.nu == 1.5 else np.sqrt(5.0)
        s = r * t(c / sigma)  # scaled distance
        poly = 1 + s if self.nu == 1.5 else 1 + s + s * s / 3
        np.negative(s, out=s)
        np.exp(s, out=s)
        s *= poly
        return s
