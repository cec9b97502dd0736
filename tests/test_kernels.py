"""Kernels against scikit-learn and closed forms."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import pairwise

from daskkrr.kernels import (
    FusedEngine,
    GaussianKernel,
    LaplacianKernel,
    LinearKernel,
    MaternKernel,
    NumpyEngine,
    PolynomialKernel,
    kernel_from_dict,
    make_kernel,
)


@pytest.fixture
def blocks():
    rng = np.random.default_rng(0)
    return rng.normal(size=(37, 6)), rng.normal(size=(23, 6))


def test_gaussian_matches_sklearn_rbf(blocks):
    A, B = blocks
    k = GaussianKernel(sigma=1.7)
    np.testing.assert_allclose(k(A, B), pairwise.rbf_kernel(A, B, gamma=1 / (2 * 1.7**2)), rtol=0, atol=1e-12)


def test_laplacian_matches_sklearn(blocks):
    A, B = blocks
    k = LaplacianKernel(sigma=2.5)
    np.testing.assert_allclose(k(A, B), pairwise.laplacian_kernel(A, B, gamma=1 / 2.5), rtol=0, atol=1e-12)


def test_polynomial_matches_sklearn(blocks):
    A, B = blocks
    k = PolynomialKernel(degree=3, gamma=0.3, coef0=1.5)
    expected = pairwise.polynomial_kernel(A, B, degree=3, gamma=0.3, coef0=1.5)
    np.testing.assert_allclose(k(A, B), expected, rtol=1e-12, atol=1e-12)


def test_linear_matches_sklearn(blocks):
    A, B = blocks
    np.testing.assert_allclose(LinearKernel()(A, B), pairwise.linear_kernel(A, B), rtol=0, atol=1e-12)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_closed_form(blocks, nu):
    A, B = blocks
    sigma = 1.3
    r = np.sqrt(((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))
    if nu == 0.5:
        expected = np.exp(-r / sigma)
    elif nu == 1.5:
        s = np.sqrt(3) * r / sigma
        expected = (1 + s) * np.exp(-s)
    else:
        s = np.sqrt(5) * r / sigma
        expected = (1 + s + s**2 / 3) * np.exp(-s)
    np.testing.assert_allclose(MaternKernel(sigma=sigma, nu=nu)(A, B), expected, rtol=0, atol=1e-12)


ALL = [
    GaussianKernel(sigma=1.1),
    LaplacianKernel(sigma=2.0),
    MaternKernel(sigma=1.0, nu=0.5),
    MaternKernel(sigma=1.0, nu=1.5),
    MaternKernel(sigma=1.0, nu=2.5),
    PolynomialKernel(degree=2, gamma=0.5, coef0=1.0),
    LinearKernel(),
]


@pytest.mark.parametrize("kernel", ALL, ids=lambda k: json.dumps(k.to_dict()))
def test_diag_and_float32(kernel, blocks):
    A, _ = blocks
    full = kernel(A, A)
    np.testing.assert_allclose(kernel.diag(A), np.diag(full), rtol=1e-12, atol=1e-12)
    k32 = kernel(A.astype(np.float32), A.astype(np.float32))
    assert k32.dtype == np.float32
    np.testing.assert_allclose(k32, full, rtol=2e-4, atol=2e-4 * np.abs(full).max())
    assert kernel(A.astype(np.float32), A).dtype == np.float64


@pytest.mark.parametrize("kernel", ALL, ids=lambda k: k.name)
def test_json_round_trip_and_equality(kernel):
    spec = json.loads(json.dumps(kernel.to_dict()))
    again = kernel_from_dict(spec)
    assert again == kernel and hash(again) == hash(kernel)
    assert make_kernel(kernel) is kernel


def test_make_kernel_errors():
    with pytest.raises(ValueError, match="unknown kernel 'cosine'"):
        make_kernel("cosine")
    with pytest.raises(ValueError, match="sigma must be > 0"):
        make_kernel("gaussian", sigma=0.0)
    with pytest.raises(TypeError, match="sigma must be a real number"):
        make_kernel("gaussian", sigma="1")
    with pytest.raises(ValueError, match="does not take parameter"):
        make_kernel("linear", sigma=1.0)
    with pytest.raises(ValueError, match="nu must be one of"):
        MaternKernel(nu=1.0)
    assert make_kernel("rbf", sigma=2.0) == GaussianKernel(sigma=2.0)


def test_shape_mismatch_message():
    with pytest.raises(ValueError, match=r"A has shape \(3, 2\), B has shape \(4, 3\)"):
        GaussianKernel()(np.ones((3, 2)), np.ones((4, 3)))


@pytest.mark.parametrize("kernel", ALL, ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("engine", [NumpyEngine(), FusedEngine()], ids=lambda e: e.name)
def test_block_products_match_dense(engine, kernel, dtype):
    rng = np.random.default_rng(1)
    Xb = rng.normal(size=(301, 5)).astype(dtype)
    Z = rng.normal(size=(17, 5)).astype(dtype)
    U = rng.normal(size=(17, 2))
    Y = rng.normal(size=(301, 2))
    K = kernel(Xb.astype(np.float64), Z.astype(np.float64))
    tol = 1e-10 if dtype == np.float64 else 1e-3
    tiny_tile = 17 * 8 * 10  # forces ~30 tiles
    scale = np.abs(K).max() ** 2 * 301
    np.testing.assert_allclose(engine.gram_matvec(kernel, Xb, Z, U, max_tile_bytes=tiny_tile), K.T @ (K @ U),
                               rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(engine.t_matvec(kernel, Xb, Z, Y, max_tile_bytes=tiny_tile), K.T @ Y, rtol=tol,
                               atol=tol * scale)
    np.testing.assert_allclose(engine.matvec(kernel, Xb, Z, U[:, 0], max_tile_bytes=tiny_tile), K @ U[:, 0],
                               rtol=tol, atol=tol * scale)
    GB = engine.gram_and_rhs(kernel, Xb, Y, Z, max_tile_bytes=tiny_tile)
    np.testing.assert_allclose(GB[:, :17], K.T @ K, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(GB[:, 17:], K.T @ Y, rtol=tol, atol=tol * scale)


def test_distances_survive_a_large_offset():
    """Raw features far from the origin: the GEMM expansion alone would lose the distances."""
    from daskkrr.kernels import GaussianKernel, squared_distances

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3)) * 0.01 + 1e4
    exact = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(squared_distances(X, X), exact, rtol=1e-8, atol=1e-12)
    K = GaussianKernel(sigma=0.01)(X, X)
    np.testing.assert_allclose(K, np.exp(-exact / 2e-4), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(np.diag(K), 1.0, rtol=0, atol=1e-12)
