"""Checks of the engine's arguments, all made before any command is sent to Redis."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

#: Largest number of ids one script call may move. Lua's ``unpack`` stops near 8,000
#: values, and a bounded call keeps Redis responsive however large the backlog is.
MAX_BATCH = 5000


def check_ids(ids: Iterable[object]) -> list[str]:
    """Return the ids, each once, in the order given (a repeat would be counted twice)."""
    if isinstance(ids, str | bytes):
        raise TypeError("ids must be a collection of str, not a single string")
    given = list(ids)
    if not given:
        raise ValueError("the batch of ids is empty")
    if len(given) > MAX_BATCH:
        raise ValueError(f"at most {MAX_BATCH} ids per call, got {len(given)}")
    checked: dict[str, None] = {}
    for id_ in given:
        if not isinstance(id_, str):
            raise TypeError(f"job ids must be str, not {type(id_).__name__}")
        if not is_id(id_):
            raise ValueError(f"job id {id_!r} must be 1 to 128 printable, non-space characters")
        checked[id_] = None
    return list(checked)


def is_id(id_: str) -> bool:
    """Whether ``id_`` is one the engine takes: 1 to 128 printable, non-space characters.
    A member another program wrote may be anything (``claim`` takes such ones out)."""
    return 0 < len(id_) <= 128 and (id_.isprintable() or _printable(id_)) and " " not in id_


def _printable(id_: str) -> bool:
    """Whether ``id_``, which ``str.isprintable`` refuses, is printable once its bytes that
    are not UTF-8 (an id another program wrote, as ``text`` reads it) are counted as
    printable: the worker removes such an id. Only as ``text`` spells it: another spelling
    of the same bytes would be a second id."""
    try:
        raw = wire(id_)
    except UnicodeEncodeError:  # a lone surrogate that no bytes read back stand for
        return False
    return text(raw) == id_ and raw.decode(errors="replace").isprintable()


def check_ms(value: object, what: str = "time") -> int:
    return int(_number(value, what))


def check_names(queues: object) -> list[str]:
    """The queue names of a list (one str given alone would be read letter by letter)."""
    if isinstance(queues, str | bytes) or not isinstance(queues, Iterable):
        raise TypeError(f"queues must be a list of queue names, not {type(queues).__name__}")
    return list(queues)


#: The latest due time accepted: 10000-01-01 00:00 UTC in ms since the epoch, which the
#: latest Python ``datetime`` (9999-12-31 23:59:59.999999) rounds to as a double, so that
#: every time a row can hold is accepted. The scripts turn the wait until a due time into
#: microseconds held by a 64-bit integer, which overflows past about 292,000 years.
MAX_DUE_MS = 253_402_300_800_000


def check_due(value: object) -> float:
    """A due time in ms since the epoch, kept as given: its fraction (microseconds) is
    the difference between a job promoted on time and one promoted up to 1 ms early or
    late. A score (a double) tells microseconds apart for the next two centuries.
    At most ``MAX_DUE_MS`` (the end of year 9999)."""
    due = _number(value, "due time")
    if due > MAX_DUE_MS:
        raise ValueError(
            f"due time must be at most {MAX_DUE_MS} ms (the end of year 9999 UTC), got {due!r}"
        )
    return due


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of milliseconds, not {type(value).__name__}")
    if not finite(value) or value < 0:
        raise ValueError(f"{what} must be a finite, non-negative number of ms, got {brief(value)}")
    return value


def finite(value: int | float) -> bool:
    """Whether ``value`` is a finite number a float can hold (an int too large for one,
    ``10**400``, is not: Redis would read it as infinity)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def brief(value: object) -> str:
    """``repr(value)``, shortened: a 400-digit int in a message helps nobody."""
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python turns into text (4300)
        return "a number of more than 4300 digits"
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def check_batch(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"batch must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_BATCH:
        raise ValueError(f"batch must be between 1 and {MAX_BATCH}, got {value}")
    return value


def check_dues(items: Mapping[str, float]) -> dict[str, float]:
    """Return job id -> due time (ms), in the order given."""
    if not isinstance(items, Mapping):
        raise TypeError("expected a mapping of job id -> due time (ms)")
    return {
        id_: check_due(due)
        for id_, due in zip(check_ids(items.keys()), items.values(), strict=True)
    }


#: The priorities a job may have; higher starts first among ids promoted together.
PRIORITY_RANGE = range(-100, 101)


def check_priorities(priorities: Mapping[str, int] | None, ids: Iterable[str]) -> dict[str, int]:
    """Return id -> priority for ``ids`` (0 for an id not given); refuse other ids."""
    given = {} if priorities is None else priorities
    if not isinstance(given, Mapping):
        raise TypeError("priorities must be a mapping of job id -> priority")
    wanted = dict.fromkeys(ids, 0)
    for id_, value in given.items():
        if id_ not in wanted:
            raise ValueError(f"a priority for id {id_!r}, which is not being added")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"a priority must be an int, not {type(value).__name__}")
        if value not in PRIORITY_RANGE:
            raise ValueError(f"a priority must be from -100 to 100, got {value}")
        wanted[id_] = value
    return wanted


def text(value: bytes | str) -> str:
    """A reply as str. Bytes that are not UTF-8 (a member another program wrote) become
    surrogate escapes, which ``wire`` turns back into the same bytes: a strict decode
    raised ``UnicodeDecodeError`` after a script had moved the id (a worker's claim
    thread died on it, and met it again once its lease ended)."""
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else value


def wire(value: str) -> bytes:
    """``value`` as the bytes Redis holds (see ``text``)."""
    return value.encode(errors="surrogateescape")


def score_ms(value: Any) -> int:
    """A score read back from Redis, in whole ms from 0 to ``MAX_DUE_MS``. Every score the
    engine writes lies there; a key written by another program may hold any double
    (``inf``, ``1e300``, a negative one), which is clamped rather than let raise
    ``OverflowError`` in the promoter or a page that shows the queue."""
    return int(min(max(float(value), 0.0), MAX_DUE_MS))


def opt_int(value: Any) -> int | None:
    """A score (see ``score_ms``), or None for the integer -1 a script gives for none."""
    if value is None or (isinstance(value, int) and value < 0):
        return None
    return score_ms(value)
