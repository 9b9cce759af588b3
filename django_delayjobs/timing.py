"""Turning ``in_``/``at``/``expires`` into aware datetimes, with clear errors.

This is the door for times: a due time or expiry is accepted only if it lies between the
Unix epoch (Redis holds due times as ms since 1970) and ``MAX_AHEAD`` from now, so that
every accepted time can be stored, read back and converted on any supported database and
in any time zone (years near 1 or 9999 overflow when shifted by an offset).
"""

from __future__ import annotations

import datetime
import math

from django.conf import settings
from django.utils import timezone

from .exceptions import ConfigurationError, InvalidSchedule
from .serialization import TZINFO_ERRORS, short_repr

#: No due time or expiry before this: Redis scores are ms since the epoch.
EARLIEST = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
ONE_MICROSECOND = datetime.timedelta(microseconds=1)
#: No due time or expiry further ahead than this (36,500 days, about 100 years).
MAX_AHEAD = datetime.timedelta(days=36500)


def due_time(in_: object, at: object, now: datetime.datetime | None = None) -> datetime.datetime:
    """Return the due time for exactly one of ``in_`` (timedelta or seconds) and ``at``."""
    if (in_ is None) == (at is None):
        raise TypeError("pass exactly one of in_= (a timedelta or seconds) and at= (a datetime)")
    if not settings.USE_TZ:  # check E015 says so at start-up, but WSGI servers skip checks
        from .checks import NEEDS_USE_TZ

        raise ConfigurationError(f"{NEEDS_USE_TZ} (check django_delayjobs.E015)")
    now = now or timezone.now()
    run_at = aware(at, "at") if at is not None else now + delay(in_, "in_")
    return within_range(run_at, "at" if at is not None else "in_", now)


def delay(value: object, what: str) -> datetime.timedelta:
    """Return ``value`` (a timedelta or seconds) as a timedelta from 0 to ``MAX_AHEAD``."""
    # Read through the base type's own methods: a subclass's overrides (its comparisons,
    # its total_seconds) must not decide what is checked, which is what is stored.
    seconds: float
    if isinstance(value, datetime.timedelta):
        seconds = datetime.timedelta.total_seconds(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = int.__int__(value)  # compared as an int: float(10**400) raises OverflowError
    elif isinstance(value, float):
        seconds = float.__float__(value)
    else:
        raise TypeError(
            f"{what} must be a timedelta or a number of seconds, not {short_repr(value)}"
        )
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise InvalidSchedule(f"{what} must be a finite, non-negative delay, got {value!r}")
    if seconds < 0:
        raise InvalidSchedule(
            f"{what} must be a finite, non-negative delay, got {short_repr(value)}"
        )
    if seconds > MAX_AHEAD.total_seconds():
        raise InvalidSchedule(
            f"{what} is more than 100 years away ({short_repr(value)}): give at most "
            f"{MAX_AHEAD.days} days"
        )
    return datetime.timedelta(seconds=seconds)


def aware(value: object, what: str) -> datetime.datetime:
    """Return ``value`` if it is an aware datetime, else raise."""
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    try:
        naive = datetime.datetime.utcoffset(value) is None  # datetime's own: as _exact
    except TZINFO_ERRORS as exc:  # a tzinfo that cannot answer
        raise InvalidSchedule(f"{what}={value!r} has a time zone that fails: {exc}") from None
    if naive:
        raise InvalidSchedule(
            f"{what}={value!r} is naive: pass an aware datetime (e.g. timezone.now() + ...)"
        )
    return value if type(value) is datetime.datetime else _exact(value, what)


def _exact(value: datetime.datetime, what: str) -> datetime.datetime:
    """The instant an aware datetime of a subclass holds, as a plain datetime in UTC, read
    through ``datetime``'s own subtraction: its overrides (``str()``, which Django writes
    to SQLite, ``astimezone``, ``__sub__``) decide nothing, as for arguments."""
    try:
        return EARLIEST + datetime.datetime.__sub__(value, EARLIEST)
    except OverflowError:  # a year near 1 or 9999, shifted by its offset
        raise InvalidSchedule(
            f"{what} is not from 1970 to {MAX_AHEAD.days} days from now"
        ) from None


def within_range(
    value: datetime.datetime, what: str, now: datetime.datetime | None = None
) -> datetime.datetime:
    """Return the aware ``value`` in UTC if it lies from ``EARLIEST`` to ``MAX_AHEAD`` from
    now, else raise ``InvalidSchedule``.

    Aware datetimes compare without conversion, so this is safe at the datetime limits.
    In UTC, because that is how every database stores it, and PostgreSQL cannot parse
    an offset with microseconds (``datetime.timezone(timedelta(microseconds=1))``).
    """
    if value < EARLIEST:
        raise InvalidSchedule(
            f"{what} ({value.isoformat()}) is before 1970, which Redis cannot hold as a due "
            "time; a time in the past runs at once, so give one from 1970 on (or in_=0)"
        )
    if value > (now or timezone.now()) + MAX_AHEAD:
        raise InvalidSchedule(
            f"{what} ({value.isoformat()}) is more than 100 years away: give a time within "
            f"{MAX_AHEAD.days} days from now"
        )
    return value.astimezone(datetime.UTC)


def expiry(
    expires: object, run_at: datetime.datetime, now: datetime.datetime | None = None
) -> datetime.datetime | None:
    """Return when a job must no longer start: ``expires`` after ``run_at``, or that datetime."""
    if expires is None:
        return None
    if isinstance(expires, datetime.datetime):
        expires_at = aware(expires, "expires")
    else:
        expires_at = run_at + delay(expires, "expires")
    expires_at = within_range(expires_at, "expires", now)
    check_runnable(run_at, expires_at, now)
    return expires_at


def check_runnable(
    run_at: datetime.datetime, expires_at: datetime.datetime, now: datetime.datetime | None = None
) -> None:
    """Raise ``InvalidSchedule`` unless a job due at ``run_at`` may still start before it
    expires at ``expires_at``: one that expires at its due time or earlier, or that has
    expired already, would be skipped at its first claim, never run."""
    if expires_at <= run_at:
        raise InvalidSchedule(
            f"expires ({expires_at.isoformat()}) must be later than the due time "
            f"({run_at.isoformat()})"
        )
    if expires_at <= (now or timezone.now()):
        raise InvalidSchedule(
            f"expires ({expires_at.isoformat()}) has already passed: the job would be "
            "skipped, never run; give a later expiry, or none"
        )


def to_ms(value: datetime.datetime) -> float:
    """Return an aware datetime as ms since the epoch (the engine's unit), to the
    microsecond: a whole ms as an int, else a float with the microseconds as its fraction
    (the nearest double, which Redis compares exactly with its own clock's microseconds),
    so that Redis promotes a job neither before its ``run_at`` nor up to 1 ms after it.

    Raises ``InvalidSchedule`` for a time Redis cannot hold (before 1970): a row that got
    into the table without passing the door (a poison row) is refused here, clearly.
    """
    if value < EARLIEST:
        raise InvalidSchedule(
            f"{value.isoformat()} is before 1970: Redis holds due times as ms since the epoch"
        )
    micros = (value - EARLIEST) // ONE_MICROSECOND
    return micros // 1000 if micros % 1000 == 0 else micros / 1000
