"""Estimator parameters as data: what TOML keys and command-line flags accept.

:func:`param_specs` reads an estimator class's ``_parameter_constraints``, its
``__init__`` defaults and the numpydoc "Parameters" section of its docstring, so
a parameter added to an estimator appears in config files and ``daskkrr fit``
with no other code. Only plain values are representable there (numbers, bools,
strings, tables); TOML has no null, so any parameter that accepts None takes
the string ``"none"`` for it.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from sklearn.utils._param_validation import Interval, Options, StrOptions

#: Parameters set by the program running the fit, never by a config file or flag.
RUNTIME_PARAMS = frozenset({"verbose"})


@dataclass(frozen=True)
class ParamSpec:
    """One estimator parameter as a config file or the command line sees it.

    Attributes
    ----------
    name : str
        The ``__init__`` argument.
    types : tuple of type
        Plain types a value may have, among ``bool, int, float, list, str, dict``
        (``float`` accepts ints too; ``list`` is a list of numbers, e.g. one length
        scale per feature, written ``[1, 2]`` in TOML and ``1,2`` on the command
        line). Empty: not representable outside Python.
    options : tuple of str or None
        The strings accepted, when the parameter takes a fixed set; None means
        any string (when ``str`` is in ``types``).
    nullable : bool
        Whether None is accepted (written ``"none"`` in TOML and on the CLI).
    default : object
        The ``__init__`` default.
    help : str
        The docstring's description, on one line.
    """

    name: str
    types: tuple[type, ...]
    options: tuple[str, ...] | None
    nullable: bool
    default: Any
    help: str

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--n-centers``."""
        return "--" + self.name.replace("_", "-")

    def _type_words(self) -> list[str]:
        """Type names (float reads "int or float": it takes ints), strings of fixed options left out."""
        names = {float: "int or float", list: "list of numbers"}
        return [names.get(t, t.__name__) for t in self.types if not (t is str and self.options is not None)]

    def describe(self) -> str:
        """Accepted values in words, e.g. ``int, "auto" or "none"``."""
        words = self._type_words() + [f'"{o}"' for o in self.options or ()]
        if self.nullable:
            words.append('"none"')
        return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"

    def convert(self, value: Any) -> Any:
        """A TOML value as the estimator takes it (``"none"`` -> None); ValueError naming the key."""
        if value is None and self.nullable:  # from Python (a flag's "none" already parsed)
            return None
        if isinstance(value, str):
            if self.nullable and value.lower() == "none":
                return None
            if str in self.types and (self.options is None or value in self.options):
                return value
            if self.options is not None:
                raise ValueError(f"{self.name} must be {self.describe()}; got {value!r}")
        elif isinstance(value, list):
            if list in self.types and value and all(_is_number(v) for v in value):
                return value
        else:
            kind = next((k for k in (bool, int, float, dict) if isinstance(value, k)), None)  # bool first
            if kind is not None and (kind in self.types or (kind is int and float in self.types)):
                return value
        extra = '; "none" stands for None' if self.nullable else ""
        raise ValueError(
            f"{self.name} must be {' or '.join(self._type_words()) or self.describe()}; got {value!r} "
            f"({type(value).__name__}){extra}"
        )

    def parse_text(self, text: str) -> Any:
        """A command-line value: ``none``, a number or a string, as the types allow."""
        text = text.strip()
        if self.nullable and text.lower() == "none":
            return None
        if bool in self.types and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if int in self.types:
            try:
                return int(text)
            except ValueError:
                pass
        if float in self.types:
            try:
                return float(text)
            except ValueError:
                pass
        if list in self.types and "," in text:
            try:
                return [float(part) for part in text.split(",") if part.strip()]
            except ValueError:
                pass
        if str in self.types and (self.options is None or text in self.options):
            return text
        raise ValueError(f"expected {self.describe()}; got {text!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain_types(constraint: Any) -> tuple[tuple[type, ...], tuple[str, ...] | None, bool]:
    """(types, string options, accepts None) of one scikit-learn constraint."""
    if constraint is None:
        return (), None, True
    if constraint == "boolean":
        return (bool,), None, False
    if constraint == "random_state":
        return (int,), None, True
    if constraint == "array-like":
        return (list,), None, False
    if isinstance(constraint, Interval):
        return ((int,) if constraint.type is Integral else (float,)), None, False
    if isinstance(constraint, StrOptions):
        return (str,), tuple(sorted(constraint.options)), False
    if isinstance(constraint, Options):
        return _plain_types(constraint.type)[0], None, False
    if isinstance(constraint, type):
        if issubclass(constraint, bool):
            return (bool,), None, False
        if issubclass(constraint, str):
            return (str,), None, False
        if issubclass(constraint, dict):
            return (dict,), None, False
        if issubclass(constraint, Integral) or constraint is Integral:
            return (int,), None, False
        if issubclass(constraint, Real) or constraint is Real:
            return (float,), None, False
    return (), None, False  # objects (Kernel, CenterSampler, Generator, ...) exist only in Python


_ORDER = (bool, int, float, list, str, dict)


def _merge(constraints: list[Any]) -> tuple[tuple[type, ...], tuple[str, ...] | None, bool]:
    types: set[type] = set()
    options: set[str] = set()
    free_str = nullable = False
    for constraint in constraints:
        found, opts, none = _plain_types(constraint)
        types.update(found)
        nullable |= none
        if opts is None and str in found:
            free_str = True
        options.update(opts or ())
    if int in types and float in types:
        types.discard(int)  # float takes ints
    choices = None if free_str or not options else tuple(sorted(options))
    return tuple(t for t in _ORDER if t in types), choices, nullable


def parameter_docs(cls: type) -> dict[str, str]:
    """Descriptions of the numpydoc "Parameters" entries of ``cls`` (and its bases), one line each."""
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        text = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        for names, description in _parameter_entries(text):
            for name in names:
                docs.setdefault(name, description)
    return docs


def _parameter_entries(doc: str) -> list[tuple[list[str], str]]:
    lines = doc.splitlines()
    try:
        start = next(i for i in range(len(lines) - 1)
                     if lines[i].strip() == "Parameters" and set(lines[i + 1].strip()) == {"-"})
    except StopIteration:
        return []
    entries: list[tuple[list[str], list[str]]] = []
    for i in range(start + 2, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and set(lines[i + 1].strip()) == {"-"} and not line.startswith(" "):
            break  # the next section
        if line and not line.startswith(" "):
            names = line.split(" : ", 1)[0] if " : " in line else line
            entries.append(([n.strip() for n in names.split(",") if n.strip()], []))
        elif entries and line.strip():
            entries[-1][1].append(line.strip())
    return [(names, _plain_text(" ".join(body))) for names, body in entries]


def _plain_text(text: str) -> str:
    """Sphinx markup out: ``x`` -> x, :class:`a.B` -> a.B."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def param_specs(cls: type[Any]) -> list[ParamSpec]:
    """Every ``__init__`` parameter of ``cls``, in order, as a :class:`ParamSpec`."""
    constraints = getattr(cls, "_parameter_constraints", {})
    docs = parameter_docs(cls)
    specs = []
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in constraints:
            raise TypeError(
                f"{cls.__name__}.__init__ takes {name!r} but {cls.__name__}._parameter_constraints has no "
                f"entry for it; declare its constraints (e.g. [Interval(Integral, 1, None, closed='left')])"
            )
        spec = constraints[name]
        types, options, nullable = ((), None, False) if spec == "no_validation" else _merge(spec)
        default = None if param.default is inspect.Parameter.empty else param.default
        specs.append(ParamSpec(name, types, options, nullable, default, docs.get(name, "")))
    return specs


def config_specs(cls: type, exclude: frozenset[str] | set[str] = RUNTIME_PARAMS) -> dict[str, ParamSpec]:
    """The parameters of ``cls`` a config file or flag may set (plain values, not ``exclude``), by name."""
    return {s.name: s for s in param_specs(cls) if s.types and s.name not in exclude}


def union_specs(classes: dict[str, type]) -> dict[str, tuple[ParamSpec, dict[str, Any]]]:
    """Settable parameters over several estimators: name -> (merged spec, {estimator name: default})."""
    merged: dict[str, tuple[ParamSpec, dict[str, Any]]] = {}
    for est_name, cls in classes.items():
        for name, spec in config_specs(cls).items():
            if name not in merged:
                merged[name] = (spec, {est_name: spec.default})
                continue
            known, defaults = merged[name]
            defaults[est_name] = spec.default
            types = tuple(t for t in _ORDER if t in set(known.types) | set(spec.types))
            free = any(str in s.types and s.options is None for s in (known, spec))
            options = None if free else tuple(sorted(set(known.options or ()) | set(spec.options or ()))) or None
            merged[name] = (ParamSpec(name, types, options, known.nullable or spec.nullable, known.default,
                                      known.help or spec.help), defaults)
    return merged
