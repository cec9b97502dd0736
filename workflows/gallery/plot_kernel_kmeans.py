"""
Kernel k-means on two circles
=============================

Ordinary k-means separates clusters by straight lines. ``NystromKernelKMeans`` runs
Lloyd's algorithm in the feature space of a Gaussian kernel (restricted to the
span of ``M`` centers), where two concentric rings become separable.
"""

import matplotlib.pyplot as plt
from sklearn.cluster import KMeans
from sklearn.datasets import make_circles
from sklearn.metrics import adjusted_rand_score

from daskkrr import NystromKernelKMeans

X, truth = make_circles(n_samples=1000, noise=0.05, factor=0.4, random_state=0)
kernel_labels = NystromKernelKMeans(
    n_clusters=2, n_centers=200, sigma=0.3, standardize=False, n_init=10, random_state=0
).fit_predict(X)
linear_labels = KMeans(n_clusters=2, n_init=10, random_state=0).fit_predict(X)

fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
for ax, labels, name in ((axes[0], linear_labels, "k-means"), (axes[1], kernel_labels, "Nystrom kernel k-means")):
    ax.scatter(X[:, 0], X[:, 1], c=labels, cmap="coolwarm", s=8)
    ax.set_title(f"{name}: adjusted Rand index {adjusted_rand_score(truth, labels):.2f}")
fig.tight_layout()
