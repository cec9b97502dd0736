"""Regret of OnlineKernelRidge on a synthetic stream, and forgetting on a drifting one.

Part 1 (regret). Rows arrive one at a time; each is predicted by the model of
the rows before it, then learnt (prequential). The regret against the best fixed
KRR in hindsight ``f*`` (exact KRR with the same ``lam`` on all n rows) is

    R_n = sum_t (y_t - f_{t-1}(x_t))^2 - sum_t (y_t - f*(x_t))^2.

Ray and Musco bound it by ``lam ||w*||^2 + d_eff`` up to constants the poster
omits. Made explicit for exact online KRR (every row kept): with ``tau_t`` the
online leverage ``b_t^T (lam I + B_{t-1}^T B_{t-1})^{-1} b_t``, Sherman-Morrison
gives ``L_t - L_{t-1} = (y_t - yhat_t)^2 / (1 + tau_t)`` for the regularised
optimum ``L_t``, hence

    R_n <= lam ||f*||^2 + max_t (y_t - yhat_t)^2 * sum_t tau_t / (1 + tau_t)
        <= lam ||f*||^2 + max_t (y_t - yhat_t)^2 * log det(I + K / lam)
        <= lam ||f*||^2 + max_t (y_t - yhat_t)^2 * d_eff * (1 + log(1 + ||K|| / lam)),

i.e. the poster's ``d_eff`` carries the factor ``Y^2 (1 + log(1 + ||K||/lam))``
(``Y^2`` the largest squared prediction error). The table gives each term for
the exact online model and the sampled one (c = 4), and whether the regret stays
under the explicit bound.

Part 2 (drift). The target function changes halfway; the prequential error
(squared, in batches) of the unbounded model and of a sliding window of W rows
after the change. Both parts are plotted to ``results/online_regret.png``.

Usage::

    python workflows/benchmarks/online_regret.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fit_tools import PeakMemory, machine, print_table, write_results  # noqa: E402

from daskkrr.kernels import make_kernel  # noqa: E402
from daskkrr.models.online import OnlineKernelRidge  # noqa: E402


def target(X: np.ndarray, which: int) -> np.ndarray:
    return np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] if which == 0 else np.cos(2 * X[:, 1]) - 0.5 * X[:, 0]


def prequential(model: OnlineKernelRidge, X: np.ndarray, y: np.ndarray, batch: int) -> np.ndarray:
    """Squared error of each row predicted before it is learnt (the first batch: predicted 0)."""
    losses = np.empty(len(X))
    for start in range(0, len(X), batch):
        stop = min(start + batch, len(X))
        pred = model.predict(X[start:stop]) if hasattr(model, "coef_") else np.zeros(stop - start)
        losses[start:stop] = (y[start:stop] - pred) ** 2
        model.partial_fit(X[start:stop], y[start:stop])
    return losses


def regret_rows(n: int, lam: float, sigma: float, seed: int) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = target(X, 0) + 0.2 * rng.normal(size=n)
    kernel = make_kernel("gaussian", sigma=sigma)
    K = kernel(X, X)
    alpha = np.linalg.solve(K + lam * np.eye(n), y)  # the best fixed KRR in hindsight
    best_loss = float(np.sum((y - K @ alpha) ** 2))
    norm2 = float(alpha @ K @ alpha)
    e = np.clip(np.linalg.eigvalsh(K), 0.0, None)
    d_eff = float(np.sum(e / (e + lam)))
    logdet = float(np.sum(np.log1p(e / lam)))
    curves, rows = {}, []
    for name, c in (("exact online (c=1e12)", 1e12), ("sampled (c=4)", 4.0)):
        # The poster's fixed lam is the sampler's gamma; the regression reaches ridge lam at row n
        # (normalised penalty lam / n, ridge lam t / n after t rows).
        model = OnlineKernelRidge(sigma=sigma, penalty=lam / n, gamma=lam, standardize=False, c=c, batch_size=1,
                                  random_state=seed)
        t0 = time.perf_counter()
        with PeakMemory() as mem:
            losses = prequential(model, X, y, 1)
        regret = float(losses.sum() - best_loss)
        y2 = float(losses.max())
        explicit = lam * norm2 + y2 * logdet
        loose = lam * norm2 + y2 * d_eff * (1 + np.log1p(e.max() / lam))
        curves[name] = np.cumsum(losses)
        rows.append({"model": name, "n": n, "lam": lam, "landmarks": model.n_landmarks_,
                     "regret": round(regret, 3), "lam_norm2": round(lam * norm2, 3), "d_eff": round(d_eff, 3),
                     "poster_bound": round(lam * norm2 + d_eff, 3), "max_sq_err": round(y2, 3),
                     "logdet": round(logdet, 3), "explicit_bound": round(explicit, 3),
                     "deff_log_bound": round(loose, 3), "under_explicit": bool(regret <= explicit),
                     "seconds": round(time.perf_counter() - t0, 2), "peak_mb": round(mem.total_mb, 1)})
    # the comparator's cumulative loss, for the plot
    curves["best fixed (hindsight)"] = np.cumsum((y - K @ alpha) ** 2)
    return rows, {"curves": curves, "bound": rows[0]["explicit_bound"], "poster": rows[0]["poster_bound"]}


def drift_rows(n: int, window: int, lam: float, sigma: float, batch: int, seed: int) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    half = n // 2
    y = np.concatenate([target(X[:half], 0), target(X[half:], 1)]) + 0.2 * rng.normal(size=n)
    rows, curves = [], {}
    for name, w in (("unbounded", None), (f"window W={window}", window)):
        model = OnlineKernelRidge(sigma=sigma, penalty=lam / (w or n), gamma=lam, standardize=False, window=w,
                                  batch_size=batch, random_state=seed)
        t0 = time.perf_counter()
        with PeakMemory() as mem:
            losses = prequential(model, X, y, batch)
        after = losses[half:]
        curves[name] = losses
        rows.append({"model": name, "n": n, "batch": batch, "landmarks": model.n_landmarks_,
                     "mse_before_change": round(float(losses[batch:half].mean()), 4),
                     "mse_after_change": round(float(after.mean()), 4),
                     "mse_last_quarter": round(float(losses[-n // 4:].mean()), 4),
                     "seconds": round(time.perf_counter() - t0, 2), "peak_mb": round(mem.total_mb, 1)})
    return rows, {"curves": curves, "half": half, "batch": batch}


def plot(regret: dict, drift: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    curves = regret["curves"]
    best = curves["best fixed (hindsight)"]
    for name, cum in curves.items():
        if name != "best fixed (hindsight)":
            a.plot(cum - best, label=f"regret, {name}")
    a.axhline(regret["bound"], color="k", ls="--", label="explicit bound (exact online)")
    a.axhline(regret["poster"], color="grey", ls=":", label="lam ||w*||^2 + d_eff (poster, no constants)")
    a.set_xlabel("rows seen")
    a.set_ylabel("cumulative loss - best fixed KRR's")
    a.set_title("Regret against the best fixed KRR in hindsight")
    a.legend()
    batch = drift["batch"]
    for name, losses in drift["curves"].items():
        k = max(1, 200 // batch) * batch
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        b.plot(np.arange(len(smooth)) + k, smooth, label=name)
    b.axvline(drift["half"], color="k", ls=":", label="target changes")
    b.set_xlabel("rows seen")
    b.set_ylabel("prequential squared error (moving mean)")
    b.set_title("Drifting stream")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute)")
    parser.add_argument("--out", default=None, help="results directory (default: results/ next to this file)")
    args = parser.parse_args()
    n_regret, n_drift, window = (800, 3000, 500) if args.quick else (3000, 20000, 2000)
    lam, sigma = 1.0, 1.0
    rows, regret = regret_rows(n_regret, lam, sigma, seed=0)
    print_table(rows, ["model", "n", "landmarks", "regret", "lam_norm2", "d_eff", "poster_bound", "max_sq_err",
                       "logdet", "explicit_bound", "under_explicit", "seconds", "peak_mb"],
                title=f"Regret (rows one at a time, lam={lam}, gaussian sigma={sigma})")
    drows, drift = drift_rows(n_drift, window, lam, sigma, batch=50, seed=1)
    print_table(drows, ["model", "n", "batch", "landmarks", "mse_before_change", "mse_after_change",
                        "mse_last_quarter", "seconds", "peak_mb"], title="Drifting stream (target changes halfway)")
    meta = {"machine": machine(), "quick": args.quick, "lam": lam, "sigma": sigma}
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results"
    write_results([*rows, *drows], out, "online_regret", meta)
    plot(regret, drift, out / "online_regret.png")


if __name__ == "__main__":
    main()
