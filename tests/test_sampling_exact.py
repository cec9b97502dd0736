"""Exact ridge leverage scores, effective dimension, the exact-RLS sampler and the weights convention."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from daskkrr.kernels import make_kernel
from daskkrr.sampling import (
    BlessSampler,
    ExactRLSSampler,
    SqueakSampler,
    effective_dimension,
    make_sampler,
    ridge_leverage_scores,
    selection_weights,
    spectral_error_bounds,
)
from daskkrr.sampling.exact import order_sample, regularized_nystrom


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(size=(240, 2)), rng.normal(loc=6.0, size=(10, 2))])
    return X, make_kernel("gaussian", sigma=1.0)


@pytest.mark.parametrize("gamma", [0.1, 1.0, 10.0])
def test_rls_match_the_definition(data, gamma):
    X, kernel = data
    K = kernel(X, X)
    direct = np.diag(np.linalg.solve(K + gamma * np.eye(len(X)), K))  # K (K + gI)^-1 is symmetric
    tau = ridge_leverage_scores(X, kernel, gamma)
    np.testing.assert_allclose(tau, direct, atol=1e-10)
    assert np.all((tau >= 0) & (tau < 1))
    assert effective_dimension(X, kernel, gamma) == pytest.approx(tau.sum(), rel=1e-10)


def test_rls_shrink_with_gamma_and_rare_points_lead(data):
    X, kernel = data
    d = [effective_dimension(X, kernel, g) for g in (0.1, 1.0, 10.0)]
    assert d[0] > d[1] > d[2] > 0
    tau = ridge_leverage_scores(da.from_array(X, chunks=50), kernel, 1.0)
    # the 10 isolated points (last rows) carry much more leverage than the bulk
    assert tau[-10:].mean() > 3 * tau[:240].mean()


def test_exact_limits_and_messages(data):
    X, kernel = data
    with pytest.raises(ValueError, match="limit 100"):
        ridge_leverage_scores(X, kernel, 1.0, max_rows=100)
    with pytest.raises(ValueError, match="gamma"):
        ridge_leverage_scores(X, kernel, 0.0)


def test_order_sample_is_exact_size():
    rng = np.random.default_rng(0)
    scores = rng.random(100)
    chosen, incl = order_sample(scores, 30, rng.random(100))
    assert chosen.size == 30 and np.all(np.diff(chosen) > 0)
    assert np.all((incl > 0) & (incl <= 1))
    # rows with the largest scores are (much) more likely to be chosen
    hits = np.zeros(100)
    for s in range(200):
        c, _ = order_sample(scores, 30, np.random.default_rng(s).random(100))
        hits[c] += 1
    assert np.corrcoef(hits, scores)[0, 1] > 0.8


def test_exact_sampler_modes(data):
    X, kernel = data
    n = len(X)
    s = make_sampler("rls", gamma=1.0, qbar=8)
    assert isinstance(s, ExactRLSSampler)
    D = s.select(X, kernel, n_centers=None, penalty=None, random_state=0)
    np.testing.assert_allclose(D.weights, (D.size / n) * D.counts / (8 * D.probabilities))
    assert set(range(240, 250)) <= set(D.indices)  # the rare cluster is always represented
    lo, hi = spectral_error_bounds(X, kernel, D, 1.0)
    assert -1e-8 <= lo and hi <= 2.0
    M = ExactRLSSampler(gamma=1.0).select(da.from_array(X, chunks=100), kernel, n_centers=25,
                                          penalty=None, random_state=0)
    assert M.size == 25
    np.testing.assert_allclose(M.weights, (25 / n) / M.probabilities)
    # gamma = None means penalty * n
    P = ExactRLSSampler().select(X, kernel, n_centers=25, penalty=1.0 / n, random_state=0)
    assert P.info["gamma"] == pytest.approx(1.0)
    np.testing.assert_array_equal(P.indices, M.indices)


def test_selection_weights_estimate_the_full_gram(data):
    """Horvitz-Thompson: sum_j s_j k(z_j, .) k(z_j, .)^T is an unbiased estimate of
    sum_i k(x_i, .) k(x_i, .)^T; test on its trace (sum_j s_j ||k(z_j, X)||^2)."""
    X, kernel = data
    n = len(X)
    K = kernel(X, X)
    target = np.sum(K**2)
    samplers = {
        "rls": ExactRLSSampler(gamma=1.0, qbar=8),
        "squeak": SqueakSampler(gamma=1.0, qbar=8),
        "bless": BlessSampler(gamma=1.0, q2=8),
    }
    with dask.config.set(scheduler="sync"):
        for name, sampler in samplers.items():
            ests = []
            for seed in range(30):
                D = sampler.select(X, kernel, n_centers=None, penalty=None, random_state=seed)
                ests.append(np.sum(selection_weights(D, n) * np.sum(K[D.indices] ** 2, axis=1)))
            assert np.mean(ests) == pytest.approx(target, rel=0.1), name


def test_regularized_nystrom_with_all_points_is_exact_ridge(data):
    X, kernel = data
    K = kernel(X, X)
    n = len(X)
    Kt = regularized_nystrom(K, np.arange(n), np.ones(n), 1e-3)
    # K (K + g I)^-1 K = K - g K (K + g I)^-1
    expected = K - 1e-3 * np.linalg.solve(K + 1e-3 * np.eye(n), K)
    np.testing.assert_allclose(Kt, expected, atol=1e-6)
