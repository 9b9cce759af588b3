"""Action arguments as JSON, with datetime, date, Decimal and UUID that round-trip.

Plain JSON values are stored as they are. The four extra types are stored as a one-key
object ``{"$dt": "..."}`` (``$d``, ``$dec``, ``$uuid``) so they come back as the same
type. Anything else is refused at ``schedule()`` time. No pickle, ever.

This is also the door for values: only what PostgreSQL's ``jsonb`` and SQLite's JSON1 both
store and give back equal is accepted (see the limits below and docs/scheduling.md).
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from .exceptions import InvalidSchedule

#: Lists and dicts nest at most this deep (``args``/``kwargs`` themselves count as one).
#: Far below what any JSON parser on the way recurses to (Python's ~1,000, SQLite's 1,000).
MAX_DEPTH = 32
#: Integers must fit in 64 bits: SQLite's JSON functions read larger ones back as floats.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: Floats must be smaller than this in magnitude: PostgreSQL's jsonb keeps numbers as
#: ``numeric`` and gives 1e16 back as the integer 10000000000000000.
FLOAT_LIMIT = 1e16
#: What a tzinfo that cannot answer raises from ``utcoffset()``: the base class raises
#: NotImplementedError; a broken subclass anything arithmetic or a bad type or value.
TZINFO_ERRORS = (ArithmeticError, NotImplementedError, TypeError, ValueError)

_LOADERS: dict[str, Callable[[str], Any]] = {
    "$dt": datetime.datetime.fromisoformat,
    "$d": datetime.date.fromisoformat,
    "$dec": Decimal,
    "$uuid": uuid.UUID,
}


def short_repr(value: object) -> str:
    """``repr(value)``, cut short; a huge int has no repr (Python refuses > 4,300 digits),
    so quoting a bad value must not raise a ValueError of its own instead of the door's;
    nor may a ``__repr__`` of the caller's that raises."""
    try:
        text = repr(value)
    except ValueError:
        return "a huge number"
    except Exception:
        return "(no repr)"
    return text if len(text) <= 40 else f"{text[:37]}..."


def check_text(value: str, what: str, max_length: int | None = None) -> str:
    """Return ``value`` as an exact str if every supported database stores it as it is,
    else raise ``InvalidSchedule``: no NUL (PostgreSQL refuses it), no lone surrogate
    (not Unicode). A subclass is read through ``str``'s own methods: its overrides (an
    ``__contains__`` that hides the NUL) decide nothing."""
    if type(value) is not str:  # the test first: an exact str is the hot path of schedule()
        value = str.__str__(value)
    if max_length is not None and len(value) > max_length:
        raise InvalidSchedule(f"{what} is {len(value)} characters long: at most {max_length} fit")
    if "\x00" in value:
        raise InvalidSchedule(
            f"{what} contains a NUL character (\\x00), which PostgreSQL cannot store: remove "
            "it, or pass binary data encoded (e.g. base64)"
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidSchedule(
                f"{what} contains a lone surrogate ({value[exc.start]!r} at index {exc.start}), "
                "which is not valid Unicode and cannot be stored: decode bytes with "
                "errors='replace', or pass them base64-encoded"
            ) from None
    return value


def check_size(values: tuple[Any, ...], what: str, limit: int) -> None:
    """Raise ``InvalidSchedule`` if the JSON-ready ``values`` take more than ``limit`` bytes
    as ``json.dumps`` writes them (which is what Django sends the database)."""
    size = sum(len(json.dumps(value)) for value in values)
    if size > limit:
        raise InvalidSchedule(
            f"{what}: {size:,} bytes of JSON, and DELAYJOBS['MAX_JSON_BYTES'] allows {limit:,}; "
            "store large data elsewhere and pass its id"
        )


def dump(value: Any, path: str = "value") -> Any:
    """Return a JSON-ready copy of ``value`` or raise ``TypeError``/``InvalidSchedule``
    naming the bad part."""
    return _dump(value, path, 0)


def _dump(value: Any, path: str, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return check_text(value, path)
    if isinstance(value, int | float):
        return _number(value, path)
    if isinstance(value, datetime.datetime):
        return {"$dt": _datetime(value, path)}
    # A scalar is read through its base type's own methods, unbound: a subclass's
    # overrides (its own __str__, isoformat or __abs__) decide nothing, so what is checked
    # is what is stored and what loads back. A dict is read once, by its items() (_items).
    if isinstance(value, datetime.date):
        return {"$d": datetime.date.isoformat(value)}
    if isinstance(value, Decimal):
        if Decimal.is_nan(value):
            raise InvalidSchedule(f"{path} is {short_repr(value)}, which is never equal to itself")
        return {"$dec": Decimal.__str__(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value if type(value) is uuid.UUID else _uuid(value, path))}
    if isinstance(value, list | tuple | dict):
        _container(path, depth)
        if isinstance(value, dict):
            items = _items(value, path)
            # A key is quoted short: the path of every value below it repeats it (a whole
            # 1 MB key made building the paths quadratic).
            return {key: _dump(item, f"{path}[{short_repr(key)}]", depth + 1)
                    for key, item in items}  # fmt: skip
        return [_dump(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    raise TypeError(
        f"{path} is a {type(value).__name__}, which cannot be stored as JSON; pass JSON "
        "values, datetime, date, Decimal or UUID (for a model instance, pass its pk)"
    )


def _uuid(value: uuid.UUID, path: str) -> uuid.UUID:
    """An exact UUID of a subclass's value (its ``int`` slot, read by ``UUID``'s own
    descriptor)."""
    try:
        return uuid.UUID(int=uuid.UUID.int.__get__(value))  # type: ignore[attr-defined,misc]
    except (AttributeError, TypeError, ValueError):
        raise InvalidSchedule(f"{path} is a {type(value).__name__} that holds no UUID") from None


def _number(value: int | float, path: str) -> int | float:
    if isinstance(value, int):
        if type(value) is not int:
            value = int.__int__(value)
        if not INT_MIN <= value <= INT_MAX:
            raise InvalidSchedule(
                f"{path} is an integer beyond 64 bits, which SQLite's JSON functions read back "
                "as a float: pass it as a str or Decimal"
            )
        return value
    if type(value) is not float:
        value = float.__float__(value)
    if not math.isfinite(value):
        raise TypeError(f"{path} is {value!r}: JSON has no NaN or infinity")
    if abs(value) >= FLOAT_LIMIT:
        raise InvalidSchedule(
            f"{path} is {value!r}: PostgreSQL gives a float of 1e16 or more back as an int; "
            "pass it as a Decimal (or a str)"
        )
    return value


def _datetime(value: datetime.datetime, path: str) -> str:
    try:
        text = datetime.datetime.isoformat(value)  # asks the tzinfo for its offset
    except TZINFO_ERRORS as exc:
        raise InvalidSchedule(
            f"{path}={short_repr(value)} has a time zone that fails: {exc}"
        ) from None
    try:
        back: datetime.datetime | None = datetime.datetime.fromisoformat(text)
    except ValueError:
        back = None
    if back is None or not same_time(back, value):
        raise InvalidSchedule(
            f"{path} is {short_repr(value)}, which reads back from ISO 8601 as {back!r} (an offset "
            "with microseconds does not survive): convert it to UTC first"
        )
    return text


def same_time(a: datetime.datetime, b: datetime.datetime) -> bool:
    """``a`` and ``b`` are the same naive time, or the same instant.

    Not ``==``: Python calls two aware datetimes in different zones unequal when either
    falls in a fold (an ambiguous local hour), even when they are the same instant.
    Read through ``datetime``'s own methods: a subclass's overrides decide nothing.
    """
    dt = datetime.datetime
    naive = dt.utcoffset(a) is None
    if naive != (dt.utcoffset(b) is None):
        return False
    if naive:
        return dt.__eq__(dt.replace(a, tzinfo=None), dt.replace(b, tzinfo=None)) is True
    return dt.__sub__(a, b) == datetime.timedelta(0)


def _container(path: str, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise InvalidSchedule(
            f"{path} nests lists and dicts more than {MAX_DEPTH} levels deep: flatten it, or "
            "store the data in a model and pass its pk"
        )


def check_depth(value: Any, path: str = "value") -> None:
    """Raise ``InvalidSchedule`` if ``value`` nests sequences and mappings (keys
    included) as deep as ``dump`` refuses. Walked without recursion, so a value nested
    thousands deep, or one that contains itself, is refused rather than a RecursionError
    (for callers that walk a value recursively before ``dump`` does: every sequence that
    ``normalize_json`` walks, a ``deque`` or a ``UserList`` too, not only a list)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            _container(path, depth)
            stack.extend((child, depth + 1) for pair in item.items() for child in pair)
        elif isinstance(item, Sequence) and not isinstance(item, str | bytes):
            _container(path, depth)
            stack.extend((child, depth + 1) for child in item)


def _items(value: dict[Any, Any], path: str) -> list[tuple[str, Any]]:
    """``value``'s pairs, read once (``items()``: a ``QueryDict``'s last values), each key
    as exact text: every check, and what is stored, read the same pairs."""
    items = [(_key(key, path), item) for key, item in value.items()]
    if len(items) > 1 and len({key for key, _ in items}) != len(items):  # str subclasses
        raise InvalidSchedule(f"{path} has two keys of the same text: pass each once")
    if len(items) == 1 and items[0][0] in _LOADERS:
        raise TypeError(f"{path} uses the reserved key {items[0][0]!r}")
    return items


def _key(key: object, path: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"{path} has a key {short_repr(key)}: JSON object keys must be str")
    text = key if type(key) is str else str.__str__(key)  # its own __repr__ may raise
    return check_text(text, f"{path} key {text!r:.40}")


def check_stored(value: Any, path: str = "value", depth: int = 0) -> None:
    """Raise ``TypeError``/``InvalidSchedule`` unless ``value`` is what ``dump`` returns
    for some acceptable value (for jobs built elsewhere and handed to ``schedule_many``)."""
    kind = type(value)  # exactly what dump() makes: a subclass's methods are not trusted
    if value is None or kind is bool:
        return
    if kind is str:
        check_text(value, path)
    elif kind is int or kind is float:
        _number(value, path)
    elif kind is dict and len(value) == 1 and next(iter(value)) in _LOADERS:
        ((tag, raw),) = value.items()
        if type(raw) is not str:  # dump() writes text; uuid.UUID(5) raises AttributeError
            raise InvalidSchedule(
                f"{path} holds {tag} with a {type(raw).__name__}, where dump() writes text: "
                "build jobs with build_job"
            )
        try:
            loaded = _LOADERS[tag](raw)
        except (ArithmeticError, TypeError, ValueError):
            raise InvalidSchedule(
                f"{path} holds {tag} {short_repr(raw)}, which does not load"
            ) from None
        # e.g. a NaN Decimal, an offset that does not round-trip; and the text itself, which
        # the loaders take in many forms (fromisoformat: any separator, NUL included)
        dumped = _dump(loaded, path, depth)
        if dumped != value:
            raise InvalidSchedule(
                f"{path} holds {tag} {short_repr(raw)}, which dump() writes as "
                f"{short_repr(dumped[tag])}: build jobs with build_job"
            )
    elif kind is list or kind is dict:
        _container(path, depth)
        pairs = _items(value, path) if kind is dict else enumerate(value)
        for key, item in pairs:
            check_stored(item, f"{path}[{short_repr(key)}]", depth + 1)
    else:
        raise TypeError(
            f"{path} is a {type(value).__name__}, which is not JSON: build jobs with build_job"
        )


#: A stored value nested deeper than this is shown as text (rendering JSON recurses).
SHOW_DEPTH = 100


def showable(value: Any) -> Any:
    """``value`` if the admin and the API can render it; else a text saying why not.

    Only a row that did not pass the door can hold such a value (nested deeper than
    ``SHOW_DEPTH``); it is walked without recursion, so any depth is safe here.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            if depth > SHOW_DEPTH:
                return f"(not shown: nested more than {SHOW_DEPTH} levels deep)"
            stack.extend((child, depth + 1) for child in _children(item))
    return value


def _children(item: list[Any] | dict[str, Any]) -> Any:
    return item.values() if isinstance(item, dict) else item


def load(value: Any) -> Any:
    """Return the Python value that ``dump`` stored."""
    if isinstance(value, list):
        return [load(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, raw),) = value.items()
            if tag in _LOADERS:
                return _LOADERS[tag](raw)
        return {key: load(item) for key, item in value.items()}
    return value
