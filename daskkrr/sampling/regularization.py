"""The regularisation ``gamma`` of leverage-score sampling, and its link to FALKON's penalty.

Ridge leverage scores are defined in kernel-matrix units,
``tau_i(gamma) = (K (K + gamma I)^{-1})_ii``. FALKON (and the scikit-learn style
estimators of this package) write the penalty per sample, minimising
``(1/n) ||y - K_nM a||^2 + lambda a^T K_MM a``, whose natural ridge in kernel-matrix
units is ``gamma = lambda * n``. Samplers take ``gamma=None`` to mean exactly that.

A dictionary sampled at ``gamma`` approximates ``K`` up to ``gamma / (1 - eps)`` in
operator norm; its size grows like ``qbar * d_eff(gamma)``, so a smaller gamma
means more centers.
"""

from __future__ import annotations

import math


def resolve_gamma(gamma: float | None, penalty: float | None, n: int) -> float:
    """``gamma`` if given, else ``penalty * n``; checked to be finite and > 0.

    Parameters
    ----------
    gamma : float or None
        Explicit regularisation in kernel-matrix units.
    penalty : float or None
        FALKON's per-sample penalty ``lambda``.
    n : int
        Number of rows the dictionary is built on.
    """
    if gamma is None:
        if penalty is None:
            raise ValueError("gamma is None and no penalty was given: pass gamma= or penalty=")
        value = float(penalty) * int(n)
        source = f"penalty * n = {penalty!r} * {n}"
    else:
        value = float(gamma)
        source = f"gamma = {gamma!r}"
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the leverage-score regularisation must be finite and > 0; got {source}")
    return value
