"""Reading TOML files (configs, workflows) with one error handling.

:func:`read_toml` turns every way a file can fail to be a TOML document into one
error of the caller's type that names the file and, for a syntax error, the line
and column; :func:`unknown_keys` words the "unknown key" error of a table with a
did-you-mean guess for each misspelt key.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable
from typing import Any

__all__ = ["read_toml", "unknown_keys"]

#: tomllib writes the position into the message: "... (at line 3, column 7)" or "(at end of document)".
_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def read_toml(path: str | os.PathLike, *, error: type[Exception] = ValueError, what: str = "TOML file"
              ) -> dict[str, Any]:
    """The document in the TOML file ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    error : type of Exception, default=ValueError
        The caller's error type (e.g. ``ConfigError``), raised for a file that exists but
        is not a TOML document.
    what : str, default="TOML file"
        What the file is, for the messages ("config file", "workflow file").

    Returns
    -------
    dict
        The document's top-level table.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    error
        When ``path`` is a directory, is not UTF-8 text, or is not valid TOML
        (``path:line:column: not valid TOML: ...``).
    """
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory; pass the path of a .toml file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not a TOML file: it is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(_syntax_message(path, exc)) from exc


def _syntax_message(path: str | os.PathLike, exc: tomllib.TOMLDecodeError) -> str:
    """``path is not valid TOML (line 3, column 7): reason``."""
    text = str(exc)
    found = _POSITION.search(text)
    if found is None:
        return f"{path} is not valid TOML: {text}"
    where = f"line {found.group(1)}, column {found.group(2)}" if found.group(1) else "at the end of the file"
    return f"{path} is not valid TOML ({where}): {text[:found.start()]}"


def unknown_keys(found: Iterable[str], accepted: Iterable[str], *, where: str, what: str = "key",
                 context: str = "") -> str:
    """The message for the keys of ``found`` that are not ``accepted`` ("" when there are none).

    Parameters
    ----------
    found, accepted : iterable of str
        The keys of the table and those it may hold.
    where : str
        The file (and table) the keys are in, first in the message.
    what : str, default="key"
        "key" or "table".
    context : str, default=""
        Words after the unknown keys (" in [data]", " for estimator 'falkon'").

    Returns
    -------
    str
        ``where: unknown key 'sigmaa'{context} (did you mean 'sigma'?); accepted: [...]``, with a
        guess for every key close to an accepted one; "" when every key is accepted.
    """
    allowed = sorted(accepted)
    bad = sorted(set(found) - set(allowed))
    if not bad:
        return ""
    guesses = [(key, close[0]) for key in bad if (close := difflib.get_close_matches(key, allowed, n=1, cutoff=0.6))]
    if len(bad) == 1:
        hint = f" (did you mean {guesses[0][1]!r}?)" if guesses else ""
    else:
        hint = f" (did you mean {', '.join(f'{close!r} for {key!r}' for key, close in guesses)}?)" if guesses else ""
    names = ", ".join(repr(key) for key in bad)
    return f"{where}: unknown {what}{'s' if len(bad) > 1 else ''} {names}{context}{hint}; accepted: {allowed}"
