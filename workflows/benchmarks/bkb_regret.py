"""BKB and BatchBKB against exact GP-UCB on discretised Branin and Hartmann-6.

Problems (rewards are the function, maximised, standardised over the arms;
observed with Gaussian noise of standard deviation 0.1):

- ``branin``: Branin on a 50 x 50 grid of [0, 1]^2 (rescaled from [-5, 10] x [0, 15]): 2500 arms;
- ``hartmann6``: Hartmann-6 (negated) at 1000 uniform points of [0, 1]^6 plus its optimum
  (1001 arms: with 3001 arms and T = 1000 the run timed out, issue 40; each step's cost
  grows with the arms, so this bounds the time; the cited run used ``--T 300``).

Methods, all with a Gaussian kernel, penalty 0.01 (the noise variance), delta
0.5 and BKB's ``beta~_t`` with eps = 0 (:func:`daskkrr.bandits.confidence_width`;
exact GP-UCB uses the same formula with its exact variances). Kernel sigma,
noise bound xi and norm bound F per problem (:data:`SETTINGS`): Branin sigma 0.3,
xi 0.05, F 0.5; Hartmann-6 sigma 0.4, xi 0.01, F 0.2. The theoretical constants
(xi = the noise's 0.1, F = the true RKHS norm) make ``beta~`` grow with the
effective dimension and, in 6 dimensions, GP-UCB and BKB alike only explore for
the first thousand steps; smaller constants are the usual practice.

- ``gp-ucb``: exact GP-UCB. Its posterior is updated incrementally (the Cholesky
  factor and ``L^{-1} K_{t,A}`` grow by a row per step: O(t A) time and memory
  per step); the textbook step that refactors and re-solves for all arms
  (O(t^3 + t^2 A)) is timed separately at a few t (``exact_recompute_step_s``);
- ``bkb``: :class:`daskkrr.bandits.BKB`, qbar = 2;
- ``bkb-defaults``: :class:`daskkrr.bandits.BKB` with its defaults but ``sigma``: the noise
  bound, penalty, norm bound and prior mean estimated online (``"auto"``, by the evidence:
  :func:`daskkrr.bandits.evidence_penalty`) and the dimension width
  (:func:`daskkrr.bandits.dimension_width`; before issue 40's second round, the
  finite-arm-set width :func:`daskkrr.bandits.bayesian_width`, now ``width="arms"``), qbar = 4;
- ``batch-bkb-defaults``: :class:`daskkrr.bandits.BatchBKB` likewise with its defaults but
  ``sigma`` (adaptive batches, ratio threshold 2);
- ``bkb-residuals``, ``batch-bkb-residuals``: the same with ``noise_estimate="residuals"``, the
  defaults before issue 40's third round (running mean, noise from the posterior mean's residuals);
- ``batch-bkb-B``: :class:`daskkrr.bandits.BatchBKB` with a fixed batch of B arms;
- ``batch-bkb-adaptive``: BatchBKB with BBKB's adaptive rule (C~ = 2).

Each (problem, method) runs in a fresh process over all seeds (the peak memory
is that process's); seed ``s`` draws the noise of every method from the same
generator, so the methods meet the same seeds. Reported: the median over seeds of
the cumulative regret R_T, its mean, the ratios of both to GP-UCB's with 90%
bootstrap intervals (the seeds resampled in pairs, :func:`bootstrap_ratios`), the
exponent a of R_t ~ t^a fitted on t in [T/4, T], |S_T|, the seconds
per step over the last 10% of steps, the rounds (model updates) and the total
time. ``results/bkb_regret.png`` plots the median regret and dictionary size
against t.

Run ``python workflows/benchmarks/bkb_regret.py --quick`` (3 seeds); the full
run uses 20 seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_tools import emit, machine, print_table, run_child, write_results  # noqa: E402

NOISE, PENALTY, QBAR = 0.1, 0.01, 2.0
#: Per problem: kernel sigma, noise bound xi, norm bound F.
SETTINGS = {"branin": (0.3, 0.05, 0.5), "hartmann6": (0.4, 0.01, 0.2)}


# --------------------------------------------------------------------------- problems
def branin(n: int = 50) -> tuple[np.ndarray, np.ndarray]:
    g = np.linspace(0.0, 1.0, n)
    X = np.array([(a, b) for a in g for b in g])
    x1, x2 = -5 + 15 * X[:, 0], 15 * X[:, 1]
    f = (x2 - 5.1 / (4 * np.pi**2) * x1**2 + 5 / np.pi * x1 - 6) ** 2 + 10 * (1 - 1 / (8 * np.pi)) * np.cos(x1) + 10
    return X, _standard(-f)


_H6_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_H6_A = np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14],
                  [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]])
_H6_P = 1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                         [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])
_H6_OPT = np.array([0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573])


def hartmann6(n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    X = np.vstack([np.random.default_rng(12345).uniform(size=(n, 6)), _H6_OPT])
    inner = np.einsum("kj,ikj->ik", _H6_A, (X[:, None, :] - _H6_P[None]) ** 2)
    return X, _standard(np.exp(-inner) @ _H6_ALPHA)


def _standard(r: np.ndarray) -> np.ndarray:
    return (r - r.mean()) / r.std()


PROBLEMS = {"branin": branin, "hartmann6": hartmann6}


# --------------------------------------------------------------------------- exact GP-UCB
class ExactGPUCB:
    """GP-UCB with the exact posterior in BKB's units (prior k / lambda, unit noise)."""

    def __init__(self, arms: np.ndarray, sigma: float, xi: float, F: float, rng: np.random.Generator):
        from daskkrr.kernels import make_kernel

        self.arms, self.rng, self.k = arms, rng, make_kernel("gaussian", sigma=sigma)
        self.xi, self.F = xi, F
        self.L = np.zeros((0, 0))
        self.V = np.zeros((0, len(arms)))
        self.alpha = np.zeros(0)
        self.pulled: list[int] = []
        self.y: list[float] = []
        self.mean = np.zeros(len(arms))
        self.variance = np.ones(len(arms)) / PENALTY
        self.beta = self._beta()

    def _beta(self) -> float:
        from daskkrr.bandits import confidence_width

        return confidence_width(variance_sum=float(self.variance[self.pulled].sum()), t=len(self.pulled),
                                kappa2=1.0, penalty=PENALTY, noise_bound=self.xi, norm_bound=self.F, delta=0.5,
                                epsilon=0.0)

    def ask(self) -> int:
        u = self.mean + self.beta * np.sqrt(self.variance)
        return int(self.rng.choice(np.flatnonzero(u == u.max())))

    def tell(self, i: int, reward: float) -> None:
        import scipy.linalg as sla

        k_new = self.k(self.arms, self.arms[i : i + 1])[:, 0]
        n = len(self.pulled)
        l_row = sla.solve_triangular(self.L, k_new[self.pulled], lower=True) if n else np.zeros(0)
        l_diag = math.sqrt(k_new[i] + PENALTY - l_row @ l_row)
        L = np.zeros((n + 1, n + 1))
        L[:n, :n], L[n, :n], L[n, n] = self.L, l_row, l_diag
        v_new = (k_new - l_row @ self.V) / l_diag
        a_new = (reward - l_row @ self.alpha) / l_diag
        self.L, self.V, self.alpha = L, np.vstack([self.V, v_new]), np.append(self.alpha, a_new)
        self.pulled.append(i)
        self.y.append(reward)
        self.mean = self.mean + v_new * a_new
        self.variance = np.maximum(self.variance - v_new**2 / PENALTY, 0.0)
        self.beta = self._beta()

    def recompute_step(self) -> float:
        """Seconds of the textbook step: factor K_t + lambda I, solve for every arm."""
        import scipy.linalg as sla

        t0 = time.perf_counter()
        Xt = self.arms[self.pulled]
        L = np.linalg.cholesky(self.k(Xt, Xt) + PENALTY * np.eye(len(self.pulled)))
        W = sla.solve_triangular(L, self.k(Xt, self.arms), lower=True)
        mean = W.T @ sla.solve_triangular(L, np.asarray(self.y), lower=True)
        var = (1.0 - np.einsum("ij,ij->j", W, W)) / PENALTY
        u = mean + self.beta * np.sqrt(np.maximum(var, 0))
        int(np.argmax(u))
        return time.perf_counter() - t0


# --------------------------------------------------------------------------- one method, all seeds (child)
def child(args) -> dict:
    from daskkrr.bandits import BKB, BatchBKB
    from daskkrr.utils.threads import blas_threads

    arms, f = PROBLEMS[args.problem]()
    sigma, xi, F = SETTINGS[args.problem]
    T = args.T
    params = dict(sigma=sigma, penalty=PENALTY, qbar=QBAR, noise_bound=xi, norm_bound=F, epsilon=0.0)
    curves, sizes, step_s, rounds, total_s, recompute = [], [], [], [], [], {}
    with blas_threads(1):
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            if args.method == "gp-ucb":
                bandit = ExactGPUCB(arms, sigma, xi, F, rng)
            elif args.method == "bkb":
                bandit = BKB(arms, random_state=rng, **params)
            elif args.method == "bkb-defaults":  # only the kernel's length scale given: noise and scale estimated
                bandit = BKB(arms, sigma=sigma, random_state=rng)
            elif args.method == "batch-bkb-defaults":
                bandit = BatchBKB(arms, sigma=sigma, random_state=rng)
            elif args.method.endswith("residuals"):  # the former defaults
                cls = BatchBKB if args.method.startswith("batch") else BKB
                bandit = cls(arms, sigma=sigma, noise_estimate="residuals", random_state=rng)
            else:
                size = None if args.method.endswith("adaptive") else int(args.method.rsplit("-", 1)[1])
                bandit = BatchBKB(arms, random_state=rng, batch_size=size, ratio_threshold=2.0,
                                  max_batch_size=64, **params)
            regret: list[float] = []
            size_curve: list[int] = []
            times: list[float] = []
            n_rounds = 0
            t_start = time.perf_counter()
            while len(regret) < T:
                t0 = time.perf_counter()
                chosen = bandit.ask() if isinstance(bandit, BatchBKB) else [bandit.ask()]
                rewards = [float(f[i] + NOISE * rng.normal()) for i in chosen]
                if isinstance(bandit, BatchBKB):
                    bandit.tell_many(chosen, rewards)  # the last batch may pass T: the curve is cut at T
                else:
                    bandit.tell(chosen[0], rewards[0])
                dt = time.perf_counter() - t0
                n_rounds += 1
                size = len(bandit.pulled) if isinstance(bandit, ExactGPUCB) else len(bandit.dictionary_)
                for i in chosen:
                    regret.append(float(f.max() - f[i]))
                    times.append(dt / len(chosen))
                    size_curve.append(size)
                if args.method == "gp-ucb" and seed == 0 and len(regret) in (T // 4, T // 2, T):
                    recompute[len(regret)] = bandit.recompute_step()
            total_s.append(time.perf_counter() - t_start)
            curves.append(np.cumsum(regret[:T]))
            sizes.append(size_curve[:T])
            step_s.append(float(np.mean(times[T - max(1, T // 10) : T])))
            rounds.append(n_rounds)
    R = np.median(np.array(curves), axis=0)
    t = np.arange(1, T + 1)
    start = T // 4
    exponent = float(np.polyfit(np.log(t[start:]), np.log(R[start:]), 1)[0])
    final = np.array([c[-1] for c in curves])
    return dict(regret_T=float(np.median(final)), regret_q25=float(np.percentile(final, 25)),
        regret_q75=float(np.percentile(final, 75)), regret_mean=float(final.mean()),
        regret_T_per_seed=final.tolist(), exponent=exponent, S_T=float(np.median([s[-1] for s in sizes])),
        step_s=float(np.median(step_s)),
        rounds=float(np.median(rounds)), total_s=float(np.median(total_s)),
        exact_recompute_step_s={str(k): v for k, v in recompute.items()},
        regret_curve=R[:: max(1, T // 200)].tolist(), size_curve=np.median(np.array(sizes), axis=0)[
            :: max(1, T // 200)].tolist(), curve_t=t[:: max(1, T // 200)].tolist())


#: Bootstrap resamples of the seeds, and the interval's level.
BOOTSTRAP, LEVEL = 4000, 0.9


def bootstrap_ratios(values: np.ndarray, baseline: np.ndarray, seed: int = 0) -> dict[str, float]:
    """The ratios of the median and of the mean R_T to the baseline's, with percentile bootstrap intervals.

    Both methods ran on the same seeds (the same arms, noise draws up to their own choices), so the seeds
    are resampled in pairs: the interval says how much the ratio hangs on which seeds were drawn.
    """
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))
    out: dict[str, float] = {}
    for name, stat in (("median", np.median), ("mean", np.mean)):
        ratios = stat(values[picks], axis=1) / stat(baseline[picks], axis=1)
        low, high = np.quantile(ratios, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        out[f"{name}_ratio"] = float(stat(values) / stat(baseline))
        out[f"{name}_ratio_low"], out[f"{name}_ratio_high"] = float(low), float(high)
    return out


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is absent: no plot (pip install matplotlib)")
        return
    problems = sorted({r["problem"] for r in rows})
    fig, axes = plt.subplots(2, len(problems), figsize=(5.5 * len(problems), 7), squeeze=False)
    for j, problem in enumerate(problems):
        for r in (r for r in rows if r["problem"] == problem and "regret_curve" in r):
            axes[0, j].plot(r["curve_t"], r["regret_curve"], label=r["method"])
            axes[1, j].plot(r["curve_t"], r["size_curve"], label=r["method"])
        axes[0, j].set(title=f"{problem}: median cumulative regret", xlabel="t", ylabel="R_t")
        axes[1, j].set(title=f"{problem}: |S_t| (exact GP-UCB: t)", xlabel="t", ylabel="dictionary size")
        axes[0, j].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 seeds")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per method (default 20, --quick 3)")
    ap.add_argument("--T", type=int, default=1000, help="steps")
    ap.add_argument("--problems", default="branin,hartmann6")
    ap.add_argument("--methods", default="gp-ucb,bkb,bkb-defaults,batch-bkb-10,batch-bkb-adaptive,"
                                         "batch-bkb-defaults")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--problem", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.seeds = args.seeds or (3 if args.quick else 20)
    if args.child:
        emit(child(args))
        return []
    rows = []
    for problem in args.problems.split(","):
        base = None
        for method in args.methods.split(","):
            result = run_child([__file__, "--child", "--problem", problem, "--method", method, "--T", str(args.T),
                                "--seeds", str(args.seeds)], timeout=args.timeout)
            row = {"problem": problem, "method": method, "A": len(PROBLEMS[problem]()[0]), "T": args.T,
                   "seeds": args.seeds, **{k: v for k, v in result.items() if k != "peak_per_process_mb"}}
            if method == "gp-ucb" and "regret_T" in row:
                base = row
                row["exact_recompute_step_s_at_T"] = row["exact_recompute_step_s"].get(str(args.T))
            if base and "regret_T" in row:
                row["regret_vs_gp_ucb"] = row["regret_T"] / base["regret_T"]
                row["regret_mean_vs_gp_ucb"] = row["regret_mean"] / base["regret_mean"]
                if row is not base:
                    ratios = bootstrap_ratios(np.array(row["regret_T_per_seed"]), np.array(base["regret_T_per_seed"]))
                    row.update({f"vs_gp_ucb_{k}": v for k, v in ratios.items()})
                row["step_speedup_vs_gp_ucb"] = base["step_s"] / row["step_s"]
                recompute = base["exact_recompute_step_s"].get(str(args.T))
                if recompute:
                    row["step_speedup_vs_recompute"] = recompute / row["step_s"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}, default=float), flush=True)
    info = machine()
    print_table(rows, ["problem", "A", "T", "seeds", "method", "regret_T", "regret_q25", "regret_q75",
                       "regret_vs_gp_ucb", "vs_gp_ucb_median_ratio_low", "vs_gp_ucb_median_ratio_high",
                       "regret_mean", "regret_mean_vs_gp_ucb", "vs_gp_ucb_mean_ratio_low",
                       "vs_gp_ucb_mean_ratio_high", "exponent", "S_T", "rounds", "step_s", "step_speedup_vs_gp_ucb",
                       "step_speedup_vs_recompute", "exact_recompute_step_s_at_T", "total_s", "peak_mb", "error"],
                f"BKB vs exact GP-UCB, {info['cores']} cores ({info['cpu']}), load {info['load_average_1min']}")
    out = write_results(rows, args.out, "bkb_regret", {"machine": info, "args": vars(args)})
    plot(rows, out[0].with_suffix(".png"))
    return rows


if __name__ == "__main__":
    main()
