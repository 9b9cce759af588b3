"""django-delayjobs: delayed one-shot actions. Redis is the clock, the database the judge.

The public API is importable from here; models load only when a verb is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .callbacks.service import schedule_http
    from .exceptions import GiveUp, Retry
    from .receivers import cancel_on
    from .registry import delayable
    from .services import cancel_for, schedule, schedule_many

__all__ = [
    "GiveUp",
    "Retry",
    "cancel_for",
    "cancel_on",
    "delayable",
    "schedule",
    "schedule_http",
    "schedule_many",
]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing the package (or its Django-free engine) imports neither
    # models (apps may not be ready) nor Django.
    if name == "delayable":
        from .registry import delayable

        return delayable
    if name in ("schedule", "schedule_many", "cancel_for"):
        from . import services

        return getattr(services, name)
    if name == "schedule_http":
        from .callbacks.service import schedule_http

        return schedule_http
    if name in ("Retry", "GiveUp"):
        from . import exceptions

        return getattr(exceptions, name)
    if name == "cancel_on":
        from . import receivers

        return receivers.cancel_on
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
