"""Choose ``gamma`` so that a SQUEAK dictionary fits a center budget (a pilot sample).

The dictionary of SQUEAK/DISQUEAK grows like ``qbar * d_eff(gamma)``: with FALKON's
``gamma = lambda * n`` and a small ``lambda`` it can exceed any center budget (and
its O(m^3) updates any time budget). Given ``n_centers``, we estimate the expected
number of unique centers as a function of gamma from a uniform pilot sample of
``s`` rows and pick the smallest gamma that fits.

Pilot formula: with ``Phi Phi^T ~ (n/s) Phi_s Phi_s^T``, the RLS of a row is
``tau_i(gamma) ~ (s/n) tau^s_i(gamma s / n)`` where ``tau^s`` are the exact RLS of the
pilot's own kernel matrix. A SQUEAK entry ends with ``p_i ~ (1 - eps) tau_i``, so
the expected number of unique centers is ``(n/s) sum_j [1 - (1 - p_j)^qbar]`` over the pilot.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from daskkrr.kernels import Kernel
from daskkrr.sampling.keyed_random import STREAM_PILOT, keyed_rng
from daskkrr.sampling.uniform import gather_rows


def expected_unique_centers(
    evals: np.ndarray, evecs_sq: np.ndarray, gamma: float, n: int, qbar: int, eps: float
) -> float:
    """Expected unique SQUEAK centers at ``gamma`` from the pilot's spectrum."""
    s = evals.shape[0]
    tau_s = evecs_sq @ (evals / (evals + gamma * s / n))
    p = np.clip((1.0 - eps) * (s / n) * tau_s, 0.0, 1.0)
    return float((n / s) * np.sum(1.0 - (1.0 - p) ** qbar))


def pilot_gamma(
    X: da.Array,
    kernel: Kernel,
    n_centers: int,
    *,
    qbar: int,
    eps: float,
    seed: int,
    client: Any = None,
    pilot_rows: int | None = None,
    overshoot: float = 1.25,
) -> tuple[float, dict[str, Any]]:
    """Smallest gamma whose expected unique dictionary is at most ``overshoot * n_centers``.

    Returns
    -------
    gamma : float
    info : dict
        Pilot size and the predicted dictionary size.
    """
    n = int(X.shape[0])
    s = int(min(n, pilot_rows or int(np.clip(2 * n_centers, 1000, 4000))))
    rng = keyed_rng(seed, STREAM_PILOT)
    idx = np.sort(rng.choice(n, size=s, replace=False))
    P = gather_rows(X, idx, client=client)
    K = np.asarray(kernel(P, P), dtype=np.float64)
    evals, evecs = np.linalg.eigh(0.5 * (K + K.T))
    evals = np.maximum(evals, 0.0)
    evecs_sq = evecs**2
    target = overshoot * n_centers
    trace = float(np.sum(evals)) * n / s
    lo, hi = trace * 1e-12 + 1e-12, max(trace, 1e-12)  # at hi, d_eff <= 1
    at_lo = expected_unique_centers(evals, evecs_sq, lo, n, qbar, eps)
    if at_lo <= target:
        return lo, {"pilot_rows": s, "predicted_unique": at_lo}
    for _ in range(60):
        mid = float(np.sqrt(lo * hi))
        if expected_unique_centers(evals, evecs_sq, mid, n, qbar, eps) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return hi, {
        "pilot_rows": s,
        "predicted_unique": expected_unique_centers(evals, evecs_sq, hi, n, qbar, eps),
    }
