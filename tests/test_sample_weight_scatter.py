"""numpy ``sample_weight`` under a distributed client is scattered to the workers like numpy rows,
block by block with X's row chunks, not embedded in every pass's graph."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np

from daskkrr import FalkonRegressor
from daskkrr.data.sample_weight import open_sample_weight

N = 20_000  # 160 kB of float64 weights: far more than a graph of a few block references


def test_numpy_weights_are_scattered_not_embedded(cluster2):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, 2))
    w = rng.uniform(0.5, 2.0, N)
    Xd = da.from_array(X, chunks=(5_000, 2))
    with cluster2.as_current():
        wd = open_sample_weight(w, X, Xd, None)
    assert wd.chunks[0] == Xd.chunks[0]
    graph_bytes = len(pickle.dumps(dict(wd.__dask_graph__())))
    assert graph_bytes < w.nbytes / 10, graph_bytes  # embedded, the graph would hold all 160 kB
    np.testing.assert_array_equal(wd.compute(scheduler=cluster2.get), w)


def test_a_weighted_numpy_fit_on_a_cluster_equals_the_threaded_fit(cluster2):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 3))
    y = np.sin(X.sum(axis=1)) + 0.05 * rng.normal(size=300)
    w = rng.uniform(0.2, 3.0, 300)
    params = dict(n_centers=20, penalty=1e-3, tol=1e-11, max_iter=100, random_state=0, strategy="gram")
    with cluster2.as_current():  # X, y and w scattered: a weight on the wrong rows would change the model
        on_cluster = FalkonRegressor(**params).fit(X, y, sample_weight=w)
    threaded = FalkonRegressor(**params).fit(X, y, sample_weight=w)
    # the same weighted system summed in another order (the workers' blocks): round-off times the
    # preconditioned system's condition, the bound test_sample_weight.py's cluster test uses
    rel = np.linalg.norm(on_cluster.coef_ - threaded.coef_) / np.linalg.norm(threaded.coef_)
    assert rel <= 1e-8, rel
