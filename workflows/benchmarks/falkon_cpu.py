"""Run FALKON (the library, CPU build) in its own virtual environment, one fit per fresh process.

FALKON needs PyTorch, which daskkrr's environment does not have, so its fits run
in the interpreter named by ``FALKON_PYTHON`` (default: ``../falkon-venv/bin/python``
relative to the repository root). :func:`run_falkon` writes the data to a
temporary ``.npz``, starts this file as a script in that interpreter, samples the
memory of the child's process tree and returns the fit time measured in the
child, the peak memory and the decision values on the test rows.

The child imports only the standard library, numpy, torch and falkon (this file
does not import daskkrr or psutil at module level), and runs FALKON with
``keops_active="no"`` on the CPU.

Models (``model=``):

- ``"logistic"``: ``falkon.LogisticFalkon`` with ``LogisticLoss``; one binary
  problem per class (one-vs-rest) for more than two classes, fitted one after the
  other (the reported time is their sum), as FALKON's LogisticFalkon takes a
  single ``+-1`` target column;
- ``"falkon"``: ``falkon.Falkon`` (least squares) on ``+-1`` one-vs-all columns,
  all columns in one fit;
- ``"regression"``: ``falkon.Falkon`` on the real-valued targets as given
  (``decision`` is then the prediction).

``dtype`` (``"float64"`` or ``"float32"``) is the precision of the tensors FALKON
gets, and ``tol`` its CG tolerance (``FalkonOptions(cg_tolerance=...)``; None: its default).

Typical use::

    from falkon_cpu import falkon_python, run_falkon
    if falkon_python() is None: ...skip, with falkon_unavailable_reason()
    out = run_falkon(Xtr, ytr, Xte, model="logistic", sigma=3.0, M=1000,
                     penalty_list=[1e-2, 1e-4, 1e-6, 1e-6], iter_list=[3, 3, 8, 8])
    out["decision"], out["fit_s"], out["peak_mb"]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
#: fit_tools.RESULT_PREFIX, which run_child reads (the child cannot import fit_tools: no psutil there).
RESULT_PREFIX = "BENCH-RESULT "


def falkon_python() -> str | None:
    """The FALKON interpreter (``$FALKON_PYTHON`` or ``../falkon-venv/bin/python``), or None if absent."""
    path = os.environ.get("FALKON_PYTHON") or str(REPO.parent / "falkon-venv" / "bin" / "python")
    return path if Path(path).is_file() and os.access(path, os.X_OK) else None


def falkon_unavailable_reason(timeout: float = 120.0) -> str | None:
    """None when ``import falkon`` works in the FALKON interpreter, else why not (for the table)."""
    python = falkon_python()
    if python is None:
        return "no FALKON interpreter (set FALKON_PYTHON, or build ../falkon-venv)"
    try:
        proc = subprocess.run([python, "-c", "import falkon, torch"], capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot run: {exc}"
    if proc.returncode != 0:
        return f"import falkon fails in {python}: {proc.stderr.strip().splitlines()[-1:]}"
    return None


def run_falkon(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    *,
    model: str = "logistic",
    sigma: float,
    M: int,
    penalty_list: Sequence[float] | None = None,
    iter_list: Sequence[int] | None = None,
    penalty: float = 1e-6,
    maxiter: int = 20,
    seed: int = 0,
    threads: int | None = None,
    dtype: str = "float64",
    tol: float | None = None,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Fit FALKON on ``(X_train, y_train)`` in a fresh process and predict ``X_test``.

    Features are used as given (scale them first). ``y_train`` holds class labels.
    Returns ``fit_s`` (seconds of the fit(s), measured in the child), ``peak_mb``
    (sum of the per-process RSS peaks of the child's tree, from
    ``fit_tools.PeakMemory``), ``wall_s``, ``classes`` and ``decision``
    (``(n_test,)`` for two classes, else ``(n_test, n_classes)``; one-vs-rest
    decision values), or ``error`` with the tail of the child's stderr.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fit_tools import run_child

    python = falkon_python()
    if python is None:
        return {"error": falkon_unavailable_reason()}
    if model not in ("logistic", "falkon", "regression"):
        raise ValueError(f"model must be 'logistic', 'falkon' or 'regression'; got {model!r}")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64'; got {dtype!r}")
    with tempfile.TemporaryDirectory(prefix="falkon-run-") as tmp:
        data = Path(tmp) / "data.npz"
        out = Path(tmp) / "out.npz"
        np.savez(data, X_train=np.ascontiguousarray(X_train, dtype=dtype),
                 y_train=np.asarray(y_train, dtype=dtype) if model == "regression" else np.asarray(y_train),
                 X_test=np.ascontiguousarray(X_test, dtype=dtype))
        spec = dict(model=model, sigma=float(sigma), M=int(M), seed=int(seed), penalty=float(penalty),
                    maxiter=int(maxiter),
                    penalty_list=None if penalty_list is None else [float(v) for v in penalty_list],
                    iter_list=None if iter_list is None else [int(v) for v in iter_list],
                    threads=threads, tol=None if tol is None else float(tol), data=str(data), out=str(out))
        result = run_child([__file__, json.dumps(spec)], timeout=timeout, python=python)
        if "error" not in result and not out.is_file():
            result["error"] = "the FALKON child reported a result but wrote no predictions"
        if "error" in result:
            return result
        with np.load(out, allow_pickle=False) as npz:
            result["decision"] = npz["decision"]
            result["classes"] = npz["classes"]
    return result


# ----------------------------------------------------------------------------- child side
def _child(spec: dict[str, Any]) -> None:  # pragma: no cover - runs in the FALKON venv
    import falkon
    import torch
    from falkon import FalkonOptions
    from falkon.gsc_losses import LogisticLoss

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    with np.load(spec["data"], allow_pickle=False) as npz:
        Xtr, ytr, Xte = npz["X_train"], npz["y_train"], npz["X_test"]
    if spec["model"] == "regression":
        classes = np.zeros(0)
        codes = ytr.reshape(-1, 1)
    else:
        classes = np.unique(ytr)
        codes = (np.where(ytr == classes[1], 1.0, -1.0)[:, None] if len(classes) == 2
                 else np.where(ytr[:, None] == classes[None, :], 1.0, -1.0)).astype(Xtr.dtype)
    X = torch.from_numpy(Xtr)
    Xt = torch.from_numpy(Xte)
    extra = {} if spec.get("tol") is None else {"cg_tolerance": spec["tol"]}
    options = FalkonOptions(keops_active="no", use_cpu=True, **extra)
    kernel = falkon.kernels.GaussianKernel(sigma=spec["sigma"], opt=options)
    M = min(int(spec["M"]), len(Xtr))
    fit_s = 0.0
    columns = []
    if spec["model"] in ("falkon", "regression"):
        est = falkon.Falkon(kernel=kernel, penalty=spec["penalty"], M=M, maxiter=spec["maxiter"],
                            seed=spec["seed"], options=options)
        t0 = time.perf_counter()
        est.fit(X, torch.from_numpy(codes))
        fit_s = time.perf_counter() - t0
        dec = est.predict(Xt).numpy()
    else:
        for j in range(codes.shape[1]):
            est = falkon.LogisticFalkon(kernel=kernel, penalty_list=spec["penalty_list"],
                                        iter_list=spec["iter_list"], loss=LogisticLoss(kernel), M=M,
                                        seed=spec["seed"], options=options)
            t0 = time.perf_counter()
            est.fit(X, torch.from_numpy(np.ascontiguousarray(codes[:, j:j + 1])))
            fit_s += time.perf_counter() - t0
            columns.append(est.predict(Xt).numpy().reshape(-1))
        dec = np.column_stack(columns)
    if dec.ndim == 2 and dec.shape[1] == 1:
        dec = dec[:, 0]
    np.savez(spec["out"], decision=dec, classes=classes)
    print(RESULT_PREFIX + json.dumps({"fit_s": fit_s, "torch": torch.__version__,
                                      "falkon": getattr(falkon, "__version__", "?")}), flush=True)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
