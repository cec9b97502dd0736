"""``compute_std`` on the tiled preconditioner route (issue 39): the tiled posterior is the dense one.

Tolerances. The tiled and the dense posterior do the same float64 arithmetic in other orders: the
triangular solves with ``T`` are backward stable, so each side's ``c = T^{-T} D k`` (and the Gram matrix
``G = sum c c^T``) carries a relative error of at most about ``M eps cond(T)``, and the factor ``R`` of
``I + G / sigma^2`` turns it into at most ``cond(R)^2`` times that in the fitted variance
(first-order perturbation of ``e^T (R^T R)^{-1} e``). So the variances, the noise estimate and the std
agree to ``M eps cond(T) cond(R)^2`` relative (:func:`roundoff`), the degrees of freedom
``M - ||R^{-1}||_F^2`` to ``M`` times that. Given the same kernel entries, this holds for float32 data
too (the posterior is float64 from the kernel rows on).

Fitted models (dense route against tiled route) also differ by their CG solutions ``alpha``: the
residual sum of squares of two coefficient vectors differs by at most ``2 ||r|| ||K d|| + ||K d||^2``
(``d`` their difference, ``r`` one's residual; the triangle inequality), and the two routes' ``T`` (dense
against tiled Cholesky of the same matrix) by ``M eps cond(T)`` relative, which the solves amplify by
``cond(T)`` once more.
"""

from __future__ import annotations

import copy
import gc
import os
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

import daskkrr
from daskkrr import FalkonRegressor
from daskkrr.kernels import GaussianKernel
from daskkrr.kernels.engine import engine_for
from daskkrr.models.persistence import ModelFileError
from daskkrr.parallel import factor_cost
from daskkrr.parallel.executor import Executor
from daskkrr.parallel.tiled_falkon import TiledFalkonPreconditioner
from daskkrr.parallel.tiled_posterior import preconditioned_gram, tiled_nystrom_posterior
from daskkrr.solvers.variance import nystrom_posterior
from daskkrr.utils.linalg import solve_upper

from .checkpoint_crash import SimulatedCrash, crash_after_cg_save

N, D, M, TILE, PENALTY = 1200, 3, 110, 40, 1e-3  # three tile rows, the last one partial
EPS = np.finfo(np.float64).eps


def roundoff(T: np.ndarray, R: np.ndarray) -> float:
    """``M eps cond(T) cond(R)^2``: the relative gap allowed between two orders of the same float64 posterior."""
    return T.shape[0] * EPS * np.linalg.cond(T) * np.linalg.cond(R) ** 2


def data(dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D)).astype(dtype)
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.normal(size=N)
    return X, y, (rng.normal(size=(200, D)) * 1.5).astype(dtype)


def kernel_rows(kernel, X: np.ndarray, Z: np.ndarray, rows: int) -> np.ndarray:
    """``k(X, Z)`` in float64, built per (row block, center tile) as the tiled Gram pass builds it (float32
    kernel entries then agree exactly: the engine's blocking changes their rounding)."""
    blocks = [[np.asarray(engine_for(kernel).kernel_block(kernel, X[a:a + rows], Z[b:b + TILE]), dtype=np.float64)
               for b in range(0, Z.shape[0], TILE)] for a in range(0, X.shape[0], rows)]
    return np.block(blocks)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("intercept", [False, True])
def test_the_tiled_posterior_is_the_dense_one(dtype, intercept):
    X, y, Xq = data(dtype)
    kernel, Z = GaussianKernel(sigma=1.5), X[:M]
    Y = np.column_stack([y - y.mean(), np.ones(N)]) if intercept else y[:, None]
    ex = Executor()
    passes = ex.passes(da.from_array(X, chunks=(400, -1)), da.from_array(Y, chunks=(400, -1)))
    pre = TiledFalkonPreconditioner.from_centers(ex, Z.astype(np.float64), kernel, penalty=PENALTY, n=N, tile=TILE,
                                                 center_sketch=intercept)
    try:
        # slices of 200 rows: each 400-row block is cut in two, as blocks far larger than M x 64 MiB are
        gram, knm_t_y = preconditioned_gram(passes, kernel, Z, pre.T, pre.d, panel_bytes=8 * M * 200)
        T, d = pre.T.to_numpy(), pre.d
        K = kernel_rows(kernel, X, Z, 200)
        W = solve_upper(T, (K * d).T, trans=True).T  # the dense route's preconditioned kernel rows
        G = W.T @ W
        # a sum of N products in another order: at most N eps |K|^T |Y| apart
        assert np.all(np.abs(knm_t_y - K.T @ Y) <= N * EPS * np.abs(K).T @ np.abs(Y))
        b, mu = knm_t_y[:, :1], (knm_t_y[:, 1] / N if intercept else None)
        coef = np.linalg.solve(K.T @ K + PENALTY * N * kernel(Z.astype(float), Z.astype(float)), b)
        parts = dict(noise_ratio=PENALTY * N, n=N, mu=mu, y_sq=np.sum(Y[:, :1] ** 2, axis=0), knm_t_y=b,
                     coef=coef, mean_kxx=1.0)
        tiled = tiled_nystrom_posterior(pre.T, d, gram, **parts)
        dense = nystrom_posterior(T, d, G, **parts)
    finally:
        pre.close()
    assert tiled.tiled and not dense.tiled
    tol = roundoff(T, dense.correction)
    np.testing.assert_allclose(gram.to_numpy(symmetric=True), G, rtol=0, atol=tol * np.abs(G).max())
    assert abs(tiled.effective_dof - dense.effective_dof) <= M * tol
    np.testing.assert_allclose(tiled.noise_variance, dense.noise_variance, rtol=tol)
    np.testing.assert_allclose(tiled.miss_ratio, dense.miss_ratio, rtol=tol)
    Kq = kernel_rows(kernel, Xq, Z, Xq.shape[0])
    kxx = kernel.diag(Xq)
    for got, want in zip(tiled.variance_parts(Kq, kxx), dense.variance_parts(Kq, kxx)):
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.max(kxx))
    np.testing.assert_allclose(tiled.std(Kq, kxx), dense.std(Kq, kxx), rtol=tol)


# sigma=0.5: K_MM is well conditioned (cond about 1e4), so the routes' factorisations keep the bound tight
FIT = dict(n_centers=M, penalty=PENALTY, sigma=0.5, tol=1e-8, max_iter=100, random_state=0, chunks=400,
           compute_std=True)


@pytest.fixture
def tiles(monkeypatch):
    monkeypatch.setattr(factor_cost, "TILE_ROWS", TILE)


def rss_gap(model_a, model_b, X, y) -> tuple[float, float]:
    """``(RSS of a, bound on |RSS_a - RSS_b|)`` from the two coefficient vectors (see the module docstring)."""
    K = model_a.kernel_(X_scaled(model_a, X), model_a.centers_)
    r = y - (K @ model_a.coef_ + model_a.intercept_)
    gap = np.linalg.norm(K @ (model_a.coef_ - model_b.coef_) + (model_a.intercept_ - model_b.intercept_))
    return float(r @ r), float(2 * np.linalg.norm(r) * gap + gap**2)


def X_scaled(model, X):
    return model.scaler_.transform(X) if model.scaler_ is not None else X


@pytest.mark.parametrize("intercept", [False, True])
def test_a_tiled_fit_has_the_dense_fits_std_and_keeps_it_through_save_and_load(tiles, tmp_path, intercept):
    X, y, Xq = data("float64", seed=1)
    fit = dict(FIT, fit_intercept=intercept)
    tiled = FalkonRegressor(preconditioner_route="tiled", std_method="auto", **fit).fit(X, y)
    dense = FalkonRegressor(preconditioner_route="dense", std_method="exact", **fit).fit(X, y)
    assert tiled.preconditioner_route_["route"] == "tiled" and tiled.posterior_.tiled
    # auto: the exact variance, and why
    assert tiled.posterior_.low_rank is None and tiled.preconditioner_route_["std_method"] == "exact"
    assert "eigenproblem" in tiled.preconditioner_route_["std_reason"]

    Kq = tiled.kernel_(X_scaled(tiled, Xq), tiled.centers_)
    kxx = tiled.kernel_.diag(X_scaled(tiled, Xq))
    T = np.asarray(dense.posterior_.factor)
    # the two routes' T differ by M eps cond(T) relative, amplified by cond(T) in c = T^-T D k
    tol = roundoff(T, np.asarray(dense.posterior_.correction)) * np.linalg.cond(T)
    assert tol < 1e-5  # a bound that tests something
    for got, want in zip(tiled.posterior_.variance_parts(Kq, kxx), dense.posterior_.variance_parts(Kq, kxx)):
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.max(kxx))
    rss, gap = rss_gap(tiled, dense, X, y)
    noise_rtol = gap / rss + M * tol  # the CG gap in RSS, and d_eff's round-off in n - d_eff
    np.testing.assert_allclose(tiled.noise_variance_, dense.noise_variance_, rtol=noise_rtol)
    mean, std = tiled.predict(Xq, return_std=True)
    _, std_dense = dense.predict(Xq, return_std=True)
    v_min = float(np.min(dense.posterior_.unit_variance(Kq, kxx, exact=True)))
    # std = sqrt(s^2 v): half the relative gaps of s^2 and of v
    np.testing.assert_allclose(std, std_dense, rtol=(noise_rtol + tol * np.max(kxx) / v_min) / 2 + 1e-15)

    tiled.save(tmp_path / "model")
    assert (tmp_path / "model" / "posterior.zarr").is_dir()
    with np.load(tmp_path / "model" / "arrays.npz") as saved:  # no M x M array beside the tiles
        assert all(sum(n >= M for n in saved[k].shape) <= 1 for k in saved.files)
    loaded = daskkrr.load(tmp_path / "model")
    assert loaded.posterior_.tiled
    mean_l, std_l = loaded.predict(Xq, return_std=True)
    np.testing.assert_array_equal(std_l, std)  # the same tiles, solved in the same order
    np.testing.assert_array_equal(mean_l, mean)


def test_a_copy_outliving_the_fitted_model_refuses_return_std_instead_of_reading_zeros(tiles):
    """The copy names the fitted model's temporary tile folder; once that model is gone, so are the tiles, and Zarr
    would read the missing tiles as zeros: the copy must say so (and how to keep them) rather than answer."""
    X, y, Xq = data("float64", seed=3)
    model = FalkonRegressor(preconditioner_route="tiled", std_method="exact", **dict(FIT, tol=1e-4)).fit(X, y)
    _, std = model.predict(Xq, return_std=True)  # opens (and caches) the factors' arrays in this process
    twin = copy.deepcopy(model)  # what pickling does too: the tile store's copy names the folder only
    folder = Path(model.posterior_.factor.path).parent
    np.testing.assert_array_equal(twin.predict(Xq, return_std=True)[1], std)  # while the model lives
    del model
    gc.collect()
    assert not folder.exists()
    with pytest.raises(FileNotFoundError, match=r"save\(\) the fitted model and load\(\) it"):
        twin.predict(Xq, return_std=True)
    assert np.all(np.isfinite(twin.predict(Xq)))  # the mean needs no tiles


def test_std_method_fast_is_refused_on_the_tiled_route(tiles):
    X, y, _ = data("float64")
    with pytest.raises(ValueError, match="std_method='fast' cannot be used on the tiled preconditioner route"):
        FalkonRegressor(preconditioner_route="tiled", std_method="fast", **FIT).fit(X, y)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    mp = pytest.MonkeyPatch()
    mp.setattr(factor_cost, "TILE_ROWS", TILE)
    try:
        X, y, _ = data("float64", seed=2)
        path = tmp_path_factory.mktemp("tiled") / "model"
        # any tiled posterior will do for the damaged-file tests: a short CG
        FalkonRegressor(preconditioner_route="tiled", std_method="exact", **dict(FIT, tol=1e-4)).fit(X, y).save(path)
    finally:
        mp.undo()
    return path


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_truncated_tile_is_refused_at_load(saved_model, tmp_path):
    path = _copy(saved_model, tmp_path / "m")
    chunk = path / "posterior.zarr" / "correction" / "c" / "0" / "1"
    chunk.write_bytes(chunk.read_bytes()[:-8])
    with pytest.raises(ModelFileError, match=r"tile \(0, 1\).*truncated"):
        daskkrr.load(path)


def test_a_lower_tile_or_a_bad_pivot_is_refused_at_load(saved_model, tmp_path):
    path = _copy(saved_model, tmp_path / "lower")
    lower = path / "posterior.zarr" / "factor" / "c" / "1" / "0"
    lower.write_bytes((path / "posterior.zarr" / "factor" / "c" / "0" / "0").read_bytes())
    with pytest.raises(ModelFileError, match="is not part of the Zarr store"):
        daskkrr.load(path)
    path = _copy(saved_model, tmp_path / "pivot")
    diagonal = path / "posterior.zarr" / "factor" / "c" / "1" / "1"
    tile = np.frombuffer(diagonal.read_bytes(), dtype="<f8").copy().reshape(TILE, TILE)
    tile[3, 3] = -1.0
    diagonal.write_bytes(tile.tobytes())
    with pytest.raises(ModelFileError, match=r"diagonal entry <= 0 in tile \(1, 1\)"):
        daskkrr.load(path)
    assert os.path.isdir(saved_model)  # the copies were refused, the original is untouched


@pytest.mark.slow  # three tiled fits with their posterior, about 20 s on the busy 2-core machine
def test_a_resumed_tiled_fit_has_the_uninterrupted_fits_std(tiles, tmp_path, monkeypatch):
    """The posterior is computed after the solve, from the resumed fit's factors (rebuilt from the saved centers):
    on the same scheduler the same tasks on the same tiles, so the same std to the last bit."""
    X, y, Xq = data("float64", seed=3)
    fit = dict(FIT, fit_intercept=True, std_method="exact")
    reference = FalkonRegressor(preconditioner_route="tiled", **fit).fit(X, y)
    with crash_after_cg_save(4), pytest.raises(SimulatedCrash):
        FalkonRegressor(preconditioner_route="tiled", **fit).fit(X, y, checkpoint=tmp_path / "ck", checkpoint_every=2)
    resumed = FalkonRegressor(preconditioner_route="tiled", **fit).fit(X, y, checkpoint=tmp_path / "ck", resume=True)
    assert resumed.posterior_.tiled
    np.testing.assert_array_equal(resumed.predict(Xq, return_std=True)[1], reference.predict(Xq, return_std=True)[1])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_tile_file_solves_as_the_whole_factor(tmp_path, dtype):
    """``TileFile.solve`` (what return_std runs per block of query rows) against one dense solve with the same
    entries: substitution in another order, at most ``M eps cond(F)`` apart relative (float64 arithmetic; float32
    tiles, as a float32 fit's ``T`` from 2048 centers, are read as they are)."""
    import zarr

    from daskkrr.solvers.tiled_factor import TileFile

    rng = np.random.default_rng(4)
    F = np.triu(rng.normal(size=(M, M)) * 0.1) + np.diag(rng.uniform(1.0, 2.0, M))
    F = F.astype(dtype)
    path = str(tmp_path / "F.zarr")
    array = zarr.create_array(store=path, shape=(M, M), chunks=(TILE, TILE), dtype=dtype, fill_value=0)
    array[...] = np.triu(F)
    tiles = TileFile(path, M, TILE)
    B = rng.normal(size=(M, 7))
    F64 = F.astype(np.float64)
    tol = M * EPS * np.linalg.cond(F64)
    for trans in (False, True):
        want = solve_upper(F64, B, trans=trans)
        np.testing.assert_allclose(tiles.solve(B, trans=trans), want, rtol=0, atol=tol * np.abs(want).max())
