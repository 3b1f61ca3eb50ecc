"""Free text from users: which characters it may hold, and how errors quote it.

Torch-free. Job names, component names and string arguments end up in terminals
(``amptrain jobs``), logs and the dashboard, so control and bidirectional
formatting characters are refused: an escape sequence in a name could rewrite a
colleague's terminal, a right-to-left override could disguise a file name.
Errors quote at most a short prefix of a bad value, never a whole payload.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Annotated, Any

from pydantic import BeforeValidator

_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
"""Control, format (bidi overrides, zero-width), line/paragraph separators, surrogates,
private use."""
_ALLOWED_FORMAT = frozenset({"\u200d"})  # zero-width joiner: part of many emoji
QUOTE_CHARS = 40


def control_character(text: str) -> str | None:
    """Why ``text`` is refused (the first offending character), or None when it is fine."""
    for position, char in enumerate(text):
        if unicodedata.category(char) in _REFUSED_CATEGORIES and char not in _ALLOWED_FORMAT:
            return (
                f"must not contain control or formatting characters "
                f"(found U+{ord(char):04X} at position {position})"
            )
    return None


def check_text(text: str) -> str:
    """A pydantic after-validator: ``text`` unchanged, or ValueError naming the character."""
    problem = control_character(text)
    if problem:
        raise ValueError(problem)
    return text


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters: enough to recognise, never a payload."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finite(value: Any) -> bool:
    """False for float NaN and infinities (which JSON cannot carry faithfully)."""
    return not isinstance(value, float) or math.isfinite(value)


_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def plain_number(value: Any) -> Any:
    """A pydantic before-validator for a number a person types (a query parameter): a
    plain decimal (``0.02``, ``2e-2``), finite and not so small that it reads as 0. Python
    would take ``1_0`` as 10, `` 10`` as 10 and ``1e-400`` as 0; each is refused here."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise ValueError(
                f"must be a plain decimal number (digits, '.', 'e'); got {quote(value)}"
            )
        number = float(value)
        mantissa = re.split("[eE]", value)[0]
        if number == 0 and mantissa.strip("+-0.") != "":
            raise ValueError(f"too small to represent (it would read as 0); got {quote(value)}")
        value = number
    if not finite(value):
        raise ValueError(f"must be a finite number; got {quote(value)}")
    return value


PlainFloat = Annotated[float, BeforeValidator(plain_number)]
"""A float typed by a person: see :func:`plain_number`."""


def plain_value(value: Any, max_text: int) -> Any:
    """A pydantic after-validator for a component argument: ``value`` unchanged, or
    ValueError naming its first problem. Plugins check their own arguments, but nothing
    reaches any builder that a terminal or JSON could not show faithfully: strings of at
    most ``max_text`` characters without control characters, finite numbers, at most 4
    levels of lists and dicts."""
    problem = _value_problem(value, max_text, depth=0)
    if problem:
        raise ValueError(problem)
    return value


def _value_problem(value: Any, max_text: int, depth: int) -> str | None:
    if depth > 4:
        return "nested too deeply (at most 4 levels)"
    if isinstance(value, str):
        if len(value) > max_text:
            return f"at most {max_text} characters; got {len(value)}"
        return control_character(value)
    if not finite(value):
        return f"must be a finite number; got {quote(value)}"
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    else:
        return None
    return next((p for v in items if (p := _value_problem(v, max_text, depth + 1))), None)
