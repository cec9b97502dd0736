"""Both block engines, through the KernelEngine interface, against the numpy reference,
for every kernel and dtype; and how engine_for resolves an engine."""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import sparse

from daskkrr.kernels import (
    BlasEngine,
    FusedEngine,
    GaussianKernel,
    Kernel,
    KernelEngine,
    LaplacianKernel,
    LinearKernel,
    MaternKernel,
    NumpyEngine,
    PolynomialKernel,
    engine_for,
    reference,
)
from daskkrr.kernels import engine as engine_module
from daskkrr.kernels._vexp import exp_neg
from daskkrr.kernels.engine import AutoFusedEngine
from daskkrr.kernels.thread_rule import current_engine_threads, engine_threads

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
ENGINES = [NumpyEngine(), BlasEngine(), FusedEngine()]
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
@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_engine_matches_reference(engine, kernel, dtype):
    X, Z, U, V = _data(dtype)
    tol = TOL[dtype]
    small = 29 * dtype(0).itemsize * 5  # five-row tiles: many tiles and a remainder
    for tile in (None, small):
        for threads in (1, 3):
            kw = {"n_threads": threads, "max_tile_bytes": tile}
            _close(engine.gram_matvec(kernel, X, Z, U, **kw), reference.knm_gram_matvec(kernel, X, Z, U), tol)
            _close(engine.t_matvec(kernel, X, Z, V, **kw), reference.knm_t_matvec(kernel, X, Z, V), tol)
            _close(engine.matvec(kernel, X, Z, U[:, 0], **kw), reference.knm_matvec(kernel, X, Z, U[:, 0]), tol)
            _close(engine.gram_and_rhs(kernel, X, V, Z, **kw), reference.knm_gram_and_rhs(kernel, X, V, Z), tol)
    K = engine.kernel_block(kernel, X, Z, n_threads=2)
    assert K.dtype == dtype and K.shape == (len(X), len(Z))
    _close(K, kernel(X.astype(np.float64), Z.astype(np.float64)), TOL[dtype] / 10)
    _close(engine.cached_gram_matvec(K, U, n_threads=2), reference.knm_gram_matvec(kernel, X, Z, U), tol)
    _close(engine.cached_t_matvec(K, V), reference.knm_t_matvec(kernel, X, Z, V), tol)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_preconditioned_gram_matches_reference(engine):
    X, Z, _, V = _data(np.float64)
    k = GaussianKernel(sigma=1.3)
    Kmm = k(Z, Z) + 1e-3 * np.eye(len(Z))
    right = (np.linalg.cholesky(Kmm).T, np.linspace(0.5, 2.0, len(Z)))
    _close(engine.gram_and_rhs(k, X, V, Z, right, n_threads=2, max_tile_bytes=29 * 8 * 7),
           reference.knm_gram_and_rhs(k, X, V, Z, right=right), 1e-10)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_shapes_and_dtypes_follow_the_reference(engine):
    X, Z, U, V = _data(np.float64, n=50, M=7)
    k = GaussianKernel()
    for method, ref, arg in (("gram_matvec", "knm_gram_matvec", U[:, 0]), ("gram_matvec", "knm_gram_matvec", U),
                             ("t_matvec", "knm_t_matvec", V[:, 0]), ("matvec", "knm_matvec", U[:, 0]),
                             ("matvec", "knm_matvec", U)):
        out = getattr(engine, method)(k, X, Z, arg)
        expected = getattr(reference, ref)(k, X, Z, arg)
        assert out.shape == expected.shape and out.dtype == np.float64
    K = engine.kernel_block(k, X, Z)
    for method, arg, shape in (("cached_gram_matvec", U[:, 0], (7,)), ("cached_gram_matvec", U, (7, 2)),
                               ("cached_t_matvec", V[:, 0], (7,)), ("cached_t_matvec", V, (7, 2))):
        out = getattr(engine, method)(K, arg)
        assert out.shape == shape and out.dtype == np.float64
    assert engine.gram_and_rhs(k, X, V[:, 0], Z).shape == (7, 8)
    # float32 rows with float64 centers compute in float64, like the reference
    out = engine.matvec(k, X.astype(np.float32), Z, U)
    _close(out, reference.knm_matvec(k, X.astype(np.float32), Z, U), 1e-12)


def test_near_coincident_pairs_are_exact_for_matern():
    """sqrt magnifies the cancellation of |x|^2 + |z|^2 - 2 x.z; such pairs are recomputed exactly."""
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(40, 5)) * 3 + 10  # far from the origin: large norms
    X = np.vstack([Z, Z + 1e-7 * rng.normal(size=Z.shape)])
    for dtype in (np.float32, np.float64):
        k = MaternKernel(sigma=1.0, nu=0.5)
        K = FusedEngine().kernel_block(k, X.astype(dtype), Z.astype(dtype))
        exact = k(X.astype(dtype).astype(np.float64), Z.astype(dtype).astype(np.float64))
        # every entry to the dtype's round-off of distances at these norms (~90 after centring) ...
        np.testing.assert_allclose(K, exact, rtol=0, atol=1e-6 if dtype == np.float32 else 1e-14)
        # ... and the near-coincident pairs (distance ~2e-7: the expansion alone gives ~1e-2) exactly
        near = np.diag(K[40:])
        np.testing.assert_allclose(near, np.diag(exact[40:]), rtol=0, atol=3e-7 if dtype == np.float32 else 1e-14)
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


class Scaled(Kernel):  # a user kernel: the fused engine does not know it
    name = "scaled"

    def _block(self, A, B):
        return 2.0 * (A @ B.T)

    def _diag(self, A):
        return 2.0 * np.einsum("ij,ij->i", A, A)


def test_engine_for_resolves_as_documented(monkeypatch):
    monkeypatch.delenv("DASKKRR_ENGINE", raising=False)
    k = GaussianKernel()
    assert engine_for(k) is AutoFusedEngine() and engine_for(k, "fused") is FusedEngine()
    assert engine_for(k, "numpy") is NumpyEngine()
    assert engine_for(Scaled()) is NumpyEngine()  # any other Kernel subclass: the reference
    assert engine_for(None) is AutoFusedEngine()  # products on a stored block need no kernel
    assert isinstance(engine_for(k), KernelEngine) and NumpyEngine() is NumpyEngine()
    monkeypatch.setenv("DASKKRR_ENGINE", "numpy")
    assert engine_for(k) is NumpyEngine() and engine_for(None) is NumpyEngine()
    assert engine_for(k, "fused") is FusedEngine()  # an explicit choice wins over the variable
    monkeypatch.setenv("DASKKRR_ENGINE", "blas")
    assert engine_for(k) is BlasEngine() and engine_for(Scaled()) is NumpyEngine()
    assert engine_for(Scaled(), "blas") is BlasEngine()  # it computes any kernel's tiles
    monkeypatch.setenv("DASKKRR_ENGINE", "fused")  # the fused loops at every width
    assert engine_for(k) is FusedEngine() and engine_for(Scaled()) is NumpyEngine()


def test_auto_computes_wide_blocks_with_blas_and_narrow_ones_fused(monkeypatch):
    """Past FUSED_MAX_FEATURES the distance GEMM dominates and OpenBLAS's is faster than the fused loops."""
    monkeypatch.delenv("DASKKRR_ENGINE", raising=False)
    k, auto = GaussianKernel(sigma=3.0), engine_for(GaussianKernel())
    wide = engine_module.FUSED_MAX_FEATURES + 1
    rng = np.random.default_rng(0)
    for d, expected in ((wide - 1, AutoFusedEngine()), (wide, BlasEngine())):
        X, Z = rng.standard_normal((30, d)), rng.standard_normal((7, d))
        assert auto._for_block(X, Z) is expected
        # and the products are the reference's, whichever computes them
        _close(auto.gram_matvec(k, X, Z, np.ones(7)), reference.knm_gram_matvec(k, X, Z, np.ones(7)), 1e-12)
    assert FusedEngine()._for_block(X, Z) is FusedEngine()  # engine="fused" keeps the fused loops
    assert auto._for_block(sparse.csr_matrix(X), Z) is NumpyEngine()


def test_small_dask_workers_run_the_blas_engine(monkeypatch):
    """The kernels layer asks an already loaded ``distributed`` for the worker's memory."""
    monkeypatch.delenv("DASKKRR_ENGINE", raising=False)
    worker = SimpleNamespace(memory_manager=SimpleNamespace(memory_limit=engine_module.FUSED_MIN_WORKER_MEMORY // 2))
    monkeypatch.setitem(sys.modules, "distributed", SimpleNamespace(get_worker=lambda: worker))
    assert engine_for(GaussianKernel()) is BlasEngine() and engine_for(None) is BlasEngine()
    monkeypatch.setenv("DASKKRR_ENGINE", "fused")
    assert engine_for(GaussianKernel()) is FusedEngine()
    monkeypatch.delenv("DASKKRR_ENGINE")
    worker.memory_manager.memory_limit = engine_module.FUSED_MIN_WORKER_MEMORY
    assert engine_for(GaussianKernel()) is AutoFusedEngine()


def test_engine_errors():
    X, Z, U, _ = _data(np.float64, n=20, M=5)
    _close(NumpyEngine().gram_matvec(Scaled(), X, Z, U), reference.knm_gram_matvec(Scaled(), X, Z, U), 1e-12)
    with pytest.raises(TypeError, match="fused engine does not implement Scaled"):
        engine_for(Scaled(), "fused")
    with pytest.raises(TypeError, match="fused engine does not implement Scaled"):
        FusedEngine().matvec(Scaled(), X, Z, U)
    with pytest.raises(ValueError, match="engine must be one of"):
        engine_for(GaussianKernel(), "gpu")
    with pytest.raises(ValueError, match="same number of features"):
        FusedEngine().matvec(GaussianKernel(), X, Z[:, :3], U)
    with pytest.raises(TypeError, match="abstract"):
        KernelEngine()


def test_without_numba_auto_falls_back_and_fused_says_why(monkeypatch):
    monkeypatch.delenv("DASKKRR_ENGINE", raising=False)
    monkeypatch.setitem(sys.modules, "daskkrr.kernels.fused", None)  # the import now fails
    monkeypatch.setattr(engine_module, "_FUSED_CORE", None)
    monkeypatch.setattr(engine_module, "_FUSED_ERROR", None)
    X, Z, U, _ = _data(np.float64, n=20, M=5)
    assert engine_for(GaussianKernel()) is BlasEngine()
    with pytest.raises(ImportError, match="fused engine needs numba"):
        engine_for(GaussianKernel(), "fused")
    with pytest.raises(ImportError, match="fused engine needs numba"):
        FusedEngine().matvec(GaussianKernel(), X, Z, U)


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


def _pool_process_threads(_: int) -> tuple[int, list[int]]:
    """(engine threads, BLAS threads of each BLAS library) in a seed_pool process."""
    import scipy.linalg  # noqa: F401  (scipy's BLAS too)
    from threadpoolctl import threadpool_info

    return current_engine_threads(), [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: the engine runs one thread anyway")
def test_seed_pool_processes_compute_on_one_thread_each(seed_pool):
    """The pool's two processes fill two cores; more threads each would oversubscribe them."""
    for engine, blas in seed_pool.map(_pool_process_threads, range(4)):
        assert engine == 1 and set(blas) == {1}


def test_stored_block_products_agree_across_engines():
    X, Z, U, V = _data(np.float32, n=5000, M=9)
    k = GaussianKernel()
    K = FusedEngine().kernel_block(k, X, Z)
    _close(NumpyEngine().kernel_block(k, X, Z), K, 1e-6)
    fused = (FusedEngine().cached_gram_matvec(K, U), FusedEngine().cached_t_matvec(K, V))
    _close(NumpyEngine().cached_gram_matvec(K, U), fused[0], 1e-12)
    _close(NumpyEngine().cached_t_matvec(K, V), fused[1], 1e-12)


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_read_only_inputs_run_the_compiled_loops_without_a_new_compile(dtype):
    """Read-only arrays (memory-mapped data, a model loaded with mmap_mode="r") get the loops
    compiled for writable ones: numba would otherwise compile the driver again mid-predict."""
    from daskkrr.kernels import fused

    X, Z, U, V = _data(dtype)
    k = GaussianKernel(sigma=1.3)

    def products(X, U, V):
        K = fused.kernel_block(k, X, Z)
        return [fused.gram_matvec(k, X, Z, U), fused.t_matvec(k, X, Z, V), fused.matvec(k, X, Z, U), K,
                fused.cached_gram_matvec(K, U), fused.cached_t_matvec(K, V),
                fused.cached_gram_matvec(_read_only(K), U), fused.cached_t_matvec(_read_only(K), V)]

    writable = products(X, U, V)
    compiled = {name: set(getattr(fused, name).signatures) for name in ("_block_rows", "_cached_rows")}
    read_only = products(_read_only(X), _read_only(U), _read_only(V))
    assert {name: set(getattr(fused, name).signatures) for name in compiled} == compiled
    for a, b in zip(read_only, writable, strict=True):
        np.testing.assert_array_equal(a, b)  # the same loops on copies of the same bits


def test_auto_runs_blas_until_the_fused_engine_is_compiled(monkeypatch, tmp_path):
    from daskkrr.kernels import warmup

    monkeypatch.delenv("DASKKRR_ENGINE", raising=False)
    monkeypatch.setattr(warmup, "marker_path", lambda: tmp_path / "absent.ready")
    monkeypatch.setattr(warmup, "_ready", False)
    monkeypatch.setattr(warmup, "_last_check", -1e9)
    monkeypatch.setattr(engine_module, "_fused_compiled_here", lambda: False)
    started = []
    monkeypatch.setattr(warmup, "start_background", lambda: started.append(1))
    k = GaussianKernel()
    assert engine_for(k) is BlasEngine() and started == [1]
    assert engine_for(k, "fused") is FusedEngine()  # an explicit choice compiles inline
    monkeypatch.setenv("DASKKRR_BACKGROUND_COMPILE", "0")
    assert engine_for(k) is AutoFusedEngine() and started == [1]  # no background: numba compiles inline


@pytest.mark.slow  # compiles the engine in fresh processes: about 50 s on 2 cores
def test_background_compile_fills_the_cache_and_later_processes_load_it(tmp_path):
    """After an install (an empty numba cache): the first products run on the BLAS
    engine without importing numba; a background process compiles; then the fused
    engine runs, and a new process loads it from the cache without compiling."""
    import os
    import subprocess

    first = """
import sys, time
from daskkrr.kernels import BlasEngine, FusedEngine, GaussianKernel, engine_for, warmup
k = GaussianKernel()
assert engine_for(k) is BlasEngine()
assert "numba" not in sys.modules
assert not warmup.start_background()  # once per process
t0 = time.monotonic()
while not warmup.fused_ready():
    assert time.monotonic() - t0 < 300, "the background compile did not finish"
    time.sleep(0.2)
assert isinstance(engine_for(k), FusedEngine)  # auto's width-aware fused engine
print("first ok")
"""
    later = """
import numpy as np
from scipy import sparse
from daskkrr.kernels import FusedEngine, GaussianKernel, engine_for, fused
k = GaussianKernel()
assert isinstance(engine_for(k), FusedEngine)
X = np.ones((10, 3), np.float32)
FusedEngine().gram_matvec(k, X, X[:4], np.ones(4))
assert not fused._block_rows.stats.cache_misses, fused._block_rows.stats
assert sum(fused._block_rows.stats.cache_hits.values()) >= 1
print("later ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "DASKKRR_ENGINE"}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    for code, expect in ((first, "first ok"), (later, "later ok")):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
        assert expect in out.stdout, out.stderr[-2000:]
    assert list(tmp_path.rglob("*.nbi")) and list(tmp_path.rglob("daskkrr-engine-*.ready"))


@pytest.mark.filterwarnings("ignore:CG stopped")  # 30 iterations either way: the same iterates
@pytest.mark.parametrize("strategy", ["gram", "cache", "recompute"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_fit_on_the_blas_engine_matches_the_fused_engine(monkeypatch, dtype, strategy):
    """What the first fit after an install (or a small Dask worker, or data with more than 64
    features) runs on gives the model the fused engine gives, with float32 kernel blocks too:
    ``recompute`` runs the engines' own ``K^T K U`` each iteration, whose float32 GEMMs once
    left this fit 2.4e-3 away from the fused engine's, its CG stalled at a residual of 3e-3."""
    from daskkrr import FalkonRegressor

    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 5)).astype(dtype)
    y = (np.sin(X[:, 0] + X[:, 1]) + 0.1 * rng.normal(size=3000)).astype(dtype)
    preds = {}
    for name in ("fused", "blas"):
        monkeypatch.setenv("DASKKRR_ENGINE", name)
        model = FalkonRegressor(n_centers=200, penalty=1e-5, max_iter=30, tol=1e-12, random_state=0,
                                dtype=np.dtype(dtype).name, strategy=strategy).fit(X, y)
        preds[name] = model.predict(X[:500])
    tol = 1e-4 if dtype == np.float32 else 1e-9
    _close(preds["blas"], preds["fused"], tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 3, 4, 5, 9, 20])
def test_cross_product_loops_cover_padding_chunks_and_row_remainders(monkeypatch, d, dtype):
    """The fused engine's own cross-product loops: features padded to a multiple of four,
    several column chunks (the last one short), tiles of 1 to 7 rows (remainders of four),
    and the BLAS GEMM they replace above LOOP_CROSS_MAX_FEATURES, all against the reference."""
    from daskkrr.kernels import fused

    monkeypatch.setattr(fused, "cross_chunk", lambda n_features, itemsize: 64)
    X, Z, U, V = _data(dtype, n=23, M=150, d=d, seed=d)
    engine = FusedEngine()
    for kernel in (GaussianKernel(sigma=1.1 * np.sqrt(d)), MaternKernel(sigma=1.5, nu=1.5),
                   PolynomialKernel(degree=2, gamma=0.3, coef0=1.0), LinearKernel()):
        expected = reference.knm_gram_matvec(kernel, X, Z, U)
        exact = kernel(X.astype(np.float64), Z.astype(np.float64))
        for loops in (True, False):
            monkeypatch.setattr(fused, "loop_cross_max_features", lambda dtype, n=1024 if loops else 0: n)
            for rows in range(1, 8):
                tile = rows * 150 * dtype(0).itemsize
                _close(engine.gram_matvec(kernel, X, Z, U, max_tile_bytes=tile), expected, TOL[dtype])
                _close(engine.matvec(kernel, X, Z, U, max_tile_bytes=tile), reference.knm_matvec(kernel, X, Z, U),
                       TOL[dtype])
            _close(engine.kernel_block(kernel, X, Z), exact, TOL[dtype] / 10)


def test_the_loops_give_way_to_a_512_bit_blas_sooner(monkeypatch):
    """With a BLAS on 256-bit kernels the loops form cross products up to 1024 features;
    with 512-bit ones (MKL, OpenBLAS SkylakeX) only up to 64 (float32) and 16 (float64)."""
    from daskkrr.kernels import fused

    for wide, f32, f64 in ((False, 1024, 1024), (True, 64, 16)):
        monkeypatch.setattr(fused, "blas_has_512bit_kernels", lambda wide=wide: wide)
        assert fused.loop_cross_max_features(np.dtype(np.float32)) == f32
        assert fused.loop_cross_max_features(np.dtype(np.float64)) == f64
        X, Z = _data(np.float64, n=9, M=7, d=20)[:2]
        jc = fused._prepare(GaussianKernel(sigma=3.0), X, Z)[2][7]
        assert (jc > 0) == (not wide)  # float64, d = 20: BLAS when it is 512-bit


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_float32_blocks_give_one_symmetric_operator(engine):
    """``U -> K^T K U`` on float32 blocks is the exact product of one float32 kernel matrix,
    summed in float64: ``u^T G v = v^T G u`` to float64 round-off. Products in float32
    (GEMMs on the tile) break that symmetry at float32's 1e-7, and CG on FALKON's system
    (penalty 1e-6) then stalls near a residual of 1e-3 (Fashion-MNIST, n = 20 000)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 70)).astype(np.float32)  # > 64 features: auto's BLAS width too
    Z = X[rng.choice(len(X), 400, replace=False)]
    u, v = rng.normal(size=(2, 400))
    k = GaussianKernel(sigma=6.0)
    Gu, Gv = (engine.gram_matvec(k, X, Z, w, n_threads=2, max_tile_bytes=400 * 4 * 256) for w in (u, v))
    scale = np.linalg.norm(u) * np.linalg.norm(Gv)
    # float64 sums of 3000 x 400 products: about sqrt(3000 * 400) * 1.1e-16 relative, far below 1e-11
    assert abs(u @ Gv - v @ Gu) <= 1e-11 * scale
