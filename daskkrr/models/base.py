"""Parameters and fit of the Nystrom estimators (FALKON, direct Nystrom, classifier).

``fit`` runs the stages of :mod:`daskkrr.pipeline` (statistics -> centers ->
preconditioner -> operator -> solve) and keeps the small fitted model they
produce: centers, coefficients, kernel, scaling. The per-block arithmetic lives
in :mod:`daskkrr.kernels`; the scheduling of blocks in :mod:`daskkrr.parallel`;
parameter checks, predict and save in :mod:`daskkrr.models.kernel_model`.
"""

from __future__ import annotations

import logging
from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from daskkrr.models.kernel_model import KernelModelBase, ParameterError, positive
from daskkrr.models.weights import check_sample_weight, refuse_weighted_std
from daskkrr.parallel.strategies import STRATEGY_CHOICES
from daskkrr.pipeline import Stage, nystrom_stages, run_fit
from daskkrr.sampling import SAMPLERS, CenterSampler
from daskkrr.solvers.variance import noise_variance

logger = logging.getLogger("daskkrr")


class NystromModelBase(KernelModelBase):
    """Parameters and fitted state shared by the Nystrom estimators (not used directly)."""

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **KernelModelBase._parameter_constraints,
        "n_centers": [positive(Integral)],
        "sampler": [StrOptions(set(SAMPLERS)), CenterSampler, np.ndarray],
        "dtype": [StrOptions({"float32", "float64"})],
        "random_state": [Interval(Integral, 0, None, closed="left"), np.random.Generator,
                         np.random.RandomState, None],
        "strategy": [StrOptions(set(STRATEGY_CHOICES))],
        "fit_intercept": ["boolean"],
    }
    #: "falkon" (preconditioned CG) or "direct" (one Gram pass, M x M solve).
    _solver = "falkon"
    #: CSR/CSC input: the kernel blocks come from sparse dot products (see :mod:`daskkrr.data.sparse`).
    _sparse_input: ClassVar[bool] = True

    # ----------------------------------------------------------------- checks
    def _check_params(self) -> None:
        super()._check_params()
        if self._solver == "direct" and self.strategy not in ("auto", "gram"):
            raise ParameterError(
                f"{type(self).__name__} solves directly from one Gram pass; strategy must be 'auto' or "
                f"'gram', got {self.strategy!r}. Use FalkonRegressor(strategy=...) for the CG strategies",
                parameter="strategy",
            )

    def _feature_dtype(self) -> str:
        return self.dtype

    @property
    def n_centers_(self) -> int:
        """Centers of the fitted model: ``n_centers``, or fewer on data with fewer rows."""
        return int(self.centers_.shape[0])

    def _sketch_rows(self) -> int | str | None:
        """Rows asked for the preconditioner's sketch: an int, "auto" (the cost model chooses,
        :func:`daskkrr.parallel.strategies.plan_sketch`) or None (FALKON's own, from the centers)."""
        rows = getattr(self, "preconditioner_rows", None)
        return rows if rows is None or rows == "auto" else int(rows)

    # --------------------------------------------------------------- the fit
    def _fit_stages(self) -> tuple[Stage, ...]:
        """The pipeline stages of this estimator's fit (see :mod:`daskkrr.pipeline`)."""
        stages = nystrom_stages(self._solver)
        if getattr(self, "compute_std", False):
            from daskkrr.pipeline.posterior import with_posterior

            stages = with_posterior(stages, self._solver)
        return stages

    def _fit_nystrom(
        self, X: Any, y: Any, checkpoint: Any = None, checkpoint_every: int = 5, resume: bool = False,
        sample_weight: Any = None,
    ) -> NystromModelBase:
        self._validate_params()
        X, y = self._check_fit_input(X, y)
        sample_weight = check_sample_weight(sample_weight, X)
        refuse_weighted_std(self, sample_weight)
        return self._run_nystrom(X, y, checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
                                 sample_weight=sample_weight)

    def _run_nystrom(
        self, X: Any, y: Any, checkpoint: Any = None, checkpoint_every: int = 5, resume: bool = False,
        sample_weight: Any = None,
    ) -> NystromModelBase:
        """The pipeline on checked input (see :meth:`_check_fit_input` and
        :func:`~daskkrr.models.weights.check_sample_weight`); the fitted state onto ``self``."""
        ctx = run_fit(self, X, y, self._fit_stages(), checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                      resume=resume, iterative=self._solver == "falkon", sample_weight=sample_weight)
        for name, value in ctx.fitted.items():
            setattr(self, name, value)
        self.posterior_ = ctx.fitted.get("posterior_")  # None without compute_std (also after a refit)
        self.noise_variance_ = noise_variance(self.posterior_)
        return self
