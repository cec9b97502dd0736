"""
Fit time against the number of rows
===================================

With ``M`` centers fixed, one FALKON fit costs ``O(n M)`` per conjugate gradient
iteration plus ``O(M^3)`` for the preconditioner, so its time grows linearly in ``n``.
Exact kernel ridge regression (scikit-learn's ``KernelRidge``) factors the ``n x n``
kernel matrix, ``O(n^3)``. The sizes here are small so the page builds quickly; the
figures depend on the machine that built this page.
"""

import time

import matplotlib.pyplot as plt
import numpy as np
from sklearn.kernel_ridge import KernelRidge

from daskkrr import FalkonRegressor

rng = np.random.default_rng(0)
sizes = [500, 1000, 2000, 4000]
sigma, penalty = 1.0, 1e-4
times: dict[str, list[float]] = {"daskkrr FALKON, M=200": [], "scikit-learn KernelRidge": []}
for n in sizes:
    X = rng.normal(size=(n, 4))
    y = np.sin(X.sum(axis=1)) + 0.1 * rng.normal(size=n)
    start = time.perf_counter()
    FalkonRegressor(n_centers=200, sigma=sigma, penalty=penalty, random_state=0).fit(X, y)
    times["daskkrr FALKON, M=200"].append(time.perf_counter() - start)
    start = time.perf_counter()
    # the same problem: Gaussian kernel exp(-|x-x'|^2 / (2 sigma^2)), alpha = penalty * n
    KernelRidge(kernel="rbf", gamma=1 / (2 * sigma**2), alpha=penalty * n).fit(X, y)
    times["scikit-learn KernelRidge"].append(time.perf_counter() - start)

fig, ax = plt.subplots(figsize=(6, 4))
for label, t in times.items():
    ax.plot(sizes, t, "o-", label=label)
ax.set(xscale="log", yscale="log", xlabel="rows n", ylabel="fit time (s)")
ax.legend()
fig.tight_layout()
