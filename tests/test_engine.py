"""The fused block engine against the numpy reference, for every kernel and dtype."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from daskkrr.kernels import (
    GaussianKernel,
    Kernel,
    LaplacianKernel,
    LinearKernel,
    MaternKernel,
    PolynomialKernel,
    blocks,
    reference,
)
from daskkrr.kernels._vexp import exp_neg
from daskkrr.kernels.threads import current_engine_threads, engine_threads

KERNELS = [
    GaussianKernel(sigma=1.3),
    LaplacianKernel(sigma=2.0),
    MaternKernel(sigma=1.1, nu=0.5),
    MaternKernel(sigma=1.7, nu=1.5),
    MaternKernel(sigma=0.9, nu=2.5),
    PolynomialKernel(degree=3, gamma=0.2, coef0=1.0),
    LinearKernel(),
]
IDS = [f"{k.name}{getattr(k, 'nu', '')}" for k in KERNELS]
# float32 entries carry ~1e-7 relative round-off; products are summed in float64.
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _data(dtype, n=203, M=29, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(dtype)
    Z = rng.normal(size=(M, d)).astype(dtype)
    Z[:4] = X[:4]  # centers drawn from the rows: exact zero distances
    return X, Z, rng.normal(size=(M, 2)), rng.normal(size=(n, 2))


def _close(actual, expected, tol):
    scale = np.abs(expected).max()
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_fused_matches_reference(kernel, dtype):
    X, Z, U, V = _data(dtype)
    tol = TOL[dtype]
    small = 29 * dtype(0).itemsize * 5  # five-row tiles: many tiles and a remainder
    for tile in (blocks.DEFAULT_TILE_BYTES, small):
        for threads in (1, 3):
            kw = dict(engine="fused", n_threads=threads)
            _close(blocks.knm_gram_matvec(kernel, X, Z, U, tile, **kw),
                   reference.knm_gram_matvec(kernel, X, Z, U), tol)
            _close(blocks.knm_t_matvec(kernel, X, Z, V, tile, **kw), reference.knm_t_matvec(kernel, X, Z, V), tol)
            _close(blocks.knm_matvec(kernel, X, Z, U[:, 0], tile, **kw),
                   reference.knm_matvec(kernel, X, Z, U[:, 0]), tol)
            _close(blocks.knm_gram_and_rhs(kernel, X, V, Z, tile, **kw),
                   reference.knm_gram_and_rhs(kernel, X, V, Z), tol)
    K = blocks.knm_block(kernel, X, Z, engine="fused", n_threads=2)
    assert K.dtype == dtype and K.shape == (len(X), len(Z))
    _close(K, kernel(X.astype(np.float64), Z.astype(np.float64)), TOL[dtype] / 10)
    _close(blocks.cached_gram_matvec(K, U, n_threads=2), reference.knm_gram_matvec(kernel, X, Z, U), tol)
    _close(blocks.cached_t_matvec(K, V), reference.knm_t_matvec(kernel, X, Z, V), tol)


def test_shapes_and_dtypes_follow_the_reference():
    X, Z, U, V = _data(np.float64, n=50, M=7)
    k = GaussianKernel()
    for fn, arg in ((blocks.knm_gram_matvec, U[:, 0]), (blocks.knm_gram_matvec, U),
                    (blocks.knm_t_matvec, V[:, 0]), (blocks.knm_matvec, U[:, 0]), (blocks.knm_matvec, U)):
        out = fn(k, X, Z, arg)
        ref = getattr(reference, fn.__name__)(k, X, Z, arg)
        assert out.shape == ref.shape and out.dtype == np.float64
    # float32 rows with float64 centers compute in float64, like the reference
    out = blocks.knm_matvec(k, X.astype(np.float32), Z, U)
    _close(out, reference.knm_matvec(k, X.astype(np.float32), Z, U), 1e-12)


def test_near_coincident_pairs_are_exact_for_matern():
    """sqrt magnifies the cancellation of |x|^2 + |z|^2 - 2 x.z; such pairs are recomputed exactly."""
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(40, 5)) * 3 + 10  # far from the origin: large norms
    X = np.vstack([Z, Z + 1e-7 * rng.normal(size=Z.shape)])
    for dtype in (np.float32, np.float64):
        k = MaternKernel(sigma=1.0, nu=0.5)
        K = blocks.knm_block(k, X.astype(dtype), Z.astype(dtype), engine="fused")
        exact = k(X.astype(dtype).astype(np.float64), Z.astype(dtype).astype(np.float64))
        np.testing.assert_allclose(K, exact, rtol=0, atol=3e-7 if dtype == np.float32 else 1e-14)
        assert np.all(np.diag(K[:40]) == 1)


def test_vectorised_exp_is_accurate_and_underflows_to_zero():
    rng = np.random.default_rng(0)
    for dtype, lo, tol in ((np.float32, -87.0, 2.5e-7), (np.float64, -700.0, 3e-16)):  # numpy's: 2e-7, 1.3e-16
        x = np.concatenate([-rng.exponential(5.0, 5000), rng.uniform(lo, 0, 5000), [0.0, -1e-30]]).astype(dtype)
        y = x.copy()
        exp_neg(y)
        exact = np.exp(x.astype(np.longdouble))
        assert np.max(np.abs(y - exact) / exact) < tol
        z = np.array([lo - 100, -1e6], dtype=dtype)
        exp_neg(z)
        assert np.all(z == 0)


def test_engine_dispatch_and_errors():
    class Scaled(Kernel):  # a user kernel: the fused engine does not know it
        name = "scaled"

        def _block(self, A, B):
            return 2.0 * (A @ B.T)

        def _diag(self, A):
            return 2.0 * np.einsum("ij,ij->i", A, A)

    X, Z, U, _ = _data(np.float64, n=20, M=5)
    assert blocks.resolve_engine(GaussianKernel()) == "fused"
    assert blocks.resolve_engine(GaussianKernel(), "numpy") == "numpy"
    assert blocks.resolve_engine(Scaled()) == "numpy"
    _close(blocks.knm_gram_matvec(Scaled(), X, Z, U), reference.knm_gram_matvec(Scaled(), X, Z, U), 1e-12)
    with pytest.raises(TypeError, match="fused engine does not implement Scaled"):
        blocks.knm_matvec(Scaled(), X, Z, U, engine="fused")
    with pytest.raises(ValueError, match="engine must be one of"):
        blocks.knm_matvec(GaussianKernel(), X, Z, U, engine="gpu")
    with pytest.raises(ValueError, match="same number of features"):
        blocks.knm_matvec(GaussianKernel(), X, Z[:, :3], U)


def test_thread_rule():
    assert current_engine_threads() >= 1  # main thread: every available core
    with engine_threads(3):
        assert current_engine_threads() == 3
    seen = []
    t = threading.Thread(target=lambda: seen.append(current_engine_threads()))
    t.start()
    t.join()
    assert seen == [1]  # inside a Dask task (any other thread): one
    with pytest.raises(ValueError, match="positive integer"):
        with engine_threads(0):
            pass


def test_auto_engine_override_and_numpy_products_on_stored_blocks(monkeypatch):
    X, Z, U, V = _data(np.float32, n=5000, M=9)
    k = GaussianKernel()
    K = blocks.knm_block(k, X, Z)
    fused = (blocks.cached_gram_matvec(K, U), blocks.cached_t_matvec(K, V))
    monkeypatch.setenv("DASKKRR_ENGINE", "numpy")
    assert blocks.auto_engine() == "numpy" and blocks.resolve_engine(k) == "numpy"
    _close(blocks.cached_gram_matvec(K, U), fused[0], 1e-12)
    _close(blocks.cached_t_matvec(K, V), fused[1], 1e-12)
    monkeypatch.setenv("DASKKRR_ENGINE", "fused")
    assert blocks.resolve_engine(k) == "fused"
