"""Numbers as an operator types them: ASCII digits, nothing else.

``int()`` and ``float()`` read far more than that: other scripts' digits (``٣``, full-width ones),
digit group underscores (``1_0`` is 10) and surrounding whitespace. A command option or a
query value spelled so is a mistake (a template's stray space, a pasted character), and
taking it would run a worker or a prune with a value nobody wrote: it is refused.
"""

from __future__ import annotations

import re
from argparse import ArgumentTypeError
from collections.abc import Callable
from typing import TypeVar

_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)
# float()'s own words too ("nan", "inf"): the callers' range checks refuse them by range.
_DECIMAL = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)
#: Longer is out of every range (and past Python's 4300-digit limit for int()).
_MAX_DIGITS = 30

T = TypeVar("T")


def whole_number(text: str) -> int:
    """An integer of ASCII digits, with an optional sign; ValueError for anything else."""
    if not isinstance(text, str) or _WHOLE.fullmatch(text) is None:
        raise ValueError(f"{text!r} is not a whole number")
    if len(text.lstrip("+-").lstrip("0")) > _MAX_DIGITS:
        raise ValueError(f"{text[:_MAX_DIGITS]!r}... is too large")
    return int(text)


def decimal_number(text: str) -> float:
    """A float of ASCII digits (``1``, ``0.5``, ``1e-1``); ValueError for anything else."""
    if not isinstance(text, str) or _DECIMAL.fullmatch(text) is None:
        raise ValueError(f"{text!r} is not a number")
    return float(text)


def option(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type=``: its reason shown (argparse words a ValueError as
    "invalid ... value", without it)."""

    def parsed(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise ArgumentTypeError(str(exc)) from exc

    parsed.__name__ = parse.__name__
    return parsed
