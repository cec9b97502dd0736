"""Held-out splits and cross-validation folds of row-chunked dask arrays (the workflows' evaluation).

Nothing of size n reaches the client: splits are lazy slices or per-block masks drawn
from ``(seed, block)``, so a split depends on the chunking, not on the workers.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np


def _block_mask(seed: int, block: int, size: int, fraction: float) -> np.ndarray:
    """Test rows of one block: the same for any worker, drawn from (seed, block)."""
    return np.random.default_rng([seed, block]).random(size) < fraction


def _take(block: np.ndarray, seed: int, fraction: float, test: bool, block_info: Any = None) -> np.ndarray:
    b = block_info[0]["chunk-location"][0]
    mask = _block_mask(seed, b, block.shape[0], fraction)
    return block[mask if test else ~mask]


def _masked(a: da.Array, counts: list[int], seed: int, fraction: float, test: bool) -> da.Array:
    chunks = (tuple(counts),) + a.chunks[1:]
    return da.map_blocks(_take, a, seed, fraction, test, chunks=chunks, dtype=a.dtype)


def holdout_split(
    X: da.Array, y: da.Array, test_fraction: float, split: str = "tail", seed: int = 0
) -> tuple[da.Array, da.Array, da.Array, da.Array]:
    """``X_train, y_train, X_test, y_test``.

    "tail" holds out the last rows (the newest, for a store that grows by
    appending); "random" holds out each row with probability ``test_fraction``,
    drawn per block from ``seed`` (the split depends on the chunking, not on the
    workers).
    """
    n = int(X.shape[0])
    if split == "tail":
        n_test = min(n - 1, max(1, int(round(n * test_fraction))))
        return X[: n - n_test], y[: n - n_test], X[n - n_test:], y[n - n_test:]
    if split != "random":
        raise ValueError(f"split must be 'tail' or 'random'; got {split!r}")
    if X.chunks[0] != y.chunks[0]:
        y = y.rechunk({0: X.chunks[0]})
    test_counts = [int(_block_mask(seed, b, s, test_fraction).sum()) for b, s in enumerate(X.chunks[0])]
    train_counts = [s - t for s, t in zip(X.chunks[0], test_counts)]
    if sum(test_counts) == 0 or sum(train_counts) == 0:
        raise ValueError(f"a random split of {n} rows with test_fraction={test_fraction} leaves an empty side; "
                         "use more rows or split = \"tail\"")
    return (
        _masked(X, train_counts, seed, test_fraction, False),
        _masked(y, train_counts, seed, test_fraction, False),
        _masked(X, test_counts, seed, test_fraction, True),
        _masked(y, test_counts, seed, test_fraction, True),
    )


def _fold_ids(seed: int, block: int, size: int, folds: int) -> np.ndarray:
    return np.random.default_rng([seed, block, folds]).integers(0, folds, size)


def _take_fold(block: np.ndarray, seed: int, folds: int, k: int, test: bool, block_info: Any = None) -> np.ndarray:
    ids = _fold_ids(seed, block_info[0]["chunk-location"][0], block.shape[0], folds)
    return block[ids == k] if test else block[ids != k]


def kfold(
    X: da.Array, y: da.Array, folds: int, split: str = "random", seed: int = 0
) -> list[tuple[da.Array, da.Array, da.Array, da.Array]]:
    """``[(X_train, y_train, X_test, y_test), ...]``, one tuple per fold.

    "random" assigns each row to a fold at random (drawn per block from ``seed``);
    "tail" cuts the rows into contiguous folds (for data in time order).
    """
    n = int(X.shape[0])
    if folds > n:
        raise ValueError(f"{folds} folds need at least {folds} rows; got {n}")
    if split == "random":
        if X.chunks[0] != y.chunks[0]:
            y = y.rechunk({0: X.chunks[0]})
        ids = [np.bincount(_fold_ids(seed, b, s, folds), minlength=folds) for b, s in enumerate(X.chunks[0])]
        out = []
        for k in range(folds):
            test_counts = [int(c[k]) for c in ids]
            train_counts = [s - t for s, t in zip(X.chunks[0], test_counts)]
            parts = []
            for a, counts, test in ((X, train_counts, False), (y, train_counts, False),
                                    (X, test_counts, True), (y, test_counts, True)):
                parts.append(da.map_blocks(_take_fold, a, seed, folds, k, test, dtype=a.dtype,
                                           chunks=(tuple(counts),) + a.chunks[1:]))
            out.append(tuple(parts))
        return out
    if split != "tail":
        raise ValueError(f"split must be 'tail' or 'random'; got {split!r}")
    edges = np.linspace(0, n, folds + 1).astype(int)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        X_train = da.concatenate([X[:a], X[b:]], axis=0) if a > 0 and b < n else (X[b:] if a == 0 else X[:a])
        y_train = da.concatenate([y[:a], y[b:]], axis=0) if a > 0 and b < n else (y[b:] if a == 0 else y[:a])
        out.append((X_train, y_train, X[a:b], y[a:b]))
    return out
