"""Checkpoints of long fits: save the state as the fit goes, continue after a crash.

A checkpoint is a directory holding a single file, ``checkpoint.npz``, that is
replaced atomically (written to a temporary file in the same directory, synced
to disk, renamed over the old one) each time the fit saves. A crash at any
moment leaves either the previous or the new checkpoint, never a mixture. The
file holds plain numpy arrays (loaded with ``allow_pickle=False``):

* ``meta``: JSON text: format name and version, library version, the fit's
  fingerprint, the stage reached and the CG iteration;
* the centers with their row indices and weights, saved once after sampling;
* ``K_nM^T y``, saved once after the right-hand-side pass;
* the complete CG state (:class:`daskkrr.solvers.CGState`) every
  ``checkpoint_every`` iterations and at the end;
* or, for logistic FALKON, the Newton state
  (:class:`daskkrr.solvers.logistic.NewtonState`: the step along the penalty
  path, coefficients, intercepts) after every Newton step, under keys
  ``newton_*`` (a solver state names its prefix in ``checkpoint_prefix``).

:class:`FitCheckpoint` is a subscriber of the fit's events
(:mod:`daskkrr.events`): it saves what the pipeline reports
(:class:`~daskkrr.events.CentersChosen`, :class:`~daskkrr.events.RhsComputed`,
:class:`~daskkrr.events.SolverState`) and hands saved results back to the
pipeline's stages on resume (``saved_centers``, ``saved_rhs``, ``cg_state``).

The fingerprint ties a checkpoint to its fit: the estimator and its parameters
(``max_iter`` and ``tol`` excepted, so a fit can be continued with more
iterations; a sketch that ``preconditioner_rows="auto"`` planned for other ones is
planned anew, and the CG restarts if that changes it: :meth:`FitCheckpoint.restart_solver`),
the data's shape, dtype and row chunking, and a digest of the
content of every row block (its X, encoded targets and row weights; see
:func:`daskkrr.data.moments.block_digest`), computed in the statistics pass that
reads the blocks anyway. The digests are exact and kept in block order, so they
do not depend on the cluster's shape; no float summed by a reduction is compared.
A checkpoint whose fingerprint differs is refused with the differing parameters
listed and the first row block whose rows or content differ named; the file is
kept. The fit's statistics (feature means and scales, target mean, weight sum)
are saved in ``meta`` too and reused on resume, so that the resumed fit works
with the very numbers the saved centers, right-hand side and CG state were
computed with. Resuming from a checkpoint gives the same model as the
uninterrupted fit: the CG continues from the saved state exactly.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from daskkrr import events as ev
from daskkrr.sampling.base import CenterDictionary
from daskkrr.solvers.cg import CGState
from daskkrr.utils.atomic import atomic_write
from daskkrr.utils.jsonable import dumps_strict, jsonable
from daskkrr.utils.safe_files import parse_json_bounded, read_npz

__all__ = ["CHECKPOINT_FILE", "CheckpointError", "FitCheckpoint", "first_block_difference"]

logger = logging.getLogger("daskkrr")

FORMAT_NAME = "daskkrr-checkpoint"
#: 2: a float32 fit's preconditioner carries a larger jitter (``FLOAT32_RELATIVE_JITTER``), and the
#: CG state lives in that preconditioner's variable, so a version-1 state must not be resumed.
#: 3: a float32 fit with at least 2048 centers factors its preconditioner in float32 (another
#: variable for the CG state again).
#: 4: a float64 fit's preconditioner carries a jitter floor that grows as the penalty falls
#: (``FLOAT64_JITTER_TIMES_PENALTY``): the same reason as 2, for float64 fits.
#: 5: the fingerprint holds a digest of every row block (X, y, weights) and no float statistics;
#: the statistics are saved apart and reused on resume.
FORMAT_VERSION = 5
CHECKPOINT_FILE = "checkpoint.npz"
#: How daskkrr.utils.atomic names the temporary of ``checkpoint.npz`` (cleaned up on start).
_TMP_PREFIX = f".{CHECKPOINT_FILE}.tmp-"
#: Key prefixes of solver states: the CG's, and other solvers' (``checkpoint_prefix`` of their state).
_SOLVER_PREFIXES = ("cg_", "newton_")


class CheckpointError(ValueError):
    """A checkpoint cannot be used: unreadable, another format, or another fit's."""


#: Entries of the fingerprint that describe the data block by block: compared by
#: :func:`first_block_difference`, which names the first block that differs.
DATA_KEYS = ("n_rows", "row_chunks", "blocks")


# --------------------------------------------------------------------------- fingerprint


def _differences(saved: Any, now: Any, prefix: str = "") -> list[str]:
    """Dotted names of the entries that differ between two JSON-like values."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(now)):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved or key not in now:
                out.append(f"{name} (only in the {'current fit' if key in now else 'checkpoint'})")
            else:
                out.extend(_differences(saved[key], now[key], name))
        return out
    if saved != now:
        show = lambda v: (repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "...")  # noqa: E731
        return [f"{prefix} (checkpoint {show(saved)}, now {show(now)})"]
    return []


def _rows(chunks: list[int], block: int) -> str:
    start = sum(chunks[:block])
    return f"rows {start}-{start + chunks[block] - 1}"


def first_block_difference(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Where the data of two fingerprints first differ, naming the row block and its rows, or None.

    Blocks are compared in order: their row ranges (the chunking is part of the fingerprint), then
    the digests of their X, y and sample weights; rows added or removed show as a block that only
    one side has.
    """
    old, new = list(saved.get("row_chunks") or []), list(now.get("row_chunks") or [])
    old_blocks, new_blocks = list(saved.get("blocks") or []), list(now.get("blocks") or [])
    for block in range(max(len(old), len(new))):
        if block >= len(old):
            return (f"row block {block} ({_rows(new, block)}) is not in the checkpoint: the data now have "
                    f"{sum(new)} rows, the checkpoint's {sum(old)} (rows were added)")
        if block >= len(new):
            return (f"row block {block} ({_rows(old, block)}) of the checkpoint is missing: the data now have "
                    f"{sum(new)} rows, the checkpoint's {sum(old)} (rows were removed)")
        if old[block] != new[block]:
            why = (f"the data now have {sum(new)} rows, the checkpoint's {sum(old)}" if sum(old) != sum(new) else
                   "the row chunking is part of the fingerprint; fit with the interrupted fit's chunks "
                   f"({old[0]} rows a block)")
            return f"row block {block} holds {_rows(old, block)} in the checkpoint but {_rows(new, block)} now: {why}"
        if block < len(old_blocks) and block < len(new_blocks):
            changed = [name for name, a, b in zip(("X", "y", "sample_weight"), old_blocks[block], new_blocks[block])
                       if a != b]
            if changed:
                return (f"row block {block} ({_rows(new, block)}) differs in {' and '.join(changed)} from the "
                        f"data the checkpoint was made with")
    if len(old_blocks) != len(old) or len(new_blocks) != len(new):
        return "the checkpoint has no digest of every row block"
    return None


# --------------------------------------------------------------------------- checkpoint


class FitCheckpoint:
    """Save and restore the stages of one fit in a checkpoint directory.

    Create it before any work (it checks its arguments and whether a checkpoint
    exists), then call :meth:`start` once the data are known. A checkpoint made
    with ``path=None`` does nothing: ``centers``/``rhs`` just compute, and
    ``cg_state``/``on_state`` are None.

    Parameters
    ----------
    path : str, os.PathLike or None
        Checkpoint directory (created if needed).
    every : int, default=5
        Save the CG state every this many iterations.
    resume : bool, default=False
        Continue from the checkpoint in ``path`` if there is one (and start afresh
        if there is none). Without ``resume`` an existing checkpoint is an error,
        so that no long fit's state is replaced by accident.

    Raises
    ------
    TypeError, ValueError
        For invalid arguments.
    FileExistsError
        If ``path`` holds a checkpoint and ``resume`` is False.
    """

    def __init__(self, path: str | os.PathLike | None, *, every: int = 5, resume: bool = False) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a directory path or None; got {type(path).__name__}")
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"checkpoint_every must be a positive integer (CG iterations); got {every!r}")
        if not isinstance(resume, (bool, np.bool_)):
            raise TypeError(f"resume must be True or False; got {resume!r}")
        self.path = None if path is None else Path(path)
        self.every = int(every)
        self.resume = bool(resume)
        self.fingerprint: dict[str, Any] | None = None
        self._arrays: dict[str, np.ndarray] = {}
        self._cg_arrays: dict[str, np.ndarray] = {}
        self._meta: dict[str, Any] = {}
        self._cg_state: CGState | None = None
        self._restored_state: dict[str, np.ndarray] = {}
        self._resumed = False
        if self.path is None:
            return
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(
                f"checkpoint {self.path} is a file; pass a directory path (it is created if needed)"
            )
        if self.file.exists() and not self.resume:
            raise FileExistsError(
                f"{self.path} already holds a checkpoint of an earlier fit; pass resume=True "
                f"(daskkrr fit --resume) to continue it, or delete the directory to start over"
            )

    # ------------------------------------------------------------------ state
    @property
    def enabled(self) -> bool:
        return self.path is not None

    @property
    def file(self) -> Path:
        if self.path is None:
            raise RuntimeError("checkpointing is disabled (path=None): there is no checkpoint file")
        return self.path / CHECKPOINT_FILE

    @property
    def cg_state(self) -> CGState | None:
        """The saved CG state to continue from, or None."""
        return self._cg_state

    def start(self, fingerprint: Callable[[], dict[str, Any]]) -> None:
        """Load and check the saved checkpoint (with ``resume``) or create the directory.

        Parameters
        ----------
        fingerprint : callable
            Returns the current fit's fingerprint (a JSON-ready dict, see
            :func:`daskkrr.pipeline.fingerprint.fit_fingerprint`); only called when
            checkpointing is enabled.

        Raises
        ------
        CheckpointError
            If the saved checkpoint is unreadable, of another format, or of another fit.
        """
        if self.path is None:  # checkpointing disabled
            return
        self.fingerprint = fingerprint()
        self.path.mkdir(parents=True, exist_ok=True)
        for stale in self.path.glob(_TMP_PREFIX + "*"):  # left by a crash mid-save
            stale.unlink(missing_ok=True)
        if self.resume and self.file.exists():
            self._load()
        elif self.resume:
            logger.info("no checkpoint in %s yet; starting the fit from the beginning", self.path)

    def _load(self) -> None:
        fix = f"delete {self.path} to start the fit over"
        try:
            # Bounded reads (no pickle, sizes checked before allocation); the metadata is text ("U").
            arrays = read_npz(self.file, kinds="biufU")
            meta = parse_json_bounded(str(arrays.pop("meta")), self.file, "meta")
        except (OSError, ValueError, KeyError, EOFError) as exc:
            raise CheckpointError(f"checkpoint {self.file} cannot be read ({exc}); {fix}") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise CheckpointError(f"{self.file} is not a daskkrr checkpoint; {fix}")
        if meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint {self.file} has format version {meta.get('format_version')!r}, but this "
                f"daskkrr reads version {FORMAT_VERSION}; {fix}, or resume with the daskkrr version "
                f"that wrote it ({meta.get('library_version', 'unknown')})"
            )
        self._check_fingerprint(meta.get("fingerprint"), fix)
        try:
            cg = {k[3:]: v for k, v in arrays.items() if k.startswith("cg_")}
            self._cg_state = CGState.from_arrays(cg) if cg else None
            if "centers" in arrays:
                CenterDictionary(
                    centers=arrays["centers"], indices=arrays["center_indices"],
                    weights=arrays["center_weights"],
                )
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.file} is damaged ({exc}); {fix}") from exc
        self._arrays = {k: v for k, v in arrays.items() if not k.startswith(_SOLVER_PREFIXES)}
        self._cg_arrays = {k: v for k, v in arrays.items() if k.startswith(_SOLVER_PREFIXES)}
        self._restored_state = {k: v for k, v in self._cg_arrays.items() if not k.startswith("cg_")}
        self._meta = meta
        self._resumed = True
        logger.info("resuming from checkpoint %s (stage %s, CG iteration %s)", self.path,
                    meta.get("stage"), meta.get("iteration"))

    def _check_fingerprint(self, saved: Any, fix: str) -> None:
        """Refuse another fit's checkpoint: the parameters and sizes that differ, then the first row
        block whose rows or content differ (the checkpoint file is left as it is)."""
        if not isinstance(saved, dict) or self.fingerprint is None:
            raise CheckpointError(f"checkpoint {self.file} has no fingerprint of its fit; {fix}")
        rest = {k: v for k, v in saved.items() if k not in DATA_KEYS}
        diffs = _differences(rest, {k: v for k, v in self.fingerprint.items() if k not in DATA_KEYS})
        # Readable differences (parameters, sizes) first; at most a few.
        diffs.sort(key=lambda d: not d.startswith(("params", "n_", "estimator")))
        shown = diffs[:4] + ([f"and {len(diffs) - 4} more"] if len(diffs) > 4 else [])
        block = first_block_difference(saved, self.fingerprint)
        if block is not None:
            shown.append(block)
        if shown:
            raise CheckpointError(
                f"checkpoint {self.path} belongs to a different fit: {'; '.join(shown)}; it is left as it "
                f"is. Resume with the same data and parameters, or {fix}"
            )

    def saved_statistics(self) -> dict[str, Any] | None:
        """The interrupted fit's feature and target statistics (:meth:`Standardizer.to_dict
        <daskkrr.data.Standardizer.to_dict>`), or None. A resumed fit uses these rather than its
        own: summed by another cluster, the same data's means differ in their last bits, and the
        saved centers, right-hand side and CG state belong to the saved ones."""
        if not self._resumed:
            return None
        stats = self._meta.get("statistics")
        return dict(stats) if isinstance(stats, dict) else None

    def save_statistics(self, state: dict[str, Any]) -> None:
        """Keep the fit's statistics for the checkpoints written from now on."""
        self._meta["statistics"] = state

    # ------------------------------------------------------------------ stages
    def on_event(self, event: ev.Event) -> None:
        """Subscriber for the fit's event bus: saves the centers, the right-hand side and the
        solver state as the pipeline reports them (restored results are not saved again)."""
        if not self.enabled:
            return
        if isinstance(event, ev.CentersChosen) and not event.restored:
            self.save_centers(event.dictionary)
        elif isinstance(event, ev.RhsComputed) and not event.restored:
            self.save_rhs(event.rhs)
        elif isinstance(event, ev.SolverState):
            prefix = getattr(event.state, "checkpoint_prefix", "cg")
            if prefix == "cg":
                self.save_cg(event.state)
            else:
                self.save_state(prefix, event.state)

    def saved_state(self, prefix: str) -> dict[str, np.ndarray] | None:
        """The arrays of the interrupted fit's solver state saved under ``prefix`` (e.g. the
        Newton state of logistic FALKON, ``"newton"``), or None."""
        found = {k[len(prefix) + 1:]: v for k, v in self._restored_state.items() if k.startswith(prefix + "_")}
        return found or None

    def save_state(self, prefix: str, state: Any) -> None:
        """Save a solver state other than the CG's: ``state.to_arrays()`` under ``prefix``,
        with ``state.iteration`` as the iteration the checkpoint reports."""
        if f"{prefix}_" not in _SOLVER_PREFIXES:
            raise ValueError(f"unknown solver state prefix {prefix!r}; expected one of {_SOLVER_PREFIXES}")
        self._restored_state = {}  # a saved state is for the next process, not this one
        self._cg_arrays = {f"{prefix}_{k}": v for k, v in state.to_arrays().items()}
        self._write(prefix, iteration=int(state.iteration))

    def saved_centers(self) -> CenterDictionary | None:
        """The centers of the interrupted fit, or None."""
        if "centers" not in self._arrays:
            return None
        info = dict(self._meta.get("sampler_info") or {})
        optional = {k: self._arrays.get(f"center_{k}") for k in ("counts", "probabilities")}
        return CenterDictionary(
            centers=self._arrays["centers"], indices=self._arrays["center_indices"],
            weights=self._arrays["center_weights"], info=info, **optional,
        )

    def saved_sketch_rows(self) -> int | None:
        """Rows of the interrupted fit's preconditioner sketch, or None: its CG state is only valid
        with the same preconditioner, which ``preconditioner_rows="auto"`` might size otherwise
        after a change of ``tol`` or ``max_iter``."""
        rows = self._meta.get("sketch_rows")
        return None if rows is None else int(rows)

    def save_sketch_rows(self, rows: int, on: str = "client", planned_for: dict[str, Any] | None = None,
                         seed: str | None = None) -> None:
        """Keep the sketch size, and where it is summed, for the checkpoints written from now on
        (the rhs and CG states); ``planned_for``: the ``max_iter`` and ``tol`` the cost model sized
        it for (None keeps the saved ones); ``seed``: the rule its rows were drawn by
        (:data:`daskkrr.solvers.sketch.SKETCH_SEED`)."""
        self._meta["sketch_rows"] = int(rows)
        self._meta["sketch_on"] = str(on)
        if seed is not None:
            self._meta["sketch_seed"] = str(seed)
        if planned_for is not None:
            self._meta["sketch_planned_for"] = dict(planned_for)

    def saved_sketch_budget(self) -> dict[str, Any] | None:
        """The ``max_iter`` and ``tol`` the interrupted fit's sketch was planned for, or None (not
        saved, or by a daskkrr that did not record them)."""
        planned = self._meta.get("sketch_planned_for")
        return dict(planned) if isinstance(planned, dict) else None

    def restart_solver(self, reason: str) -> None:
        """Drop the interrupted fit's CG state, which belongs to a preconditioner the resumed fit does
        not build; the centers and the right-hand side are kept, and the CG starts from zero. Warns
        with ``reason`` where there was a CG state: the iterations done are lost."""
        if self._cg_state is not None:
            warnings.warn(f"resuming from {self.path}: the CG starts over from the saved centers and right-hand "
                          f"side after {self._cg_state.iteration} iterations, because {reason}",
                          UserWarning, stacklevel=2)
        self._cg_state = None
        self._cg_arrays = {k: v for k, v in self._cg_arrays.items() if not k.startswith("cg_")}
        self._meta.pop("iteration", None)

    def saved_sketch_seed(self) -> str | None:
        """The rule the interrupted fit's sketch rows were drawn by, or None: written before the rule
        was recorded, when the seed was the centers' bytes (the same rows are not drawn again)."""
        seed = self._meta.get("sketch_seed")
        return None if seed is None else str(seed)

    def saved_sketch_on(self) -> str | None:
        """Where the interrupted fit summed its sketch ("client" or "workers"), or None: summed
        elsewhere, the same sums come out in another order, and the resumed CG state would meet a
        preconditioner changed by round-off."""
        on = self._meta.get("sketch_on")
        return None if on is None else str(on)

    def saved_rhs(self) -> np.ndarray | None:
        """The interrupted fit's ``K_nM^T y``, or None."""
        return np.array(self._arrays["rhs"], dtype=np.float64) if "rhs" in self._arrays else None

    def save_centers(self, dictionary: CenterDictionary) -> None:
        self._arrays.update(
            centers=np.asarray(dictionary.centers), center_indices=np.asarray(dictionary.indices),
            center_weights=np.asarray(dictionary.weights),
        )
        for key in ("counts", "probabilities"):
            value = getattr(dictionary, key)
            if value is not None:
                self._arrays[f"center_{key}"] = np.asarray(value)
        self._meta["sampler_info"] = jsonable(dict(dictionary.info))
        self._write("centers")

    def save_rhs(self, rhs: np.ndarray) -> None:
        self._arrays["rhs"] = np.asarray(rhs, dtype=np.float64)
        self._write("rhs")

    def save_cg(self, state: CGState) -> None:
        """Save a CG state (called by the solver every ``every`` iterations and at the end)."""
        self._cg_state = None  # a saved state is for the next process, not this one
        self._cg_arrays = {f"cg_{k}": v for k, v in state.to_arrays().items()}
        self._write("cg", iteration=state.iteration)

    # ------------------------------------------------------------------ writing
    def _write(self, stage: str, iteration: int | None = None) -> None:
        """Replace the checkpoint file atomically with everything known so far."""
        import daskkrr

        self._meta.update(
            format=FORMAT_NAME, format_version=FORMAT_VERSION, library_version=daskkrr.__version__,
            fingerprint=self.fingerprint, stage=stage,
        )
        if iteration is not None:
            self._meta["iteration"] = int(iteration)
        # Any: numpy's savez stub types **kwds so that a str-keyed dict could collide with allow_pickle.
        meta = np.array(dumps_strict(self._meta, sort_keys=True))
        arrays: dict[str, Any] = {"meta": meta, **self._arrays, **self._cg_arrays}
        # Durable: the README promises a checkpoint survives the crash it exists for.
        atomic_write(self.file, lambda fh: np.savez(fh, **arrays), durable=True, mode=0o600)
        logger.info("checkpoint saved to %s (stage %s%s)", self.path, stage,
                    "" if iteration is None else f", CG iteration {iteration}")

