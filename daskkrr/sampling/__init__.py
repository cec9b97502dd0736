"""Center selection for Nystrom/FALKON: uniform sampling and ridge-leverage-score samplers."""

from __future__ import annotations

from typing import Any

from daskkrr.sampling.base import CenterDictionary, CenterSampler
from daskkrr.sampling.uniform import UniformSampler, gather_rows

SAMPLERS: dict[str, type[CenterSampler]] = {"uniform": UniformSampler}


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
    "CenterDictionary",
    "CenterSampler",
    "UniformSampler",
    "gather_rows",
    "make_sampler",
]
