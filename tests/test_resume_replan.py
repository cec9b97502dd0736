"""A resume with another ``max_iter`` honours it: with ``preconditioner_rows="auto"`` the sketch is
planned for the resumed fit's ``max_iter``/``tol``, and where that changes the sketch the CG starts
over from the saved centers and right-hand side (with a warning), so the resumed fit is the
uninterrupted fit with the new ``max_iter``, not a continuation stuck with the old plan."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import daskkrr.pipeline.stages as stages
from daskkrr import FalkonRegressor

PARAMS = dict(n_centers=80, penalty=1e-2, sigma=2.0, tol=1e-10, strategy="recompute", random_state=0, chunks=500)
#: Sketch rows the patched cost model picks for a long fit (none for a short one): the cost model's
#: own choice depends on the machine's cores and memory, this one does not.
LONG_FIT_ROWS = 400


@pytest.fixture
def data():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(1500, 3))
    return X, np.sin(X.sum(axis=1)) + 0.05 * rng.normal(size=1500)


@pytest.fixture
def budget_sized_sketch(monkeypatch):
    """The cost model's decision made machine-independent: FALKON's own preconditioner (0 sketch
    rows) for a fit of fewer than 10 iterations, LONG_FIT_ROWS rows for a longer one."""
    plan_sketch = stages.plan_sketch

    def plan(requested, X, *, max_iter, **kwargs):
        if requested == "auto":
            requested = 0 if max_iter < 10 else LONG_FIT_ROWS
        return plan_sketch(requested, X, max_iter=max_iter, **kwargs)

    monkeypatch.setattr(stages, "plan_sketch", plan)


def test_a_resume_with_more_iterations_plans_for_them(data, budget_sized_sketch, tmp_path):
    ckpt = tmp_path / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short fit does not converge, as intended
        short = FalkonRegressor(max_iter=3, **PARAMS).fit(*data, checkpoint=ckpt)
    assert short.preconditioner_rows_ == 0 and short.n_iter_ == 3
    with pytest.warns(UserWarning, match="CG starts over .* after 3 iterations"):
        resumed = FalkonRegressor(max_iter=60, **PARAMS).fit(*data, checkpoint=ckpt, resume=True)
    uninterrupted = FalkonRegressor(max_iter=60, **PARAMS).fit(*data)
    assert resumed.preconditioner_rows_ == uninterrupted.preconditioner_rows_ == LONG_FIT_ROWS
    assert resumed.converged_ and resumed.n_iter_ == uninterrupted.n_iter_
    np.testing.assert_array_equal(resumed.center_indices_, uninterrupted.center_indices_)
    # the same centers, right-hand side (the strategy is fixed, so the cost model cannot pick another operator
    # for the other max_iter), preconditioner and a CG from zero: the same arithmetic, the same numbers
    np.testing.assert_array_equal(resumed.coef_, uninterrupted.coef_)
    # the checkpoint now holds the new plan: a resume of the finished fit keeps it and gives the same model
    again = FalkonRegressor(max_iter=60, **PARAMS).fit(*data, checkpoint=ckpt, resume=True)
    np.testing.assert_array_equal(again.coef_, resumed.coef_)


def test_a_resume_whose_plan_is_unchanged_continues_the_cg(data, budget_sized_sketch, tmp_path):
    ckpt = tmp_path / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FalkonRegressor(max_iter=3, **PARAMS).fit(*data, checkpoint=ckpt, checkpoint_every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = FalkonRegressor(max_iter=6, **PARAMS).fit(*data, checkpoint=ckpt, resume=True)
    assert not [w for w in caught if "starts over" in str(w.message)]
    direct = FalkonRegressor(max_iter=6, **PARAMS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct.fit(*data)
    assert resumed.preconditioner_rows_ == 0 and resumed.n_iter_ == 6
    np.testing.assert_array_equal(resumed.coef_, direct.coef_)  # the CG continued from its exact state


def test_a_checkpoint_whose_sketch_was_seeded_by_the_old_rule_starts_the_cg_over(data, tmp_path):
    """Checkpoints written before the sketch's seed rule was recorded drew their rows from the centers' bytes
    (daskkrr.solvers.sketch.SKETCH_SEED): a resume draws other rows, another preconditioner, so its CG state
    must not be continued."""
    import json

    params = {**PARAMS, "preconditioner_rows": LONG_FIT_ROWS}
    ckpt = tmp_path / "ck"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        FalkonRegressor(max_iter=3, **params).fit(*data, checkpoint=ckpt, checkpoint_every=1)
    (file,) = [p for p in ckpt.rglob("*.npz")] if ckpt.is_dir() else [ckpt]
    with np.load(file) as saved:
        arrays = dict(saved)
    meta = json.loads(str(arrays["meta"]))
    assert meta["sketch_seed"] == "center-rows"
    del meta["sketch_seed"]  # as an older daskkrr wrote it
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    with open(file, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.warns(UserWarning, match="CG starts over .* drawn by an older daskkrr"):
        resumed = FalkonRegressor(max_iter=60, **params).fit(*data, checkpoint=ckpt, resume=True)
    uninterrupted = FalkonRegressor(max_iter=60, **params).fit(*data)
    np.testing.assert_array_equal(resumed.coef_, uninterrupted.coef_)
