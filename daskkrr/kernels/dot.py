"""Dot-product kernels: linear and polynomial."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.sparse import row_dot


@dataclasses.dataclass(frozen=True)
class LinearKernel(Kernel):
    """``k(a, b) = <a, b>``."""

    name: ClassVar[str] = "linear"

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return A @ B.T

    def _sparse_block(self, A, B):
        return row_dot(A, B)

    def _diag(self, A: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", A, A)


@dataclasses.dataclass(frozen=True)
class PolynomialKernel(Kernel):
    """``k(a, b) = (gamma <a, b> + coef0) ** degree`` (scikit-learn's polynomial kernel).

    Parameters
    ----------
    degree : int, default=3
        The power.
    gamma : float, default=1.0
        Scale of the inner product.
    coef0 : float, default=1.0
        The constant added before the power.
    """

    name: ClassVar[str] = "polynomial"
    degree: int = 3
    gamma: float = 1.0
    coef0: float = 1.0

    def _validate(self) -> None:
        if float(self.degree) != int(self.degree) or self.degree < 1:
            raise ValueError(f"PolynomialKernel: degree must be a positive integer; got {self.degree!r}")
        if self.gamma <= 0:
            raise ValueError(f"PolynomialKernel: gamma must be > 0; got {self.gamma!r}")
        if self.coef0 < 0:
            raise ValueError(
                f"PolynomialKernel: coef0 must be >= 0 for a positive definite kernel; got {self.coef0!r}"
            )

    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return self._power(A @ B.T)

    def _sparse_block(self, A, B):
        return self._power(row_dot(A, B))

    def _power(self, K: np.ndarray) -> np.ndarray:
        """``(gamma K + coef0) ** degree`` for the dot products ``K``, in place where it can."""
        t = K.dtype.type
        K *= t(self.gamma)
        K += t(self.coef0)
        return K ** int(self.degree)

    def _diag(self, A: np.ndarray) -> np.ndarray:
        t = A.dtype.type
        return (t(self.gamma) * np.einsum("ij,ij->i", A, A) + t(self.coef0)) ** int(self.degree)
