"""Checkpoints of tiled fits (issue 39): no ``M x M`` matrix in the file, and a resume on another cluster.

The checkpoint holds the centers, ``K_nM^T y`` and the CG state (``M x t`` blocks); the tiled factors
are rebuilt from the saved centers on resume. Resumed on another scheduler (here: checkpointed on
the threaded one, resumed on two worker processes), the data passes sum their blocks in another
order and the tile tasks run in other processes, so the products differ by round-off; both runs
stop at a relative residual ``rho`` of the same system, so (tests/test_tiled_falkon.py) their
solutions differ by at most ``(rho_1 + rho_2) sqrt(cond(op))`` relative to the solution's norm in
the Nystrom system's energy norm.
"""

from __future__ import annotations

import numpy as np
import pytest

from daskkrr import FalkonRegressor
from daskkrr.checkpoint import CHECKPOINT_FILE, FitCheckpoint
from daskkrr.parallel import factor_cost

from .checkpoint_crash import SimulatedCrash, crash_after_cg_save
from .test_tiled_falkon import check_same_solution

N, D, M = 1500, 3, 120
FIT = dict(n_centers=M, penalty=1e-3, sigma=1.5, tol=1e-10, max_iter=100, random_state=0,
           preconditioner_route="tiled", chunks=500, fit_intercept=False)


@pytest.fixture
def data(monkeypatch):
    monkeypatch.setattr(factor_cost, "TILE_ROWS", 40)  # three tile rows
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D))
    return X, np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.05 * rng.normal(size=N)


def crashed_fit(X, y, ckpt) -> None:
    """A tiled fit on the threaded scheduler that crashes right after saving CG iteration 4."""
    with crash_after_cg_save(4), pytest.raises(SimulatedCrash):
        FalkonRegressor(**FIT).fit(X, y, checkpoint=ckpt, checkpoint_every=2)


def test_a_tiled_checkpoint_holds_no_m_by_m_matrix(data, tmp_path, monkeypatch):
    X, y = data
    crashed_fit(X, y, tmp_path / "ck")
    with np.load(tmp_path / "ck" / CHECKPOINT_FILE) as saved:
        shapes = {key: saved[key].shape for key in saved.files}
    assert "centers" in shapes and any(key.startswith("cg_") for key in shapes)
    assert all(sum(n >= M for n in shape) <= 1 for shape in shapes.values()), shapes  # no M x M array


@pytest.mark.slow  # about 2.5 minutes on the busy 2-core machine: the resumed CG's tile solves on 2 workers
def test_a_tiled_fit_resumes_on_another_cluster(data, tmp_path, cluster2, monkeypatch):
    X, y = data
    reference = FalkonRegressor(**FIT).fit(X, y)
    assert reference.preconditioner_route_["route"] == "tiled" and reference.converged_
    crashed_fit(X, y, tmp_path / "ck")
    restored = []
    cg_state = FitCheckpoint.cg_state

    def spy(self):
        state = cg_state.fget(self)
        restored.append(state is not None and state.iteration)
        return state

    monkeypatch.setattr(FitCheckpoint, "cg_state", property(spy))
    with cluster2.as_current():  # other processes, another scheduler
        resumed = FalkonRegressor(**FIT).fit(X, y, checkpoint=tmp_path / "ck", resume=True)
    assert 4 in restored  # continued from the saved iteration, not restarted
    assert resumed.preconditioner_route_["route"] == "tiled"
    assert abs(resumed.n_iter_ - reference.n_iter_) <= 1, (resumed.n_iter_, reference.n_iter_)
    check_same_solution(reference, resumed, X)  # the bound of the module docstring
