"""Progress of fits: a bar for terminals and notebooks, log records, the dashboard feed.

>>> from daskkrr.progress import report
>>> with report(bar=True):          # doctest: +SKIP
...     model.fit("train.zarr")

Estimators with ``verbose=True`` show the bar without :func:`report`. Every fit
on a ``distributed`` client also publishes its progress to the scheduler, where
the daskkrr dashboard page (``<dashboard>/daskkrr``) shows it live.
"""

from daskkrr.progress.bar import ProgressBar, describe, in_notebook
from daskkrr.progress.state import ANNOTATION, BLOCK_TASKS, PHASES, FitProgress
from daskkrr.progress.tracker import FitTracker, current_tracker, fit_progress, report, tracked_fit

__all__ = [
    "ANNOTATION",
    "BLOCK_TASKS",
    "PHASES",
    "FitProgress",
    "FitTracker",
    "ProgressBar",
    "current_tracker",
    "describe",
    "fit_progress",
    "in_notebook",
    "report",
    "tracked_fit",
]
