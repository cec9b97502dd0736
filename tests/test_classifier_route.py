"""FalkonClassifier takes the many-centers parameters (``preconditioner_route``, ``memory_budget``)."""

from __future__ import annotations

import numpy as np
from sklearn.base import clone

from daskkrr import FalkonClassifier
from daskkrr.parallel import factor_cost


def test_classifier_memory_budget_takes_the_tiled_route(monkeypatch):
    """A memory budget below the dense factors sends the classifier's fit down the tiled route,
    spilled to Zarr, and it predicts the dense route's labels: three blobs 8 standard deviations
    apart, so every training row's margin is far above CG's tolerance (1e-7) and round-off."""
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 40)
    rng = np.random.default_rng(0)
    y = np.repeat(np.array(["a", "b", "c"]), 100)
    X = rng.normal(size=(300, 3)) + 8.0 * (y[:, None] == np.array(["a", "b", "c"])[None, :])
    fit = dict(n_centers=90, penalty=1e-4, tol=1e-7, max_iter=100, random_state=0)
    dense = FalkonClassifier(**fit).fit(X, y)
    tiled = FalkonClassifier(memory_budget=50_000, **fit).fit(X, y)
    assert dense.preconditioner_route_["route"] == "dense"
    route = tiled.preconditioner_route_
    assert route["route"] == "tiled" and route["storage"] == "zarr" and route["tile"] == 40
    assert clone(tiled).get_params()["memory_budget"] == 50_000
    forced = FalkonClassifier(preconditioner_route="tiled", **fit).fit(X, y)
    assert forced.preconditioner_route_["storage"] == "memory"
    np.testing.assert_array_equal(tiled.predict(X), dense.predict(X))
    np.testing.assert_array_equal(forced.predict(X), y)
