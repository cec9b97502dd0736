"""scikit-learn style estimators and model files."""

from daskkrr.models.base import NystromModelBase
from daskkrr.models.classifier import FalkonClassifier
from daskkrr.models.persistence import load_model, save_model
from daskkrr.models.regressors import ExactKernelRidge, FalkonRegressor, NystromRegressor

__all__ = [
    "ExactKernelRidge",
    "FalkonClassifier",
    "FalkonRegressor",
    "NystromModelBase",
    "NystromRegressor",
    "load_model",
    "save_model",
]
