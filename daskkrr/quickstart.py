"""The README's main job: generate data, fit FALKON on a local Dask cluster, report.

Runs with nothing but the package installed: the data are generated chunk by
chunk into a temporary Zarr store, so no download or shared file is needed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def run_quickstart(
    n: int = 100_000,
    d: int = 8,
    n_centers: int = 1000,
    max_iter: int = 15,
    seed: int = 0,
    scheduler: str | None = None,
    n_workers: int | None = None,
    print_fn=print,
    security: Any = None,
) -> dict:
    """Fit on ``n`` synthetic rows (80/20 split by rows) and print the figures; return them."""
    from daskkrr import FalkonRegressor, open_dataset
    from daskkrr.data import write_regression_zarr
    from daskkrr.parallel import Executor, cluster_client

    with tempfile.TemporaryDirectory(prefix="daskkrr-quickstart-") as tmp:
        store = Path(tmp) / "data.zarr"
        with cluster_client(scheduler, n_workers=n_workers, security=security) as client:
            print_fn(f"Dask dashboard: {client.dashboard_link}")
            t0 = time.perf_counter()
            write_regression_zarr(store, n, d, chunk_rows=max(1000, n // 20), random_state=seed)
            print_fn(f"generated {n} rows x {d} features into {store.name} in {time.perf_counter() - t0:.1f}s")
            X, y = open_dataset(store)
            n_train = int(0.8 * n)
            model = FalkonRegressor(n_centers=min(n_centers, n_train), penalty=1e-6, max_iter=max_iter,
                                    random_state=seed)  # fits on the current client: cluster_client's
            t0 = time.perf_counter()
            model.fit(X[:n_train], y[:n_train])
            fit_time = time.perf_counter() - t0
            pred = model.predict(X[n_train:])
            err = pred - y[n_train:]
            rmse, y_std = Executor().compute((err**2).mean() ** 0.5, y[n_train:].std())  # on cluster_client's
            figures = {
                "n_train": n_train,
                "n_test": n - n_train,
                "n_centers": int(model.centers_.shape[0]),
                "cg_iterations": int(model.n_iter_),
                "fit_seconds": round(fit_time, 2),
                "test_rmse": float(rmse),
                "test_rmse_of_mean_predictor": float(y_std),
                "dashboard": client.dashboard_link,
            }
    print_fn(
        f"FALKON: {figures['n_centers']} centers, {figures['cg_iterations']} CG iterations, "
        f"fit {figures['fit_seconds']:.1f}s\n"
        f"test RMSE {figures['test_rmse']:.4f} (predicting the mean: {figures['test_rmse_of_mean_predictor']:.4f}, "
        f"ratio {figures['test_rmse'] / max(figures['test_rmse_of_mean_predictor'], 1e-300):.3f})"
    )
    return figures
