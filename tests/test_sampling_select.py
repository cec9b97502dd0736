"""The samplers' shared ``select``: one executor argument, the selection timed, custom samplers either way."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from daskkrr.kernels import make_kernel
from daskkrr.parallel import Executor
from daskkrr.sampling import SAMPLERS, FixedCenters, make_sampler
from daskkrr.sampling.base import CenterDictionary, CenterSampler

N, D, M = 240, 3, 12


@pytest.fixture(scope="module")
def data() -> da.Array:
    return da.from_array(np.random.default_rng(0).normal(size=(N, D)), chunks=(60, D))


def _samplers() -> list[CenterSampler]:
    """Every registered sampler (small settings where its defaults would be slow) and given centers."""
    small = {"disqueak": {"n_leaves": 2}}
    return [make_sampler(name, **small.get(name, {})) for name in SAMPLERS] + [FixedCenters(np.zeros((M, D)))]


@pytest.mark.parametrize("sampler", _samplers(), ids=lambda s: type(s).__name__)
def test_every_sampler_records_its_seconds_and_takes_one_executor(sampler, data):
    kernel = make_kernel("gaussian", sigma=1.0)
    out = sampler.select(data, kernel, n_centers=M, penalty=1e-3, random_state=0, executor=Executor())
    assert isinstance(out, CenterDictionary) and out.size >= 1
    assert out.info["seconds"] >= 0.0  # set by CenterSampler._timed_select for every built-in sampler
    with pytest.raises(TypeError, match="pass executor= or client=, not both"):
        sampler.select(data, kernel, n_centers=M, penalty=1e-3, random_state=0, executor=Executor(),
                       client=Executor())


def test_a_sampler_that_implements_neither_select_nor__select_says_so(data):
    class Nothing(CenterSampler):
        name = "nothing"

    with pytest.raises(NotImplementedError, match="Nothing implements neither _select nor select"):
        Nothing().select(data, make_kernel("gaussian", sigma=1.0), n_centers=M)


def test_a_sampler_may_implement__select_only(data):
    """The hook a new sampler implements: ``select``'s arguments, the executor resolved."""

    class FirstRows(CenterSampler):
        name = "first"

        def _select(self, X, kernel, *, n_centers, penalty, random_state, executor):
            assert isinstance(executor, Executor)
            rows = np.arange(n_centers)
            return CenterDictionary(executor.compute(X[:n_centers])[0], rows, np.ones(n_centers))

    out = FirstRows().select(data, make_kernel("gaussian", sigma=1.0), n_centers=M)
    np.testing.assert_array_equal(out.centers, np.asarray(data[:M]))  # exact: rows copied, no arithmetic
    assert out.info["seconds"] >= 0.0
