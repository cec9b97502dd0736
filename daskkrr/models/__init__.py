"""scikit-learn style estimators and model files."""

from daskkrr.models.base import NystromModelBase
from daskkrr.models.classifier import FalkonClassifier
from daskkrr.models.kernel_model import KernelModelBase
from daskkrr.models.loading import load_model
from daskkrr.models.online import OnlineKernelRidge
from daskkrr.models.persistence import save_model
from daskkrr.models.registry import ESTIMATORS, UNSUPERVISED, estimator_class
from daskkrr.models.regressors import (
    ExactKernelRidge,
    FalkonRegressor,
    NystromRegressor,
)
from daskkrr.models.unsupervised import NystromKernelKMeans, NystromKernelPCA

__all__ = [
    "ESTIMATORS",
    "ExactKernelRidge",
    "FalkonClassifier",
    "FalkonRegressor",
    "KernelModelBase",
    "NystromKernelKMeans",
    "NystromKernelPCA",
    "NystromModelBase",
    "NystromRegressor",
    "UNSUPERVISED",
    "OnlineKernelRidge",
    "estimator_class",
    "load_model",
    "save_model",
]
