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
``max_cpu_mem`` (bytes) bounds FALKON's kernel blocks on the CPU (``FalkonOptions(max_cpu_mem=...)``):
its default, no bound, makes each ``K_nM v`` product allocate the whole ``n x M`` block at once.

``y_test`` (``"regression"`` only): FALKON's own validation callback (``error_fn``, ``error_every=1``,
``fit(X, Y, Xts, Yts)``) gives the test RMSE after every CG iteration; ``rmse_trace`` then lists
``[iteration, seconds, rmse]``, the seconds since the fit started less the callbacks' own time
(``trace_s``, which is also taken out of ``fit_s``), as daskkrr's traced fits count theirs.

:func:`probe_preconditioner` starts FALKON's preconditioner at one ``M`` under an address-space
limit and stops it once its Cholesky factorisation has started: the largest ``M`` it can hold.

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
import threading
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
    y_test: np.ndarray | None = None,
    max_cpu_mem: float | None = None,
    timeout: float = 3600.0,
    cpus: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Fit FALKON on ``(X_train, y_train)`` in a fresh process and predict ``X_test``.

    Features are used as given (scale them first). ``y_train`` holds class labels.
    Returns ``fit_s`` (seconds of the fit(s), measured in the child), ``peak_mb``
    (sum of the per-process RSS peaks of the child's tree, from
    ``fit_tools.PeakMemory``), ``wall_s``, ``classes`` and ``decision``
    (``(n_test,)`` for two classes, else ``(n_test, n_classes)``; one-vs-rest
    decision values), or ``error`` with the tail of the child's stderr; with ``y_test``
    (regression) also ``rmse_trace``, ``trace_s`` and ``n_iter`` (see the module docstring). ``cpus``: the cores
    the child is pinned to (``fit_tools.run_child``), and its torch threads (unless ``threads`` is given).
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
    if y_test is not None and model != "regression":
        raise ValueError(f"y_test (the per-iteration test RMSE) needs model='regression'; got model={model!r}")
    with tempfile.TemporaryDirectory(prefix="falkon-run-") as tmp:
        data = Path(tmp) / "data.npz"
        out = Path(tmp) / "out.npz"
        np.savez(data, X_train=np.ascontiguousarray(X_train, dtype=dtype),
                 y_train=np.asarray(y_train, dtype=dtype) if model == "regression" else np.asarray(y_train),
                 X_test=np.ascontiguousarray(X_test, dtype=dtype),
                 **({} if y_test is None else {"y_test": np.asarray(y_test, dtype=dtype)}))
        spec = dict(model=model, sigma=float(sigma), M=int(M), seed=int(seed), penalty=float(penalty),
                    maxiter=int(maxiter),
                    penalty_list=None if penalty_list is None else [float(v) for v in penalty_list],
                    iter_list=None if iter_list is None else [int(v) for v in iter_list],
                    threads=len(set(cpus)) if threads is None and cpus is not None else threads,
                    tol=None if tol is None else float(tol), data=str(data), out=str(out),
                    max_cpu_mem=None if max_cpu_mem is None else float(max_cpu_mem))
        result = run_child([__file__, json.dumps(spec)], timeout=timeout, python=python, cpus=cpus)
        if "error" not in result and not out.is_file():
            result["error"] = "the FALKON child reported a result but wrote no predictions"
        if "error" in result:
            return result
        with np.load(out, allow_pickle=False) as npz:
            result["decision"] = npz["decision"]
            result["classes"] = npz["classes"]
    return result


#: The probe child's line when FALKON's first Cholesky factorisation starts (its matrix then allocated and filled).
FACTOR_PREFIX = "FALKON-FACTOR-START "


def probe_preconditioner(
    M: int,
    *,
    limit_bytes: float,
    d: int = 20,
    sigma: float = 1.0,
    penalty: float = 1e-6,
    dtype: str = "float32",
    hold_s: float = 5.0,
    seed: int = 0,
    max_cpu_mem: float | None = None,
    timeout: float = 900.0,
) -> dict[str, Any]:
    """Start FALKON's preconditioner for ``M`` centers (``d`` standard normal features) in a fresh process whose
    address space is limited to ``limit_bytes``, and stop it ``hold_s`` seconds after its first Cholesky
    factorisation has started.

    FALKON's preconditioner (``FalkonPreconditioner.init``) holds one ``M x M`` matrix of the centers' dtype:
    ``K_MM`` is written into it, factorised in place (``potrf``), multiplied in place (``lauum``) and factorised
    again; the factorisation starting means that matrix is allocated and filled. While ``K_MM`` is computed,
    FALKON's kernel blocks take up to ``max_cpu_mem`` bytes more (its option; without it, no bound: two more
    ``M x M`` temporaries were measured). Returns ``held`` (True when
    it started), ``matrix_mb`` (``M^2`` entries), ``vm_base_mb`` (the child's address space before the
    matrix), ``rss_mb`` and ``seconds`` when the factorisation started, ``peak_mb`` (the child's RSS peak,
    sampled), ``finished`` (the whole preconditioner was built within ``hold_s``, then ``hwm_mb`` is the
    child's own RSS high-water mark) and, where it did not start, ``error``: the last line of its stderr
    (torch's allocation error, or the signal that ended it).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fit_tools import PeakMemory

    python = falkon_python()
    if python is None:
        return {"error": falkon_unavailable_reason()}
    spec = dict(probe=True, M=int(M), d=int(d), sigma=float(sigma), penalty=float(penalty), dtype=dtype,
                seed=int(seed), limit_bytes=int(limit_bytes),
                max_cpu_mem=None if max_cpu_mem is None else float(max_cpu_mem))
    row: dict[str, Any] = {"M": int(M), "matrix_mb": round(np.dtype(dtype).itemsize * M * M / 2**20, 1),
                           "limit_mb": round(limit_bytes / 2**20, 1), "held": False, "finished": False}
    proc = subprocess.Popen([python, __file__, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(REPO), env={**os.environ, "PYTHONUNBUFFERED": "1"})
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        with PeakMemory(proc.pid) as mem:
            assert proc.stdout is not None
            for line in proc.stdout:  # until the factorisation starts, the result line comes, or the child ends
                if line.startswith(FACTOR_PREFIX):
                    row.update(json.loads(line[len(FACTOR_PREFIX):]), held=True)
                    _wait_or_kill(proc, hold_s)
                    break
            out, err = proc.communicate()
    finally:
        killer.cancel()
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            row.update(json.loads(line[len(RESULT_PREFIX):]), finished=True)
    row["peak_mb"] = round(mem.total_mb, 1)
    if not row["held"]:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        row["error"] = lines[-1][-400:] if lines else f"the probe ended with exit code {proc.returncode}"
    return row


def _wait_or_kill(proc: subprocess.Popen, seconds: float) -> None:
    """Let ``proc`` run for ``seconds`` more (or until it ends), then kill it if it still runs."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()


# ----------------------------------------------------------------------------- child side
def _options(spec: dict[str, Any]) -> Any:  # pragma: no cover - runs in the FALKON venv
    """FALKON's options on the CPU without KeOps, with the spec's CG tolerance and block memory if given."""
    from falkon import FalkonOptions

    extra: dict[str, float] = {}
    if spec.get("tol") is not None:
        extra["cg_tolerance"] = spec["tol"]
    if spec.get("max_cpu_mem") is not None:
        extra["max_cpu_mem"] = spec["max_cpu_mem"]
    return FalkonOptions(keops_active="no", use_cpu=True, **extra)


def _traced_falkon(falkon: Any, trace: list[list[float]], clock: dict[str, float]) -> Any:  # pragma: no cover
    """``falkon.Falkon`` whose per-iteration validation callback is timed: each iterate's test error is kept in
    ``trace`` as ``[iteration, seconds since clock["t0"] less the callbacks' time so far, error]``, and the
    callbacks' seconds are summed in ``clock["eval_s"]`` (the error is FALKON's ``error_fn`` on ``Xts, Yts``)."""

    class TracedFalkon(falkon.Falkon):  # type: ignore[misc, name-defined]
        def _get_callback_fn(self, *args: Any, **kwargs: Any) -> Any:
            inner = super()._get_callback_fn(*args, **kwargs)

            def timed(it: int, beta: Any, train_time: float) -> None:
                t = time.perf_counter()
                inner(it, beta, train_time)
                trace.append([int(it), round(t - clock["t0"] - clock["eval_s"], 3), float(self.val_errors_[-1])])
                clock["eval_s"] += time.perf_counter() - t

            return timed

    return TracedFalkon


def _rmse(y: Any, pred: Any) -> float:  # pragma: no cover - runs in the FALKON venv
    """FALKON's ``error_fn(targets, predictions)``: the root mean squared error, summed in float64."""
    return float(((pred.double() - y.double()) ** 2).mean().sqrt())


def _status_mb(field: str) -> float:  # pragma: no cover - runs in the FALKON venv
    """A ``VmSize``/``VmRSS``/``VmHWM`` figure of this process, in MiB (Linux ``/proc/self/status``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _probe_child(spec: dict[str, Any]) -> None:  # pragma: no cover - runs in the FALKON venv
    """Build FALKON's preconditioner for ``spec["M"]`` random centers under ``RLIMIT_AS`` (see
    :func:`probe_preconditioner`); announce the first factorisation's start on stdout."""
    import resource

    # The limit stands in for the machine's memory so that a probe beyond it fails in this process
    # (torch's allocation error) instead of pressing on other processes' memory.
    resource.setrlimit(resource.RLIMIT_AS, (spec["limit_bytes"], spec["limit_bytes"]))
    import falkon
    import torch
    from falkon.preconditioner import flk_preconditioner

    options = _options(spec)
    kernel = falkon.kernels.GaussianKernel(sigma=spec["sigma"], opt=options)
    centers = torch.from_numpy(
        np.random.default_rng(spec["seed"]).standard_normal((spec["M"], spec["d"])).astype(spec["dtype"]))
    base = {"vm_base_mb": _status_mb("VmSize")}
    potrf = flk_preconditioner.potrf_wrapper
    t0 = time.perf_counter()

    def announced(*args: Any, **kwargs: Any) -> Any:
        if base:  # the first factorisation only
            print(FACTOR_PREFIX + json.dumps({**base, "rss_mb": _status_mb("VmRSS"),
                                              "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
            base.clear()
        return potrf(*args, **kwargs)

    flk_preconditioner.potrf_wrapper = announced  # FalkonPreconditioner.init calls it by its module name
    flk_preconditioner.FalkonPreconditioner(spec["penalty"], kernel, options).init(centers)
    print(RESULT_PREFIX + json.dumps({"hwm_mb": _status_mb("VmHWM"), "init_s": round(time.perf_counter() - t0, 2),
                                      "falkon": getattr(falkon, "__version__", "?"), "torch": torch.__version__}),
          flush=True)


def _child(spec: dict[str, Any]) -> None:  # pragma: no cover - runs in the FALKON venv
    import falkon
    import torch
    from falkon.gsc_losses import LogisticLoss

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    with np.load(spec["data"], allow_pickle=False) as npz:
        Xtr, ytr, Xte = npz["X_train"], npz["y_train"], npz["X_test"]
        yte = npz["y_test"] if "y_test" in npz.files else None
    if spec["model"] == "regression":
        classes = np.zeros(0)
        codes = ytr.reshape(-1, 1)
    else:
        classes = np.unique(ytr)
        codes = (np.where(ytr == classes[1], 1.0, -1.0)[:, None] if len(classes) == 2
                 else np.where(ytr[:, None] == classes[None, :], 1.0, -1.0)).astype(Xtr.dtype)
    X = torch.from_numpy(Xtr)
    Xt = torch.from_numpy(Xte)
    options = _options(spec)
    kernel = falkon.kernels.GaussianKernel(sigma=spec["sigma"], opt=options)
    M = min(int(spec["M"]), len(Xtr))
    fit_s = 0.0
    columns = []
    extra: dict[str, Any] = {}
    if spec["model"] in ("falkon", "regression"):
        trace: list[list[float]] = []
        clock = {"t0": 0.0, "eval_s": 0.0}
        cls, traced = (falkon.Falkon, {}) if yte is None else (
            _traced_falkon(falkon, trace, clock), {"error_fn": _rmse, "error_every": 1})
        est = cls(kernel=kernel, penalty=spec["penalty"], M=M, maxiter=spec["maxiter"], seed=spec["seed"],
                  options=options, **traced)
        fit_args = () if yte is None else (Xt, torch.from_numpy(yte.reshape(-1, 1)))
        clock["t0"] = t0 = time.perf_counter()
        est.fit(X, torch.from_numpy(codes), *fit_args)
        fit_s = time.perf_counter() - t0 - clock["eval_s"]
        if yte is not None:
            extra = {"rmse_trace": trace, "trace_s": clock["eval_s"], "n_iter": len(trace)}
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
    print(RESULT_PREFIX + json.dumps({"fit_s": fit_s, "torch": torch.__version__, **extra,
                                      "falkon": getattr(falkon, "__version__", "?")}), flush=True)


if __name__ == "__main__":
    _spec = json.loads(sys.argv[1])
    (_probe_child if _spec.get("probe") else _child)(_spec)
