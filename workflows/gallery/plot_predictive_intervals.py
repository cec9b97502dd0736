"""
Predictive intervals
====================

With ``compute_std=True`` a regressor keeps the Gaussian-process posterior of its
Nystrom fit, and ``predict(X, return_std=True)`` returns the standard deviation of
the latent function. Adding the estimated noise variance (``noise_variance_``)
gives the standard deviation of a new observation; mean +- 1.96 of it is a 95%
predictive interval. The interval widens away from the training data.
"""

import matplotlib.pyplot as plt
import numpy as np

from daskkrr import FalkonRegressor

rng = np.random.default_rng(0)
x = np.concatenate([rng.uniform(-3, -0.5, 150), rng.uniform(1, 3, 150)])  # a gap in (-0.5, 1)
y = np.sin(2 * x) + 0.2 * rng.normal(size=x.size)
model = FalkonRegressor(n_centers=100, sigma=0.5, penalty=1e-4, compute_std=True, random_state=0)
model.fit(x[:, None], y)

grid = np.linspace(-4, 4, 400)
mean, f_std = model.predict(grid[:, None], return_std=True)
y_std = np.sqrt(f_std**2 + model.noise_variance_)
covered = np.mean(np.abs(y - model.predict(x[:, None])) <= 1.96 * np.sqrt(
    model.predict(x[:, None], return_std=True)[1] ** 2 + model.noise_variance_))

fig, ax = plt.subplots(figsize=(7, 4))
ax.scatter(x, y, s=6, color="gray", label="training data")
ax.plot(grid, np.sin(2 * grid), "k--", lw=1, label="true function")
ax.plot(grid, mean, color="C0", label="prediction")
ax.fill_between(grid, mean - 1.96 * y_std, mean + 1.96 * y_std, alpha=0.25, color="C0", label="95% interval")
ax.set(xlabel="x", ylabel="y", title=f"{covered:.0%} of the training points inside the interval")
ax.legend(loc="lower left")
fig.tight_layout()
