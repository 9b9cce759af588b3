"""Errors django-delayjobs raises, and the two an action may raise. All derive from
``DelayJobsError``.

Bad input to a public entry point raises ``TypeError`` or ``InvalidSchedule`` (a
``ValueError``); nothing else escapes for a bad value.
"""

from __future__ import annotations

import datetime

from django.core.exceptions import ImproperlyConfigured

from .engine.errors import DelayJobsError, EngineUnavailable


class InvalidSchedule(DelayJobsError, ValueError):
    """``schedule()`` or ``reschedule()`` got a value it cannot accept."""


class NotDelayable(DelayJobsError, TypeError):
    """The callable is not a registered action (decorate it with ``@delayable``)."""


class UnknownAction(DelayJobsError):
    """A stored job names an action this process has not registered."""


class AlreadyRunning(DelayJobsError):
    """A job that ``cancel_for(..., fail_if_running=True)`` had to stop is already running."""


class ConfigurationError(DelayJobsError, ImproperlyConfigured):
    """The ``DELAYJOBS`` settings cannot work."""


class Retry(DelayJobsError):
    """Raised by an action: this attempt failed; try again after ``after`` (a timedelta or
    seconds, at most a day, a negative one meaning now; default, and for NaN: the usual
    backoff). The job is still dead after ``max_attempts``."""

    def __init__(self, message: str = "", *, after: datetime.timedelta | float | None = None):
        super().__init__(message)
        if isinstance(after, datetime.timedelta):
            after = after.total_seconds()
        elif after is not None and (isinstance(after, bool) or not isinstance(after, int | float)):
            raise TypeError(f"after must be a timedelta or seconds, not {type(after).__name__}")
        self.after = after


class GiveUp(DelayJobsError):
    """Raised by an action: the job cannot succeed; it is dead now, whatever attempts are
    left (a 404 from a callback's receiver, say)."""


class TimeLimitExceeded(DelayJobsError):
    """The failure recorded for an attempt whose action ran past ``MAX_RUN_SECONDS`` (the
    worker records it; the action itself is not interrupted)."""


__all__ = [
    "AlreadyRunning",
    "ConfigurationError",
    "DelayJobsError",
    "EngineUnavailable",
    "GiveUp",
    "InvalidSchedule",
    "NotDelayable",
    "Retry",
    "TimeLimitExceeded",
    "UnknownAction",
]
