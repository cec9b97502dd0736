"""Center selection for Nystrom/FALKON: uniform sampling and ridge-leverage-score samplers.

Registered names (``make_sampler(name, **params)``, ``FalkonRegressor(sampler=name)``):

- ``"uniform"``: :class:`UniformSampler`, distinct rows uniformly at random;
- ``"rls"``: :class:`ExactRLSSampler`, exact ridge leverage scores (small n, the oracle);
- ``"squeak"``: :class:`SqueakSampler`, one sequential pass (Calandriello et al.);
- ``"disqueak"``: :class:`DisqueakSampler`, leaves in parallel merged along a tree;
- ``"bless"``: :class:`BlessSampler`, coarse-to-fine regularisations (Rudi et al. 2018).

Leverage-score samplers take ``gamma`` in kernel-matrix units; ``gamma=None`` means
``penalty * n`` (FALKON's lambda times the number of rows).
"""

from __future__ import annotations

from typing import Any

from daskkrr.sampling.base import CenterDictionary, CenterSampler
from daskkrr.sampling.bless import BlessSampler
from daskkrr.sampling.diagnostics import selection_weights, spectral_error_bounds
from daskkrr.sampling.disqueak import DisqueakSampler
from daskkrr.sampling.exact import ExactRLSSampler, effective_dimension, ridge_leverage_scores
from daskkrr.sampling.squeak import SqueakSampler
from daskkrr.sampling.squeak_reference import squeak_reference
from daskkrr.sampling.uniform import UniformSampler, gather_rows

SAMPLERS: dict[str, type[CenterSampler]] = {
    "uniform": UniformSampler,
    "rls": ExactRLSSampler,
    "squeak": SqueakSampler,
    "disqueak": DisqueakSampler,
    "bless": BlessSampler,
}


def make_sampler(sampler: str | CenterSampler, **params: Any) -> CenterSampler:
    """Return a sampler object from a registry name or pass one through."""
    if isinstance(sampler, CenterSampler):
        return sampler
    if not isinstance(sampler, str):
        raise TypeError(
            f"sampler must be a name or a CenterSampler; got {type(sampler).__name__}"
        )
    key = sampler.lower()
    if key not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {sorted(SAMPLERS)}")
    return SAMPLERS[key](**params)


__all__ = [
    "SAMPLERS",
    "BlessSampler",
    "CenterDictionary",
    "CenterSampler",
    "DisqueakSampler",
    "ExactRLSSampler",
    "SqueakSampler",
    "UniformSampler",
    "effective_dimension",
    "gather_rows",
    "make_sampler",
    "ridge_leverage_scores",
    "selection_weights",
    "spectral_error_bounds",
    "squeak_reference",
]
