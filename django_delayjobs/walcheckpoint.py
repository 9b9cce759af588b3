"""SQLite in WAL mode: a worker's commits never run a checkpoint; its housekeeping does.

SQLite checkpoints the WAL (copies its pages back into the database file) inside the
commit that takes it past ``wal_autocheckpoint`` pages (1,000): at a few hundred jobs a
second that is a 5-10 ms stall of a worker thread about every 60 jobs, most of a
queue's p99 lateness. While a worker process runs, its connections to SQLite databases
are opened with ``PRAGMA wal_autocheckpoint=0`` and the housekeeping thread runs a
``PASSIVE`` checkpoint (one that never waits for readers or writers) at most once a
second, beside the worker threads, when jobs have finished since the last one (an idle
worker does no disk I/O). Other processes' connections keep SQLite's default.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

UID = "django_delayjobs.walcheckpoint"


def _no_autocheckpoint(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint=0")


def take_over() -> None:
    """From now on, connections this process opens leave checkpoints to ``checkpoint()``."""
    connection_created.connect(_no_autocheckpoint, dispatch_uid=UID)


def give_back() -> None:
    connection_created.disconnect(dispatch_uid=UID)


def checkpoint() -> None:
    """Run a PASSIVE checkpoint of every SQLite database (in-memory ones have no WAL).
    A failure is left to the next call."""
    for conn in connections.all():
        if conn.vendor != "sqlite" or conn.is_in_memory_db():  # type: ignore[attr-defined]
            continue
        with contextlib.suppress(DatabaseError), conn.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
