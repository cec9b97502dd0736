"""A checkpoint knows its data (issue 36, items 1 and 2): every row block's content is in the
fingerprint, so changed data are refused with the first block that differs, and a fit resumed
in another process or on another cluster gives the uninterrupted fit's model.

Tolerances: a resume in the same process and scheduler runs the same arithmetic and is bitwise
(tests/test_checkpoint.py). A resume on another scheduler continues the CG from the saved state
with products summed by other workers, whose round-off differs (per product about the dtype's eps
times the number of summed blocks); CG's iterates move by that round-off times the condition of
the preconditioned system (small for FALKON at these penalties), plus at most one iteration more or
less when the residual lands at ``tol``. Hence, relative to the coefficients' norm: float64 <= 1e-9
(eps 2.2e-16 times a condition below 1e4, and ``tol=1e-10`` for the step of one iteration), float32
<= 1e-3 (the CG's residual stalls near its attainable accuracy, about eps32 = 1.2e-7 times the
condition, and ``tol=1e-4`` bounds the step of one iteration).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import daskkrr
from daskkrr import FalkonClassifier, FalkonRegressor
from daskkrr.checkpoint import CHECKPOINT_FILE, CheckpointError, FitCheckpoint
from daskkrr.data import write_zarr
from daskkrr.models.logistic import LogisticFalkonClassifier

N, D, CHUNK = 1500, 4, 300  # five row blocks of 300 rows
RTOL = {"float64": 1e-9, "float32": 1e-3}  # see the module docstring
TOL = {"float64": 1e-10, "float32": 1e-4}

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D))
    score = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=N)
    return {
        "X": X,
        "ratings": np.digitize(score, np.quantile(score, [0.2, 0.4, 0.6, 0.8])).astype(np.float64) + 1.0,
        "classes": np.digitize(score, np.quantile(score, [1 / 3, 2 / 3])),
        "binary": (score > np.median(score)).astype(np.int64),
        "weights": rng.uniform(0.5, 2.0, size=N),
    }


DATA = _data()
#: estimator, its target in DATA, its parameters (the dtype's tol is added).
ESTIMATORS = {
    "regressor": (FalkonRegressor, "ratings", dict(n_centers=60, penalty=1e-3, max_iter=80)),
    "classifier": (FalkonClassifier, "classes", dict(n_centers=60, penalty=1e-3, max_iter=80)),
    "logistic": (LogisticFalkonClassifier, "binary", dict(n_centers=40, penalty=1e-2, max_iter=60,
                                                            newton_iterations=20)),
}


def _make(name: str, dtype: str = "float64"):
    cls, target, params = ESTIMATORS[name]
    model = cls(**params, tol=TOL[dtype], dtype=dtype, random_state=0, chunks=CHUNK)
    return model, DATA[target]


class Crash(Exception):
    """Stands in for the client's death right after a checkpoint was saved."""


def _crash_at(monkeypatch, point: str) -> None:
    """Crash after the centers are saved ("sampled") or after the second solver save ("mid")."""
    write = FitCheckpoint._write
    solver_saves = []

    def write_then_crash(self, stage, iteration=None):
        write(self, stage, iteration)
        if stage in ("cg", "newton"):
            solver_saves.append(iteration)
        if (point == "sampled" and stage == "centers") or (point == "mid" and len(solver_saves) == 2):
            raise Crash(stage)

    monkeypatch.setattr(FitCheckpoint, "_write", write_then_crash)


def _meta(ckpt: Path) -> dict:
    with np.load(ckpt / CHECKPOINT_FILE, allow_pickle=False) as npz:
        return json.loads(str(npz["meta"]))


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


_REFERENCES: dict[tuple[str, str], object] = {}


def _uninterrupted(name: str, dtype: str):
    """The fit never interrupted, on the threaded scheduler (computed once per module)."""
    if (name, dtype) not in _REFERENCES:
        model, y = _make(name, dtype)
        _REFERENCES[name, dtype] = model.fit(DATA["X"], y)
    return _REFERENCES[name, dtype]


@pytest.fixture(scope="module")
def clusters(cluster2):
    """LocalClusters of 1, 2 and 3 single-threaded worker processes, started when first asked for
    (2: the run's shared ``cluster2``, whose workers have imported daskkrr already)."""
    from distributed import Client, LocalCluster

    started: dict[int, tuple] = {}

    def get(workers: int):
        if workers == 2:
            return cluster2
        if workers not in started:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, memory_limit="1GiB")
            started[workers] = (cluster, Client(cluster, set_as_default=False))
        return started[workers][1]

    yield get
    for cluster, client in started.values():
        client.close()
        cluster.close()


# ---------------------------------------------------------------- resume on other clusters (Python)
FAST = [("regressor", "float64", "mid", 2), ("classifier", "float32", "sampled", 1), ("logistic", "float64", "end", 3)]
#: The whole matrix takes about an hour on 2 cores, beyond the suite's budget: run it with
#: DASKKRR_RESUME_MATRIX=1. The FAST cases take every value of every axis at least once; the
#: default run keeps the first (on the run's shared two-worker cluster), the others start a cluster
#: of 1 and of 3 workers each and are marked slow.
FAST_CASES = [FAST[0], *(pytest.param(*case, marks=pytest.mark.slow) for case in FAST[1:])]
FULL_MATRIX = pytest.mark.skipif(not os.environ.get("DASKKRR_RESUME_MATRIX"),
                                 reason="the full resume matrix runs with DASKKRR_RESUME_MATRIX=1 (about an hour)")
FULL = [(e, t, p, w) for e in ESTIMATORS for t in ("float64", "float32") for p in ("sampled", "mid", "end")
        for w in (1, 2, 3) if (e, t, p, w) not in FAST]


def _resume_case(name, dtype, point, workers, clusters, tmp_path, monkeypatch):
    reference = _uninterrupted(name, dtype)
    model, y = _make(name, dtype)
    ckpt = tmp_path / "ck"
    if point == "end":  # the state a crash between the last save and the model's leaves
        model.fit(DATA["X"], y, checkpoint=ckpt, checkpoint_every=2)
    else:
        _crash_at(monkeypatch, point)
        with pytest.raises(Crash):
            model.fit(DATA["X"], y, checkpoint=ckpt, checkpoint_every=2)
        monkeypatch.undo()
    assert (_meta(ckpt)["stage"] == "centers") == (point == "sampled")
    client = clusters(workers)
    with client.as_current():  # another scheduler, other processes
        resumed, _ = _make(name, dtype)
        resumed.fit(DATA["X"], y, checkpoint=ckpt, resume=True)
    np.testing.assert_array_equal(resumed.center_indices_, reference.center_indices_)
    if hasattr(reference, "classes_"):
        np.testing.assert_array_equal(resumed.classes_, reference.classes_)
    assert abs(resumed.n_iter_ - reference.n_iter_) <= 1, (resumed.n_iter_, reference.n_iter_)
    assert _relative(resumed.coef_, reference.coef_) <= RTOL[dtype]
    np.testing.assert_allclose(resumed.intercept_, reference.intercept_, rtol=RTOL[dtype], atol=RTOL[dtype])


@pytest.mark.parametrize("name, dtype, point, workers", FAST_CASES)
def test_a_resume_on_another_cluster_gives_the_uninterrupted_model(name, dtype, point, workers, clusters,
                                                                     tmp_path, monkeypatch):
    _resume_case(name, dtype, point, workers, clusters, tmp_path, monkeypatch)


@pytest.mark.slow
@FULL_MATRIX
@pytest.mark.parametrize("name, dtype, point, workers", FULL)
def test_every_resume_of_the_matrix_gives_the_uninterrupted_model(name, dtype, point, workers, clusters,
                                                                    tmp_path, monkeypatch):
    _resume_case(name, dtype, point, workers, clusters, tmp_path, monkeypatch)


# ---------------------------------------------------------------- changed data are refused
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints of short fits: the regressor on integer ratings, unweighted and weighted, and the
    classifier."""
    out = {}
    for key, name, weighted in (("regressor", "regressor", False), ("weighted", "regressor", True),
                                ("classifier", "classifier", False)):
        model, y = _make(name)
        model.set_params(max_iter=4)
        ckpt = tmp_path_factory.mktemp(key) / "ck"
        model.fit(DATA["X"], y, sample_weight=DATA["weights"] if weighted else None, checkpoint=ckpt,
                  checkpoint_every=2)
        out[key] = ckpt
    return out


def _permuted_within(a: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``a`` with rows lo..hi-1 in another order (their values, counts and mean unchanged)."""
    out = a.copy()
    out[lo:hi] = a[lo:hi][np.random.default_rng(1).permutation(hi - lo)]
    assert not np.array_equal(out, a)
    return out


def _swap_two_labels(y: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Two rows of different classes in rows lo..hi-1 exchange their labels (class counts unchanged)."""
    i = lo
    j = next(k for k in range(lo + 1, hi) if y[k] != y[i])
    out = y.copy()
    out[i], out[j] = y[j], y[i]
    return out


def _one_ulp(X: np.ndarray, row: int) -> np.ndarray:
    out = X.copy()
    out[row, 2] = np.nextafter(out[row, 2], np.inf)
    return out


def _swap_rows(a: np.ndarray, i: int, j: int) -> np.ndarray:
    out = a.copy()
    out[[i, j]] = a[[j, i]]
    return out


X, RATINGS, CLASSES, W = DATA["X"], DATA["ratings"], DATA["classes"], DATA["weights"]
#: (checkpoint, X, y, sample_weight, parameter changes, the error's words)
CHANGES = {
    "ratings re-assigned in block 3": ("regressor", X, _permuted_within(RATINGS, 900, 1200), None, {},
                                       r"row block 3 \(rows 900-1199\) differs in y"),
    "two labels swapped in block 2": ("classifier", X, _swap_two_labels(CLASSES, 600, 900), None, {},
                                      r"row block 2 \(rows 600-899\) differs in y"),
    "one value of X by one ulp": ("regressor", _one_ulp(X, 1234), RATINGS, None, {},
                                  r"row block 4 \(rows 1200-1499\) differs in X"),
    "a row moved to another block": ("regressor", _swap_rows(X, 350, 1000), _swap_rows(RATINGS, 350, 1000), None,
                                     {}, r"row block 1 \(rows 300-599\) differs in X and y"),
    "a column's order": ("regressor", X[:, [1, 0, 2, 3]], RATINGS, None, {},
                         r"row block 0 \(rows 0-299\) differs in X"),
    "X stored as float32": ("regressor", X.astype(np.float32), RATINGS, None, {},
                            r"row block 0 \(rows 0-299\) differs in X"),
    "one weight": ("weighted", X, RATINGS, np.where(np.arange(N) == 450, 1.25, W), {},
                   r"row block 1 \(rows 300-599\) differs in sample_weight"),
    "weights dropped": ("weighted", X, RATINGS, None, {}, r"row block 0 \(rows 0-299\) differs in sample_weight"),
    "the chunking": ("regressor", X, RATINGS, None, {"chunks": 250},
                     r"row block 0 holds rows 0-299 in the checkpoint but rows 0-249 now: the row chunking is "
                     r"part of the fingerprint"),
    "rows appended": ("regressor", np.vstack([X, X[:100]]), np.concatenate([RATINGS, RATINGS[:100]]), None, {},
                      r"row block 5 \(rows 1500-1599\) is not in the checkpoint: .* \(rows were added\)"),
    "the last row removed": ("regressor", X[:-1], RATINGS[:-1], None, {},
                             r"row block 4 holds rows 1200-1499 in the checkpoint but rows 1200-1498 now: the data "
                             r"now have 1499 rows, the checkpoint's 1500"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_data_are_refused_with_the_block_named(change, saved, tmp_path):
    import shutil

    key, Xc, yc, wc, params, words = CHANGES[change]
    ckpt = Path(shutil.copytree(saved[key], tmp_path / "ck"))
    before = (ckpt / CHECKPOINT_FILE).read_bytes()
    model, _ = _make("classifier" if key == "classifier" else "regressor")
    model.set_params(**params)
    with pytest.raises(CheckpointError, match=rf"belongs to a different fit: .*{words}.*; it is left as it is"):
        model.fit(Xc, yc, sample_weight=wc, checkpoint=ckpt, resume=True)
    assert (ckpt / CHECKPOINT_FILE).read_bytes() == before  # kept: the right data can still resume it


def test_the_same_data_in_another_array_type_resume(saved, tmp_path):
    """The digests are of the values, not of the container: a dask array with the same chunks resumes."""
    import shutil

    import dask.array as da

    ckpt = Path(shutil.copytree(saved["regressor"], tmp_path / "ck"))
    model, _ = _make("regressor")
    model.set_params(max_iter=6)
    model.fit(da.from_array(X, chunks=(CHUNK, D)), da.from_array(RATINGS, chunks=CHUNK), checkpoint=ckpt,
              resume=True)
    assert _meta(ckpt)["iteration"] == 6


def test_the_statistics_of_the_interrupted_fit_are_reused(saved, tmp_path, monkeypatch):
    """Issue 36, item 2: another cluster's tree sums the target mean to other last bits; the resumed
    fit takes the saved statistics instead of refusing or mixing them with the saved state."""
    import shutil

    from daskkrr.data import Standardizer

    ckpt = Path(shutil.copytree(saved["regressor"], tmp_path / "ck"))
    stats = _meta(ckpt)["statistics"]
    fit = Standardizer.fit

    def off_in_the_last_bits(self, *args, **kwargs):
        fit(self, *args, **kwargs)
        self.y_mean_ = np.nextafter(self.y_mean_, np.inf)  # as another reduction tree's sum
        self.mean_ = np.nextafter(self.mean_, np.inf)
        return self

    monkeypatch.setattr(Standardizer, "fit", off_in_the_last_bits)
    model, _ = _make("regressor")
    model.set_params(max_iter=6)
    model.fit(X, RATINGS, checkpoint=ckpt, resume=True)
    np.testing.assert_array_equal(model.y_mean_, stats["y_mean"])
    np.testing.assert_array_equal(model.scaler_.mean_, stats["mean"])
    np.testing.assert_array_equal(model.scaler_.scale_, stats["scale"])


# ---------------------------------------------------------------- the CLI: a killed client, resumed elsewhere
def _daskkrr(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "daskkrr.cli", *args, "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(ckpt: Path, proc: subprocess.Popen, reached, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not ((ckpt / CHECKPOINT_FILE).exists() and reached(_meta(ckpt))):
        if proc.poll() is not None:
            return  # finished first: the checkpoint holds the end of the fit, a point like any other
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for a checkpoint in {ckpt}")
        time.sleep(0.02)


def _reached(solver_stage: str, mid: int, end: int) -> dict:
    """The three points of a fit, as its checkpoint shows them: the centers saved (the first save),
    the solver's state of iteration ``mid`` saved, and of iteration ``end``."""
    def at(iteration: int):
        return lambda meta: meta.get("stage") == solver_stage and meta.get("iteration", 0) >= iteration

    return {"sampled": lambda meta: True, "mid": at(mid), "end": at(end)}


#: How each estimator is fitted on the command line. ``toml``: its ``[model]`` table (the classifier
#: is chosen there, the logistic by ``--estimator``: both ways the CLI picks one); ``params``: given as
#: flags and to the uninterrupted reference; ``target``: its labels in DATA; ``points``: its checkpoint
#: at the three points. FALKON's own preconditioner (no row sketch) gives the regressor and the
#: classifier 20-40 CG iterations, so the points lie apart; the logistic saves after each of its 3-5
#: Newton steps.
CLI_ESTIMATORS = {
    "falkon": dict(cls=FalkonRegressor, target="ratings", toml='preconditioner_rows = "none"\n', flags=[],
                   params=dict(n_centers=60, penalty=1e-3, max_iter=80, preconditioner_rows=None),
                   points=_reached("cg", 4, 8)),
    "classifier": dict(cls=FalkonClassifier, target="classes",
                       toml='estimator = "classifier"\npreconditioner_rows = "none"\n', flags=[],
                       params=dict(n_centers=60, penalty=1e-3, max_iter=80, preconditioner_rows=None),
                       points=_reached("cg", 4, 8)),
    "logistic": dict(cls=LogisticFalkonClassifier, target="binary", toml="newton_iterations = 20\n",
                     flags=["--estimator", "logistic"],
                     params=dict(n_centers=40, penalty=1e-2, max_iter=60, newton_iterations=20),
                     points=_reached("newton", 2, 3)),
}
POINTS = CLI_ESTIMATORS["falkon"]["points"]
CLI_FAST = [(signal.SIGKILL, "mid", 1, 3, "float32")]
CLI_FULL = [(s, p, a, b, t) for s in (signal.SIGTERM, signal.SIGKILL) for p in POINTS for a, b in ((1, 2), (3, 1))
            for t in ("float64", "float32") if (s, p, a, b, t) not in CLI_FAST]


def all_pairs(factors: list[tuple], reverse: bool = False) -> list[tuple]:
    """A covering design of strength two: cases (one value per factor) such that every two values of
    two different factors appear together in at least one case. Greedy: of all combinations (in order,
    or reversed), take the one that covers the most pairs not yet covered, until none is left.
    Deterministic, so the cases' ids stay the same from run to run."""
    import itertools

    def pairs(case: tuple) -> set:
        return {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}

    candidates = list(itertools.product(*factors))
    if reverse:
        candidates.reverse()
    uncovered = set().union(*map(pairs, candidates))
    design = []
    while uncovered:
        best = max(candidates, key=lambda case: len(pairs(case) & uncovered))
        design.append(best)
        uncovered -= pairs(best)
    return design


#: The classifier and the logistic on the command line. A full product (2 signals x 3 points x 3 first
#: x 3 resume worker counts x 2 dtypes = 108, or 24 with the regressor's two worker pairs) would take
#: about 40 minutes per estimator on 2 idle cores. A fault that shows only with one particular value of
#: one factor, or with a particular pair of values of two factors (SIGKILL while the centers are saved,
#: float32 on 3 workers, ...), is found by any design that holds every pair of values once: the
#: pairwise design holds them in about 10 cases per estimator. The two estimators take the
#: combinations in opposite orders, so their designs differ and together they hold more triples. The
#: regressor keeps its full product (CLI_FULL).
CLI_FACTORS = [(signal.SIGTERM, signal.SIGKILL), tuple(POINTS), (1, 2, 3), (1, 2, 3), ("float64", "float32")]
CLI_PAIRWISE = [(name, *case) for name, reverse in (("classifier", False), ("logistic", True))
                for case in all_pairs(CLI_FACTORS, reverse=reverse)]


def test_the_pairwise_designs_hold_every_pair_of_values():
    """Every two values of two factors are in one case of each estimator's design, in far fewer cases
    than the full product."""
    import itertools

    for name in ("classifier", "logistic"):
        cases = [case[1:] for case in CLI_PAIRWISE if case[0] == name]
        assert len(cases) <= 12, (name, len(cases))
        for (i, values_i), (j, values_j) in itertools.combinations(enumerate(CLI_FACTORS), 2):
            held = {(case[i], case[j]) for case in cases}
            assert held == set(itertools.product(values_i, values_j)), (name, i, j)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The training data as Zarr stores, one per target in DATA (written when first asked for)."""
    written: dict[str, Path] = {}

    def get(target: str) -> Path:
        if target not in written:
            written[target] = write_zarr(X, DATA[target], tmp_path_factory.mktemp(target) / "train.zarr",
                                         chunk_rows=CHUNK)
        return written[target]

    return get


@pytest.fixture(scope="module")
def store(stores):
    return stores("ratings")


_CLI_REFERENCES: dict[tuple[str, str], object] = {}


def _cli_reference(name: str, store: Path, dtype: str):
    """The uninterrupted fit of the command line's parameters, on the threaded scheduler (once each)."""
    if (name, dtype) not in _CLI_REFERENCES:
        spec = CLI_ESTIMATORS[name]
        _CLI_REFERENCES[name, dtype] = spec["cls"](**spec["params"], sigma=2.0, tol=TOL[dtype], random_state=0,
                                                    dtype=dtype).fit(store)
    return _CLI_REFERENCES[name, dtype]


def _assert_same_classifications(model, reference, dtype: str) -> None:
    """Equal predicted classes wherever the reference's margin exceeds what the coefficients'
    tolerance can move. A decision value is k(x, C) @ coef + intercept with Gaussian kernel values in
    [0, 1], so |k(x, C) @ (coef - coef_ref)| <= sqrt(M) * ||coef - coef_ref|| <= sqrt(M) * RTOL *
    ||coef_ref|| per class (Cauchy-Schwarz); add the intercepts' difference. A row whose two best
    classes (binary: whose decision value and 0) are further apart than twice that must keep its
    class; the decision values themselves are compared to the same bound. Float64 leaves every row
    clear; the float32 classifier none (its 3 x 60 coefficients, of norm about 180, cancel to decision
    values below 2, so the bound is about 1.4 against margins of about 0.65): there the coefficients'
    and intercepts' tolerance carries the comparison."""
    rows = X[::5]
    got, want = model.decision_function(rows), reference.decision_function(rows)
    bound = (np.sqrt(reference.coef_.shape[0]) * RTOL[dtype] * np.linalg.norm(reference.coef_)
             + np.max(np.abs(model.intercept_ - reference.intercept_)))
    assert np.max(np.abs(got - want)) <= bound, (np.max(np.abs(got - want)), bound)
    ranked = np.sort(want, axis=1) if want.ndim == 2 else np.stack([np.minimum(want, 0), np.maximum(want, 0)], 1)
    clear = ranked[:, -1] - ranked[:, -2] > 2 * bound
    np.testing.assert_array_equal(model.predict(rows)[clear], reference.predict(rows)[clear])


def _cli_case(name, stores, tmp_path, signum, point, first_workers, resume_workers, dtype):
    spec = CLI_ESTIMATORS[name]
    store = stores(spec["target"])
    ckpt, out = tmp_path / "ck", tmp_path / "model"
    config = tmp_path / "model.toml"
    config.write_text(f'[model]\n{spec["toml"]}dtype = "{dtype}"\n')
    params = spec["params"]
    flags = [*spec["flags"], "--centers", str(params["n_centers"]), "--penalty", str(params["penalty"]), "--sigma",
             "2.0", "--tol", str(TOL[dtype]), "--max-iter", str(params["max_iter"]), "--seed", "0", "--config",
             str(config)]
    fit = ["fit", "--data", str(store), *flags, "--checkpoint", str(ckpt), "--checkpoint-every", "1"]
    proc = _daskkrr(*fit, "--out", str(tmp_path / "interrupted"), "--workers", str(first_workers))
    _wait_for(ckpt, proc, spec["points"][point])
    if proc.poll() is None:  # else it finished first: it is resumed from its final checkpoint all the same
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    # 0 if it finished first; SIGTERM: the handler's exit 128 + 15; SIGKILL: killed by the signal.
    assert proc.returncode in (0, 128 + signum if signum == signal.SIGTERM else -signum), (proc.returncode, err)
    resumed = _daskkrr(*fit, "--out", str(out), "--workers", str(resume_workers), "--resume")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    model = daskkrr.load(out)
    reference = _cli_reference(name, store, dtype)
    assert type(model) is spec["cls"]
    np.testing.assert_array_equal(model.center_indices_, reference.center_indices_)
    assert abs(model.n_iter_ - reference.n_iter_) <= 1, (model.n_iter_, reference.n_iter_)
    assert _relative(model.coef_, reference.coef_) <= RTOL[dtype]
    if name != "falkon":
        np.testing.assert_array_equal(model.classes_, reference.classes_)
        np.testing.assert_allclose(model.intercept_, reference.intercept_, rtol=RTOL[dtype], atol=RTOL[dtype])
        _assert_same_classifications(model, reference, dtype)


#: The per-test limit of pyproject.toml (600 s) is shorter than a case's own deadlines (600 s to reach
#: the point, 120 s to end, 600 s to resume): on 2 cores under a load of 38 a logistic case took over
#: 600 s and was stopped while its resume was still running. The limit covers the deadlines instead.
CLI_TIMEOUT = pytest.mark.timeout(600 + 120 + 600 + 180)


@pytest.mark.slow  # two command-line fits, each with its own local cluster
@CLI_TIMEOUT
@pytest.mark.parametrize("signum, point, first_workers, resume_workers, dtype", CLI_FAST)
def test_a_killed_cli_fit_resumes_on_another_cluster(stores, tmp_path, signum, point, first_workers, resume_workers,
                                                     dtype):
    _cli_case("falkon", stores, tmp_path, signum, point, first_workers, resume_workers, dtype)


@pytest.mark.slow
@FULL_MATRIX
@CLI_TIMEOUT
@pytest.mark.parametrize("signum, point, first_workers, resume_workers, dtype", CLI_FULL)
def test_every_cli_interruption_resumes(stores, tmp_path, signum, point, first_workers, resume_workers, dtype):
    _cli_case("falkon", stores, tmp_path, signum, point, first_workers, resume_workers, dtype)


@pytest.mark.slow
@FULL_MATRIX
@CLI_TIMEOUT
@pytest.mark.parametrize("name, signum, point, first_workers, resume_workers, dtype", CLI_PAIRWISE)
def test_every_cli_interruption_of_a_classifier_resumes(name, stores, tmp_path, signum, point, first_workers,
                                                        resume_workers, dtype):
    _cli_case(name, stores, tmp_path, signum, point, first_workers, resume_workers, dtype)


# ---------------------------------------------------------------- SIGTERM at three points of a CLI fit, resumed
def _sigterm_in(monkeypatch, owner, name: str, when=lambda *args, **kwargs: True) -> None:
    """Replace ``owner.name`` by a wrapper that, the first time ``when(*args)`` holds, sends this process
    SIGTERM and then carries on: the CLI's handler raises in the main thread at once, inside that call."""
    original = getattr(owner, name)
    sent: list[bool] = []

    def wrapper(*args, **kwargs):
        if not sent and when(*args, **kwargs):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def _at_statistics(monkeypatch) -> None:
    from daskkrr.data import Standardizer

    _sigterm_in(monkeypatch, Standardizer, "fit")  # the pass over the data, before the centers are sampled


def _in_cg(monkeypatch) -> None:
    write = FitCheckpoint._write

    def write_then_term(self, stage, iteration=None):
        write(self, stage, iteration)
        if stage == "cg" and iteration == 4:  # mid-CG: the state of iteration 4 is saved, 5 is next
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(FitCheckpoint, "_write", write_then_term)


def _writing_the_model(monkeypatch) -> None:
    # np.savez of the model's arrays into its temporary folder: the fit is done, the model half-written.
    # (A checkpoint is written with np.savez to an open file.)
    _sigterm_in(monkeypatch, np, "savez",
                lambda file, *a, **k: isinstance(file, (str, os.PathLike)) and ".model.tmp-" in os.fspath(file))


SIGTERM_POINTS = {"statistics": (_at_statistics, None), "cg": (_in_cg, "cg"), "writing": (_writing_the_model, "cg")}


@pytest.mark.slow  # six command-line fits on a running 2-worker cluster: about 20 s each on 2 busy cores
@pytest.mark.parametrize("point", list(SIGTERM_POINTS))
def test_sigterm_at_three_points_of_a_fit_then_resume(point, store, clusters, tmp_path, monkeypatch, capsys):
    """``daskkrr fit`` gets SIGTERM during its statistics pass, mid-CG, or while writing the model:
    exit 143 with the documented line, no model and no temporary left, the checkpoint whole (none yet
    after the statistics pass); ``--resume`` then gives the uninterrupted fit's model (module docstring)."""
    from daskkrr.cli import main

    address = clusters(2).scheduler.address
    ckpt, out, config = tmp_path / "ck", tmp_path / "model", tmp_path / "model.toml"
    config.write_text('[model]\npreconditioner_rows = "none"\n')
    fit = ["fit", "--data", str(store), "--out", str(out), "--centers", "60", "--penalty", "1e-3", "--sigma", "2.0",
           "--tol", str(TOL["float64"]), "--max-iter", "80", "--seed", "0", "--config", str(config),
           "--checkpoint", str(ckpt), "--checkpoint-every", "1", "--scheduler", address, "-q"]
    arm, stage = SIGTERM_POINTS[point]
    arm(monkeypatch)
    assert main(fit) == 128 + signal.SIGTERM
    monkeypatch.undo()
    assert "daskkrr: interrupted (received SIGTERM); no partial output was left" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".model*")), sorted(p.name for p in tmp_path.iterdir())
    saved = (ckpt / CHECKPOINT_FILE).exists()
    assert saved == (stage is not None) and (not saved or _meta(ckpt)["stage"] == stage)
    if ckpt.exists():
        assert sorted(p.name for p in ckpt.iterdir()) == ([CHECKPOINT_FILE] if saved else [])
    assert main([*fit, "--resume"]) == 0, capsys.readouterr().err
    model = daskkrr.load(out)
    reference = _cli_reference("falkon", store, "float64")
    np.testing.assert_array_equal(model.center_indices_, reference.center_indices_)
    assert abs(model.n_iter_ - reference.n_iter_) <= 1, (model.n_iter_, reference.n_iter_)
    assert _relative(model.coef_, reference.coef_) <= RTOL["float64"]
