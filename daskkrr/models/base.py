"""The shared Nystrom pipeline behind the Nystrom estimators (FALKON, direct Nystrom, classifier).

``fit`` = open and validate the data -> one statistics pass (standardisation and
finiteness) -> choose centers -> solve for the coefficients (FALKON's CG or the
direct solve) -> a small fitted model: centers, coefficients, kernel, scaling.
The per-block arithmetic lives in :mod:`daskkrr.kernels.blocks`; the scheduling
of blocks in :mod:`daskkrr.parallel`; parameter checks, predict and save in
:mod:`daskkrr.models.kernel_model`.
"""

from __future__ import annotations

import logging
import numbers
import time
from numbers import Integral
from typing import Any, ClassVar

import dask.array as da
import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from daskkrr.checkpoint import FitCheckpoint, fit_fingerprint
from daskkrr.data import Standardizer
from daskkrr.kernels import Kernel
from daskkrr.kernels.blocks import knm_gram_and_rhs, knm_gram_matvec, knm_t_matvec
from daskkrr.models._inputs import is_in_memory, load_training_data
from daskkrr.models.kernel_model import KernelModelBase, ParameterError, positive
from daskkrr.parallel import resolve_client, scheduler_context
from daskkrr.parallel.strategies import (
    STRATEGY_CHOICES,
    make_operator,
    plan_strategy,
    prepare_passes,
)
from daskkrr.progress import current_tracker, tracked_fit
from daskkrr.sampling import SAMPLERS, CenterSampler, make_sampler
from daskkrr.sampling.uniform import gather_rows
from daskkrr.solvers import FalkonPreconditioner, falkon_solve
from daskkrr.solvers.intercept import centered_gram_matvec
from daskkrr.solvers.sketch import KernelRowSketch, auto_sketch_rows, sketch_indices

logger = logging.getLogger("daskkrr")


class NystromModelBase(KernelModelBase):
    """Parameters and fitted state shared by the Nystrom estimators (not used directly)."""

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        **KernelModelBase._parameter_constraints,
        "n_centers": [positive(Integral)],
        "sampler": [StrOptions(set(SAMPLERS)), CenterSampler],
        "dtype": [StrOptions({"float32", "float64"})],
        "random_state": [Interval(Integral, 0, None, closed="left"), np.random.Generator,
                         np.random.RandomState, None],
        "strategy": [StrOptions(set(STRATEGY_CHOICES))],
        "fit_intercept": ["boolean"],
    }
    #: "falkon" (preconditioned CG) or "direct" (one Gram pass, M x M solve).
    _solver = "falkon"

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

    def _sketch_rows(self, n: int, n_centers: int) -> int:
        """Rows of the preconditioner's sketch (0: FALKON's own, from the centers)."""
        rows = getattr(self, "preconditioner_rows", None)
        if rows is None:
            return 0
        if rows == "auto":
            return auto_sketch_rows(n, n_centers)
        return min(int(rows), n)

    # --------------------------------------------------------------- the fit
    def _prepare(self, X: Any, y: Any) -> tuple[da.Array, da.Array, bool]:
        """Open, validate and standardise; return scaled X, 2-D targets and whether y was 1-D."""
        self._validate_params()
        Xd, yd = load_training_data(X, y, self.chunks)
        n, d = Xd.shape
        if self.n_centers > n:
            raise ValueError(
                f"n_centers={self.n_centers} is larger than the number of training rows ({n}); "
                f"use n_centers <= {n}"
            )
        scaler = Standardizer(with_mean=self.standardize, with_std=self.standardize)
        t0 = time.perf_counter()
        current_tracker().begin(n, Xd.numblocks[0], d)  # progress: bar, logs, dashboard
        current_tracker().phase("statistics")
        with scheduler_context(resolve_client(self.client)):  # the passes run where the fit runs
            Y = self._encode_targets(yd)
            scaler.fit(Xd, Y)  # one pass: statistics and finiteness of X and Y
        current_tracker().pass_done()
        logger.info("statistics pass over %d rows in %.2fs", n, time.perf_counter() - t0)
        self.scaler_ = scaler if self.standardize else None
        centre_y = self.standardize or self._fits_intercept()
        self.y_mean_ = (np.asarray(scaler.y_mean_, dtype=np.float64).reshape(-1) if centre_y
                        else np.zeros(Y.shape[1]))
        self.intercept_ = self.y_mean_.copy()  # final unless an intercept is fitted
        Xs = scaler.transform(Xd) if self.standardize else Xd
        Xs = Xs.astype(self.dtype)
        Y = Y - self.y_mean_ if centre_y else Y
        self.n_features_in_ = int(d)
        return Xs, Y, yd.ndim == 1 and self._squeeze_single_target

    @tracked_fit
    def _fit_nystrom(
        self, X: Any, y: Any, checkpoint: Any = None, checkpoint_every: int = 5, resume: bool = False
    ) -> "NystromModelBase":
        start = time.perf_counter()
        # Checks the arguments and refuses an existing checkpoint without resume, before any work.
        ckpt = FitCheckpoint(checkpoint, every=checkpoint_every, resume=resume)
        Xs, Y, one_d = self._prepare(X, y)
        client = resolve_client(self.client)
        with scheduler_context(client):  # every pass and gather runs where the fit runs
            return self._solve(Xs, Y, one_d, client, ckpt, start, is_in_memory(X))

    def _solve(self, Xs: da.Array, Y: da.Array, one_d: bool, client: Any, ckpt: FitCheckpoint,
               start: float, in_memory: bool) -> "NystromModelBase":
        """Centers, preconditioner, strategy and solve, after the statistics pass."""
        n = int(Xs.shape[0])
        self.kernel_ = self._make_kernel(self.n_features_in_)
        seed = _seed(self.random_state)
        sampler = make_sampler(self.sampler)
        ckpt.start(lambda: fit_fingerprint(self, Xs, Y, client))  # loads (and checks) a saved state
        t0 = time.perf_counter()
        current_tracker().phase("sampling")
        dictionary = ckpt.centers(lambda: sampler.select(
            Xs, self.kernel_, n_centers=self.n_centers, penalty=float(self.penalty),
            random_state=seed, client=client,
        ))
        logger.info("selected %d centers with %s in %.2fs", dictionary.size, type(sampler).__name__,
                    time.perf_counter() - t0)
        current_tracker().sampled(dictionary)
        current_tracker().phase("preconditioner")
        Z = np.ascontiguousarray(dictionary.centers, dtype=self.dtype)
        intercept = self._fits_intercept()
        sketch = None
        rows = self._sketch_rows(n, Z.shape[0]) if self._solver == "falkon" else 0
        if rows:
            sketch = KernelRowSketch(self.kernel_, gather_rows(Xs, sketch_indices(n, rows, Z), client), Z)
        Z64 = Z.astype(np.float64)
        precond = FalkonPreconditioner.from_kernel_matrix(
            self.kernel_(Z64, Z64), penalty=float(self.penalty), n=n,
            weights=None if dictionary.is_uniform else dictionary.weights, sketch=sketch, center_sketch=intercept,
        )
        del Z64
        self.preconditioner_rows_ = 0 if sketch is None else int(sketch.rows)
        if intercept:  # K_nM^T 1 comes with K_nM^T Y: one more column of targets
            ones = da.ones((n, 1), chunks=(Y.chunks[0], (1,)))
            # "tasks": a column merge needs no shuffle (and Dask's choice would import distributed).
            Y = da.concatenate([Y, ones], axis=1).rechunk({1: -1}, method="tasks")
        # Strategy (recompute | cache | gram) from the cost model unless given; see daskkrr.parallel.strategies.
        plan = plan_strategy(
            "gram" if self._solver == "direct" else getattr(self, "strategy", "auto"), Xs,
            n_centers=Z.shape[0], n_targets=Y.shape[1], iterations=int(getattr(self, "max_iter", 1)),
            tol=float(getattr(self, "tol", 1e-7)), client=client, in_memory=in_memory,
            sketched=sketch is not None,
        )
        self.strategy_ = plan.strategy
        passes = current_tracker().watch(prepare_passes(Xs, Y, client, plan))  # reports each pass
        Zh = passes.broadcast(Z)
        operator = make_operator(plan.strategy, passes, self.kernel_, Zh, Z.shape[0],
                                 preconditioner=None if self._solver == "direct" else precond)
        if self._solver == "direct":
            b, mu = _split_column_sums(operator.knm_t_y, n, intercept)
            gram = operator.gram
            if intercept:
                gram -= n * np.outer(mu, mu)
            coef = precond.direct_solve(gram, b)
            self.n_iter_ = 0
            self.residuals_ = np.zeros((1, b.shape[1]))
            self.converged_ = True
        else:
            b, mu = _split_column_sums(ckpt.rhs(operator.rhs), n, intercept)
            gram_matvec = operator.gram_matvec if mu is None else centered_gram_matvec(operator.gram_matvec, mu, n)

            def progress(it: int, rel: np.ndarray) -> None:
                current_tracker().cg_iteration(it, rel)  # logs at INFO; bar if verbose

            coef, result = falkon_solve(
                precond, gram_matvec, b, tol=float(self.tol), max_iter=int(self.max_iter),
                callback=progress,
                state=ckpt.cg_state, on_state=ckpt.on_state, state_every=ckpt.every,
            )
            self.n_iter_ = int(result.n_iter)
            self.residuals_ = result.residuals
            self.converged_ = bool(result.converged)
        operator.close()  # frees cached kernel blocks
        self.n_data_passes_ = passes.n_passes + 1  # + the statistics pass
        self.centers_ = Z
        self.center_indices_ = dictionary.indices
        self.center_weights_ = dictionary.weights
        self.sampler_info_ = dict(dictionary.info)
        self.jitter_ = float(precond.jitter)
        if mu is not None:  # f(x) = k(x, Z) coef + b with b = mean(y - K_nM coef), unpenalised
            self.intercept_ = self.y_mean_ - mu @ coef.reshape(coef.shape[0], -1)
        self.coef_ = coef[:, 0] if (one_d and coef.ndim == 2) else coef
        self.fit_time_ = time.perf_counter() - start
        logger.info("fit done in %.2fs (%d CG iterations)", self.fit_time_, self.n_iter_)
        return self


# Block tasks: RowBlockPasses calls fn(X_b, [Y_b,] *args).
def _rhs_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
    return knm_t_matvec(kernel, Xb, Z, Yb)


def _gram_rhs_task(Xb: np.ndarray, Yb: np.ndarray, kernel: Kernel, Z: np.ndarray) -> np.ndarray:
    return knm_gram_and_rhs(kernel, Xb, Yb, Z)


def _gram_matvec_task(Xb: np.ndarray, kernel: Kernel, Z: np.ndarray, U: np.ndarray) -> np.ndarray:
    return knm_gram_matvec(kernel, Xb, Z, U)


def _split_column_sums(knm_t_y: np.ndarray, n: int, intercept: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``K_nM^T Y`` and, with an intercept, ``mu = K_nM^T 1 / n`` (the last column)."""
    if not intercept:
        return knm_t_y, None
    return np.ascontiguousarray(knm_t_y[:, :-1]), knm_t_y[:, -1] / n


def _seed(random_state: Any) -> int | None:
    """One integer seed from ``random_state`` (int, None, or a numpy Generator/RandomState)."""
    if random_state is None or isinstance(random_state, numbers.Integral):
        return None if random_state is None else int(random_state)
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**63 - 1))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2**31 - 1))
    raise TypeError(f"random_state must be None, an int or a numpy Generator; got {random_state!r}")
