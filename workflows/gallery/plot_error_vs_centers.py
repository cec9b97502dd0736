"""
Test error against the number of centers
========================================

FALKON approximates kernel ridge regression with ``M`` centers (Nystrom). The test
error falls as ``M`` grows and levels off once the centers span the part of the
kernel's feature space the data use; the exact solution (``ExactKernelRidge``, all
``n`` rows as centers) is the floor. The centers are drawn uniformly; the leverage
score samplers (``sampler="squeak"``, ``"bless"``) reach the floor with fewer centers
on data with sparse regions, at the cost of a sampling pass.
"""

import matplotlib.pyplot as plt
import numpy as np

from daskkrr import ExactKernelRidge, FalkonRegressor

rng = np.random.default_rng(0)
n, d = 1500, 3
X = rng.normal(size=(n, d))
y = np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=n)
X_train, X_test, y_train, y_test = X[:1000], X[1000:], y[:1000], y[1000:]
params = dict(sigma=1.5, penalty=1e-5)


def rmse(model) -> float:
    return float(np.sqrt(np.mean((model.predict(X_test) - y_test) ** 2)))


centers = [5, 10, 20, 40, 80, 160]
seeds = range(3)
errors = np.array(
    [[rmse(FalkonRegressor(n_centers=m, random_state=s, **params).fit(X_train, y_train)) for m in centers]
     for s in seeds]
)
exact = rmse(ExactKernelRidge(**params).fit(X_train, y_train))

fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(centers, np.median(errors, axis=0), "o-", label="FALKON, uniform centers (median of 3 draws)")
ax.fill_between(centers, errors.min(axis=0), errors.max(axis=0), alpha=0.2)
ax.axhline(exact, color="k", ls="--", label="exact KRR (n centers)")
ax.axhline(0.1, color="gray", ls=":", label="noise level")
ax.set(xscale="log", yscale="log", xlabel="number of centers M", ylabel="test RMSE")
ax.legend()
fig.tight_layout()
