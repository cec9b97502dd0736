"""BBKB: BKB asking for batches of arms to evaluate in parallel.

Calandriello, Carratino, Lazaric, Valko and Rosasco, "Near-linear time Gaussian
process optimization with adaptive batching and resparsification", ICML 2020.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from daskkrr.bandits.bkb import BKB, _check_real
from daskkrr.bandits.posterior import HallucinatedVariance
from daskkrr.utils.threads import blas_threads


class BatchBKB(BKB):
    """BKB that asks for a batch of arms, then updates once all their rewards are told.

    Within a batch the posterior mean stays the one at the start of the batch, and
    the variance is updated as if each chosen arm had already been observed (it does
    not depend on the rewards), so the arms of a batch spread out. The batch ends:

    - adaptively (``batch_size=None``, BBKB's rule, Lemma 1 of the paper): once
      ``1 + sum_{s in batch} sigma~^2_fb(x_s) > ratio_threshold``, where ``sigma~^2_fb``
      is the variance frozen at the start of the batch. This sum bounds the ratio
      ``sigma~^2_fb(x) / sigma~^2_t(x)`` for every arm, so confidence bounds widened
      by ``ratio_threshold`` stay valid without the batch's rewards;
    - or after a fixed number of arms ``batch_size`` (GP-BUCB style); the ratio is
      then not enforced and ``ratio_threshold`` only widens ``beta~``.

    When a batch's rewards are all told, the dictionary is resampled once with the
    variances of the batch's start (BBKB's resparsification), the posterior is
    recomputed and ``beta~`` is :func:`~daskkrr.bandits.bkb.confidence_width` with
    ``ratio = ratio_threshold`` (with ``noise_bound="auto"``: BKB's estimated-noise width
    times ``sqrt(ratio_threshold)``).

    Parameters
    ----------
    arms, kernel, sigma, penalty, qbar, delta, noise_bound, norm_bound, epsilon, random_state
        As for :class:`~daskkrr.bandits.BKB`.
    beta_scale, width, noise_estimate
        As for :class:`~daskkrr.bandits.BKB`.
    batch_size : int or None, default=None
        Arms per batch; None: the adaptive rule above.
    ratio_threshold : float, default=2.0
        ``C~ > 1`` of the adaptive rule (larger: bigger batches, wider bounds).
    max_batch_size : int or None, default=None
        Cap of an adaptive batch (None: the number of arms).

    Attributes
    ----------
    batch_sizes_ : list of int
        Size of every batch asked so far.
    n_rounds_ : int
        Batches whose rewards have all been told (model updates).
    (and those of :class:`~daskkrr.bandits.BKB`)

    Examples
    --------
    >>> import numpy as np
    >>> from daskkrr.bandits import BatchBKB
    >>> arms = np.linspace(0, 1, 50)[:, None]
    >>> bandit = BatchBKB(arms, sigma=0.2, penalty=0.01, noise_bound=0.1, batch_size=4, random_state=0)
    >>> batch = bandit.ask()
    >>> len(batch), len(set(batch))
    (4, 4)
    >>> bandit.tell_many(batch, [-(arms[i, 0] - 0.3) ** 2 for i in batch])
    >>> bandit.n_rounds_
    1
    """

    def __init__(
        self,
        arms: Any,
        *,
        batch_size: int | None = None,
        ratio_threshold: float = 2.0,
        max_batch_size: int | None = None,
        **bkb_params: Any,
    ):
        super().__init__(arms, **bkb_params)
        self.batch_size = _check_size("batch_size", batch_size)
        self.max_batch_size = _check_size("max_batch_size", max_batch_size)
        self.ratio_threshold = _check_real("ratio_threshold", ratio_threshold, low=1.0)
        self.batch_sizes_: list[int] = []
        self.n_rounds_ = 0
        self._batch: list[int] = []

    def ask(self, batch_size: int | None = None) -> list[int]:  # type: ignore[override]
        """The arms of the next batch (a list of indices, possibly with repeats).

        ``batch_size`` overrides the constructor's for this batch. Every arm of the
        previous batch must have been told (or excluded) first.
        """
        if self._pending:
            raise ValueError(f"the previous batch has arms without a reward: {self.pending}; "
                             "tell (or exclude) them before asking for a new batch")
        size = _check_size("batch_size", batch_size) or self.batch_size
        self._check_arms_left()
        with blas_threads(1):  # small matrices: see BKB._update
            batch = self._choose_batch(size)
        self._batch = batch
        self._pending.update(batch)
        self.batch_sizes_.append(len(batch))
        return batch

    def _choose_batch(self, size: int | None) -> list[int]:
        cap = size or min(self.max_batch_size or self.n_arms, self.n_arms)
        frozen = self.variance_
        hallucinated = HallucinatedVariance(self.posterior_, self.kernel, self._points, self.counts_)
        sd_scale = self.beta_
        ratio = 1.0
        batch: list[int] = []
        while len(batch) < cap:
            u = self.mean_ + sd_scale * np.sqrt(hallucinated.variance)
            u[self._excluded] = -np.inf
            index = self._argmax(u)
            batch.append(index)
            hallucinated.add(index)
            ratio += float(frozen[index])
            if size is None and ratio > self.ratio_threshold:
                break
        return batch

    def tell(self, index: Any, reward: Any) -> None:
        """Record the reward of one arm of the current batch; the model is updated once
        every arm of the batch has its reward."""
        i = self._take_pending(index, reward)
        self._observe([i], [float(reward)])
        self._end_of_batch()

    def tell_many(self, indices: Sequence[Any], rewards: Sequence[Any]) -> None:
        """Record the rewards of several arms of the current batch."""
        if len(indices) != len(rewards):
            raise ValueError(f"{len(indices)} indices but {len(rewards)} rewards")
        taken = [self._take_pending(i, r) for i, r in zip(indices, rewards, strict=True)]
        self._observe(taken, [float(r) for r in rewards])
        self._end_of_batch()

    def exclude(self, index: Any) -> None:
        super().exclude(index)
        self._end_of_batch()

    def _end_of_batch(self) -> None:
        if self._pending or not self._batch:
            return
        self._batch = []
        self.n_rounds_ += 1
        self._update(self.ratio_threshold)


def _check_size(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 or None; got {value!r}")
    return int(value)
