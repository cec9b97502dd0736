"""
Kernel PCA embedding of handwritten digits
==========================================

``NystromKernelPCA`` computes the leading kernel principal components on ``M``
centers and projects any row onto them, block by block. Here the 1797 8x8 digit
images bundled with scikit-learn are embedded in two dimensions; the digits,
which the model never sees, mostly fall into separate groups.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import load_digits

from daskkrr import NystromKernelPCA

X, digit = load_digits(return_X_y=True)
pca = NystromKernelPCA(n_components=2, n_centers=300, sigma=4.0, random_state=0)
embedding = pca.fit_transform(X)

fig, ax = plt.subplots(figsize=(6, 5))
points = ax.scatter(embedding[:, 0], embedding[:, 1], c=digit, cmap="tab10", s=8)
fig.colorbar(points, ax=ax, label="digit")
ax.set(xlabel="component 1", ylabel="component 2", title="Nystrom kernel PCA, M = 300")
fig.tight_layout()
