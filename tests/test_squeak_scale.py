"""SQUEAK and DISQUEAK at large dictionaries (issue 39): what an update holds, what travels, the budget.

- the entries' estimates from the diagonal of ``A^{-1}`` equal the explicit Eq. 4/5 solve;
- the factor and the inverse are built in their input's memory (no extra ``m x m`` copy);
- a batch's peak allocation stays within :func:`factor_bytes` (two ``m x m`` matrices), well below
  the earlier route's (Gram, weighted Gram, factor, extension, solve: six);
- the state between tasks holds the dictionary's rows, not its Gram;
- a dictionary over ``memory_budget`` fails before allocating, with the figures and the fix.
"""

from __future__ import annotations

import pickle
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest
from scipy.linalg import solve_triangular

from daskkrr.kernels import make_kernel
from daskkrr.parallel.guards import ResourceGuardError
from daskkrr.sampling import DisqueakSampler, SqueakSampler
from daskkrr.sampling.dictionary import factor_in_place, inverse_diagonal, weighted_kernel_gram
from daskkrr.sampling.keyed_random import STREAM_SQUEAK_BATCH, keyed_rng
from daskkrr.sampling.squeak_core import SqueakParams, entry_estimates, factor_bytes, squeak_batch
from daskkrr.testing import squeak_numpy

D = 10
#: sigma = sqrt(d) / 2: two standard normal rows have kernel value about exp(-4), so the kernel
#: matrix is nearly diagonal and the dictionary keeps almost every row (m grows with n).
KERNEL = make_kernel("gaussian", sigma=np.sqrt(D) / 2)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, D))


def test_entry_estimates_equal_the_explicit_solve():
    """``g (1 - g (A^{-1})_ii) / w_i`` against ``k_ii - ||L^{-1} D k_i||^2`` with the same factor.

    A per-entry shift ``g`` (three distinct values) checks the identity entry by entry. Both sides
    are differences of numbers of size ``k_ii = 1``; each carries a round-off error of at most about
    ``m cond(A) eps`` (triangular solve/inverse, Higham Thm. 8.5), here ``cond(A) < 1000`` (asserted) and
    ``m = 150``: ``150 * 1000 * 2.2e-16 ~ 3e-11``; the tolerance 1e-9 leaves margin for the constants.
    """
    m = 150
    P = rows(m, 1) * 0.3  # closer rows: a dense, not diagonal, kernel matrix
    w = np.random.default_rng(2).uniform(0.5, 3.0, m)
    g = 0.5 * (1.0 + np.arange(m) % 3)
    K = np.asarray(KERNEL(P, P))
    A = np.sqrt(w)[:, None] * K * np.sqrt(w)[None, :] + np.diag(g)
    assert np.linalg.cond(A) < 1000
    L = np.linalg.cholesky(A)
    U = solve_triangular(L, np.sqrt(w)[:, None] * K, lower=True)
    explicit = np.diag(K) - np.einsum("ij,ij->j", U, U)
    params = SqueakParams(gamma=1.0, qbar=16, eps=0.5)
    got = entry_estimates(L.copy(), np.sqrt(w), g, params) * params.gamma / (1.0 - params.eps)
    np.testing.assert_allclose(got, explicit, rtol=0, atol=1e-9)


def test_factor_and_inverse_live_in_the_gram_memory():
    m = 120
    P = rows(m)
    sw = np.full(m, 1.3)
    A = weighted_kernel_gram(P, sw, KERNEL, 0.5, block_bytes=8 * m * 7)  # 7-row blocks
    # Built in blocks, it is the one-shot D K D + reg I to round-off of the kernel: an exponent of O(10) carries
    # about 10 eps of absolute error, so each entry about 10 eps relative (2e-15; rtol 1e-12 leaves 500x margin).
    np.testing.assert_allclose(A, 1.69 * np.asarray(KERNEL(P, P)) + 0.5 * np.eye(m), rtol=1e-12, atol=1e-14)
    L, jitter = factor_in_place(A)
    assert np.shares_memory(L, A), "the factor must overwrite the Gram, not copy it"
    # Cholesky's backward error: |L L^T - A| <= gamma_{m+1} |L| |L^T| (Higham, Thm. 10.3), entries of |L| |L^T| at
    # most the diagonal's 1.69 + 0.5: 121 * 1.1e-16 * 2.2 ~ 3e-14, so 1e-12 leaves a margin of 30.
    np.testing.assert_allclose(L @ L.T, 1.69 * np.asarray(KERNEL(P, P)) + (0.5 + jitter) * np.eye(m), atol=1e-12)
    expected = np.diag(np.linalg.inv(L @ L.T))
    d = inverse_diagonal(L)
    assert np.shares_memory(L, A)  # trtri wrote the inverse where the factor was
    # cond(L L^T) <= (||1.69 K|| + 0.5) / 0.5 < 100 here: the two inverses agree to ~ m cond eps.
    np.testing.assert_allclose(d, expected, rtol=1e-10)


def test_a_batch_holds_at_most_two_dictionary_matrices():
    """tracemalloc's peak over one batch (numpy reports its buffers to it) against ``factor_bytes``.

    The route before issue 39 held the Gram, its weighted copy, the factor, the extended factor, the
    extended Gram and the shrink step's solve (six ``m x m`` float64 matrices): over 2.5x this bound.
    """
    params = SqueakParams(gamma=0.5, qbar=16, eps=0.5)
    state = squeak_numpy(rows(700), KERNEL, params, seed=3).dictionary
    m, b = state.size, 60
    assert m > 600, "the data should keep almost every row"
    new = rows(b, seed=9)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = squeak_batch(state, new, 700, KERNEL, params, keyed_rng(3, STREAM_SQUEAK_BATCH, 700))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.size > m
    assert out.gram.size == 0
    assert peak <= factor_bytes(m, b) + 2**20, f"peak {peak / 2**20:.1f} MiB > bound {factor_bytes(m, b) / 2**20:.1f}"
    assert peak < 2.5 * 8 * m * m


def test_a_merge_holds_one_dictionary_matrix():
    """A DISQUEAK merge builds the union's Gram, factors it and inverts the factor in the same memory: its peak is
    one ``m x m`` float64 matrix (:func:`factor_bytes` with no new rows), what its memory check and "auto" price."""
    from daskkrr.sampling.keyed_random import STREAM_MERGE_NODE
    from daskkrr.sampling.squeak_core import merge_dictionaries

    params = SqueakParams(gamma=0.5, qbar=16, eps=0.5)
    left = squeak_numpy(rows(400), KERNEL, params, seed=3).dictionary
    right = squeak_numpy(rows(400, seed=1), KERNEL, params, seed=4, first_row=400).dictionary
    m = left.size + right.size
    assert m > 700, "the data should keep almost every row"
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        merged = merge_dictionaries(left, right, KERNEL, params, keyed_rng(3, STREAM_MERGE_NODE, 0, 800))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert 0 < merged.size <= m
    # one matrix plus the union's rows and per-entry vectors (well under 1 MiB here)
    assert peak <= factor_bytes(m, 0) + 2**20, f"peak {peak / 2**20:.1f} MiB > {factor_bytes(m, 0) / 2**20:.1f}"


def test_the_state_between_tasks_carries_rows_not_the_gram():
    """The pickled pass state is O(m d): well under one m x m float64 matrix when m >> d."""
    st = squeak_numpy(rows(600), KERNEL, SqueakParams(gamma=0.5, qbar=16, eps=0.5), seed=0, block_rows=150)
    m = st.dictionary.size
    assert m > 500
    assert st.dictionary.gram.size == 0
    nbytes = len(pickle.dumps(st, protocol=5))
    # rows (8 d) + index, probability, copies, estimate (32) per entry, plus the history and framing
    assert nbytes < 8 * m * (D + 4) + 64 * 2**10 < 8 * m * m


@pytest.mark.parametrize("cls", [SqueakSampler, DisqueakSampler])
def test_memory_budget_fails_before_the_factor_with_the_fix(cls):
    X = da.from_array(rows(400), chunks=(100, D))
    budget = factor_bytes(150, 64)  # the dictionary grows past 150 entries
    dense = {"factor_route": "dense"} if cls is DisqueakSampler else {}  # "auto" tiles a merge over the budget
    with dask.config.set(scheduler="sync"):
        with pytest.raises(ResourceGuardError) as err:
            cls(gamma=0.5, memory_budget=budget, **dense).select(X, KERNEL, random_state=0)
        msg = str(err.value)
        assert "m = " in msg and "memory_budget = " in msg and "GB" in msg, msg
        assert "max_dictionary <= " in msg and "raise gamma" in msg, msg
        assert ("SQUEAK batch of rows [" in msg) if cls is SqueakSampler else ("DISQUEAK merge" in msg), msg
        # The same run with room for its largest factor goes through: the check measures what it says.
        D_ok = cls(gamma=0.5, memory_budget=factor_bytes(400, 400)).select(X, KERNEL, random_state=0)
    assert D_ok.centers.shape[0] > 150


def test_memory_budget_is_validated():
    with pytest.raises(ValueError, match="memory_budget"):
        SqueakParams(gamma=1.0, qbar=4, eps=0.5, memory_budget=0)


def test_the_default_budget_on_a_cluster_is_one_workers_limit(cluster2):
    """An update runs in one worker: the default budget is at most the smallest worker limit (2 GiB here), not
    the workers' sum (4 GiB); it is lower only where this machine has less free memory than that."""
    from daskkrr.parallel.executor import Executor
    from daskkrr.sampling.squeak import resolve_memory_budget

    limits = [w["memory_limit"] for w in cluster2.scheduler_info()["workers"].values()]
    assert len(limits) == 2 and min(limits) > 0
    # the free-memory figure moves between readings, so no equality with it
    assert 0 < resolve_memory_budget(None, Executor(cluster2)) <= min(limits)
    assert resolve_memory_budget(12345, Executor(cluster2)) == 12345


def test_a_batch_is_never_under_an_eighth_of_the_dictionary():
    """The 64 MiB cap alone gives ``8.4e6 / m`` rows (419 at m = 20 000): each batch refactors the dictionary,
    so a row would cost ``m^4 / 1.3e7`` flops. The fraction rule keeps ``m / 8`` rows, and the batch does not
    depend on the memory found at run time (the dictionary drawn for a seed is the same on every machine)."""
    p = SqueakParams(gamma=1.0, qbar=16, eps=0.5)
    assert p.batch_rows(0) == 64 and p.batch_rows(1000) == 1000  # small dictionaries: max(batch_min, m)
    assert p.batch_rows(2000) == 2000 and p.batch_rows(5000) == (64 * 2**20) // (8 * 5000)  # the byte cap
    assert p.batch_rows(20_000) == 2500 and p.batch_rows(35_000) == 4375
    budgeted = SqueakParams(gamma=1.0, qbar=16, eps=0.5, memory_budget=10**9)
    assert all(budgeted.batch_rows(m) == p.batch_rows(m) for m in (100, 5000, 20_000))
    assert SqueakParams(gamma=1.0, qbar=16, eps=0.5, batch_fraction=0.0).batch_rows(20_000) == 419
    with pytest.raises(ValueError, match="batch_fraction"):
        SqueakParams(gamma=1.0, qbar=16, eps=0.5, batch_fraction=1.5)


@pytest.mark.parametrize("batches", [True, False])
def test_the_largest_dictionary_named_in_the_error_is_the_largest_that_fits(batches):
    from daskkrr.sampling.squeak_core import check_factor_memory, largest_dictionary

    for budget in (10**8, 10**9, 2 * 10**10):
        p = SqueakParams(gamma=1.0, qbar=16, eps=0.5, memory_budget=budget)
        m = largest_dictionary(p, budget, batches=batches)
        b = p.batch_rows if batches else (lambda _m: 0)
        assert factor_bytes(m, b(m)) <= budget < factor_bytes(m + 1, b(m + 1))
        check_factor_memory(m, b(m), p, "fits")
        with pytest.raises(ResourceGuardError, match=f"max_dictionary <= {m} fits"):
            check_factor_memory(m + 1, b(m + 1), p, "over")
