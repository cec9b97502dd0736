"""The estimators by the names config files, workflow files and the CLI use.

The one list of estimators: :mod:`daskkrr.config` and :mod:`daskkrr.workflow.spec`
check ``estimator = "..."`` against it, ``daskkrr fit --estimator`` offers its
names (and a flag for every parameter of its classes), and
:mod:`daskkrr.models.persistence` loads model files only of its classes.
"""

from __future__ import annotations

from daskkrr.models.classifier import FalkonClassifier
from daskkrr.models.online import OnlineKernelRidge
from daskkrr.models.regressors import (
    ExactKernelRidge,
    FalkonRegressor,
    NystromRegressor,
)
from daskkrr.models.unsupervised import NystromKernelKMeans, NystromKernelPCA

#: name -> estimator class.
ESTIMATORS: dict[str, type] = {
    "falkon": FalkonRegressor,
    "nystrom": NystromRegressor,
    "exact": ExactKernelRidge,
    "classifier": FalkonClassifier,
    "online": OnlineKernelRidge,
}

#: name -> unsupervised estimator class (``daskkrr embed`` / ``daskkrr cluster``; no target).
UNSUPERVISED: dict[str, type] = {
    "kpca": NystromKernelPCA,
    "kmeans": NystromKernelKMeans,
}

#: The estimator of configs that name none.
DEFAULT_ESTIMATOR = "falkon"


def estimator_class(name: str) -> type:
    """The class registered as ``name``; ValueError naming the choices otherwise."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def classes_by_class_name() -> dict[str, type]:
    """Registered classes by ``__name__``, as model files name them."""
    return {cls.__name__: cls for cls in (*ESTIMATORS.values(), *UNSUPERVISED.values())}
