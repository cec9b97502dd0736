"""
Bandit optimisation with BKB: cumulative regret
===============================================

:class:`daskkrr.bandits.BKB` maximises an unknown function over a finite set of
arms from noisy evaluations, choosing each arm by an upper confidence bound of a
Gaussian-process posterior kept on a small, adaptive Nystrom dictionary. The
cumulative regret (the sum of ``f(best) - f(chosen)``) grows sub-linearly when the
bandit learns; a random search's grows linearly. The dictionary stays far smaller
than the number of steps.
"""

import matplotlib.pyplot as plt
import numpy as np

from daskkrr.bandits import BKB

rng = np.random.default_rng(0)
grid = np.linspace(0.0, 1.0, 30)
arms = np.array([(a, b) for a in grid for b in grid])  # 900 arms in [0, 1]^2
f = np.exp(-((arms - [0.7, 0.3]) ** 2).sum(axis=1) / 0.05) + 0.5 * np.exp(
    -((arms - [0.2, 0.8]) ** 2).sum(axis=1) / 0.02
)
steps, noise = 300, 0.1

# beta_scale shrinks the theoretical confidence width, which over-explores (as GP-UCB's practice does)
bandit = BKB(
    arms, sigma=0.2, penalty=noise**2, noise_bound=noise, norm_bound=1.0, beta_scale=0.05, qbar=2.0, random_state=0
)
bkb_regret = []
for _ in range(steps):
    i = bandit.ask()
    bandit.tell(i, f[i] + noise * rng.normal())
    bkb_regret.append(f.max() - f[i])
random_regret = f.max() - f[rng.integers(len(arms), size=steps)]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
ax1.plot(np.cumsum(bkb_regret), label="BKB")
ax1.plot(np.cumsum(random_regret), label="random arms")
ax1.set(xlabel="step t", ylabel="cumulative regret", title="regret")
ax1.legend()
ax2.plot(bandit.dictionary_size_)
ax2.set(xlabel="step t", ylabel="|S_t|", title="dictionary size")
fig.tight_layout()
print("best arm found:", arms[int(np.argmax(bandit.mean_))], "true best:", arms[int(np.argmax(f))])
