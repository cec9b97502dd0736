"""What the stages of one fit share: the parameters, the execution layer, the events, and
the results each stage leaves for the next."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from daskkrr.events import EventBus
from daskkrr.parallel import Executor


class StageStore(Protocol):
    """Results saved by an interrupted fit, handed back to the stages on resume.

    :class:`daskkrr.checkpoint.FitCheckpoint` is the one implementation; with no
    checkpoint every method returns None.
    """

    every: int

    def start(self, fingerprint: Callable[[], dict[str, Any]]) -> None: ...

    def saved_centers(self) -> Any | None: ...

    def saved_rhs(self) -> np.ndarray | None: ...

    @property
    def cg_state(self) -> Any | None: ...

    def restart_solver(self, reason: str) -> None: ...


@dataclasses.dataclass
class FitContext:
    """The shared state of one fit, filled in stage by stage.

    Stages read the estimator's parameters from ``params`` and never set
    attributes on it: what the fitted model keeps goes into ``fitted``, which the
    estimator copies onto itself when the pipeline has finished.
    """

    params: Any
    executor: Executor
    events: EventBus
    store: StageStore
    X_in: Any = None
    y_in: Any = None
    #: ``fit``'s checked ``sample_weight`` (None, numpy, dask or a store variable's name).
    sample_weight_in: Any = None
    #: Whether the training input is in memory (numpy); the cost model reads it.
    in_memory: bool = False
    #: ``y (dask) -> Y (n, t) float64``: regression targets or one-vs-all codes.
    encode_targets: Callable[[Any], Any] | None = None

    # statistics
    #: dtype of the training features as given (float32 input keeps float32 coefficients and outputs).
    input_dtype: Any = None
    #: Centers to choose: the estimator's ``n_centers``, at most the number of rows.
    n_centers: int | None = None
    X: Any = None
    Y: Any = None
    one_d: bool = False
    scaler: Any = None
    y_mean: np.ndarray | None = None
    kernel: Any = None
    #: Row weights, float64 (n,) with the row chunks of ``X`` (dask), or None when every weight is 1.
    #: The objective is ``sum_i w_i (y_i - f(x_i))^2 + penalty * weight_sum * ||f||^2``.
    sample_weight: Any = None
    #: Sum of the row weights: the "n" that scales the penalty (``n`` when unweighted).
    weight_sum: float = 0.0
    #: ``(X, y, w)`` digests of every row block, in block order (only when checkpointing).
    block_digests: list | None = None
    # centers
    dictionary: Any = None
    centers: np.ndarray | None = None
    # preconditioner
    preconditioner: Any = None
    sketch_rows: int = 0
    #: The sketch size chosen and the expected cost of each candidate (``SketchPlan``; None: no sketch planned).
    sketch_plan: Any = None
    #: Dense or tiled preconditioner factors (a :class:`~daskkrr.parallel.factor_cost.FactorPlan`).
    factor_plan: Any = None
    # operator
    plan: Any = None
    passes: Any = None
    operator: Any = None
    #: ``K_nM^T w / weight_sum`` when an intercept is fitted (the rhs pass's extra column).
    mu: np.ndarray | None = None
    # solve
    coef: np.ndarray | None = None
    n_iter: int = 0
    converged: bool = True

    # exact KRR by PCG (daskkrr.pipeline.exact_pcg)
    tile_plan: Any = None
    #: The row blocks of ``X`` as task arguments (kept on the workers when they fit).
    x_blocks: Any = None
    #: ``sqrt`` of the sample weights, ``(n, 1)`` chunked like ``X`` (None: unweighted).
    row_scale: Any = None
    #: ``lambda`` of ``K + lambda I`` and ``lambda_p`` of the preconditioner.
    shift: float = 0.0
    preconditioner_penalty: float = 0.0
    features: Any = None
    adaptive_trace: list = dataclasses.field(default_factory=list)

    fitted: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def close(self) -> None:
        """Free what the operator holds (cached kernel blocks on the workers) and a tiled preconditioner's tiles
        (kept past the solve for the posterior of a fit with ``compute_std``)."""
        if self.operator is not None:
            self.operator.close()
            self.operator = None
        close = getattr(self.preconditioner, "close", None)
        if close is not None:
            close()
