"""BLESS: level schedule, in-memory vs blockwise levels, accuracy against exact RLS, budgets."""

from __future__ import annotations

import json

import dask
import dask.array as da
import numpy as np
import pytest

from daskkrr.kernels import make_kernel
from daskkrr.sampling import BlessSampler, effective_dimension, make_sampler, spectral_error_bounds
from daskkrr.sampling.bless_core import bless_gammas, candidate_mask


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(400, 3))
    return X, make_kernel("gaussian", sigma=1.5)


def test_schedule_and_nested_candidates():
    g = bless_gammas(1.0, 100.0, 2.0)
    assert g[-1] == 1.0 and all(a > b for a, b in zip(g, g[1:]))
    assert g[0] == pytest.approx(50.0) and len(g) == 7
    assert bless_gammas(5.0, 1.0, 2.0) == [5.0]
    rows = np.arange(10_000)
    small, big = candidate_mask(rows, 3, 0.1), candidate_mask(rows, 3, 0.4)
    assert np.all(big[small]) and 0.08 < small.mean() < 0.12
    with pytest.raises(ValueError, match="q must be > 1"):
        bless_gammas(1.0, 10.0, 1.0)


def test_levels_in_memory_and_blockwise_agree_for_any_chunking(data):
    X, kernel = data
    a = BlessSampler(gamma=2.0).select(da.from_array(X, chunks=(100, 3)), kernel, random_state=4)
    b = BlessSampler(gamma=2.0, max_candidate_bytes=500).select(
        da.from_array(X, chunks=(33, 3)), kernel, random_state=4)
    assert a.info["passes"] == 1 and b.info["passes"] > 3
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-8)
    levels = a.info["levels"]
    assert [lv["gamma"] for lv in levels][-1] == 2.0
    assert all(x["candidates"] <= y["candidates"] for x, y in zip(levels, levels[1:]))
    json.dumps(a.info)


def test_bless_accuracy_and_size(data):
    X, kernel = data
    gamma = 2.0
    d_eff = effective_dimension(X, kernel, gamma)
    sampler = make_sampler("bless", gamma=gamma, q2=8)
    ok, sizes, d_est = 0, [], []
    with dask.config.set(scheduler="sync"):
        for seed in range(20):
            D = sampler.select(X, kernel, n_centers=None, penalty=None, random_state=seed)
            lo, hi = spectral_error_bounds(X, kernel, D, gamma)
            ok += (lo >= -1e-8) and (hi <= 2 * gamma)
            sizes.append(D.size)
            d_est.append(D.info["d_eff_estimate"])
    assert ok >= 19
    assert 4 * d_eff <= np.mean(sizes) <= 10 * d_eff
    assert np.mean(d_est) == pytest.approx(d_eff, rel=0.3)


def test_budget_stops_the_descent_and_thins(data):
    X, kernel = data
    D = BlessSampler(q2=8).select(X, kernel, n_centers=30, penalty=1e-6, random_state=0)
    assert D.size == 30
    assert D.info["stopped"] == "n_centers"
    assert D.info["gamma"] > 1e-6 * 400
    np.testing.assert_allclose(D.weights, (30 / 400) / D.probabilities)
