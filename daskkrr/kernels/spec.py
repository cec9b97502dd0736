"""Kernels as the fused engine's compiled loops see them: a code and up to three numbers.

Kept apart from :mod:`daskkrr.kernels.fused` so that choosing an engine does not
import numba.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from daskkrr.kernels.base import Kernel
from daskkrr.kernels.dot import LinearKernel, PolynomialKernel
from daskkrr.kernels.stationary import GaussianKernel, LaplacianKernel, MaternKernel

# Kernel codes understood by the compiled loops.
GAUSSIAN, LAPLACIAN, MATERN05, MATERN15, MATERN25, POLYNOMIAL, LINEAR = range(7)

@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A kernel as the compiled loops see it: a code and up to three parameters."""

    kind: int
    p0: float = 0.0
    p1: float = 0.0
    degree: int = 1

    @property
    def stationary(self) -> bool:
        return self.kind in (GAUSSIAN, LAPLACIAN, MATERN05, MATERN15, MATERN25)


def kernel_spec(kernel: Kernel) -> KernelSpec | None:
    """The :class:`KernelSpec` of a built-in kernel, or None (then use the numpy reference).

    A stationary kernel with one length scale per feature (ARD) has the spec of its
    isotropic version (``sigma = 1``): the loops see inputs already divided by the
    length scales (:func:`ard_inputs`).
    """
    sigma = 1.0
    if isinstance(kernel, (GaussianKernel, LaplacianKernel, MaternKernel)) and not kernel.is_ard:
        sigma = float(kernel.length_scales[0])
    # `type(kernel) is C` (not isinstance: subclasses may change the formula) also narrows the type.
    if type(kernel) is GaussianKernel:
        return KernelSpec(GAUSSIAN, 0.5 / sigma**2)
    if type(kernel) is LaplacianKernel:
        return KernelSpec(LAPLACIAN, 1.0 / sigma)
    if type(kernel) is MaternKernel:
        kind, c = {0.5: (MATERN05, 1.0), 1.5: (MATERN15, math.sqrt(3.0)), 2.5: (MATERN25, math.sqrt(5.0))}[
            kernel.nu
        ]
        return KernelSpec(kind, c / sigma)
    if type(kernel) is PolynomialKernel:
        return KernelSpec(POLYNOMIAL, float(kernel.gamma), float(kernel.coef0), int(kernel.degree))
    if type(kernel) is LinearKernel:
        return KernelSpec(LINEAR)
    return None


def ard_inputs(kernel: Kernel, Xb: Any, Z: Any) -> tuple[Any, Any]:
    """``(Xb, Z)`` divided column by column by the length scales of an ARD kernel; as they are otherwise."""
    if isinstance(kernel, (GaussianKernel, LaplacianKernel, MaternKernel)) and kernel.is_ard:
        return kernel.scale_inputs(Xb), kernel.scale_inputs(Z)
    return Xb, Z


def supports(kernel: Kernel) -> bool:
    """True when the fused engine implements ``kernel``."""
    return kernel_spec(kernel) is not None
