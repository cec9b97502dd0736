"""SQUEAK: the point-by-point reference and the batched Dask pass against exact RLS.

Each statistical claim is checked over 40 seeds on a small Gaussian-kernel problem
(n = 300) at two regularisations (the second in the slow run), with qbar = 48 and eps = 0.5:

- 0 <= K - K~ <= gamma / (1 - eps) I (Eq. 3 with the dictionary's weights),
- dictionary size with copies <= 3 qbar d_eff(gamma) (Thm. 1),
- every dictionary point's RLS estimate within [tau / alpha, tau] (Lemma 2),

each in at least 95% of the seeds; and the batched pass must match the reference's
mean dictionary size and spectral error within 15%. The reference's runs over the seeds use
:func:`squeak_point_by_point`, Alg. 1 with half the arithmetic per step, checked to draw the
dictionaries of :func:`daskkrr.testing.squeak_reference`.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import Counter

import dask
import dask.array as da
import numpy as np
import pytest
from scipy.linalg.lapack import dpotrf, dtrtri

from daskkrr.kernels import make_kernel
from daskkrr.sampling import (
    SAMPLERS,
    CenterDictionary,
    SqueakSampler,
    effective_dimension,
    make_sampler,
    ridge_leverage_scores,
    selection_weights,
    spectral_error_bounds,
)
from daskkrr.sampling.squeak_core import SqueakParams
from daskkrr.testing import squeak_numpy, squeak_reference

N_SEEDS = 40
QBAR = 48
EPS = 0.5
GAMMAS = (1.0, 4.0)
ALPHA_SQUEAK = (1 + EPS) / (1 - EPS)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    kernel = make_kernel("gaussian", sigma=2.5)
    taus = {g: ridge_leverage_scores(X, kernel, g) for g in GAMMAS}
    return X, kernel, taus


def dictionary_checks(X, kernel, D, gamma, tau, alpha):
    """(spectral ok, size ok, rls ok, size with copies, spectral max / gamma)."""
    lo, hi = spectral_error_bounds(X, kernel, D, gamma)
    spectral_ok = lo >= -1e-8 and hi <= gamma / (1 - EPS) * (1 + 1e-9) + 1e-8
    size = int(D.counts.sum())
    size_ok = size <= 3 * QBAR * tau.sum()
    est = np.asarray(D.info["rls_estimates"])
    exact = tau[D.indices]
    rls_ok = bool(np.all(est <= exact * (1 + 1e-8)) and np.all(est >= exact / alpha * (1 - 1e-8)))
    return spectral_ok, size_ok, rls_ok, size, hi / gamma


def summarise(rows):
    arr = np.array(rows, dtype=float)
    return {
        "spectral": arr[:, 0].mean(),
        "size_bound": arr[:, 1].mean(),
        "rls": arr[:, 2].mean(),
        "size": arr[:, 3].mean(),
        "error": arr[:, 4].mean(),
    }


def assert_guarantees(stats, label):
    for key in ("spectral", "size_bound", "rls"):
        assert stats[key] >= 0.95, f"{label}: {key} held in only {stats[key]:.0%} of {N_SEEDS} seeds"


#: The guarantees at both regularisations; the second's 40 reference runs double the cost: slow.
GAMMA_CASES = [GAMMAS[0], pytest.param(GAMMAS[1], marks=pytest.mark.slow)]


def squeak_point_by_point(X, kernel, gamma: float, qbar: int, eps: float, seed: int) -> CenterDictionary:
    """:func:`daskkrr.testing.squeak_reference` (Alg. 1, one point at a time, the same random stream),
    with each step's Eq. 5 computed in about half the arithmetic, for the statistics over many seeds.

    Each step queries every column of ``S_bar`` (the entries and the new point). With ``C`` the
    column scales ``c_j = sqrt(q_j / (qbar p_j))`` (1 for the new point) and
    ``Ks = C K C + gamma I``, ``C K C Ks^{-1} C K C = (Ks - gamma I) Ks^{-1} (Ks - gamma I)
    = Ks - 2 gamma I + gamma^2 Ks^{-1}``, so ``k_jj - k_j^T S_bar Ks^{-1} S_bar^T k_j =
    (gamma / c_j^2) (1 - gamma (Ks^{-1})_jj)``: the diagonal of ``Ks^{-1}`` (the column norms of
    ``L^{-1}``) replaces a triangular solve with ``m + 1`` right-hand sides. It is checked against
    the reference in :func:`test_the_fast_point_by_point_squeak_is_the_reference`.
    """
    K = np.asarray(kernel(X, X), dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows, q, p = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    rls = np.zeros(0)
    for t in range(K.shape[0]):
        cols = np.append(rows, t)
        c2 = np.append(q / (qbar * p), 1.0)
        c = np.sqrt(c2)
        Ks = K[cols][:, cols] * c * c[:, None]
        Ks.flat[:: cols.size + 1] += gamma
        L, info = dpotrf(Ks, lower=1, clean=1, overwrite_a=1)
        assert info == 0, f"step {t}: S_bar^T K S_bar + gamma I is not positive definite (info={info})"
        Linv, info = dtrtri(L, lower=1, overwrite_c=1)
        assert info == 0, f"step {t}: singular Cholesky factor (info={info})"
        resid = gamma / c2 * (1.0 - gamma * np.einsum("ij,ij->j", Linv, Linv))
        tau = (1.0 - eps) / gamma * np.maximum(resid, 0.0)  # (1 + eps) / (alpha gamma) = (1 - eps) / gamma
        p_old = np.append(p, 1.0)
        p_new = np.maximum(np.minimum(tau, p_old), p_old / 2.0)
        q_old = rng.binomial(q, p_new[:-1] / p_old[:-1]) if q.size else q  # SHRINK, then EXPAND
        q = np.append(q_old, rng.binomial(qbar, p_new[-1]))
        keep = q > 0
        rows, q, p, rls = cols[keep], q[keep], p_new[keep], tau[keep]
    n, m = K.shape[0], rows.size
    return CenterDictionary(centers=X[rows], indices=rows, weights=(m / n) * q / (qbar * p), counts=q,
                            probabilities=p, info={"rls_estimates": rls.tolist()})


def _reference_checks(X, kernel, gamma: float, tau, seed: int):
    """:func:`dictionary_checks` of the reference's dictionary for one seed (run in a pool process)."""
    D = squeak_point_by_point(X, kernel, gamma, QBAR, EPS, seed)
    return dictionary_checks(X, kernel, D, gamma, tau, ALPHA_SQUEAK)


def _production_checks(X, kernel, gamma: float, tau, seed: int):
    """:func:`dictionary_checks` of the batched pass's dictionary for one seed (run in a pool process)."""
    sampler = SqueakSampler(gamma=gamma, qbar=QBAR, eps=EPS)
    with dask.config.set(scheduler="sync"):
        D = sampler.select(da.from_array(X, chunks=(70, 3)), kernel, random_state=seed)
    return dictionary_checks(X, kernel, D, gamma, tau, ALPHA_SQUEAK)


def _stats_over_seeds(problem, seed_pool, checks):
    """gamma -> the summary of ``checks`` over the seeds, computed for the gammas the run's tests ask for;
    the seeds are split between the run's two pool processes."""
    X, kernel, taus = problem

    @functools.cache
    def stats(g: float) -> dict[str, float]:
        return summarise(list(seed_pool.map(functools.partial(checks, X, kernel, g, taus[g]), range(N_SEEDS))))

    return stats


#: Batches cut by the fraction rule alone: a byte cap of one row leaves ``ceil(m / 8)`` rows (the rule
#: that takes over past m = 8192 with the default 64 MiB), instead of the ``max(64, m)`` of the other runs.
FRACTION_PARAMS = {"batch_bytes": 8, "batch_fraction": 0.125}


def _fraction_batch_checks(X, kernel, gamma: float, tau, seed: int):
    """:func:`dictionary_checks` of a pass whose batches are ``ceil(m / 8)`` rows (run in a pool process)."""
    params = SqueakParams(gamma=gamma, qbar=QBAR, eps=EPS, **FRACTION_PARAMS)
    state = squeak_numpy(X, kernel, params, seed, block_rows=70)
    assert params.batch_rows(state.dictionary.size) == max(1, -(-state.dictionary.size // 8))
    D = state.dictionary.to_center_dictionary(QBAR, X.shape[0], {})
    return dictionary_checks(X, kernel, D, gamma, tau, ALPHA_SQUEAK)


@pytest.fixture(scope="module")
def reference_stats(problem, seed_pool):
    """gamma -> the reference's summary over the seeds."""
    return _stats_over_seeds(problem, seed_pool, _reference_checks)


@pytest.fixture(scope="module")
def production_stats(problem, seed_pool):
    """gamma -> the batched pass's summary over the seeds (70-row chunks, synchronous scheduler)."""
    return _stats_over_seeds(problem, seed_pool, _production_checks)


@pytest.mark.parametrize("gamma", GAMMA_CASES)
def test_reference_squeak_guarantees(reference_stats, gamma):
    assert_guarantees(reference_stats(gamma), f"reference SQUEAK, gamma={gamma}")


@pytest.mark.parametrize("gamma", GAMMA_CASES)
def test_production_squeak_guarantees(production_stats, gamma):
    assert_guarantees(production_stats(gamma), f"SqueakSampler, gamma={gamma}")


@pytest.mark.parametrize("gamma", GAMMA_CASES)
def test_production_matches_reference(reference_stats, production_stats, gamma):
    ref, prod = reference_stats(gamma), production_stats(gamma)
    for key in ("size", "error"):
        rel = abs(prod[key] - ref[key]) / ref[key]
        assert rel <= 0.15, f"mean {key}: batched {prod[key]:.3g} vs reference {ref[key]:.3g}"


def test_batches_of_an_eighth_of_the_dictionary_keep_the_guarantees(problem, seed_pool, reference_stats):
    """Past m = 8192 a batch is ``m / 8`` rows (the byte cap alone would leave ``8.4e6 / m``): a batch is a
    DISQUEAK merge of the dictionary with the batch's rows at probability 1, so Thm. 1 and Lemma 2 still
    hold, and the dictionary's size and spectral error match Alg. 1's over the seeds as the default
    batches' do. Checked on the small problem with the byte cap forced to one row."""
    gamma = GAMMAS[0]
    stats = _stats_over_seeds(problem, seed_pool, _fraction_batch_checks)(gamma)
    assert_guarantees(stats, f"batches of m / 8 rows, gamma={gamma}")
    ref = reference_stats(gamma)
    for key in ("size", "error"):
        rel = abs(stats[key] - ref[key]) / ref[key]
        assert rel <= 0.15, f"mean {key}: batches of m / 8 {stats[key]:.3g} vs reference {ref[key]:.3g}"


def test_the_fast_point_by_point_squeak_is_the_reference(problem):
    """The statistics' oracle draws the reference's dictionaries: the same random stream, and Eq. 5's
    estimates equal to round-off (both O(cond(Ks) eps) with cond(Ks) below 1e4 here), so no
    Binomial draw differs and the probabilities agree far inside rtol=1e-10."""
    X, kernel, _ = problem
    for gamma, seed in ((GAMMAS[0], 0), (GAMMAS[1], 1)):
        ref = squeak_reference(X[:150], kernel, gamma, QBAR, EPS, seed)
        fast = squeak_point_by_point(X[:150], kernel, gamma, QBAR, EPS, seed)
        np.testing.assert_array_equal(fast.indices, ref.indices)
        np.testing.assert_array_equal(fast.counts, ref.counts)
        np.testing.assert_allclose(fast.probabilities, ref.probabilities, rtol=1e-10, atol=0)
        np.testing.assert_allclose(fast.info["rls_estimates"], ref.info["rls_estimates"], rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(fast.weights, ref.weights, rtol=1e-10)


def test_reference_weights_follow_the_convention(problem):
    X, kernel, _ = problem
    D = squeak_reference(X[:120], kernel, 4.0, 8, EPS, 0)
    n, m = 120, D.size
    np.testing.assert_allclose(D.weights, (m / n) * D.counts / (8 * D.probabilities))
    np.testing.assert_allclose(selection_weights(D, n), D.counts / (8 * D.probabilities))


def test_result_does_not_depend_on_chunking_or_scheduler(problem):
    X, kernel, _ = problem
    sampler = SqueakSampler(gamma=2.0, qbar=8)
    with dask.config.set(scheduler="sync"):
        ref = sampler.select(da.from_array(X, chunks=(300, 3)), kernel, random_state=7)
    for chunks in (37, 100):
        other = sampler.select(da.from_array(X, chunks=(chunks, 3)), kernel, random_state=7)
        np.testing.assert_array_equal(other.indices, ref.indices)
        np.testing.assert_array_equal(other.counts, ref.counts)
        np.testing.assert_allclose(other.weights, ref.weights)
    st = squeak_numpy(X, kernel, SqueakParams(2.0, 8, EPS), 7, block_rows=55)
    np.testing.assert_array_equal(np.sort(st.dictionary.indices), ref.indices)


def test_numpy_input_and_random_state_precedence(problem):
    X, kernel, _ = problem
    a = SqueakSampler(gamma=2.0, qbar=8, random_state=3).select(X, kernel)
    b = SqueakSampler(gamma=2.0, qbar=8, random_state=99).select(X, kernel, random_state=3)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.info["seed"] == 3


def test_history_and_anytime_budgets(problem):
    X, kernel, _ = problem
    Xd = da.from_array(X, chunks=(50, 3))
    full = SqueakSampler(gamma=2.0, qbar=8).select(Xd, kernel, random_state=1)
    hist = full.info["history"]
    assert [h["block"] for h in hist] == list(range(6))
    assert hist[-1]["rows_seen"] == 300 and full.info["rows_seen"] == 300
    assert all(h["unique"] <= h["dictionary_size"] for h in hist)
    assert hist[0]["rows_seen"] == 0  # 50 rows wait for a full first batch (64 rows)
    assert all(a["rows_seen"] <= b["rows_seen"] for a, b in zip(hist, hist[1:]))
    assert hist[-1]["rls_sum"] > 0
    json.dumps(full.info)  # JSON-ready diagnostics
    d_eff = effective_dimension(X, kernel, 2.0)
    assert 0.7 * d_eff <= full.info["d_eff_estimate"] <= 1.3 * d_eff

    part = SqueakSampler(gamma=2.0, qbar=8, max_rows=120).select(Xd, kernel, random_state=1)
    assert part.info["rows_seen"] == 120 and part.indices.max() < 120

    capped = SqueakSampler(gamma=2.0, qbar=8, max_dictionary=20, max_inflight_bytes=2400)
    small = capped.select(Xd, kernel, random_state=1)
    assert small.info["stopped"] == "max_dictionary"
    assert small.info["rows_seen"] < 300
    assert small.info["segments"] < small.info["n_blocks"]
    assert small.indices.max() < small.info["rows_seen"]


def test_n_centers_thins_to_exactly_the_budget(problem):
    X, kernel, _ = problem
    sampler = SqueakSampler(gamma=1.0, qbar=16)
    free = sampler.select(X, kernel, random_state=2)
    assert free.size > 50
    D = sampler.select(X, kernel, n_centers=50, random_state=2)
    assert D.size == 50 and set(D.indices) <= set(free.indices)
    assert D.info["thinned_to"] == 50
    np.testing.assert_allclose(D.weights, (50 / 300) * D.counts / (16 * D.probabilities))
    # gamma=None with a budget: gamma is raised from penalty * n so the pass fits it.
    auto = SqueakSampler(qbar=16).select(X, kernel, n_centers=40, penalty=1e-6, random_state=2)
    assert auto.size <= 40
    assert auto.info["gamma"] > 1e-6 * 300
    assert auto.info["gamma_source"].startswith("raised")


def counting_store(store):
    """Wrap a zarr store so that reads of chunk keys are counted in ``wrapped.reads``.

    zarr re-creates wrappers (``with_read_only``), so all copies share one counter.
    """
    from zarr.storage import WrapperStore

    reads: Counter = Counter()
    lock = threading.Lock()

    class Counting(WrapperStore):
        def _count(self, key):
            if key.startswith("c/") or "/c/" in key:
                with lock:
                    reads[key] += 1

        async def get(self, key, prototype, byte_range=None):
            self._count(key)
            return await self._store.get(key, prototype, byte_range)

        async def get_partial_values(self, prototype, key_ranges):
            key_ranges = list(key_ranges)
            for key, _ in key_ranges:
                self._count(key)
            return await self._store.get_partial_values(prototype, key_ranges)

    wrapped = Counting(store)
    wrapped.reads = reads
    return wrapped


@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_single_pass_reads_each_chunk_once(tmp_path, problem, scheduler):
    import zarr

    X, kernel, _ = problem
    path = tmp_path / "x.zarr"
    z = zarr.create_array(str(path), shape=X.shape, chunks=(40, 3), dtype="f8")
    z[:] = X
    store = counting_store(zarr.storage.LocalStore(str(path)))
    arr = zarr.open_array(store=store, mode="r")
    Xd = da.from_zarr(arr)
    assert Xd.numblocks == (8, 1)
    with dask.config.set(scheduler=scheduler):
        D = SqueakSampler(gamma=2.0, qbar=8, max_inflight_bytes=3 * 40 * 3 * 8).select(
            Xd, kernel, random_state=0)
    assert D.info["segments"] == 3
    assert len(store.reads) == 8, sorted(store.reads)
    assert set(store.reads.values()) == {1}, store.reads


def test_registry_and_errors(problem):
    X, kernel, _ = problem
    assert {"uniform", "squeak", "disqueak", "bless", "rls"} <= set(SAMPLERS)
    assert isinstance(make_sampler("squeak", qbar=4), SqueakSampler)
    with pytest.raises(ValueError, match=r"rechunk"):
        SqueakSampler(gamma=1.0).select(da.from_array(X, chunks=(100, 1)), kernel, random_state=0)
    with pytest.raises(ValueError, match="penalty"):
        SqueakSampler().select(X, kernel, random_state=0)
    with pytest.raises(ValueError, match="eps"):
        SqueakSampler(gamma=1.0, eps=1.5).select(X, kernel, random_state=0)
    with pytest.raises(ValueError, match="qbar"):
        SqueakSampler(gamma=1.0, qbar=0).select(X, kernel, random_state=0)
