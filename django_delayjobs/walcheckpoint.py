"""SQLite in WAL mode: a worker's commits never run a checkpoint; its housekeeping does.

SQLite checkpoints the WAL (copies its pages back into the database file) inside the
commit that takes it past ``wal_autocheckpoint`` pages (1,000): at a few hundred jobs a
second that is a 5-10 ms stall of a worker thread about every 60 jobs, most of a
queue's p99 lateness. While a worker process runs, its connections to SQLite databases
are opened with ``PRAGMA wal_autocheckpoint=0`` and the housekeeping thread runs a
``PASSIVE`` checkpoint (one that never waits for readers or writers) at most once a
second, beside the worker threads, when jobs have finished since the last one (an idle
worker does no disk I/O). Only the database the jobs live on: the project's other aliases,
and other processes' connections, keep SQLite's default.

A PASSIVE checkpoint alone lets the WAL grow for as long as the worker is busy: the WAL
starts again from its beginning only once all of it is copied, and a worker thread
commits while the checkpoint runs (a busy worker's WAL grew by about 1 GB in 20 s). So
once the WAL holds ``RESTART_PAGES`` pages, a ``RESTART`` checkpoint follows, which takes
the write lock to copy the pages committed meanwhile and starts the WAL over. Not every
second: holding the write lock through its ``fsync`` stalls the worker's commits
(W4's p99 at 1,000,000 rows went from 5-6 ms to 20-31 ms with one every second). It waits
at most ``RESTART_WAIT_MS`` for the lock and for readers still on the WAL (it holds the
write lock while it waits); when it cannot have them, the next checkpoint tries again.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from . import sql

logger = logging.getLogger("django_delayjobs.worker")

UID = "django_delayjobs.walcheckpoint"
#: The WAL is started over once it holds this many pages (256 MiB of 4 KiB pages).
RESTART_PAGES = 65_536
#: The longest a RESTART checkpoint waits for the write lock and for readers (ms).
RESTART_WAIT_MS = 5


def _no_autocheckpoint(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.vendor == "sqlite" and connection.alias == sql.db():
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint=0")


def take_over() -> None:
    """From now on, connections this process opens leave checkpoints to ``checkpoint()``."""
    connection_created.connect(_no_autocheckpoint, dispatch_uid=UID)


def give_back() -> None:
    connection_created.disconnect(dispatch_uid=UID)


def checkpoint() -> None:
    """Copy the WAL of the jobs' database, if SQLite, back into it (an in-memory one has
    no WAL), and start a long WAL over (above). A failure is logged and left to the next
    call."""
    conn = connections[sql.db()]
    if conn.vendor != "sqlite" or conn.is_in_memory_db():  # type: ignore[attr-defined]
        return
    try:
        with conn.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            if cursor.fetchone()[1] >= RESTART_PAGES:  # pages in the WAL (-1: not WAL)
                _restart(cursor)
    except DatabaseError as exc:
        logger.warning("could not checkpoint the WAL of SQLite database %r (%s); trying "
                       "again after the next jobs", conn.alias, exc)  # fmt: skip


def _restart(cursor: Any) -> None:
    cursor.execute("PRAGMA busy_timeout")
    waits = int(cursor.fetchone()[0])
    cursor.execute(f"PRAGMA busy_timeout = {RESTART_WAIT_MS}")
    try:
        cursor.execute("PRAGMA wal_checkpoint(RESTART)")
        cursor.fetchone()
    finally:
        cursor.execute(f"PRAGMA busy_timeout = {waits}")
