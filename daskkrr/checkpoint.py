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
  ``checkpoint_every`` iterations and at the end.

The fingerprint ties a checkpoint to its fit: the estimator and its parameters
(``max_iter`` and ``tol`` excepted, so a fit can be continued with more
iterations), the data's shape, dtype and row chunking, a SHA-256 of the first
row block after scaling, and the feature and target statistics of the whole
data. A checkpoint whose fingerprint differs is refused with the differences
listed. Resuming from a checkpoint gives the same model as the uninterrupted
fit: the CG continues from the saved state exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from daskkrr.sampling.base import CenterDictionary
from daskkrr.solvers.cg import CGState
from daskkrr.utils.atomic import atomic_write
from daskkrr.utils.jsonable import dumps_strict, jsonable, jsonable_params

__all__ = ["CHECKPOINT_FILE", "CheckpointError", "FitCheckpoint", "fit_fingerprint"]

logger = logging.getLogger("daskkrr")

FORMAT_NAME = "daskkrr-checkpoint"
FORMAT_VERSION = 1
CHECKPOINT_FILE = "checkpoint.npz"
#: How daskkrr.utils.atomic names the temporary of ``checkpoint.npz`` (cleaned up on start).
_TMP_PREFIX = f".{CHECKPOINT_FILE}.tmp-"

#: Parameters that may change between the interrupted fit and its continuation.
_FREE_PARAMS = frozenset({"client", "verbose", "max_iter", "tol"})


class CheckpointError(ValueError):
    """A checkpoint cannot be used: unreadable, another format, or another fit's."""


# --------------------------------------------------------------------------- fingerprint


def _block_digest(*blocks: np.ndarray) -> str:
    """SHA-256 of the shapes, dtypes and bytes of some numpy blocks."""
    h = hashlib.sha256()
    for block in blocks:
        a = np.ascontiguousarray(block)
        h.update(f"{a.shape}{a.dtype.str}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def fit_fingerprint(model: Any, Xs: Any, Y: Any, client: Any = None) -> dict[str, Any]:
    """What identifies a fit: estimator, parameters and (scaled) training data.

    Parameters
    ----------
    model : NystromModelBase
        The estimator, after its statistics pass (``scaler_``, ``y_mean_`` set).
    Xs, Y : dask arrays
        Scaled features ``(n, d)`` and centred 2-D targets ``(n, t)``, row-chunked.
    client : distributed.Client or None
        Where to hash the first row block (only the digest comes back).

    Returns
    -------
    dict
        JSON-ready.
    """
    import dask
    from dask.delayed import delayed

    params = {k: v for k, v in jsonable_params(model).items() if k not in _FREE_PARAMS}
    digest = delayed(_block_digest, pure=True)(Xs.blocks[0], Y.blocks[0])
    first = client.compute(digest, sync=True) if client is not None else dask.compute(digest)[0]
    chunks = [int(c) for c in Xs.chunks[0]]
    scaler = getattr(model, "scaler_", None)
    classes = getattr(model, "classes_", None)
    fingerprint = {
        "estimator": type(model).__name__,
        "params": params,
        "n_rows": int(Xs.shape[0]),
        "n_features": int(Xs.shape[1]),
        "n_targets": int(Y.shape[1]),
        "dtype": str(Xs.dtype),
        "row_blocks": len(chunks),
        "row_chunks_sha256": hashlib.sha256(json.dumps(chunks).encode()).hexdigest(),
        "first_block_sha256": first,
        "scaler": None if scaler is None else scaler.to_dict(),
        "y_mean": np.asarray(getattr(model, "y_mean_", [])),
        "classes": None if classes is None else np.asarray(classes),
    }
    return json.loads(dumps_strict(fingerprint))  # plain values, as read back from a checkpoint


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
        assert self.path is not None
        return self.path / CHECKPOINT_FILE

    @property
    def cg_state(self) -> CGState | None:
        """The saved CG state to continue from, or None."""
        return self._cg_state

    @property
    def on_state(self) -> Callable[[CGState], None] | None:
        """Callback for :func:`daskkrr.solvers.falkon_solve` (None when disabled)."""
        return self.save_cg if self.enabled else None

    @property
    def resumed(self) -> bool:
        """Whether a saved state was loaded by :meth:`start`."""
        return self._resumed

    def start(self, fingerprint: Callable[[], dict[str, Any]]) -> None:
        """Load and check the saved checkpoint (with ``resume``) or create the directory.

        Parameters
        ----------
        fingerprint : callable
            Returns the current fit's fingerprint (:func:`fit_fingerprint`); only
            called when checkpointing is enabled.

        Raises
        ------
        CheckpointError
            If the saved checkpoint is unreadable, of another format, or of another fit.
        """
        if not self.enabled:
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
            with np.load(self.file, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            meta = json.loads(str(arrays.pop("meta")))
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
        diffs = _differences(meta.get("fingerprint"), self.fingerprint)
        if diffs:
            # Readable differences (parameters, sizes) first, digests last; at most a few.
            diffs.sort(key=lambda d: ("sha256" in d, not d.startswith(("params", "n_", "estimator"))))
            shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
            raise CheckpointError(
                f"checkpoint {self.path} belongs to a different fit: {shown}. Resume with "
                f"the same data and parameters, or {fix}"
            )
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
        self._arrays = {k: v for k, v in arrays.items() if not k.startswith("cg_")}
        self._cg_arrays = {k: v for k, v in arrays.items() if k.startswith("cg_")}
        self._meta = meta
        self._resumed = True
        logger.info("resuming from checkpoint %s (stage %s, CG iteration %s)", self.path,
                    meta.get("stage"), meta.get("iteration"))

    # ------------------------------------------------------------------ stages
    def centers(self, compute: Callable[[], CenterDictionary]) -> CenterDictionary:
        """The saved centers, or ``compute()``'s (then saved)."""
        if "centers" in self._arrays:
            info = dict(self._meta.get("sampler_info") or {})
            optional = {k: self._arrays.get(f"center_{k}") for k in ("counts", "probabilities")}
            return CenterDictionary(
                centers=self._arrays["centers"], indices=self._arrays["center_indices"],
                weights=self._arrays["center_weights"], info=info, **optional,
            )
        dictionary = compute()
        if self.enabled:
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
        return dictionary

    def rhs(self, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The saved ``K_nM^T y``, or ``compute()``'s (then saved)."""
        if "rhs" in self._arrays:
            return np.array(self._arrays["rhs"], dtype=np.float64)
        b = np.asarray(compute(), dtype=np.float64)
        if self.enabled:
            self._arrays["rhs"] = b
            self._write("rhs")
        return b

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
        arrays = {"meta": np.array(dumps_strict(self._meta, sort_keys=True)), **self._arrays, **self._cg_arrays}
        # Durable: the README promises a checkpoint survives the crash it exists for.
        atomic_write(self.file, lambda fh: np.savez(fh, **arrays), durable=True, mode=0o600)
        logger.info("checkpoint saved to %s (stage %s%s)", self.path, stage,
                    "" if iteration is None else f", CG iteration {iteration}")

