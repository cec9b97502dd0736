"""The named benchmarks: which script measures what, and what each figure is compared to.

Each entry points at a script in this folder that already measures its figures (each fit
in a fresh process through :func:`fit_tools.run_child`, where it fits models) and writes
``{"meta": ..., "rows": [...]}`` through :func:`fit_tools.write_results`. The runner
(``python -m workflows.benchmarks``) runs the script unchanged, with ``--out`` pointed at a
scratch folder, and reads those rows back.

A comparison says where each row's baseline is, measured in the same run:

- :class:`BaselineRows`: other rows of the same table (``column == baseline``, matched on
  ``match``), e.g. scikit-learn's fit beside daskkrr's on the same data and size;
- :class:`PairedColumns`: columns of the same row, e.g. ``daskkrr_tta_s`` beside
  ``falkon_tta_s``.

A tuple of comparisons holds several baselines (each comparison row then names its own in
``against``), e.g. the dense route's rows and FALKON's beside the same fits.

Benchmarks with ``comparison=None`` report figures whose ratios the script computes
itself (``time_per_row_vs_1e6``, ``first_vs_warm``, ...) or that have no baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class BaselineRows:
    """Rows with ``column == baseline`` are the baseline of the rows that share ``match``."""

    column: str
    baseline: str
    match: tuple[str, ...]
    figures: tuple[str, ...]


@dataclass(frozen=True)
class PairedColumns:
    """Each row holds its own baseline: ``pairs[figure] = (candidate column, baseline column)``."""

    pairs: dict[str, tuple[str, str]]


@dataclass(frozen=True)
class Benchmark:
    """One named benchmark.

    ``key`` names the columns that identify a row (to line rows up across repeats and
    between two results); ``quick_args`` are the script's arguments for a short run
    (``None``: the script has no short size).
    """

    name: str
    script: str
    summary: str
    key: tuple[str, ...]
    comparison: BaselineRows | PairedColumns | tuple[BaselineRows | PairedColumns, ...] | None = None
    quick_args: tuple[str, ...] | None = ("--quick",)

    @property
    def path(self) -> Path:
        return HERE / self.script


def _rows(column: str, baseline: str, match: tuple[str, ...], *figures: str) -> BaselineRows:
    return BaselineRows(column, baseline, match, figures)


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("engine_throughput", "engine_throughput.py",
              "kernel entries per second of the fused engine against the numpy loop and GEMM's rate",
              key=("dtype", "d"),
              comparison=PairedColumns({"entries_per_s": ("fused_Mps", "numpy_Mps"),
                                        "entries_per_s_vs_gemm": ("fused_Mps", "gemm_Mps"),
                                        "entries_per_s_1_thread": ("fused_1t_Mps", "numpy_1t_Mps")})),
    Benchmark("fit_vs_sklearn", "fit_vs_sklearn.py",
              "fit time, memory and test error against scikit-learn's Nystroem + Ridge on the same centers",
              key=("data", "n", "M", "method"),
              comparison=_rows("method", "sklearn-nystroem", ("data", "n", "M"), "fit_s", "peak_mb", "rmse")),
    Benchmark("time_to_accuracy", "time_to_accuracy.py",
              "time to 1.01x the best test RMSE, daskkrr against FALKON (CPU) in fresh processes",
              key=("data", "n", "M", "dtype"),
              comparison=PairedColumns({"time_to_accuracy_s": ("daskkrr_tta_s", "falkon_tta_s"),
                                        "peak_mb": ("daskkrr_peak_mb", "falkon_peak_mb"),
                                        "rmse": ("daskkrr_rmse", "falkon_rmse")})),
    Benchmark("parquet_input", "parquet_input.py",
              "a Parquet folder converted to Zarr and fitted, against fitted directly: time and peak memory",
              key=("n", "route"),
              comparison=_rows("route", "zarr", ("n",), "total_s", "fit_s", "peak_mb")),
    Benchmark("scaling_zarr", "scaling_zarr.py",
              "fit time and memory from a Zarr store as n grows (ratios to n = 1e6 in the rows)",
              key=("n", "M")),
    Benchmark("workers_scaling", "workers_scaling.py",
              "fit time on 1, 2 and 4 single-threaded workers, and the model's prediction for more",
              key=("config", "n", "M"),
              comparison=_rows("config", "1 worker, 1 core", ("n", "M"), "fit_s", "peak_mb")),
    Benchmark("logistic_vs_baselines", "logistic_vs_baselines.py",
              "kernel logistic regression against FALKON's and scikit-learn's",
              key=("data", "method"),
              comparison=_rows("method", "falkon-logistic", ("data",), "fit_s", "log_loss", "accuracy", "peak_mb")),
    Benchmark("numpy_on_cluster", "numpy_on_cluster.py",
              "a fit from numpy arrays under a distributed client against the same fit from a Zarr store",
              key=("input", "n"), comparison=_rows("input", "zarr", ("n",), "seconds", "large_graph_warnings")),
    Benchmark("cold_start", "cold_start.py", "first fit after an install against a warm fit (ratio in the rows)",
              key=("case", "engine")),
    Benchmark("sketch_cost", "sketch_cost.py", "the preconditioner's row sketch against the earlier default",
              key=("case", "method"),
              comparison=_rows("method", "old-default", ("case",), "fit_s", "rmse", "peak_mb")),
    Benchmark("squeak_scale", "squeak_scale.py",
              "SQUEAK and DISQUEAK as the dictionary m grows: time, CPU seconds, peak memory per process, state bytes",
              key=("method", "m")),
    Benchmark("many_centers", "many_centers.py",
              "the tiled preconditioner (no M x M matrix in one process) against the dense one and FALKON, by M",
              key=("M", "method"),
              comparison=(_rows("method", "dense", ("M",), "fit_s", "rmse", "peak_mb", "max_process_mb"),
                          _rows("method", "falkon", ("M",), "equal_error_s", "fit_s", "rmse", "peak_mb",
                                "max_process_mb"))),
    Benchmark("sample_weight_cost", "sample_weight_cost.py", "the cost of sample weights against an unweighted fit",
              key=("strategy", "variant"),
              comparison=_rows("variant", "unweighted", ("strategy",), "fit_s", "peak_mb")),
    Benchmark("sparse_input", "sparse_input.py",
              "a FALKON fit on sparse CSR rows (density 1%) against the same fit on the densified rows",
              key=("variant",),
              comparison=_rows("variant", "dense", (), "fit_s", "peak_mb")),
    Benchmark("exact_fashion_mnist", "exact_fashion_mnist.py", "exact KRR (PCG) against FALKON on Fashion-MNIST",
              key=("method",),
              comparison=_rows("method", "exact", (), "fit_s", "test_accuracy", "peak_mb")),
    Benchmark("exact_pcg_table4", "exact_pcg_table4.py", "preconditioned CG for exact KRR, by preconditioner",
              key=("dataset", "method")),
    Benchmark("predictive_std", "predictive_std.py", "the cost of predictive standard deviations",
              key=("method",)),
    Benchmark("std_calibration", "std_calibration.py", "calibration of predictive intervals",
              key=("penalty",), quick_args=None),
    Benchmark("fast_variance", "fast_variance.py",
              "return_std with the fast (low-rank) and the exact variance against predict, and the fast one's errors",
              key=("M",)),
    Benchmark("convergence_defaults", "convergence_defaults.py", "CG iterations and score at the default tolerance",
              key=("dataset", "task", "tol"), quick_args=("--max-rows", "2000")),
    Benchmark("bkb_regret", "bkb_regret.py", "BKB's regret and step time against GP-UCB",
              key=("problem", "method"),
              comparison=_rows("method", "gp-ucb", ("problem",), "regret_T", "step_s", "peak_mb")),
    Benchmark("online_regret", "online_regret.py", "online KRR regret against its bounds", key=("model",)),
    Benchmark("online_speed", "online_speed.py", "online updates per batch and per stream",
              key=("part", "lam", "batch_index")),
    Benchmark("tune_pmlb", "tune_pmlb.py", "BKBSearchCV against a 20-point grid on PMLB sets",
              key=("set", "method"),
              comparison=_rows("method", "grid-20", ("set",), "r2", "seconds", "peak_mb")),
    Benchmark("tune_arm_length", "tune_arm_length.py", "BKB arm length against a grid", key=("set", "seed", "method"),
              comparison=_rows("method", "grid-20", ("set", "seed"), "test_r2")),
    Benchmark("unsupervised_dask_ml", "unsupervised_dask_ml.py", "Nystrom kernel k-means against dask-ml's KMeans",
              key=("method",)),
    Benchmark("unsupervised_m_sweep", "unsupervised_m_sweep.py", "kernel k-means and PCA error against M",
              key=("method", "M")),
    Benchmark("unsupervised_out_of_core", "unsupervised_out_of_core.py", "kernel k-means and PCA from a Zarr store",
              key=("n", "task")),
    Benchmark("unsupervised_quality", "unsupervised_quality.py", "clustering quality against k-means on raw features",
              key=("data", "method"),
              comparison=_rows("method", "sklearn KMeans (raw)", ("data",), "ari", "nmi", "seconds", "peak_mb")),
)}
