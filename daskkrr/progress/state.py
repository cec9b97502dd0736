"""The progress of one fit as plain data: what the bar, the logs and the dashboard show.

:class:`FitProgress` is a small JSON-ready record (phase, passes over the data,
blocks read, dictionary growth, CG residuals). It knows nothing about Dask, the
terminal or the scheduler; :mod:`daskkrr.progress.tracker` updates it and hands it
to the sinks.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

#: Dask annotation that tags every task of a fit with the fit's id.
ANNOTATION = "daskkrr_fit"

#: Phases of a fit, in order. "sampling" is one pass for SQUEAK-like samplers.
PHASES = ("starting", "statistics", "sampling", "preconditioner", "rhs", "cg", "solve", "done")

#: Longest series published to the scheduler (longer ones are thinned evenly).
MAX_POINTS = 400


def _thin(points: list[list[float]], limit: int = MAX_POINTS) -> list[list[float]]:
    """At most ``limit`` points, evenly spaced, always keeping the last one."""
    if len(points) <= limit:
        return [list(p) for p in points]
    step = len(points) / (limit - 1)
    out = [list(points[int(i * step)]) for i in range(limit - 1)]
    out.append(list(points[-1]))
    return out


@dataclasses.dataclass
class FitProgress:
    """Where one fit stands.

    Attributes
    ----------
    fit_id : str
        Unique id of the fit (also the Dask annotation of its tasks).
    estimator, sampler : str
        Class name of the estimator and name of the center sampler.
    n_rows, n_blocks, n_features : int
        Size of the training data (0 until known).
    phase : str
        One of :data:`PHASES`, or "failed".
    status : str
        "running", "done" or "failed".
    passes : int
        Completed passes over the row blocks (of the data, or of kernel blocks
        kept in worker memory by the "cache" strategy).
    blocks_done : int
        Row blocks processed by the completed passes.
    blocks_in_pass : int
        Blocks finished in the pass under way (live, when a counter is attached).
    rows_in_pass : int
        Rows of the pass under way that a streaming sampler reported processed from
        inside its block tasks (live, finer than whole blocks).
    pass_task : str or None
        Task prefix of the pass under way (for the live block counts).
    task_base : dict
        Per task prefix, the block tasks of that kind in completed passes; the
        scheduler's cumulative count minus this is the live part of a pass.
    dictionary : list of [rows_seen, size]
        Growth of the SQUEAK dictionary (empty for uniform sampling).
    n_centers : int or None
        Number of centers once chosen.
    cg : list of [iteration, relative_residual]
        Preconditioned relative residual after each CG iteration.
    max_iter : int or None
        CG iteration limit.
    solver : str
        The iterative solver whose steps ``cg`` holds: "CG", or "Lloyd" (kernel k-means; its
        residual is the centers' shift).
    started, updated : float
        Unix times.
    finished : float or None
    error : str or None
        One-line message when the fit failed.
    converged : bool or None
        Whether the solver reached its tolerance (None until the fit ends).
    """

    fit_id: str
    estimator: str = ""
    sampler: str = ""
    n_rows: int = 0
    n_blocks: int = 0
    n_features: int = 0
    phase: str = "starting"
    status: str = "running"
    passes: int = 0
    blocks_done: int = 0
    blocks_in_pass: int = 0
    rows_in_pass: int = 0
    pass_task: str | None = None
    task_base: dict[str, int] = dataclasses.field(default_factory=dict)
    dictionary: list[list[float]] = dataclasses.field(default_factory=list)
    n_centers: int | None = None
    cg: list[list[float]] = dataclasses.field(default_factory=list)
    max_iter: int | None = None
    solver: str = "CG"
    expected_passes: int | None = None
    started: float = dataclasses.field(default_factory=time.time)
    updated: float = dataclasses.field(default_factory=time.time)
    finished: float | None = None
    error: str | None = None
    converged: bool | None = None

    # ----------------------------------------------------------- derived figures
    @property
    def blocks_read(self) -> int:
        """Row blocks read so far (completed passes plus the live part of the current one)."""
        return self.blocks_done + min(self.blocks_in_pass, self.n_blocks)

    @property
    def live_rows(self) -> int:
        """Rows of the pass under way: from its finished blocks, or the sampler's own count if further."""
        live = 0
        if self.n_blocks:
            live = round(min(self.blocks_in_pass, self.n_blocks) * self.n_rows / self.n_blocks)
        return int(min(max(live, self.rows_in_pass), self.n_rows))

    @property
    def rows_streamed(self) -> int:
        """Rows read so far; the live part of a pass is estimated from its blocks (:attr:`live_rows`)."""
        return self.passes * self.n_rows + self.live_rows

    @property
    def dictionary_size(self) -> int | None:
        """Current dictionary size (SQUEAK), else the number of centers once known."""
        if self.dictionary:
            return int(self.dictionary[-1][1])
        return self.n_centers

    @property
    def cg_iteration(self) -> int:
        return int(self.cg[-1][0]) if self.cg else 0

    @property
    def residual(self) -> float | None:
        return float(self.cg[-1][1]) if self.cg else None

    @property
    def elapsed(self) -> float:
        end = self.finished if self.finished is not None else time.time()
        return max(0.0, end - self.started)

    @property
    def fraction(self) -> float | None:
        """Estimated fraction of the fit's passes done (None when unknown)."""
        if not self.expected_passes:
            return None
        if self.status == "done":
            return 1.0
        live = self.live_rows / self.n_rows if self.n_rows else 0.0
        return max(0.0, min(1.0, (self.passes + live) / self.expected_passes))

    def apply_counts(self, counts: dict[str, int]) -> bool:
        """Set the live block count of the current pass from cumulative per-task counts.

        Returns True when the count changed.
        """
        if not self.pass_task:
            return False
        live = int(counts.get(self.pass_task, 0)) - int(self.task_base.get(self.pass_task, 0))
        live = max(0, min(live, self.n_blocks))
        if live == self.blocks_in_pass:
            return False
        self.blocks_in_pass = live
        return True

    def close_pass(self, n_tasks: int | None = None) -> None:
        """Book a finished pass: its blocks, and its ``n_tasks`` block tasks (for :meth:`apply_counts`)."""
        n_tasks = self.n_blocks if n_tasks is None else int(n_tasks)
        self.passes += 1
        self.blocks_done += self.n_blocks
        if self.pass_task:
            self.task_base[self.pass_task] = self.task_base.get(self.pass_task, 0) + n_tasks
        self.blocks_in_pass = 0
        self.rows_in_pass = 0

    # --------------------------------------------------------------- JSON
    def to_dict(self, *, thin: bool = False) -> dict[str, Any]:
        """JSON-ready dict with the derived figures; ``thin`` caps the series' lengths."""
        out = dataclasses.asdict(self)
        if thin:
            out["dictionary"] = _thin(self.dictionary)
            out["cg"] = _thin(self.cg)
        out.update(
            blocks_read=self.blocks_read,
            rows_streamed=self.rows_streamed,
            dictionary_size=self.dictionary_size,
            cg_iteration=self.cg_iteration,
            residual=self.residual,
            elapsed=round(self.elapsed, 3),
            fraction=self.fraction,
        )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitProgress:
        """Inverse of :meth:`to_dict` (derived keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
