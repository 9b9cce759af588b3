"""Errors django-delayjobs raises. All derive from ``DelayJobsError``."""

from __future__ import annotations

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


__all__ = [
    "AlreadyRunning",
    "ConfigurationError",
    "DelayJobsError",
    "EngineUnavailable",
    "InvalidSchedule",
    "NotDelayable",
    "UnknownAction",
]
