"""Packages whose exported names are imported on first use (PEP 562 ``__getattr__``).

A Dask worker imports a task function's module, and with it every ``__init__`` above it. A
package that imported all its modules up front made a worker that unpickles one small block
function import the rest as well (table converters with pandas and pyarrow, estimators with
scikit-learn); a lazy package imports only the module asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package that imports its names on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    exports : mapping of str to str
        Each exported name to the module of the package that defines it (``"loading"`` for
        ``package.loading``).

    Returns
    -------
    getattr : callable
        ``__getattr__(name)``: an exported name (imported from its module and cached in the
        package), else a submodule of the package (``package.name``, as an eager ``__init__``
        had made them attributes), else AttributeError.
    dir : callable
        ``__dir__()``: the exported names, sorted.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f"{package}.{module}"), name)
            namespace[name] = value  # found as a plain attribute from now on
            return value
        if name.startswith("__"):  # probes (copy, pickle, inspect) for attributes no module defines
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise  # the submodule exists, but an import inside it failed
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
