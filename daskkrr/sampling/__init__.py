"""Center selection for Nystrom/FALKON: uniform sampling and ridge-leverage-score samplers.

Registered names (``make_sampler(name, **params)``, ``FalkonRegressor(sampler=name)``):

- ``"uniform"``: :class:`UniformSampler`, distinct rows uniformly at random (``uniform.py``);
- ``"rls"``: :class:`ExactRLSSampler`, exact ridge leverage scores (small n, the oracle; ``exact.py``);
- ``"squeak"``: :class:`SqueakSampler`, one sequential pass (Calandriello et al.; ``squeak.py``);
- ``"disqueak"``: :class:`DisqueakSampler`, leaves in parallel merged along a tree (``squeak.py``);
- ``"bless"``: :class:`BlessSampler`, coarse-to-fine regularisations (Rudi et al. 2018; ``bless.py``);
- ``"rpcholesky"``: :class:`RPCholeskySampler`, randomly pivoted Cholesky (Chen et al. 2023; ``rpcholesky.py``).

An array of shape (M, n_features) passed as ``sampler=`` is used as the centers
(:class:`FixedCenters`, ``fixed.py``).

Leverage-score samplers take ``gamma`` in kernel-matrix units; ``gamma=None`` means
``penalty * n`` (FALKON's lambda times the number of rows). Every sampler runs its
passes over the data through :class:`daskkrr.parallel.executor.Executor`
(``select(..., executor=...)``; ``client=`` is an alias). Test oracles live in
:mod:`daskkrr.testing`.
"""

from __future__ import annotations

# Importing a sampler's module registers it in SAMPLERS (``@register``).
from daskkrr.sampling.base import (
    SAMPLERS,
    CenterDictionary,
    CenterSampler,
    make_sampler,
)
from daskkrr.sampling.bless import BlessSampler
from daskkrr.sampling.exact import (
    ExactRLSSampler,
    effective_dimension,
    ridge_leverage_scores,
    selection_weights,
    spectral_error_bounds,
)
from daskkrr.sampling.fixed import FixedCenters
from daskkrr.sampling.rpcholesky import RPCholeskySampler
from daskkrr.sampling.squeak import DisqueakSampler, SqueakSampler
from daskkrr.sampling.uniform import UniformSampler

__all__ = [
    "SAMPLERS",
    "BlessSampler",
    "CenterDictionary",
    "CenterSampler",
    "DisqueakSampler",
    "ExactRLSSampler",
    "FixedCenters",
    "RPCholeskySampler",
    "SqueakSampler",
    "UniformSampler",
    "effective_dimension",
    "make_sampler",
    "ridge_leverage_scores",
    "selection_weights",
    "spectral_error_bounds",
]
