"""Kernel functions evaluated on numpy blocks of rows.

>>> from daskkrr.kernels import make_kernel
>>> k = make_kernel("gaussian", sigma=2.0)
>>> k.to_dict()
{'name': 'gaussian', 'sigma': 2.0}
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from daskkrr.kernels.base import Kernel, squared_distances
from daskkrr.kernels.dot import LinearKernel, PolynomialKernel
from daskkrr.kernels.engine import BlasEngine, FusedEngine, KernelEngine, NumpyEngine, engine_for
from daskkrr.kernels.stationary import GaussianKernel, LaplacianKernel, MaternKernel

KERNELS: dict[str, type[Kernel]] = {
    cls.name: cls
    for cls in (GaussianKernel, LaplacianKernel, MaternKernel, PolynomialKernel, LinearKernel)
}
# Common aliases users type.
_ALIASES = {"rbf": "gaussian", "laplace": "laplacian", "poly": "polynomial"}


def make_kernel(kernel: str | Kernel | dict[str, Any], **params: Any) -> Kernel:
    """Build a kernel from a name and parameters, a ``to_dict()`` dict, or pass a Kernel through.

    Parameters that the kernel does not take (for example ``sigma`` for the linear
    kernel) are ignored when they are ``None``; otherwise they are an error.

    Parameters
    ----------
    kernel : str, Kernel or dict
        A registered name or alias (``"gaussian"``, ``"rbf"``, ``"laplacian"``,
        ``"matern"``, ``"linear"``, ``"polynomial"``), a dict from ``Kernel.to_dict()``,
        or a kernel object (returned as is).
    **params
        The kernel's parameters (``sigma``, ``nu``, ``degree`` ...).

    Returns
    -------
    Kernel
        The kernel object.
    """
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, dict):
        spec = dict(kernel)
        name = spec.pop("name", None)
        if name is None:
            raise ValueError(f"kernel dict needs a 'name' key; got {kernel!r}")
        return make_kernel(name, **spec, **params)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a name, a dict or a Kernel; got {type(kernel).__name__}")
    cls = KERNELS[kernel_key(kernel)]
    key = cls.name
    accepted = {f.name for f in dataclasses.fields(cls)}  # not the ClassVars
    given = {k: v for k, v in params.items() if v is not None}
    extra = sorted(set(given) - accepted)
    if extra:
        raise ValueError(
            f"kernel {key!r} does not take parameter(s) {extra}; it takes {sorted(accepted) or 'none'}"
        )
    return cls(**given)


def kernel_key(kernel: str) -> str:
    """The registered name of the kernel ``kernel`` names (aliases and case resolved).

    Parameters
    ----------
    kernel : str
        A kernel name or alias, in any case.

    Returns
    -------
    str
        The key in :data:`KERNELS`.

    Raises
    ------
    ValueError
        For an unknown name, listing the known ones and suggesting the closest
        (``'gausian'`` -> ``'gaussian'``).
    """
    key = _ALIASES.get(kernel.lower(), kernel.lower())
    if key not in KERNELS:
        close = difflib.get_close_matches(kernel.lower(), [*KERNELS, *_ALIASES], n=1)
        hint = f"; did you mean {_ALIASES.get(close[0], close[0])!r}?" if close else ""
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {sorted(KERNELS)}{hint}")
    return key


def kernel_from_dict(spec: dict[str, Any]) -> Kernel:
    """Inverse of :meth:`Kernel.to_dict`.

    Parameters
    ----------
    spec : dict
        ``{"name": ..., **parameters}``, as ``Kernel.to_dict()`` writes it.

    Returns
    -------
    Kernel
        The kernel object.
    """
    return make_kernel(spec)


__all__ = [
    "BlasEngine",
    "KERNELS",
    "FusedEngine",
    "GaussianKernel",
    "Kernel",
    "KernelEngine",
    "LaplacianKernel",
    "LinearKernel",
    "MaternKernel",
    "NumpyEngine",
    "PolynomialKernel",
    "engine_for",
    "kernel_from_dict",
    "kernel_key",
    "make_kernel",
    "squared_distances",
]
