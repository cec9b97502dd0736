"""Leverage-score centers inside FALKON: the weighted preconditioner keeps CG fast."""

from __future__ import annotations

import numpy as np
import pytest

from daskkrr.sampling import BlessSampler, DisqueakSampler, SqueakSampler

FalkonRegressor = pytest.importorskip("daskkrr.models").FalkonRegressor


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    f = lambda X: np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2]  # noqa: E731
    X = rng.normal(size=(3000, 3))
    Xt = rng.normal(size=(1500, 3))
    return X, f(X) + 0.1 * rng.normal(size=3000), Xt, f(Xt)


def _fit(X, y, sampler, n_centers, preconditioner_rows=None):
    """FALKON's own (weighted) preconditioner unless ``preconditioner_rows`` is given: the
    papers' claim is about it."""
    return FalkonRegressor(sampler=sampler, n_centers=n_centers, penalty=1e-4, sigma=1.0,
                           max_iter=100, tol=1e-6, random_state=0,
                           preconditioner_rows=preconditioner_rows).fit(X, y)


# "squeak" by name is SqueakSampler() (test_sampling_squeak's test_registry_and_errors checks the
# registry), so its fits repeat the [squeak] case's: slow.
# slow: the default run covers DISQUEAK's centers in tests/test_sampling_disqueak.py::test_disqueak_guarantees[8]
# (its dictionary's weights meet SQUEAK's spectral bound) and the fit on such a dictionary in the [squeak] case
# here (the same weighted preconditioner and CG; only the selection differs).
# slow, for the same reason: BLESS's dictionary is checked against its spectral bound and size by
# tests/test_sampling_bless.py::test_bless_accuracy_and_size, the fit on weighted centers by the [squeak] case.
@pytest.mark.parametrize(
    "sampler",
    [SqueakSampler(), pytest.param(DisqueakSampler(n_leaves=4), marks=pytest.mark.slow),
     pytest.param(BlessSampler(), marks=pytest.mark.slow), pytest.param("squeak", marks=pytest.mark.slow)],
    ids=["squeak", "disqueak-4-leaves", "bless", "squeak-by-name"],
)
def test_rls_centers_converge_no_slower_than_uniform(regression, sampler):
    X, y, Xt, yt = regression
    model = _fit(X, y, sampler, 300)
    M = model.centers_.shape[0]
    assert 200 <= M <= 300
    assert not np.allclose(model.center_weights_, 1.0)  # the weighted preconditioner is used
    uniform = _fit(X, y, "uniform", M)
    assert model.converged_ and uniform.converged_
    assert model.n_iter_ <= uniform.n_iter_ + 2, (model.n_iter_, uniform.n_iter_)
    # the row sketch joins the weighted centers' rows and still saves iterations
    sketched = _fit(X, y, sampler, 300, preconditioner_rows="auto")
    assert sketched.converged_ and sketched.n_iter_ < model.n_iter_, (sketched.n_iter_, model.n_iter_)
    mse = np.mean((model.predict(Xt) - yt) ** 2)
    mse_uniform = np.mean((uniform.predict(Xt) - yt) ** 2)
    assert mse <= 1.05 * mse_uniform
