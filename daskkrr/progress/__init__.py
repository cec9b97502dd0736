"""Progress of fits: a bar for terminals and notebooks, log records, the dashboard feed.

>>> from daskkrr.progress import report
>>> with report(bar=True):          # doctest: +SKIP
...     model.fit("train.zarr")

Estimators with ``verbose=True`` show the bar without :func:`report`. Every fit
on a ``distributed`` client also publishes its progress to the scheduler, where
the daskkrr dashboard page (``<dashboard>/daskkrr``) shows it live.
"""

from daskkrr.progress.bar import ProgressBar, describe, in_notebook
from daskkrr.progress.state import ANNOTATION, PHASES, FitProgress
from daskkrr.progress.tracker import FitTracker, fit_progress, report

__all__ = [
    "ANNOTATION",
    "PHASES",
    "FitProgress",
    "FitTracker",
    "ProgressBar",
    "describe",
    "fit_progress",
    "in_notebook",
    "report",
]
