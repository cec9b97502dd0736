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


# ------------------------------------------------------------ DISQUEAK's merges as tiles
def disqueak_tolerance(dictionary, gamma: float, eps: float, qbar: int) -> float:
    """``m eps cond(A)`` for the root merge's ``A = D K D + (1 + eps) gamma I`` (``D^2 = q / (qbar p)``)."""
    m = len(dictionary.indices)
    s_max = float(np.max(dictionary.counts / (qbar * dictionary.probabilities)))
    return m * np.finfo(np.float64).eps * (1.0 + m * s_max / ((1.0 + eps) * gamma))


def _merge_routes(dictionary) -> list[str]:
    return [h["factor_route"] for h in dictionary.info["history"] if "node" in h]


@pytest.mark.parametrize("tree", ["balanced", "chain"])
def test_disqueak_tiled_merges_give_the_dense_dictionary(data, monkeypatch, tree):
    """Forced tiled merges (several tile rows, factors in memory; the tree merged level by level on the
    client): the same rows and copies as the one-graph dense route, the weights and estimates to the bound."""
    from daskkrr.sampling import DisqueakSampler

    monkeypatch.setattr(factor_cost, "TILE_ROWS", 48)
    X, kernel = data
    kw = dict(gamma=0.5, n_leaves=4, tree=tree, random_state=3)
    dense = DisqueakSampler(factor_route="dense", **kw).select(X, kernel)
    tiled = DisqueakSampler(factor_route="tiled", **kw).select(X, kernel)
    assert _merge_routes(dense) == ["dense"] * 3
    assert _merge_routes(tiled) == ["tiled (memory)"] * 3
    assert len(dense.indices) > 100  # the root factor has three tile rows or more
    np.testing.assert_array_equal(tiled.indices, dense.indices)
    np.testing.assert_array_equal(tiled.counts, dense.counts)
    tol = disqueak_tolerance(dense, 0.5, 0.5, 16)
    assert tol < 1e-8  # the bound says something here
    np.testing.assert_allclose(tiled.weights, dense.weights, rtol=tol)
    np.testing.assert_allclose(tiled.info["rls_estimates"], dense.info["rls_estimates"], rtol=tol, atol=tol)


def test_disqueak_auto_tiles_the_merges_over_the_budget():
    """A budget that holds the leaves' SQUEAK updates (a batch: two ``m x m`` matrices and its tiles) but not the
    upper merges' dense factors (one ``m x m`` matrix each): "auto" merges the first level in tasks and tiles the
    two upper levels (spilled: the budget also caps the workers' share), with the dictionary of the dense route
    under no budget. Without a budget nothing is tiled."""
    from daskkrr.sampling import DisqueakSampler
    from daskkrr.sampling.squeak_core import SqueakParams, factor_bytes

    X = da.from_array(np.random.default_rng(2).normal(size=(800, 3)), chunks=(100, 3))
    kernel = make_kernel("gaussian", sigma=1.5)
    kw = dict(gamma=0.5, n_leaves=8, random_state=3)
    free = DisqueakSampler(**kw).select(X, kernel)
    assert _merge_routes(free) == ["dense"] * 7
    leaves = [h["unique"] for h in free.info["history"] if h.get("block") == 0]
    assert len(leaves) == 8
    p = SqueakParams(gamma=0.5, qbar=16, eps=0.5)
    budget = max(factor_bytes(m, p.batch_rows(m)) for m in range(1, max(leaves) + 1))
    nodes = {tuple(h["node"]): h["unique"] for h in free.info["history"] if "node" in h}
    # the upper merges' unions (their two halves' entries) are over the budget as one dense matrix
    unions = [nodes[(0, 200)] + nodes[(200, 400)], nodes[(400, 600)] + nodes[(600, 800)]]
    assert min(factor_bytes(u, 0) for u in unions) > budget
    tiled = DisqueakSampler(memory_budget=budget, **kw).select(X, kernel)
    routes = _merge_routes(tiled)  # history order: [0, 200), [200, 400), [0, 400), [400, 600), [600, 800), ...
    assert [routes[i] for i in (0, 1, 3, 4)] == ["dense"] * 4, routes
    assert all(routes[i].startswith("tiled") for i in (2, 5, 6)), routes
    np.testing.assert_array_equal(tiled.indices, free.indices)
    np.testing.assert_array_equal(tiled.counts, free.counts)
    np.testing.assert_allclose(tiled.weights, free.weights, rtol=disqueak_tolerance(free, 0.5, 0.5, 16))


def test_disqueak_tiled_merges_on_a_cluster(data, cluster2):
    """On two worker processes: the leaves and dense merges run as tasks, the tiled root's tiles on the
    workers; the same dictionary as the threaded dense route."""
    from daskkrr.sampling import DisqueakSampler

    X, kernel = data
    kw = dict(gamma=0.5, n_leaves=4, random_state=3)
    dense = DisqueakSampler(factor_route="dense", **kw).select(X, kernel)
    tiled = DisqueakSampler(factor_route="tiled", **kw).select(X, kernel, client=cluster2)
    assert _merge_routes(tiled) == ["tiled (memory)"] * 3
    np.testing.assert_array_equal(tiled.indices, dense.indices)
    np.testing.assert_array_equal(tiled.counts, dense.counts)
    np.testing.assert_allclose(tiled.weights, dense.weights, rtol=disqueak_tolerance(dense, 0.5, 0.5, 16))


def test_tiled_solves_take_chunks_of_an_eighth_of_the_client_budget(data, monkeypatch):
    """Each chunk's solve reads every tile of the factor (from Zarr when spilled): at m = 30 000 with a 2 GiB
    budget, 64 MB chunks made a DISQUEAK root merge spend a third of its time decoding tiles. BLESS's levels
    take chunks of an eighth of the client's memory budget where that is more than 64 MB, and the solves give
    the same scores whatever the chunk (below)."""
    from daskkrr.parallel.strategies import plan_factor_route
    from daskkrr.sampling import bless_core

    assert bless_core.solve_chunk_bytes(2**33) == 2**30
    assert bless_core.solve_chunk_bytes(2**20) == bless_core.TILED_SOLVE_BYTES
    seen: list[tuple[int, int]] = []
    build = bless_core.TiledBlessFactor.from_dictionary.__func__

    def recording(cls, d, *args, **kwargs):
        factor = build(cls, d, *args, **kwargs)
        seen.append((d.size, factor.solve_bytes))
        return factor

    monkeypatch.setattr(bless_core.TiledBlessFactor, "from_dictionary", classmethod(recording))
    X, kernel = data
    budget = 2**30  # under the free memory of any machine that runs the suite: the client's budget is this
    BlessSampler(gamma=GAMMA, gamma_0=GAMMA_0, factor_route="tiled", memory_budget=budget).select(
        X, kernel, random_state=4)
    assert seen
    for m, solve_bytes in seen:
        plan = plan_factor_route(m, "float64", route="tiled", memory_budget=budget)
        assert solve_bytes == bless_core.solve_chunk_bytes(plan.client_bytes)
        if plan.client_bytes > 8 * bless_core.TILED_SOLVE_BYTES:
            assert solve_bytes > bless_core.TILED_SOLVE_BYTES


def test_disqueak_tiled_merges_score_the_entries_from_the_tiled_inverse(data, monkeypatch):
    """A tiled merge scores its entries from ``diag(A^{-1})`` (the tiled ``trtri``, ``m^3 / 3`` flops), not by
    solving the factor with every entry's kernel column (``m^3``), and never builds BLESS's solving factor."""
    from daskkrr.parallel import tiled_linalg
    from daskkrr.sampling import DisqueakSampler, bless_core

    calls: list[int] = []
    inverse = tiled_linalg.inverse_row_squares

    def counting(T):
        calls.append(T.layout.M)
        return inverse(T)

    def refused(*args, **kwargs):
        raise AssertionError("a DISQUEAK merge solved for its entries' scores")

    monkeypatch.setattr(tiled_linalg, "inverse_row_squares", counting)
    monkeypatch.setattr(bless_core.TiledBlessFactor, "residuals", refused)
    monkeypatch.setattr(tiled_linalg, "solve_column_norms", refused)
    X, kernel = data
    out = DisqueakSampler(gamma=0.5, n_leaves=4, factor_route="tiled", random_state=3).select(X, kernel)
    assert _merge_routes(out) == ["tiled (memory)"] * 3
    assert len(calls) == 3 and min(calls) > 0


def test_the_residuals_do_not_depend_on_the_chunk(data, monkeypatch):
    """One chunk and chunks of 7 columns: the same scores to round-off. The solves are column by column in exact
    arithmetic; another chunk width changes only the GEMMs' blocking, so each score moves by at most about
    ``m eps cond(A)`` (``kappa^2 = 1``, ``cond(A) <= 1 + m max(s) / gamma`` with ``s = 1 / p = 2``)."""
    from daskkrr.kernels import make_kernel as _make
    from daskkrr.parallel.executor import Executor
    from daskkrr.sampling.bless_core import TiledBlessFactor
    from daskkrr.sampling.dictionary import DictionaryState

    monkeypatch.setattr(factor_cost, "TILE_ROWS", 48)
    rng = np.random.default_rng(5)
    pts = rng.normal(size=(120, 3))
    d = DictionaryState(points=pts, indices=np.arange(120), probs=np.full(120, 0.5),
                        copies=np.ones(120, dtype=np.int64), rls=np.zeros(120), gram=np.zeros((0, 0)))
    kernel = _make("gaussian", sigma=1.5)
    Xc = rng.normal(size=(50, 3))
    kc = np.ones(50)
    out = []
    for solve_bytes in (2**30, 8 * 120 * 7):
        f = TiledBlessFactor.from_dictionary(d, 0.3, kernel, executor=Executor(), tile=48, solve_bytes=solve_bytes)
        try:
            out.append(f.residuals(kernel, Xc, kc))
        finally:
            f.close()
    m, gamma = 120, 0.3
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=m * np.finfo(np.float64).eps * (1.0 + m * 2.0 / gamma))


def test_a_merge_with_an_empty_side_records_no_factor():
    """A merge whose one side has no entries factors nothing: its history says "none", not the route it was given."""
    from daskkrr.sampling.squeak_core import SqueakParams, StreamState, merge_states, stream_block, stream_finish

    kernel = make_kernel("gaussian", sigma=1.5)
    p = SqueakParams(gamma=0.5, qbar=16, eps=0.5)
    X = np.random.default_rng(0).normal(size=(60, 3))
    full = stream_finish(stream_block(None, X, 0, 0, kernel, p, seed=1), kernel, p, seed=1)
    empty = StreamState.start(3, X.dtype, first_row=60)
    merged = merge_states(full, empty, kernel, p, seed=1, factor_route="tiled (zarr)")
    assert merged.history[-1]["factor_route"] == "none"
    assert merged.dictionary.size == full.dictionary.size > 0
    both = merge_states(full, stream_finish(stream_block(None, X + 5.0, 0, 60, kernel, p, seed=1), kernel, p, seed=1),
                        kernel, p, seed=1, factor_route="dense")
    assert both.history[-1]["factor_route"] == "dense"
