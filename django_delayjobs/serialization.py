"""Action arguments as JSON, with datetime, date, Decimal and UUID that round-trip.

Plain JSON values are stored as they are. The four extra types are stored as a one-key
object ``{"$dt": "..."}`` (``$d``, ``$dec``, ``$uuid``) so they come back as the same
type. Anything else is refused at ``schedule()`` time. No pickle, ever.
"""

from __future__ import annotations

import datetime
import math
import uuid
from decimal import Decimal
from typing import Any

_TAGS = {"$dt", "$d", "$dec", "$uuid"}


def dump(value: Any, path: str = "value") -> Any:
    """Return a JSON-ready copy of ``value`` or raise ``TypeError`` naming the bad part."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{path} is {value!r}: JSON has no NaN or infinity")
        return value
    if isinstance(value, datetime.datetime):
        return {"$dt": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$d": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, list | tuple):
        return [dump(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{path} has a key {key!r}: JSON object keys must be str")
        if len(value) == 1 and next(iter(value)) in _TAGS:
            raise TypeError(f"{path} uses the reserved key {next(iter(value))!r}")
        return {key: dump(item, f"{path}[{key!r}]") for key, item in value.items()}
    raise TypeError(
        f"{path} is a {type(value).__name__}, which cannot be stored as JSON; pass JSON "
        "values, datetime, date, Decimal or UUID (for a model instance, pass its pk)"
    )


def load(value: Any) -> Any:
    """Return the Python value that ``dump`` stored."""
    if isinstance(value, list):
        return [load(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, raw),) = value.items()
            if tag == "$dt":
                return datetime.datetime.fromisoformat(raw)
            if tag == "$d":
                return datetime.date.fromisoformat(raw)
            if tag == "$dec":
                return Decimal(raw)
            if tag == "$uuid":
                return uuid.UUID(raw)
        return {key: load(item) for key, item in value.items()}
    return value
