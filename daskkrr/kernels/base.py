"""Kernel interface: small, comparable, JSON-serialisable kernel objects.

A kernel evaluates ``k(A, B)`` for two numpy blocks of rows and ``diag(k(A, A))``.
Blocks are float32 or float64; the result has the common floating dtype of the
inputs (float32 only when both are float32). Kernels know nothing about Dask.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from daskkrr.kernels.sparse import blockwise_dense, dense_pieces, is_sparse, sparse_pair

_FLOATS = (np.float32, np.float64)


def as_block(a: Any, name: str = "A") -> np.ndarray:
    """Return ``a`` as a C-contiguous 2-D float32/float64 array (ints become float64)."""
    arr = np.asarray(a)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, features); got shape {arr.shape}")
    if arr.dtype not in _FLOATS:
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise TypeError(f"{name} must be numeric; got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
    return np.ascontiguousarray(arr)


def result_dtype(A: np.ndarray, B: np.ndarray) -> np.dtype:
    return np.result_type(A.dtype, B.dtype)


def _pair(A: Any, B: Any) -> tuple[np.ndarray, np.ndarray]:
    A = as_block(A, "A")
    B = as_block(B, "B")
    if A.shape[1] != B.shape[1]:
        raise ValueError(
            f"k(A, B) needs the same number of features: A has shape {A.shape}, B has shape {B.shape}"
        )
    dt = result_dtype(A, B)
    return A.astype(dt, copy=False), B.astype(dt, copy=False)


def squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Pairwise squared Euclidean distances by the GEMM expansion, clipped at zero.

    Both sets are first shifted by the mean of ``B`` (distances do not change): the
    expansion ``|a|^2 + |b|^2 - 2 a.b`` loses ``eps (|a|^2 + |b|^2)`` to cancellation,
    which on raw, unstandardised features far from the origin can swamp the distances
    themselves (the fused engine does the same).

    Parameters
    ----------
    A : ndarray of shape (n, d)
    B : ndarray of shape (m, d)

    Returns
    -------
    ndarray of shape (n, m)
        ``|A_i - B_j|^2``, never negative.
    """
    if B.shape[0]:
        shift = B.mean(axis=0)
        A = A - shift
        B = B - shift
    an = np.einsum("ij,ij->i", A, A)
    bn = np.einsum("ij,ij->i", B, B)
    D = A @ B.T
    D *= -2
    D += an[:, None]
    D += bn[None, :]
    np.maximum(D, 0, out=D)
    return D


def _real(kernel: Any, field: str, value: Any, *, element: bool = False) -> float | int:
    """``value`` if it is a finite real number (not a bool); TypeError/ValueError naming the field.

    An ``element`` of a vector field may also be a numpy number; it comes back as a float.
    """
    if element and isinstance(value, (np.integer, np.floating)):
        value = float(value)
    if element and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(kernel).__name__}.{field} must be a real number; got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{type(kernel).__name__}.{field} must be finite; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Kernel(ABC):
    """Base class of all kernels.

    Subclasses are frozen dataclasses: equal parameters mean equal kernels, and
    ``to_dict``/``from_dict`` round-trip through JSON.
    """

    name: ClassVar[str] = ""
    #: Fields that may also hold a tuple of numbers (one per feature), e.g. ARD length scales.
    _vector_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self._vector_fields and isinstance(value, (list, tuple, np.ndarray)):
                items = np.asarray(value, dtype=object)
                if items.ndim != 1 or not items.size:
                    raise ValueError(f"{type(self).__name__}.{f.name} must be a number or a non-empty 1-D "
                                     f"vector (one per feature); got shape {items.shape}")
                # A tuple keeps the frozen dataclass hashable and comparable (an ndarray would not).
                object.__setattr__(self, f.name, tuple(_real(self, f.name, v, element=True) for v in items))
            else:
                _real(self, f.name, value)
        self._validate()

    def _validate(self) -> None:  # pragma: no cover - default: nothing to check
        """Check the parameters beyond finiteness; subclasses override it to raise ValueError."""
        return None  # a hook with a default (B027): kernels such as LinearKernel have nothing to check

    def __call__(self, A: Any, B: Any) -> np.ndarray:
        """Kernel matrix ``K[i, j] = k(A[i], B[j])`` of shape ``(len(A), len(B))``.

        ``A`` and ``B`` may be scipy sparse matrices (see :mod:`daskkrr.kernels.sparse`); the
        result is dense."""
        if is_sparse(A) or is_sparse(B):
            return self._sparse_block(*sparse_pair(A, B))
        A, B = _pair(A, B)
        return self._block(A, B)

    def diag(self, A: Any) -> np.ndarray:
        """``diag(k(A, A))`` without forming the matrix (sparse ``A``: a bounded dense piece at a time)."""
        if is_sparse(A):
            A = sparse_pair(A, A[:0])[0]
            return np.concatenate([self._diag(piece) for _, piece in dense_pieces(A)] or [np.empty(0, A.dtype)])
        A = as_block(A)
        return self._diag(A)

    def _sparse_block(self, A: Any, B: Any) -> np.ndarray:
        """``k(A, B)`` when ``A`` or ``B`` is sparse (CSR, common float dtype).

        The default densifies bounded pieces of rows and applies :meth:`_block`; kernels with a
        dot-product form override it to work on the sparse rows."""
        return blockwise_dense(self._block, A, B)

    @abstractmethod
    def _block(self, A: np.ndarray, B: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _diag(self, A: np.ndarray) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description, ``{"name": ..., <parameters>}``."""
        return {"name": self.name, **dataclasses.asdict(self)}

    def params(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @property
    def is_stationary(self) -> bool:
        """True when ``k(x, x)`` is the same constant for every x."""
        return False
