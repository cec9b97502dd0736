"""daskkrr.utils: the one jittered Cholesky, atomic writer, JSON sanitiser and BLAS limiter."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from daskkrr.sampling.cholesky import extend_cholesky, lower_cholesky

from daskkrr.solvers import JitterWarning as PublicJitterWarning
from daskkrr.utils.atomic import atomic_symlink, atomic_write, atomic_write_bytes
from daskkrr.utils.jsonable import dumps_strict, jsonable, jsonable_params
from daskkrr.utils.linalg import JitterWarning, cholesky_jitter
from daskkrr.utils.threads import available_cores, blas_threads

ROOT = Path(__file__).resolve().parents[1]


def test_utils_imports_neither_dask_nor_other_daskkrr_layers():
    code = (
        "import sys\n"
        "import daskkrr.utils.atomic, daskkrr.utils.jsonable, daskkrr.utils.linalg, daskkrr.utils.threads\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')\n"
        "             or (m.startswith('daskkrr.') and not m.startswith('daskkrr.utils')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ Cholesky


def test_solvers_reexport_the_one_jitter_warning():
    assert PublicJitterWarning is JitterWarning


def test_round_off_jitter_is_silent_and_exact():
    rng = np.random.default_rng(0)
    B = rng.normal(size=(30, 30))
    S = B @ B.T + 30 * np.eye(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitterWarning)
        T, jitter = cholesky_jitter(S)
    assert jitter == pytest.approx(30 * np.finfo(float).eps * np.mean(np.diag(S)))
    np.testing.assert_allclose(T.T @ T, S + jitter * np.eye(30), atol=1e-10)
    assert np.all(np.tril(T, -1) == 0)


def test_plain_first_then_escalation_from_zero_jitter():
    S = np.diag([1.0, 1.0, -1e-10])  # needs more than round-off
    with pytest.warns(JitterWarning, match="needed jitter"):
        T, jitter = cholesky_jitter(S, initial_jitter=0.0)
    assert 1e-10 < jitter < 1e-6
    np.testing.assert_allclose(T.T @ T, S + jitter * np.eye(3), atol=1e-12)


def test_in_place_factor_keeps_the_input_when_a_try_fails():
    rng = np.random.default_rng(2)
    B = rng.normal(size=(6, 6))
    S = np.asfortranarray(B @ B.T - 1e-6 * np.eye(6) - np.linalg.eigvalsh(B @ B.T)[0] * np.eye(6))
    work = S.copy(order="F")
    with pytest.warns(JitterWarning):
        T, jitter = cholesky_jitter(work, overwrite=True)
    assert np.shares_memory(T, work)
    np.testing.assert_allclose(T.T @ T, S + jitter * np.eye(6), atol=1e-10)


def test_refusal_names_the_remedy():
    with pytest.raises(np.linalg.LinAlgError, match="singular. increase gamma"):
        cholesky_jitter(np.diag([1.0, 1.0, -0.5]), advice="increase gamma")
    with pytest.raises(ValueError, match="square"):
        cholesky_jitter(np.ones((2, 3)))


def test_empty_matrix():
    T, jitter = cholesky_jitter(np.zeros((0, 0)))
    assert T.shape == (0, 0) and jitter == 0.0


def test_samplers_lower_factor_uses_the_same_policy():
    rng = np.random.default_rng(1)
    B = rng.normal(size=(12, 4))
    A = B @ B.T + 1e-3 * np.eye(12)
    L, jitter = lower_cholesky(A)
    np.testing.assert_allclose(L @ L.T, A + jitter * np.eye(12), atol=1e-12)
    assert np.all(np.triu(L, 1) == 0)
    L8, j1 = lower_cholesky(A[:8, :8])
    cross = np.linalg.solve(L8, A[:8, 8:])
    Lx, j2 = extend_cholesky(L8, cross, A[8:, 8:])
    np.testing.assert_allclose(Lx @ Lx.T, A + np.diag([j1] * 8 + [j2] * 4), atol=1e-10)
    with pytest.raises(np.linalg.LinAlgError, match="increase gamma"):
        lower_cholesky(np.diag([1.0, 1.0, -0.5]))


# ------------------------------------------------------------------ atomic files


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.bin"
    atomic_write_bytes(path, b"old")
    atomic_write(path, lambda fh: fh.write(b"new"), durable=False)
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


@pytest.mark.parametrize("durable", [True, False])
def test_failed_write_keeps_the_old_file(tmp_path, durable):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def fails(fh):
        fh.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, fails, durable=durable)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_durable_write_syncs_file_and_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    atomic_write_bytes(tmp_path / "a", b"x", durable=False)
    assert synced == []
    atomic_write_bytes(tmp_path / "b", b"x")
    assert len(synced) == 2  # the file, then its directory


def test_atomic_write_mode(tmp_path):
    path = atomic_write_bytes(tmp_path / "secret", b"x", mode=0o600)
    assert path.stat().st_mode & 0o777 == 0o600


def test_atomic_symlink_replaces_a_link(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    link = tmp_path / "latest"
    atomic_symlink("a", link)
    atomic_symlink("b", link)
    assert os.readlink(link) == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "latest"]


# ------------------------------------------------------------------ JSON


def test_jsonable_is_strict_json():
    value = {1: np.float32(1.5), "a": (np.int64(2), np.nan), "arr": np.array([[1.0, np.inf]]),
             "b": np.bool_(True), "z": np.array(3.0), "s": "x"}
    plain = jsonable(value)
    assert plain == {"1": 1.5, "a": [2, None], "arr": [[1.0, None]], "b": True, "z": 3.0, "s": "x"}
    assert json.loads(dumps_strict(value)) == plain
    assert type(plain["a"][0]) is int and type(plain["b"]) is bool
    assert dumps_strict(math.nan) == "null"


def test_jsonable_params():
    class Kernel:
        def to_dict(self):
            return {"name": "gaussian", "sigma": 1.0}

    class Sampler:
        name = "squeak"

    class Estimator:
        def get_params(self, deep=False):
            return {"client": object(), "kernel": Kernel(), "sampler": Sampler(), "penalty": np.float64(1e-3),
                    "random_state": np.random.default_rng(0), "n_centers": np.int32(5), "sizes": (1, 2)}

    assert jsonable_params(Estimator()) == {
        "kernel": {"name": "gaussian", "sigma": 1.0}, "sampler": "squeak", "penalty": 1e-3,
        "random_state": None, "n_centers": 5, "sizes": [1, 2],
    }


# ------------------------------------------------------------------ threads


def test_blas_threads_limits_and_restores():
    from threadpoolctl import threadpool_info

    def blas_limits():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas_limits()
    with blas_threads(1):
        assert all(n == 1 for n in blas_limits())
    assert blas_limits() == before
    assert 1 <= available_cores() <= (os.cpu_count() or 1)
