"""How calibrated ``return_std`` is, before and after the residual noise estimate (issue 37).

One ``FalkonRegressor(compute_std=True)`` fit per penalty on a PMLB set from
``../shared/data`` (``--dataset``, default 564_fried; synthetic rows without it, see
``predictive_std.load_split``), then on the held-out rows:

- ``resid_sd``: the standard deviation of the test residuals ``y - mean``;
- ``std_ml`` / ``std``: the mean latent std with the maximum-likelihood amplitude
  (``posterior_.likelihood_prior_variance``, what ``return_std`` gave before) and with
  the calibrated one (now), and ``in2_ml`` / ``in2``: the fraction of test residuals
  inside +-2 of them;
- ``obs_ml`` / ``obs``: the mean std of a new observation, ``sqrt(std^2 + noise)``
  (the GP's noise variance under each amplitude), and ``in2obs_ml`` / ``in2obs``: its
  +-2 coverage (nominal 95.4%);
- ``noise_ml`` / ``noise``: the two noise variances (``noise_variance_`` is the second).

``python workflows/benchmarks/std_calibration.py --max-rows 10000 --centers 300``
takes well under a minute.
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

from fit_tools import machine, print_table, write_results  # noqa: E402
from predictive_std import load_split  # noqa: E402

COLUMNS = ("penalty", "n_train", "M", "resid_sd", "std_ml", "in2_ml", "std", "in2", "obs_ml", "in2obs_ml", "obs",
           "in2obs", "noise_ml", "noise", "d_eff")


def calibration(penalty: float, data: tuple[np.ndarray, ...], centers: int) -> dict[str, Any]:
    """The figures of one fit (see the module docstring)."""
    from daskkrr import FalkonRegressor

    Xtr, Xte, ytr, yte = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FalkonRegressor(n_centers=centers, penalty=penalty, random_state=0, compute_std=True).fit(Xtr, ytr)
    mean, std = model.predict(Xte, return_std=True)
    post = model.posterior_
    resid = np.abs(yte - mean)
    std_ml = std * np.sqrt(post.likelihood_prior_variance[0] / post.prior_variance[0])
    noise_ml = float(post.likelihood_prior_variance[0] * post.noise_ratio)
    noise = float(model.noise_variance_[0])
    obs_ml, obs = np.sqrt(std_ml**2 + noise_ml), np.sqrt(std**2 + noise)
    return {
        "penalty": penalty, "n_train": len(ytr), "M": centers, "resid_sd": float(np.std(yte - mean)),
        "std_ml": float(std_ml.mean()), "in2_ml": float(np.mean(resid <= 2 * std_ml)),
        "std": float(std.mean()), "in2": float(np.mean(resid <= 2 * std)),
        "obs_ml": float(obs_ml.mean()), "in2obs_ml": float(np.mean(resid <= 2 * obs_ml)),
        "obs": float(obs.mean()), "in2obs": float(np.mean(resid <= 2 * obs)),
        "noise_ml": noise_ml, "noise": noise, "d_eff": float(post.effective_dof),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="564_fried")
    ap.add_argument("--max-rows", type=int, default=10_000)
    ap.add_argument("--centers", type=int, default=300)
    ap.add_argument("--penalties", default="1e-6,1e-4,1e-3", help="comma-separated")
    ap.add_argument("--out", default=None, help="results folder (default: results/ next to this file)")
    args = ap.parse_args(argv)
    data = load_split(args.dataset, args.max_rows)
    rows = [calibration(float(p), data, args.centers) for p in args.penalties.split(",")]
    print_table(rows, COLUMNS)
    write_results(rows, args.out, f"std_calibration_{args.dataset}_M{args.centers}",
                  {"machine": machine(), "dataset": args.dataset, "argv": sys.argv[1:]})
    return rows


if __name__ == "__main__":
    main()
