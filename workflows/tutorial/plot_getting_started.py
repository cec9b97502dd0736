"""
Getting started: diabetes progression
=====================================

This tutorial fits daskkrr's FALKON regressor to a real data set, compares it with
scikit-learn, saves and reloads the model, predicts with uncertainty, fits again
out of core from a Zarr store, and finally on a Dask cluster. It uses scikit-learn's
bundled *diabetes* data (442 patients, 10 baseline measurements, a measure of
disease progression one year later), so it runs offline in a few seconds; the same
calls work on stores of any size.

Install with ``pip install daskkrr`` (or ``pip install -e .`` in a checkout).
"""

# %%
# The data
# --------
# ``load_diabetes`` returns numpy arrays. We keep a quarter of the rows for testing.

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import load_diabetes
from sklearn.kernel_approximation import Nystroem
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import Ridge
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import daskkrr
from daskkrr import FalkonRegressor

X, y = load_diabetes(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
print(X_train.shape, X_test.shape)

# %%
# Fit FALKON
# ----------
# ``FalkonRegressor`` is a scikit-learn estimator. It standardises the features
# (``standardize=True``), uses a Gaussian kernel of length scale ``sigma`` on them,
# ``n_centers`` Nystrom centers drawn from the rows, and solves the kernel ridge
# problem with a preconditioned conjugate gradient. ``penalty`` is the ridge
# regularisation per row (scikit-learn's ``alpha`` is ``penalty * n``). Both can be
# chosen with ``GridSearchCV`` like any scikit-learn estimator.

sigma, penalty = 5.0, 1e-2
model = FalkonRegressor(n_centers=200, sigma=sigma, penalty=penalty, random_state=0)
model.fit(X_train, y_train)
print(f"FALKON test R^2: {model.score(X_test, y_test):.3f}")

# %%
# Compare with scikit-learn
# -------------------------
# The same problem in scikit-learn: exact ``KernelRidge`` on the standardised
# features, and ``Nystroem`` features followed by ``Ridge``. The Gaussian kernel
# ``exp(-|x - x'|^2 / (2 sigma^2))`` is scikit-learn's ``rbf`` with
# ``gamma = 1 / (2 sigma^2)``. The three scores should be close: on 331 rows, 200
# centers approximate the kernel well.

gamma, alpha = 1 / (2 * sigma**2), penalty * len(X_train)
baselines = {
    "scikit-learn KernelRidge": make_pipeline(StandardScaler(), KernelRidge(kernel="rbf", gamma=gamma, alpha=alpha)),
    "scikit-learn Nystroem + Ridge": make_pipeline(
        StandardScaler(), Nystroem(gamma=gamma, n_components=200, random_state=0), Ridge(alpha=alpha)
    ),
}
scores = {"daskkrr FALKON": model.score(X_test, y_test)}
for name, baseline in baselines.items():
    # KernelRidge does not centre y; daskkrr fits an intercept. Centre y for a fair comparison.
    baseline.fit(X_train, y_train - y_train.mean())
    scores[name] = baseline.score(X_test, y_test - y_train.mean())
for name, score in scores.items():
    print(f"{name:<32} R^2 = {score:.3f}")

# %%
# Save and load
# -------------
# ``save`` writes arrays and JSON metadata to a folder (no pickle);
# :func:`daskkrr.load` reads it back, checking every file, and returns a fitted
# estimator whose predictions are those of the original.

workdir = Path(tempfile.mkdtemp())
model.save(workdir / "diabetes-model")
loaded = daskkrr.load(workdir / "diabetes-model")
print("same predictions:", np.allclose(loaded.predict(X_test), model.predict(X_test)))

# %%
# Predict with uncertainty
# ------------------------
# Fitted with ``compute_std=True``, the model also gives the posterior standard
# deviation of its prediction (see the user guide, "Predictive uncertainty").
# Adding the estimated noise variance gives intervals for new observations.

model_std = FalkonRegressor(n_centers=200, sigma=sigma, penalty=penalty, compute_std=True, random_state=0)
model_std.fit(X_train, y_train)
mean, f_std = model_std.predict(X_test, return_std=True)
y_std = np.sqrt(f_std**2 + model_std.noise_variance_)
inside = np.abs(y_test - mean) <= 1.96 * y_std
print(f"{inside.mean():.0%} of the test targets inside their 95% interval")

order = np.argsort(mean)
fig, ax = plt.subplots(figsize=(7, 4))
ax.errorbar(np.arange(len(order)), mean[order], yerr=1.96 * y_std[order], fmt="none", alpha=0.3, label="95% interval")
ax.scatter(np.arange(len(order)), y_test[order], s=8, color="k", label="true progression")
ax.set(xlabel="test patients, sorted by prediction", ylabel="disease progression")
ax.legend()
fig.tight_layout()

# %%
# Out of core, from a Zarr store
# ------------------------------
# For data larger than memory, write the rows once to a row-chunked Zarr store
# (:func:`daskkrr.write_zarr`, or ``daskkrr convert`` for CSV/TSV files) and fit on
# the path: every pass streams the chunks, and only ``M``-sized vectors reach the
# client. Here the chunks are 64 rows, so the fit streams 6 blocks per pass.

store = daskkrr.write_zarr(X_train, y_train, workdir / "diabetes.zarr", chunk_rows=64)
X_lazy, y_lazy = daskkrr.open_dataset(store)
print(X_lazy)
from_store = FalkonRegressor(n_centers=200, sigma=sigma, penalty=penalty, random_state=0).fit(store)
print(f"fitted from Zarr, test R^2: {from_store.score(X_test, y_test):.3f}")

# %%
# On a Dask cluster
# -----------------
# With a ``distributed`` client active, the block tasks run on its workers. Here a
# ``LocalCluster`` of two worker threads in this process, reached over TCP on the
# loopback address (``processes=False`` keeps this page's script simple: worker
# processes would re-import a script that has no ``if __name__ == "__main__"``
# guard). On a real cluster, pass the scheduler's address to ``Client`` and give
# the workers the store at the same path.

cluster = LocalCluster(
    n_workers=2,
    threads_per_worker=1,
    processes=False,
    protocol="tcp://",
    host="127.0.0.1",
    dashboard_address="127.0.0.1:0",  # any free port
)
with cluster, Client(cluster) as client:
    on_cluster = FalkonRegressor(n_centers=200, sigma=sigma, penalty=penalty, random_state=0).fit(store)
    print(f"fitted on {client}, test R^2: {on_cluster.score(X_test, y_test):.3f}")
    print("Dask dashboard (the daskkrr page, live during a fit, is <dashboard>/daskkrr):", client.dashboard_link)

# %%
# Where next: the user guide's pages on running fits (``daskkrr run`` workflows, the
# CLI), on choosing ``sigma``, ``penalty`` and ``n_centers``, and the example gallery.
