"""Plain, strict JSON from numpy-laden values: one sanitiser for model files, checkpoints and runs.

The NaN policy: strict JSON (RFC 8259) has no NaN or infinities, so every
non-finite float becomes ``null``. Files written this way are read by any JSON
parser; files written before (which could hold the non-standard ``NaN`` token)
still load, since Python's reader accepts it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

__all__ = ["SAMPLER_CENTERS_ARRAY", "dumps_strict", "jsonable", "jsonable_params"]

#: Name, in a model file's arrays, of the centers the user passed as ``sampler=``.
SAMPLER_CENTERS_ARRAY = "sampler_centers"


def jsonable(value: Any) -> Any:
    """Plain-Python, strict-JSON copy of ``value``.

    numpy scalars and arrays (any shape) become Python numbers and nested lists,
    tuples become lists, mapping keys become strings, and NaN or infinite floats
    become None. Other values (str, int, bool, None, ...) are returned unchanged.

    Parameters
    ----------
    value : object
        A number, string, numpy scalar or array, or a dict/list/tuple of these.

    Returns
    -------
    object
        A value ``json.dumps(..., allow_nan=False)`` accepts (if the leaves are JSON types).
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`jsonable` ``(value)``, refusing anything non-standard.

    ``kwargs`` go to :func:`json.dumps` (``indent``, ``sort_keys``, ``default``).
    """
    return json.dumps(jsonable(value), allow_nan=False, **kwargs)


def jsonable_params(estimator: Any) -> dict[str, Any]:
    """An estimator's ``get_params(deep=False)`` as JSON-ready values.

    The ``client`` is left out (it belongs to the session, not the model); a
    sampler object is recorded by its name, an array of centers as ``{"array": "sampler_centers"}``
    (the model file's arrays hold it), a kernel object by its ``to_dict()``,
    and a ``random_state`` that is not an int or None (a Generator) as None.
    """
    params = {}
    for key, value in estimator.get_params(deep=False).items():
        if key == "client":
            continue
        if key == "sampler" and isinstance(value, np.ndarray):  # the user's centers: in the arrays, named here
            value = {"array": SAMPLER_CENTERS_ARRAY}
        elif key == "sampler" and not isinstance(value, str):
            value = getattr(value, "name", None) or type(value).__name__
        if key == "kernel" and not isinstance(value, str):
            value = value.to_dict()
        if isinstance(value, np.generic):
            value = value.item()
        if key == "random_state" and not (value is None or isinstance(value, int)):
            value = None
        params[key] = jsonable(value)
    return params
