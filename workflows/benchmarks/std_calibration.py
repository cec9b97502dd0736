"""How calibrated ``return_std`` is, with one amplitude (before) and the miss's own (now; issue 37).

One ``FalkonRegressor(compute_std=True)`` fit per penalty on a PMLB set from
``../shared/data`` (``--dataset``, default 564_fried; synthetic rows without it, see
``predictive_std.load_split``), then on the held-out rows:

- ``resid_sd``: the standard deviation of the test residuals ``y - mean``;
- ``std_old`` / ``std``: the mean latent std with one amplitude ``s^2 = residual variance /
  (penalty n)`` for the whole Nystrom variance (what ``return_std`` gave before) and with the
  centers' miss at its own amplitude (now; ``posterior_.miss_ratio``);
- ``noise``: ``noise_variance_``, the residual variance ``RSS / (n - d_eff)`` (the same before and now);
- ``in1_old``, ``in2_old`` / ``in1``, ``in2``: the fraction of test targets inside ``+-1`` and ``+-2``
  of a new observation's std ``sqrt(std^2 + noise)`` (nominal 68.3% and 95.4%);
- ``f_in2_old`` / ``f_in2``: for 564_fried, whose noise-free function is known (Friedman #1,
  noise variance 1), the fraction of the true function values inside ``+-2 std`` (NaN otherwise).

``python -m workflows.benchmarks run std_calibration`` takes a few minutes (M = 1000).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import SHARED_DATA, machine, print_table, write_results  # noqa: E402
from predictive_std import load_split  # noqa: E402

COLUMNS = ("penalty", "n_train", "M", "resid_sd", "d_eff", "noise", "std_old", "std", "in1_old",
           "in2_old", "in1", "in2", "f_in2_old", "f_in2")


def friedman(X: np.ndarray) -> np.ndarray:
    """564_fried's noise-free targets (Friedman #1 on the first five features)."""
    return 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]


def one_amplitude_std(model: Any, X: np.ndarray) -> np.ndarray:
    """The std with ``s^2`` for the whole Nystrom variance: ``sqrt(s^2 (miss + fit))``, before issue 37."""
    post = model.posterior_
    Xs = model.scaler_.transform(X)
    miss, fit = post.variance_parts(model.kernel_(Xs, model.centers_), model.kernel_.diag(Xs))
    return np.sqrt(post.prior_variance[0] * np.maximum(miss + fit, 0.0))


def calibration(penalty: float, data: tuple[np.ndarray, ...], centers: int, known_f: bool) -> dict[str, Any]:
    """The figures of one fit (see the module docstring)."""
    from daskkrr import FalkonRegressor

    Xtr, Xte, ytr, yte = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FalkonRegressor(n_centers=centers, penalty=penalty, random_state=0, compute_std=True).fit(Xtr, ytr)
    mean, std = model.predict(Xte, return_std=True)
    post = model.posterior_
    std_old = one_amplitude_std(model, Xte)
    noise = float(model.noise_variance_[0])
    resid = np.abs(yte - mean)
    obs_old, obs = np.sqrt(std_old**2 + noise), np.sqrt(std**2 + noise)
    f_err = np.abs(friedman(Xte) - mean) if known_f else None
    return {
        "penalty": penalty, "n_train": len(ytr), "M": centers, "resid_sd": float(np.std(yte - mean)),
        "d_eff": float(post.effective_dof), "noise": noise,
        "std_old": float(std_old.mean()), "std": float(std.mean()),
        "in1_old": float(np.mean(resid <= obs_old)), "in2_old": float(np.mean(resid <= 2 * obs_old)),
        "in1": float(np.mean(resid <= obs)), "in2": float(np.mean(resid <= 2 * obs)),
        "f_in2_old": float("nan") if f_err is None else float(np.mean(f_err <= 2 * std_old)),
        "f_in2": float("nan") if f_err is None else float(np.mean(f_err <= 2 * std)),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="564_fried")
    ap.add_argument("--max-rows", type=int, default=10_000)
    ap.add_argument("--centers", type=int, default=1000)
    ap.add_argument("--penalties", default="1e-6,1e-4,1e-3", help="comma-separated")
    ap.add_argument("--out", default=None, help="results folder (default: results/ next to this file)")
    args = ap.parse_args(argv)
    data = load_split(args.dataset, args.max_rows)
    known_f = args.dataset == "564_fried" and (SHARED_DATA / "564_fried.tsv.gz").is_file()
    rows = [calibration(float(p), data, args.centers, known_f) for p in args.penalties.split(",")]
    print_table(rows, COLUMNS)
    write_results(rows, args.out, f"std_calibration_{args.dataset}_M{args.centers}",
                  {"machine": machine(), "dataset": args.dataset, "argv": sys.argv[1:]})
    return rows


if __name__ == "__main__":
    main()
