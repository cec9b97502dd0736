"""Random streams keyed by *what* is being sampled, never by *who* samples it.

Every random draw of the leverage-score samplers comes from a generator derived
from the user's seed and a key that names the piece of work: the global row offset
of a SQUEAK batch, the row range of a DISQUEAK merge node, a BLESS level. The same
seed therefore gives the same dictionary whatever the number of workers, the
scheduler or the order in which independent tasks run.
"""

from __future__ import annotations

from typing import cast

import numpy as np

#: Stream tags, one per kind of random decision.
STREAM_SQUEAK_BATCH = 1
STREAM_MERGE_NODE = 2
STREAM_BLESS_LEVEL = 3
STREAM_THINNING = 4
STREAM_EXACT_RLS = 5
STREAM_PILOT = 6
STREAM_RPCHOLESKY = 7


def resolve_seed(random_state: int | np.integer | None) -> int:
    """Return a non-negative integer seed; ``None`` draws fresh entropy (recorded by callers)."""
    if random_state is None:
        # cast: numpy types entropy broadly; a SeedSequence made without entropy draws an int
        return int(cast(int, np.random.SeedSequence().entropy) % (2**63))
    if isinstance(random_state, (bool, np.bool_)) or not isinstance(random_state, (int, np.integer)):
        raise TypeError(
            f"random_state must be an int or None; got {type(random_state).__name__}. "
            "Pass an integer seed, e.g. random_state=0"
        )
    if random_state < 0:
        raise ValueError(f"random_state must be >= 0; got {random_state}")
    return int(random_state)


def keyed_rng(seed: int, stream: int, *key: int) -> np.random.Generator:
    """Generator for the piece of work named by ``(stream, *key)`` under ``seed``.

    Parameters
    ----------
    seed : int
        The user's seed (see :func:`resolve_seed`).
    stream : int
        One of the ``STREAM_*`` tags of this module.
    *key : int
        Non-negative integers naming the work item (row offsets, node ids, levels).
    """
    spawn_key = (int(stream),) + tuple(int(k) for k in key)
    if any(k < 0 for k in spawn_key):
        raise ValueError(f"keys must be non-negative integers; got {spawn_key}")
    return np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=spawn_key))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z.copy()
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def row_uniforms(seed: int, stream: int, level: int, rows: np.ndarray) -> np.ndarray:
    """One uniform number in [0, 1) per global row index, independent of how rows are grouped.

    A counter-based hash (SplitMix64 finaliser) of ``(seed, stream, level, row)``: the
    value for row ``i`` is the same whether the row is processed in a block of 10 or of
    10 000 rows, on any worker.
    """
    rows = np.asarray(rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = _splitmix64(
            np.array([np.uint64(seed % 2**64) ^ (np.uint64(stream) << np.uint64(56))
                      ^ (np.uint64(level) << np.uint64(40))], dtype=np.uint64)
        )[0]
        z = _splitmix64(rows * _GOLDEN + base)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
