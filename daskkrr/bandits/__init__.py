"""Gaussian-process bandit optimisation over a finite arm set, on adaptive Nystrom dictionaries.

- :class:`BKB` (Calandriello et al., COLT 2019): GP-UCB whose posterior lives on a
  dictionary of pulled arms resampled at every step with probability proportional
  to their posterior variance; ``ask() -> index``, ``tell(index, reward)``.
- :class:`BatchBKB` (BBKB, Calandriello et al., ICML 2020): the same asking for
  batches, adaptive (variance-ratio rule) or of a fixed size.

Pure numpy on the client: the arm set and the dictionary are small; the kernels
are :mod:`daskkrr.kernels`'.
"""

from daskkrr.bandits.batch import BatchBKB
from daskkrr.bandits.bkb import BKB, bayesian_width, confidence_width, dimension_width, evidence_penalty
from daskkrr.bandits.posterior import HallucinatedVariance, NystromPosterior, nystrom_embedding

__all__ = ["BKB", "BatchBKB", "HallucinatedVariance", "NystromPosterior", "bayesian_width", "confidence_width",
           "dimension_width", "evidence_penalty", "nystrom_embedding"]
