"""``daskkrr fit --centers M`` on a cluster takes the tiled preconditioner by itself (issue 39, CLI and TOML).

Nothing new to learn: the route is chosen by the cost model from the client's memory (which holds
the dense factors) and the workers' memory limits (which hold the tiles), or from ``memory_budget``
given as ``--memory-budget`` or a ``[model]`` key of the TOML config. At the tests' M = 300 the dense
factors take ``3 x 8 x 300^2`` = 2.16 MB, so a client of 1 MB stands in for M = 50 000 on a 24 GB
machine (60 GB of dense factors), and a budget of 100 000 bytes forces the tiles to Zarr.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from daskkrr.cli import main
from daskkrr.data import write_zarr
from daskkrr.parallel import factor_cost, strategies

M = 300


def _route(model) -> dict:
    return json.loads((model / "daskkrr-model.json").read_text())["fitted"]["preconditioner_route_"]


@pytest.fixture
def fit_args(tmp_path, cluster2):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1500, 3))
    store = write_zarr(X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=1500), tmp_path / "train.zarr", chunk_rows=500)
    # One CG iteration: the route is chosen before CG starts, and one iteration runs the route's factors (what
    # is checked is the route and the model file, not the solution).
    return ["fit", "--data", str(store), "--centers", str(M), "--sigma", "2.0", "--max-iter", "1",
            "--scheduler", cluster2.scheduler.address, "--no-progress", "--quiet"]


def test_fit_takes_the_tiled_route_when_the_client_cannot_hold_the_dense_factors(fit_args, cluster2, tmp_path,
                                                                                 monkeypatch):
    """No flag: the client's memory refuses the dense factors, the workers' memory limits keep the tiles."""
    assert factor_cost.dense_bytes(M) > 2 * 1_000_000
    monkeypatch.setattr(strategies, "client_memory_budget", lambda client: 1_000_000)
    assert main([*fit_args, "--out", str(tmp_path / "m")]) == 0
    route = _route(tmp_path / "m")
    limits = sum(w["memory_limit"] for w in cluster2.scheduler_info()["workers"].values())
    assert route["route"] == "tiled" and route["storage"] == "memory", route
    assert route["client_bytes"] == 1_000_000
    assert route["worker_bytes"] == int(factor_cost.TILE_MEMORY_FRACTION * limits)  # from the workers' limits


def test_memory_budget_from_the_config_or_the_flag(fit_args, tmp_path):
    """``memory_budget`` in TOML spills the tiles to Zarr; ``--memory-budget`` overrides the file."""
    config = tmp_path / "model.toml"
    config.write_text("[model]\nmemory_budget = 100000\n")
    assert main([*fit_args, "--config", str(config), "--out", str(tmp_path / "toml")]) == 0
    route = _route(tmp_path / "toml")
    assert route["route"] == "tiled" and route["storage"] == "zarr", route
    assert route["client_bytes"] == 100_000 and route["worker_bytes"] == 50_000
    assert "more than 50% of its memory budget" in route["reason"]
    assert main([*fit_args, "--config", str(config), "--memory-budget", "none", "--out", str(tmp_path / "flag")]) == 0
    assert _route(tmp_path / "flag")["route"] == "dense"


def test_predict_with_a_model_whose_centers_are_in_zarr(fit_args, cluster2, tmp_path, monkeypatch):
    """``daskkrr predict`` streams a Zarr model's center chunks (tests/test_model_store.py) to the same
    predictions, up to the chunked sum's round-off (``(J + 2) eps |k| |C|``, bounded here by its largest
    value over the rows: |k| <= 1 for the Gaussian kernel, so ``(J + 2) eps ||C||_1``)."""
    import zarr

    import daskkrr
    from daskkrr.data import model_store

    assert main([*fit_args, "--out", str(tmp_path / "m")]) == 0
    fitted = daskkrr.load(tmp_path / "m")
    monkeypatch.setattr(model_store, "CHUNK_BYTES", 100 * 3 * 8)  # three chunks of 100 centers
    fitted.save(tmp_path / "z", store="zarr")
    assert daskkrr.load(tmp_path / "z").centers_.numblocks[0] == 3
    data = fit_args[fit_args.index("--data") + 1]
    assert main(["predict", "--model", str(tmp_path / "z"), "--data", data, "--out", str(tmp_path / "p.zarr"),
                 "--scheduler", cluster2.scheduler.address]) == 0
    got = zarr.open_group(str(tmp_path / "p.zarr"), mode="r")["y_pred"][:]
    want = fitted.predict(zarr.open_group(data, mode="r")["X"][:])
    np.testing.assert_allclose(got, want, rtol=0, atol=5 * np.finfo(float).eps * np.abs(fitted.coef_).sum())
