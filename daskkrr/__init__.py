"""daskkrr: out-of-core kernel ridge regression on Dask and Zarr.

>>> from daskkrr import FalkonRegressor, open_dataset, load

The estimators and helpers are imported lazily, so ``import daskkrr.kernels``
(as a worker does to run a block task) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "ExactKernelRidge": "daskkrr.models",
    "FalkonClassifier": "daskkrr.models",
    "FalkonRegressor": "daskkrr.models",
    "NystromKernelKMeans": "daskkrr.models",
    "NystromKernelPCA": "daskkrr.models",
    "NystromRegressor": "daskkrr.models",
    "OnlineKernelRidge": "daskkrr.models",
    "load": ("daskkrr.models.loading", "load_model"),
    "open_dataset": "daskkrr.data",
    "write_zarr": "daskkrr.data",
}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'daskkrr' has no attribute {name!r}")
    module, attr = (target, name) if isinstance(target, str) else target
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
