"""Solvers: a matrix-free conjugate gradient, FALKON, direct Nystrom and exact KRR, and the
posterior variance of their Gaussian processes (``predict(X, return_std=True)``)."""

from daskkrr.solvers.cg import CGResult, CGState, conjugate_gradient
from daskkrr.solvers.exact import exact_krr_coefficients, nystrom_lstsq_coefficients
from daskkrr.solvers.falkon import FalkonPreconditioner, falkon_solve
from daskkrr.solvers.variance import PosteriorVariance
from daskkrr.utils.linalg import JitterWarning, cholesky_jitter

__all__ = [
    "CGResult",
    "CGState",
    "FalkonPreconditioner",
    "JitterWarning",
    "PosteriorVariance",
    "cholesky_jitter",
    "conjugate_gradient",
    "exact_krr_coefficients",
    "falkon_solve",
    "nystrom_lstsq_coefficients",
]
