"""Property-based tests (hypothesis) of the data layer and the kernels: random shapes, dtypes,
chunkings and values either work and agree with a numpy reference, or fail with the
documented error."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from daskkrr.data import Standardizer, open_dataset, write_zarr
from daskkrr.kernels import FusedEngine, NumpyEngine, make_kernel

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMERIC = ["float64", "float32", "int64", "int32", "uint8", "bool"]
NON_NUMERIC = ["complex128", "object", "<U3", "datetime64[s]"]

# Documented errors of open_dataset / check_features / check_target.
DOCUMENTED = [
    (TypeError, r"has dtype .*; expected bool, integer or float"),
    (ValueError, r"must be 2-D \(n_samples, n_features\)"),
    (ValueError, r"has shape \(\d+, \d+\); at least 1 row and 1 column are required"),
    (ValueError, r"y has \d+ rows but X has \d+"),
    (ValueError, r"y must be 1-D .* or 2-D"),
    (ValueError, r"a 2-D target needs at least 1 column"),
]


def _documented(exc: Exception) -> bool:
    return any(isinstance(exc, kind) and re.search(pattern, str(exc)) for kind, pattern in DOCUMENTED)


def _array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=shape) * 10
    if dtype == "object":
        return values.astype(object)
    if dtype == "<U3":
        return values.astype("<U3")
    if dtype.startswith("datetime"):
        return values.astype(np.int64).astype(dtype)
    if dtype == "bool":
        return values > 0
    return values.astype(dtype)


@st.composite
def inputs(draw):
    ndim = draw(st.sampled_from([2, 2, 2, 1, 3]))
    shape = tuple(draw(st.integers(0, 40)) if i == 0 else draw(st.integers(0, 5)) for i in range(ndim))
    dtype = draw(st.sampled_from(NUMERIC + NON_NUMERIC))
    y_kind = draw(st.sampled_from(["none", "1d", "2d", "short", "3d", "2d-empty"]))
    chunks = draw(st.one_of(st.none(), st.integers(1, 50)))
    lazy = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return shape, dtype, y_kind, chunks, lazy, seed


def _target(kind: str, n: int, seed: int):
    rng = np.random.default_rng(seed + 1)
    return {
        "none": None,
        "1d": rng.normal(size=n),
        "2d": rng.normal(size=(n, 2)),
        "short": rng.normal(size=max(n - 1, 0) if n else 1),
        "3d": rng.normal(size=(n, 1, 1)),
        "2d-empty": np.zeros((n, 0)),
    }[kind]


@FAST
@given(inputs())
def test_open_dataset_works_or_fails_as_documented(case):
    shape, dtype, y_kind, chunks, lazy, seed = case
    X = _array(dtype, shape, seed)
    y = _target(y_kind, shape[0], seed)
    source = da.from_array(X, chunks=max(1, shape[0] // 3 or 1)) if lazy and dtype != "object" else X
    valid = (
        len(shape) == 2 and shape[0] >= 1 and shape[1] >= 1 and dtype in NUMERIC
        and y_kind in ("none", "1d", "2d")
    )
    try:
        Xd, yd = open_dataset(source, y=y, chunks=chunks)
    except (TypeError, ValueError) as exc:
        assert not valid, f"valid input refused: {exc}"
        assert _documented(exc), f"undocumented error: {type(exc).__name__}: {exc}"
        return
    assert valid, "invalid input accepted"
    assert len(Xd.chunks[1]) == 1, "a block must hold all columns"
    assert Xd.dtype == X.dtype
    if chunks is not None:
        assert max(Xd.chunks[0]) <= chunks
    np.testing.assert_array_equal(Xd.compute(), X)
    if y is None:
        assert yd is None
    else:
        assert yd.chunks[0] == Xd.chunks[0]
        np.testing.assert_array_equal(yd.compute(), y)


@FAST
@given(
    n=st.integers(1, 60), d=st.integers(1, 6),
    row_chunk=st.integers(1, 60), col_chunk=st.integers(1, 6), seed=st.integers(0, 2**16),
)
def test_any_dask_chunking_becomes_row_blocks(n, d, row_chunk, col_chunk, seed):
    X = np.random.default_rng(seed).normal(size=(n, d))
    Xd, yd = open_dataset(da.from_array(X, chunks=(row_chunk, col_chunk)), y=da.from_array(X[:, 0], chunks=7))
    assert len(Xd.chunks[1]) == 1 and yd.chunks[0] == Xd.chunks[0]
    np.testing.assert_array_equal(Xd.compute(), X)
    np.testing.assert_array_equal(yd.compute(), X[:, 0])


@FAST
@given(
    X=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=30),
                 elements=st.floats(-1e6, 1e6, allow_nan=False, width=64)),
    chunk=st.integers(1, 30),
    constant=st.booleans(),
)
@example(X=np.array([[0.0], [5e-324]]), chunk=1, constant=False)  # a spread below the smallest normal float
def test_standardizer_matches_numpy(X, chunk, constant):
    if constant:
        X = X.copy()
        X[:, 0] = 3.25
    s = Standardizer().fit(da.from_array(X, chunks=(chunk, X.shape[1])))
    std = X.std(axis=0)
    np.testing.assert_allclose(s.mean_, X.mean(axis=0), rtol=1e-9, atol=1e-9 * (1 + np.abs(X).max()))
    scale_ref = np.where(std <= 1e-9 * (1 + np.abs(X).max(axis=0)), 1.0, std)
    well_defined = std > 1e-6 * (1 + np.abs(X).max(axis=0))  # away from round-off level
    np.testing.assert_allclose(s.scale_[well_defined], scale_ref[well_defined], rtol=1e-6)
    assert np.all(np.isfinite(s.scale_)) and np.all(s.scale_ > 0)
    if constant:
        assert s.scale_[0] == 1.0
    out = s.transform(X)
    assert np.all(np.isfinite(out))


@FAST
@given(
    n=st.integers(1, 80), d=st.integers(1, 4), chunk=st.integers(1, 40), seed=st.integers(0, 2**16),
    bad=st.sampled_from([np.nan, np.inf, -np.inf]), in_y=st.booleans(), data=st.data(),
)
def test_non_finite_values_are_located(n, d, chunk, seed, bad, in_y, data):
    rng = np.random.default_rng(seed)
    X, y = rng.normal(size=(n, d)), rng.normal(size=n)
    rows = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    for r in rows:
        if in_y:
            y[r] = bad
        else:
            X[r, data.draw(st.integers(0, d - 1))] = bad
    first = min(rows)
    block = first // chunk
    stop = min(n, (block + 1) * chunk) - 1
    name = "y" if in_y else "X"
    with pytest.raises(ValueError, match=rf"{name} has NaN or inf in rows {block * chunk}-{stop} "
                                         rf"\(block {block}, first at row {first}\)"):
        Standardizer().fit(da.from_array(X, chunks=(chunk, d)), da.from_array(y, chunks=chunk))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 50), d=st.integers(1, 4), chunk_rows=st.one_of(st.none(), st.integers(1, 60)),
    dtype=st.sampled_from(["float64", "float32", "int16", "bool"]), two_d=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_write_zarr_round_trip(n, d, chunk_rows, dtype, two_d, seed):
    X = _array(dtype, (n, d), seed)
    y = np.random.default_rng(seed).normal(size=(n, 2) if two_d else n)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_zarr(X, y, Path(tmp) / "s.zarr", chunk_rows=chunk_rows)
        Xd, yd = open_dataset(path)
        assert Xd.dtype == X.dtype and len(Xd.chunks[1]) == 1
        np.testing.assert_array_equal(Xd.compute(), X)
        np.testing.assert_array_equal(yd.compute(), y)
        assert [p.name for p in Path(tmp).iterdir()] == ["s.zarr"]


# ---------------------------------------------------------------- kernels


def _reference_kernel(name: str, params: dict, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Straight from the definitions, pairwise in float64 (no GEMM expansion)."""
    A, B = A.astype(np.float64), B.astype(np.float64)
    diff = A[:, None, :] - B[None, :, :]
    r2 = np.sum(diff**2, axis=-1)
    if name == "gaussian":
        return np.exp(-r2 / (2 * params["sigma"] ** 2))
    if name == "laplacian":
        return np.exp(-np.sum(np.abs(diff), axis=-1) / params["sigma"])
    if name == "matern":
        s = np.sqrt(r2) / params["sigma"]
        nu = params["nu"]
        if nu == 0.5:
            return np.exp(-s)
        if nu == 1.5:
            return (1 + np.sqrt(3) * s) * np.exp(-np.sqrt(3) * s)
        return (1 + np.sqrt(5) * s + 5 * s**2 / 3) * np.exp(-np.sqrt(5) * s)
    if name == "polynomial":
        return (params["gamma"] * A @ B.T + params["coef0"]) ** params["degree"]
    return A @ B.T


@st.composite
def kernel_specs(draw):
    name = draw(st.sampled_from(["gaussian", "laplacian", "matern", "polynomial", "linear"]))
    params: dict = {}
    if name in ("gaussian", "laplacian", "matern"):
        params["sigma"] = draw(st.floats(0.3, 10.0))
    if name == "matern":
        params["nu"] = draw(st.sampled_from([0.5, 1.5, 2.5]))
    if name == "polynomial":
        params.update(degree=draw(st.integers(1, 3)), gamma=draw(st.floats(0.05, 1.0)),
                      coef0=draw(st.floats(0.0, 2.0)))
    return name, params


def _points(draw, n_max=12, d=None):
    d = d or draw(st.integers(1, 5))
    n = draw(st.integers(1, n_max))
    return np.asarray(draw(hnp.arrays(np.float64, (n, d), elements=st.floats(-3, 3, width=64)))), d


@FAST
@given(spec=kernel_specs(), dtype=st.sampled_from([np.float64, np.float32]), data=st.data())
def test_kernels_match_the_definitions(spec, dtype, data):
    name, params = spec
    A, d = _points(data.draw)
    B, _ = _points(data.draw, d=d)
    kernel = make_kernel(name, **params)
    K = kernel(A.astype(dtype), B.astype(dtype))
    assert K.shape == (len(A), len(B)) and K.dtype == dtype
    ref = _reference_kernel(name, params, A.astype(dtype), B.astype(dtype))
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(K, ref, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(kernel.diag(A.astype(dtype)), np.diag(_reference_kernel(name, params, A, A)),
                               rtol=rtol, atol=rtol * scale)
    assert make_kernel(kernel.to_dict()) == kernel


@FAST
@given(
    name=st.sampled_from(["gaussian", "laplacian", "matern"]),
    sigma=st.one_of(st.floats(max_value=0.0), st.just(float("nan")), st.just(float("inf"))),
)
def test_invalid_kernel_parameters_are_refused(name, sigma):
    with pytest.raises(ValueError, match=r"sigma must be (> 0|finite)"):
        make_kernel(name, sigma=sigma)


ENGINES = [NumpyEngine(), FusedEngine()]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=kernel_specs(), t=st.integers(1, 3), tile=st.integers(8, 4096), data=st.data())
def test_block_products_match_dense_numpy(engine, spec, t, tile, data):
    name, params = spec
    X, d = _points(data.draw, n_max=40)
    Z, _ = _points(data.draw, n_max=15, d=d)
    kernel = make_kernel(name, **params)
    rng = np.random.default_rng(0)
    U, V = rng.normal(size=(len(Z), t)), rng.normal(size=(len(X), t))
    K = _reference_kernel(name, params, X, Z)
    scale = max(1.0, float(np.abs(K).max())) ** 2 * len(X) * len(Z)
    tol = dict(rtol=1e-9, atol=1e-11 * scale)
    np.testing.assert_allclose(engine.gram_matvec(kernel, X, Z, U, max_tile_bytes=tile), K.T @ (K @ U), **tol)
    np.testing.assert_allclose(engine.t_matvec(kernel, X, Z, V, max_tile_bytes=tile), K.T @ V, **tol)
    np.testing.assert_allclose(engine.matvec(kernel, X, Z, U, max_tile_bytes=tile), K @ U, **tol)
    np.testing.assert_allclose(engine.gram_matvec(kernel, X, Z, U[:, 0], max_tile_bytes=tile),
                               K.T @ (K @ U[:, 0]), **tol)
