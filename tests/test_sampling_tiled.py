"""BLESS with its dictionary's ``m x m`` factor as tiles (issue 39): the dense route's centers.

Each BLESS level factors ``A = S K_JJ S + gamma I`` of the previous dictionary and scores its
candidates by ``k(x, x) - ||L^{-1} S k_J(x)||^2``. The tiled route computes the same backward-stable
Cholesky factor and triangular solves, in another summation order, so each score differs by at most
about ``m eps cond(A) kappa^2`` (``kappa^2 = max k(x, x)``): the tolerances below are that bound,
with ``cond(A) <= 1 + m max(s) kappa^2 / gamma`` taken at the last (largest, least regularised) level.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from daskkrr.kernels import make_kernel
from daskkrr.parallel import factor_cost
from daskkrr.sampling import BlessSampler

GAMMA = 0.2
GAMMA_0 = 6.4  # five levels (the default kappa^2 n = 400 gives eleven): the test stays fast


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(400, 3))
    return da.from_array(X, chunks=(100, 3)), make_kernel("gaussian", sigma=1.5)


def score_tolerance(dictionary) -> float:
    """``m eps cond(A)`` (relative, kappa^2 = 1 for the Gaussian kernel) for the last level's dictionary."""
    m = len(dictionary.indices)
    s_max = float(np.max(1.0 / dictionary.probabilities))
    cond = 1.0 + m * s_max / GAMMA
    return m * np.finfo(np.float64).eps * cond


@pytest.mark.parametrize("how", ["budget", "blockwise"])
def test_tiled_bless_factor_gives_the_dense_centers(data, monkeypatch, how):
    """A tiny memory budget (auto: tiles spilled to Zarr) and a forced tiled route with the levels run
    block by block (tiles in memory, candidates gathered for the tile graphs): the same centers, their
    weights and every level's d_eff estimate as the dense route, to the bound above."""
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 48)  # dictionaries of up to 228 points: up to 5 tile rows
    X, kernel = data
    dense = BlessSampler(gamma=GAMMA, gamma_0=GAMMA_0, factor_route="dense").select(X, kernel, random_state=4)
    if how == "budget":
        tiled = BlessSampler(gamma=GAMMA, gamma_0=GAMMA_0, memory_budget=1000).select(X, kernel, random_state=4)
        storage = "zarr"
    else:
        tiled = BlessSampler(gamma=GAMMA, gamma_0=GAMMA_0, factor_route="tiled",
                               max_candidate_bytes=500).select(
            X, kernel, random_state=4)
        storage = "memory"
        assert tiled.info["passes"] > 3  # the blockwise levels ran
    routes = [lv["factor_route"] for lv in tiled.info["levels"]]
    assert routes[0] == "none" and set(routes[1:]) == {f"tiled ({storage})"}
    assert all(lv["factor_route"] == "dense" for lv in dense.info["levels"][1:])
    assert len(dense.indices) > 100
    np.testing.assert_array_equal(tiled.indices, dense.indices)
    tol = score_tolerance(dense)
    assert tol < 1e-6  # the bound says something here
    np.testing.assert_allclose(tiled.weights, dense.weights, rtol=tol)
    np.testing.assert_allclose(tiled.probabilities, dense.probabilities, rtol=tol)
    np.testing.assert_allclose([lv["d_eff_estimate"] for lv in tiled.info["levels"]],
                               [lv["d_eff_estimate"] for lv in dense.info["levels"]], rtol=tol)


def test_auto_keeps_the_dense_factor_within_the_client_memory(data):
    """No regression: without a budget the small dictionaries are factored on the client."""
    X, kernel = data
    out = BlessSampler(gamma=1.0).select(X, kernel, random_state=4)
    assert {lv["factor_route"] for lv in out.info["levels"][1:]} == {"dense"}
