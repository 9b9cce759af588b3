"""Module-level actions for the tests."""

import time

from django.db import connection

from django_delayjobs import delayable
from django_delayjobs.models import Job

from .models import Record


@delayable
def record(label: str, **extra: object) -> str:
    Record.objects.create(label=label)
    return label


@delayable
def echo(*args: object, **kwargs: object) -> None:
    Record.objects.create(label=repr((args, kwargs)))


@delayable
def fail(label: str = "boom") -> None:
    Record.objects.create(label=f"attempt:{label}")
    raise RuntimeError(f"failing on purpose: {label}")


@delayable
def slow(label: str, seconds: float) -> None:
    time.sleep(seconds)
    Record.objects.create(label=label)


def plain(label: str) -> None:
    """Not registered: scheduling it must fail."""


@delayable
def write_then_sleep(label: str, seconds: float) -> None:
    """Write first, then sleep: a kill during the sleep must roll the write back."""
    Record.objects.create(label=label)
    time.sleep(seconds)


#: The database connections the actions of ``note_connection`` ran on (kept alive, so
#: that distinct connections have distinct ids).
seen_connections: list[object] = []


@delayable
def note_connection() -> None:
    seen_connections.append(connection.connection)


@delayable
def cancel_job(job_id: str) -> None:
    """Cancel another job from inside an action and record whether the cancel won."""
    won = Job.objects.get(pk=job_id).cancel()
    Record.objects.create(label=f"cancelled:{won}")


from . import task_functions  # noqa: E402,F401  (the worker imports @task functions via tasks.py)
