"""Optional dependencies, looked up without importing them."""

from __future__ import annotations

import functools
import importlib.util


@functools.cache
def numba_installed() -> bool:
    """Whether numba can be imported (without importing it)."""
    return importlib.util.find_spec("numba") is not None
