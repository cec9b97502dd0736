"""The tiled M x M linear algebra (daskkrr.parallel.tiled_linalg) against numpy/scipy.

Tolerances are Higham's componentwise bounds for each algorithm (the tiled ones do the same
operations in another order, which the bounds allow), with ``gamma_k = k u / (1 - k u)``:

- Cholesky: ``|T^T T - S| <= gamma_{M+1} |T|^T |T|`` (Higham, Theorem 10.3);
- triangular solve: ``(T + dT) x = v`` with ``|dT| <= gamma_M |T|`` (Theorem 8.5), so the
  residual is at most ``gamma_M |T| |x|``, plus the same again for evaluating it;
- a product: ``|fl(T T^T) - T T^T| <= gamma_M |T| |T|^T``;
- a triangular inverse, by columns or blocks of them: ``|X T - I| <= gamma_M |X| |T|`` (Section 14.2:
  each column of ``X`` solves a triangular system), so ``|X - T^{-1}| <= gamma_M |X| |T| |T^{-1}|``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from daskkrr.kernels import GaussianKernel
from daskkrr.parallel.executor import Executor
from daskkrr.parallel.tiled_linalg import (
    TileFactorError,
    TileLayout,
    TileStore,
    ZarrTile,
    _op_minus_product,
    _op_shifted,
    _op_trsv,
    _task,
    inverse_row_squares,
    kernel_cholesky,
    solve_upper_tiled,
    tiled_cholesky,
    triangle_bytes,
    upper_times_transpose,
)
from daskkrr.utils.linalg import JitterPolicy, JitterWarning, cholesky_jitter

M = 300


def gamma(k: int, dtype: str) -> float:
    u = float(np.finfo(dtype).eps) / 2
    return k * u / (1 - k * u)


@pytest.fixture(scope="module")
def centers() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(M, 3))


KERNEL = GaussianKernel(sigma=2.0)


def _check_factor(T: np.ndarray, S: np.ndarray, jitter: float, dtype: str) -> None:
    T = T.astype(np.float64)
    assert np.array_equal(T, np.triu(T))
    err = np.abs(T.T @ T - S - jitter * np.eye(len(S)))
    bound = gamma(len(S) + 1, dtype) * (np.abs(T).T @ np.abs(T)) + gamma(len(S), "float64") * np.abs(S)
    assert np.all(err <= 2 * bound), float(np.max(err / bound))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("tile", "spill"), [(64, False), (70, False), (70, True)])
def test_cholesky_solves_and_lauum_match_numpy(centers, dtype, tile, spill):
    """Factor, solves and T T^T on the threaded scheduler, in memory and spilled to Zarr (at the
    non-dividing tile size); the jitter is the dense factorisation's (same policy, same matrix)."""
    ex = Executor()
    store = TileStore() if spill else None
    try:
        T, jitter, d = kernel_cholesky(ex, centers, KERNEL, tile=tile, dtype=dtype, store=store)
        assert T.storage == ("zarr" if spill else "memory") and T.layout.nb == -(-M // tile)
        S = KERNEL(centers, centers)
        _, dense_jitter = cholesky_jitter(S.astype(dtype))
        assert jitter == dense_jitter and np.array_equal(d, np.ones(M))
        Tn = T.to_numpy().astype(np.float64)
        _check_factor(Tn, S, jitter, dtype)

        V = np.random.default_rng(1).normal(size=(M, 3))
        for trans in (False, True):
            x = solve_upper_tiled(T, V, trans=trans)
            A = Tn.T if trans else Tn
            bound = 2 * gamma(M, "float64") * (np.abs(A) @ np.abs(x))
            assert np.all(np.abs(A @ x - V) <= bound + 1e-300)

        w = Tn.sum(axis=1)
        G = upper_times_transpose(T, rows=M, center=w, shift=0.5, store=store).to_numpy(symmetric=True)
        exact = (Tn @ Tn.T - np.outer(w, w) / M) / M + 0.5 * np.eye(M)
        bound = gamma(M + 2, dtype) * ((np.abs(Tn) @ np.abs(Tn).T + np.outer(np.abs(w), np.abs(w)) / M) / M)
        assert np.all(np.abs(G - exact) <= 2 * bound + gamma(2, dtype) * 0.5)
    finally:
        if store is not None:
            store.close()


def test_weighted_kernel_factor(centers):
    """``D K D`` with the centers' importance weights, against the dense factor's matrix."""
    weights = np.random.default_rng(2).uniform(0.5, 2.0, size=M)
    T, jitter, d = kernel_cholesky(Executor(), centers, KERNEL, tile=64, weights=weights)
    S = np.sqrt(weights)[:, None] * KERNEL(centers, centers) * np.sqrt(weights)[None, :]
    assert np.allclose(d, np.sqrt(weights), rtol=0, atol=0)
    _check_factor(T.to_numpy(), S, jitter, "float64")


def _check_inverse_row_squares(got: np.ndarray, Tn: np.ndarray) -> None:
    """``got`` against ``sum_j (T^{-1})_ij^2``: each entry of the tiled inverse and of the reference is within
    ``E = gamma_M |U| |T| |U|`` of ``U = T^{-1}`` (to first order), so each row's squares within
    ``sum_j 2 E_ij (2 |U_ij| + 2 E_ij)``."""
    from scipy.linalg import solve_triangular

    U = solve_triangular(Tn, np.eye(len(Tn)), lower=False)
    E = gamma(len(Tn), "float64") * (np.abs(U) @ np.abs(Tn) @ np.abs(U))
    bound = np.sum(2 * E * (2 * np.abs(U) + 2 * E), axis=1)
    err = np.abs(got - np.sum(U**2, axis=1))
    assert np.all(err <= bound), float(np.max(err / bound))
    assert float(np.max(bound / np.sum(U**2, axis=1))) < 1e-6  # the bound says something here


@pytest.mark.parametrize(("tile", "spill", "threads"), [(64, False, 2), (70, True, 2), (16, True, 8)])
def test_inverse_row_squares_match_the_dense_inverse(centers, tile, spill, threads):
    """``diag((T^T T)^{-1})`` from the tiled ``trtri``: in memory, and spilled, where ``T^{-1}`` is written over
    ``T``'s tiles (19 tile columns on 8 threads: a tile written before the sums above it read it would show);
    ``T`` is released."""
    import dask

    store = TileStore() if spill else None
    try:
        T, _, _ = kernel_cholesky(Executor(), centers, KERNEL, tile=tile, store=store, regularizer=0.1)
        Tn = T.to_numpy()
        with dask.config.set(scheduler="threads", num_workers=threads):
            got = inverse_row_squares(T)
        assert T.tiles == {}
        _check_inverse_row_squares(got, Tn)
    finally:
        if store is not None:
            store.close()


def dense_source(S: np.ndarray, layout: TileLayout):
    """A tile source reading the tiles of a dense matrix (as tests build them)."""

    def source(i, j, shift, target):
        tile = S[slice(*layout.bounds(i)), slice(*layout.bounds(j))]
        return _task("shift", _op_shifted, target, tile, shift, "float64")

    return source


def test_jitter_is_escalated_as_the_dense_factorisation():
    """A matrix with an eigenvalue of -1e-10: the dense factorisation escalates the jitter past
    round-off, and so does the tiled one (the whole factorisation redone), to the same value and
    with the same warning."""
    rng = np.random.default_rng(4)
    Q, _ = np.linalg.qr(rng.normal(size=(M, M)))
    eig = np.linspace(1.0, 2.0, M)
    eig[7] = -1e-10
    S = (Q * eig) @ Q.T
    S = (S + S.T) / 2
    with pytest.warns(JitterWarning):
        _, dense_jitter = cholesky_jitter(S)
    layout = TileLayout(M, 64)
    policy = JitterPolicy.for_matrix((M, M), float(np.mean(np.diag(S))), np.float64, what="test matrix")
    with pytest.warns(JitterWarning, match="test matrix"):
        T, jitter = tiled_cholesky(Executor(), layout, dense_source(S, layout), policy, dtype="float64")
    assert jitter == dense_jitter > 1e-10 > policy.first
    _check_factor(T.to_numpy(), S, jitter, "float64")


def test_failed_factorisation_without_escalation_raises():
    """A negative-definite matrix: escalate=False raises at once; with escalation the limit says the fix."""
    layout = TileLayout(10, 4)
    ex = Executor()
    source = dense_source(-np.eye(10), layout)
    policy = JitterPolicy.for_matrix((10, 10), 1.0, np.float64, what="test matrix")
    with pytest.raises(np.linalg.LinAlgError, match="failed"):
        tiled_cholesky(ex, layout, source, policy, dtype="float64", escalate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(np.linalg.LinAlgError, match="singular. Use fewer centers"):
            tiled_cholesky(ex, layout, source, policy, dtype="float64")
    assert issubclass(TileFactorError, np.linalg.LinAlgError)


def test_triangle_bytes():
    """The upper-triangle tiles of a 300 x 300 matrix in tiles of 70: 4 full tile rows and a 20-row one."""
    sizes = [70, 70, 70, 70, 20]
    expected = sum(sizes[i] * sizes[j] for i in range(5) for j in range(i, 5)) * 4
    assert triangle_bytes(300, 70, 4) == expected
    assert triangle_bytes(300, 300, 8) == 300 * 300 * 8


def test_spilled_tile_is_read_as_stored_and_solved_in_that_order():
    """A spilled tile is read as Zarr stores it (C order), not copied to Fortran order: that transposing copy took
    five times the read and was most of a spilled CG iteration. The solves' tile operations take the C-ordered
    float32 tile as it is (its transpose for the products, float64 for the diagonal solve): the same float64
    arithmetic on the same entries in another order, so within Higham's bounds (module docstring)."""
    b = 40
    rng = np.random.default_rng(5)
    T32 = (np.triu(rng.normal(size=(b, b))) + b * np.eye(b)).astype(np.float32)  # an upper-triangular tile
    G32 = rng.normal(size=(b, b)).astype(np.float32)  # an off-diagonal tile
    store = TileStore()
    try:
        layout = TileLayout(2 * b, b)
        path = store.array("T", layout, np.float32)
        diag, off = (ZarrTile(path, layout.bounds(0), layout.bounds(j)) for j in (0, 1))
        diag.write(np.asfortranarray(T32))
        off.write(np.asfortranarray(G32))
        Tc, Gc = diag.read(), off.read()
    finally:
        store.close()
    assert Tc.flags.c_contiguous and not Tc.flags.f_contiguous
    assert np.array_equal(Tc, T32) and np.array_equal(Gc, G32)
    T64, G64 = T32.astype(np.float64), G32.astype(np.float64)
    x, acc = rng.normal(size=(b, 2)), rng.normal(size=(b, 2))
    for trans in (False, True):
        A, G = (T64.T, G64.T) if trans else (T64, G64)
        solved = _op_trsv(Tc, x, trans)
        assert np.all(np.abs(A @ solved - x) <= 2 * gamma(b, "float64") * (np.abs(A) @ np.abs(solved)))
        got = _op_minus_product(acc, Gc, x, trans)
        bound = 2 * gamma(b + 1, "float64") * (np.abs(acc) + np.abs(G) @ np.abs(x))
        assert np.all(np.abs(got - (acc - G @ x)) <= bound)


def test_on_a_local_cluster(cluster2, centers):
    """Tiles held as futures on two worker processes, and spilled to Zarr by the workers: the
    threaded result's jitter, within the bounds."""
    local, local_jitter, _ = kernel_cholesky(Executor(), centers, KERNEL, tile=100, dtype="float32")
    Ln = local.to_numpy().astype(np.float64)
    V = np.random.default_rng(3).normal(size=(M, 2))
    for store in (None, TileStore()):
        T, jitter, _ = kernel_cholesky(Executor(cluster2), centers, KERNEL, tile=100, dtype="float32", store=store)
        assert T.storage == ("memory" if store is None else "zarr") and jitter == local_jitter
        Tn = T.to_numpy().astype(np.float64)
        _check_factor(Tn, KERNEL(centers, centers), jitter, "float32")
        x = solve_upper_tiled(T, V, trans=True)
        assert np.all(np.abs(Tn.T @ x - V) <= 2 * gamma(M, "float64") * (np.abs(Tn.T) @ np.abs(x)))
        # the same operations on the same tiles: equal but for BLAS's own kernel choices (per-tile bound)
        assert np.max(np.abs(Tn - Ln)) <= 10 * gamma(M, "float32") * np.max(np.abs(Ln))
        T.release()
        if store is not None:
            store.close()


def test_spilled_inverse_holds_a_few_tiles_per_thread():
    """Spilled, each tile of ``U`` is one task holding its sum and the two tiles it reads (plus ``U_jj`` and a
    product): about five tiles per thread, seven with Zarr's read and write buffers. As chains of tasks the
    scheduler held 85 of the 120 tiles' worth here (6 GB at ``M = 52 000`` under a 2 GiB budget)."""
    import tracemalloc

    import dask

    Z = np.random.default_rng(4).normal(size=(2400, 5))
    store = TileStore()
    try:
        T, _, _ = kernel_cholesky(Executor(), Z, KERNEL, tile=160, store=store, regularizer=0.1)
        tile_bytes = 160 * 160 * 8
        tracemalloc.start()
        try:
            with dask.config.set(scheduler="threads", num_workers=2):
                inverse_row_squares(T)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        store.close()
    assert peak <= 2 * 7 * tile_bytes + 16 * tile_bytes, peak / tile_bytes  # 16 tiles' worth: the graph itself


def test_inverse_row_squares_on_a_local_cluster(cluster2, centers):
    """The tiled inverse on two worker processes, with tiles as futures and spilled (the workers write
    ``T^{-1}`` over ``T``'s tiles): within the bound of the threaded test."""
    for store in (None, TileStore()):
        T, _, _ = kernel_cholesky(Executor(cluster2), centers, KERNEL, tile=70, store=store, regularizer=0.1)
        Tn = T.to_numpy()
        _check_inverse_row_squares(inverse_row_squares(T), Tn)
        if store is not None:
            store.close()
