"""The API reference lists the public API, and every name it lists has numpydoc sections.

The names are read from ``docs/api/index.rst`` (its autosummary entries); a listed
subpackage stands for every class and function in its ``__all__``. A class needs a
Parameters section when its constructor takes arguments (a dataclass may document
its fields as Attributes instead); a function needs Parameters
when it takes arguments and Returns (or Yields) unless it is annotated ``-> None``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

from numpydoc.docscrape import NumpyDocString

ROOT = Path(__file__).resolve().parents[1]
API_INDEX = ROOT / "docs" / "api" / "index.rst"
#: Engine layers and helpers the reference leaves out (see the note in docs/api/index.rst).
INTERNAL = ("daskkrr.solvers", "daskkrr.parallel", "daskkrr.pipeline", "daskkrr.guards", "daskkrr.dashboard",
            "daskkrr.utils", "daskkrr.testing")


def listed_names() -> list[str]:
    """The dotted names of the autosummary entries of the API index."""
    return re.findall(r"^   (daskkrr(?:\.\w+)+)$", API_INDEX.read_text(), flags=re.MULTILINE)


def resolve(dotted: str) -> Any:
    try:
        return importlib.import_module(dotted)
    except ImportError:
        module, _, attr = dotted.rpartition(".")
        return getattr(importlib.import_module(module), attr)


def public_objects() -> list[tuple[str, Any]]:
    """Every class and function the reference documents, with its documented name."""
    objects = []
    for dotted in listed_names():
        obj = resolve(dotted)
        if not inspect.ismodule(obj):
            objects.append((dotted, obj))
            continue
        for name in obj.__all__:
            member = getattr(obj, name)
            if inspect.isclass(member) or inspect.isfunction(member):
                objects.append((f"{dotted}.{name}", member))
    return objects


def takes_arguments(obj: Any) -> bool:
    parameters = inspect.signature(obj).parameters.values()
    return any(p.name not in ("self", "cls") for p in parameters)


def returns_value(func: Any) -> bool:
    # the package uses `from __future__ import annotations`: annotations are strings
    return inspect.signature(func).return_annotation not in ("None", None)


def missing_sections(obj: Any) -> list[str]:
    """The numpydoc sections ``obj``'s docstring lacks."""
    doc = NumpyDocString(inspect.getdoc(obj) or "")
    missing = []
    # a dataclass's fields are its constructor's parameters: an Attributes section documents both
    fields_documented = dataclasses.is_dataclass(obj) and bool(doc["Attributes"])
    if takes_arguments(obj) and not (doc["Parameters"] or fields_documented):
        missing.append("Parameters")
    if inspect.isfunction(obj) and returns_value(obj) and not (doc["Returns"] or doc["Yields"]):
        missing.append("Returns")
    return missing


def test_reference_lists_no_internal_module():
    listed = listed_names()
    assert listed, f"no autosummary entries found in {API_INDEX}"
    internal = [name for name in listed if name.startswith(INTERNAL)]
    assert not internal, f"{API_INDEX.relative_to(ROOT)} lists internal modules {internal}; remove them"


def test_reference_lists_the_top_level_api():
    import daskkrr

    listed = set(listed_names())
    absent = [name for name in daskkrr.__all__ if name != "__version__" and f"daskkrr.{name}" not in listed]
    assert not absent, f"{API_INDEX.relative_to(ROOT)} lacks daskkrr.{absent}; add them to its autosummary"


def test_every_listed_name_has_parameters_and_returns():
    problems = [
        f"{name}: no {' or '.join(missing)} section ({inspect.getsourcefile(obj)})"
        for name, obj in public_objects()
        # an exception's arguments are its message, by convention left undocumented
        if not (inspect.isclass(obj) and issubclass(obj, BaseException))
        if (missing := missing_sections(obj))
    ]
    assert not problems, "numpydoc sections missing:\n" + "\n".join(problems)


def test_the_check_sees_a_missing_section():
    """The checker itself: a docstring without sections is reported, one with them is not."""

    def undocumented(a: int) -> int:
        """Add one."""
        return a + 1

    def documented(a: int) -> int:
        """Add one.

        Parameters
        ----------
        a : int

        Returns
        -------
        int
        """
        return a + 1

    def no_result(a: int) -> None:
        """Nothing.

        Parameters
        ----------
        a : int
        """

    assert missing_sections(undocumented) == ["Parameters", "Returns"]
    assert missing_sections(documented) == []
    assert missing_sections(no_result) == []
