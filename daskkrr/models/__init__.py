"""scikit-learn style estimators and model files."""

from daskkrr.models.base import NystromModelBase
from daskkrr.models.classifier import FalkonClassifier
from daskkrr.models.kernel_model import KernelModelBase
from daskkrr.models.loading import load_model
from daskkrr.models.online import OnlineKernelRidge
from daskkrr.models.persistence import save_model
from daskkrr.models.registry import ESTIMATORS, estimator_class
from daskkrr.models.regressors import (
    ExactKernelRidge,
    FalkonRegressor,
    NystromRegressor,
)

__all__ = [
    "ESTIMATORS",
    "ExactKernelRidge",
    "FalkonClassifier",
    "FalkonRegressor",
    "KernelModelBase",
    "NystromModelBase",
    "NystromRegressor",
    "OnlineKernelRidge",
    "estimator_class",
    "load_model",
    "save_model",
]
