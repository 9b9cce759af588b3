"""Turning ``in_``/``at``/``expires`` into aware datetimes, with clear errors."""

from __future__ import annotations

import datetime
import math

from django.utils import timezone

from .exceptions import InvalidSchedule


def due_time(in_: object, at: object, now: datetime.datetime | None = None) -> datetime.datetime:
    """Return the due time for exactly one of ``in_`` (timedelta or seconds) and ``at``."""
    if (in_ is None) == (at is None):
        raise TypeError("pass exactly one of in_= (a timedelta or seconds) and at= (a datetime)")
    now = now or timezone.now()
    if at is not None:
        return aware(at, "at")
    return now + delay(in_, "in_")


def delay(value: object, what: str) -> datetime.timedelta:
    """Return ``value`` (a timedelta or seconds) as a non-negative timedelta."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{what} must be a timedelta or a number of seconds, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidSchedule(f"{what} must be a finite, non-negative delay, got {value!r}")
    if seconds > 100 * 365 * 86400:
        raise InvalidSchedule(f"{what} is more than 100 years away: {value!r}")
    return datetime.timedelta(seconds=seconds)


def aware(value: object, what: str) -> datetime.datetime:
    """Return ``value`` if it is an aware datetime, else raise."""
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    if timezone.is_naive(value):
        raise InvalidSchedule(
            f"{what}={value!r} is naive: pass an aware datetime (e.g. timezone.now() + ...)"
        )
    return value


def expiry(expires: object, run_at: datetime.datetime) -> datetime.datetime | None:
    """Return when a job must no longer start: ``expires`` after ``run_at``, or that datetime."""
    if expires is None:
        return None
    if isinstance(expires, datetime.datetime):
        expires_at = aware(expires, "expires")
    else:
        expires_at = run_at + delay(expires, "expires")
    if expires_at <= run_at:
        raise InvalidSchedule(f"expires ({expires_at}) must be later than the due time ({run_at})")
    return expires_at


def to_ms(value: datetime.datetime) -> int:
    """Return an aware datetime as whole ms since the epoch (the engine's unit), rounded
    up so that Redis never promotes a job before its ``run_at``."""
    return math.ceil(value.timestamp() * 1000)
