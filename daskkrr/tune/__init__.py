"""Hyperparameter tuning of daskkrr estimators by batched Gaussian-process bandit (BBKB).

>>> from daskkrr.tune import BKBSearchCV

:class:`BKBSearchCV` draws candidates of ``sigma`` (scalar or per feature),
``penalty`` and ``n_centers`` in log space, asks :class:`daskkrr.bandits.BatchBKB`
which to try, fits each batch in parallel on the Dask cluster, and works as a
scikit-learn search (``best_params_``, ``best_estimator_``, ``cv_results_``).
"""

from daskkrr.tune.search import BKBSearchCV
from daskkrr.tune.space import default_space, draw_candidates, parse_space

__all__ = ["BKBSearchCV", "default_space", "draw_candidates", "parse_space"]
