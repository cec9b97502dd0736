"""DISQUEAK: guarantees against exact RLS for 1, 2, 4 and 8 leaves, and worker independence."""

from __future__ import annotations

import functools
import json

import dask
import dask.array as da
import numpy as np
import pytest

from daskkrr.kernels import make_kernel
from daskkrr.parallel.executor import Executor
from daskkrr.sampling import DisqueakSampler, SqueakSampler, ridge_leverage_scores
from daskkrr.sampling.squeak import leaf_boundaries

from .test_sampling_squeak import EPS, N_SEEDS, QBAR, assert_guarantees, dictionary_checks, summarise

ALPHA_DISQUEAK = (1 + 3 * EPS) / (1 - EPS)  # Lemma 4
GAMMA = 2.0


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(320, 3))
    kernel = make_kernel("gaussian", sigma=2.5)
    return X, kernel, ridge_leverage_scores(X, kernel, GAMMA)


#: The default run checks the deepest tree (8 leaves on 4 blocks: three levels of merges, each merging
#: two dictionaries as every smaller tree does). 1 leaf is SQUEAK itself (test_one_leaf_is_squeak, and
#: the guarantees in test_sampling_squeak); 2 and 4 leaves are shallower trees of the same merges, whose
#: row ranges test_tree_shapes checks: slow.
LEAF_CASES = [pytest.param(n, marks=pytest.mark.slow) for n in (1, 2, 4)] + [8]


@pytest.mark.parametrize("n_leaves", LEAF_CASES)
def test_disqueak_guarantees(problem, seed_pool, n_leaves):
    X, kernel, tau = problem
    rows = seed_pool.map(functools.partial(_disqueak_checks, X, kernel, tau, n_leaves), range(N_SEEDS))
    assert_guarantees(summarise(list(rows)), f"DISQUEAK with {n_leaves} leaves")


def _disqueak_checks(X, kernel, tau, n_leaves: int, seed: int):
    """:func:`dictionary_checks` of DISQUEAK's dictionary for one seed (run in a pool process)."""
    sampler = DisqueakSampler(gamma=GAMMA, qbar=QBAR, eps=EPS, n_leaves=n_leaves)
    with dask.config.set(scheduler="sync"):
        D = sampler.select(da.from_array(X, chunks=(80, 3)), kernel, random_state=seed)
    return dictionary_checks(X, kernel, D, GAMMA, tau, ALPHA_DISQUEAK)


def test_one_leaf_is_squeak(problem):
    X, kernel, _ = problem
    Xd = da.from_array(X, chunks=(80, 3))
    a = DisqueakSampler(gamma=GAMMA, qbar=8, n_leaves=1).select(Xd, kernel, random_state=4)
    b = SqueakSampler(gamma=GAMMA, qbar=8).select(Xd, kernel, random_state=4)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.counts, b.counts)


def _leaf_letter(state, block, block_index, first_row):
    """A leaf of two rows named by its position: a, b, c, ..."""
    return chr(ord("a") + first_row // 2)


def _concat(left, right):
    return f"({left}{right})"


def test_tree_shapes():
    passes = Executor().passes(da.zeros((10, 2), chunks=(2, 2)))
    shape = passes.tree_merge(_leaf_letter, name="shape", bounds=[0, 2, 4, 6, 8, 10], merge=_concat)
    assert shape == "(((ab)(cd))e)"
    shape = passes.tree_merge(_leaf_letter, name="shape", bounds=[0, 2, 4, 6, 8], merge=_concat,
                              tree="chain")
    assert shape == "(((ab)c)d)"
    X = da.zeros((10, 2), chunks=(4, 2))
    np.testing.assert_array_equal(leaf_boundaries(X, None), [0, 4, 8, 10])
    np.testing.assert_array_equal(leaf_boundaries(X, 2), [0, 4, 10])
    np.testing.assert_array_equal(leaf_boundaries(X, 3), [0, 4, 8, 10])
    np.testing.assert_array_equal(leaf_boundaries(X, 4), [0, 2, 5, 8, 10])
    with pytest.raises(ValueError, match="n_leaves"):
        leaf_boundaries(X, 11)
    with pytest.raises(ValueError, match="tree"):
        DisqueakSampler(gamma=1.0, tree="star").select(X + 1.0, make_kernel("gaussian"), random_state=0)


@pytest.mark.parametrize("tree", ["balanced", "chain"])
def test_dictionary_does_not_depend_on_workers(problem, tree):
    from distributed import Client, LocalCluster

    X, kernel, _ = problem
    Xd = da.from_array(X, chunks=(40, 3))
    sampler = DisqueakSampler(gamma=GAMMA, qbar=8, tree=tree)  # one leaf per block: 8 leaves
    with dask.config.set(scheduler="sync"):
        ref = sampler.select(Xd, kernel, random_state=11)
    assert ref.info["n_leaves"] == 8
    json.dumps(ref.info)
    for n_workers in (1, 2):
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            # client= is an alias of executor=; both must give the same dictionary.
            where = {"client": client} if n_workers == 1 else {"executor": Executor(client)}
            got = sampler.select(Xd, kernel, random_state=11, **where)
        np.testing.assert_array_equal(got.indices, ref.indices)
        np.testing.assert_array_equal(got.counts, ref.counts)
        np.testing.assert_allclose(got.weights, ref.weights, rtol=1e-12)
    threaded = sampler.select(Xd, kernel, random_state=11)
    np.testing.assert_array_equal(threaded.indices, ref.indices)
    other = sampler.select(Xd, kernel, random_state=12)
    assert not np.array_equal(other.indices, ref.indices)


def test_each_chunk_read_once(tmp_path, problem):
    import zarr

    from .test_sampling_squeak import counting_store

    X, kernel, _ = problem
    path = tmp_path / "x.zarr"
    zarr.create_array(str(path), shape=X.shape, chunks=(40, 3), dtype="f8")[:] = X
    store = counting_store(zarr.storage.LocalStore(str(path)))
    Xd = da.from_zarr(zarr.open_array(store=store, mode="r"))
    D = DisqueakSampler(gamma=GAMMA, qbar=8, n_leaves=3).select(Xd, kernel, random_state=0)
    assert D.info["n_leaves"] == 3
    assert len(store.reads) == 8 and set(store.reads.values()) == {1}, store.reads
