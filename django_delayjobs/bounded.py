"""Database reads that a database that does not answer cannot hold for ever.

A server that accepts connections and never answers (a host that hangs), or a table held
by a lock (a migration's ``ALTER TABLE``), holds a query for as long, and Python cannot
stop a call that waits on a socket. A read that serves a scrape or a probe therefore runs
in a thread of its own, with a connection of its own that it closes, and is waited for
at most ``DATABASE_TIMEOUT_SECONDS``. One such thread runs at a time: a read waits for
the one under way (within its own bound) rather than leave one more thread and connection
behind at each scrape, and fails at once while one that was given up on still waits (a
health check of many queues must not wait the bound once per queue).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

T = TypeVar("T")

#: How long a bounded read waits for the database.
DATABASE_TIMEOUT_SECONDS = 5.0

_slot = threading.Semaphore(1)  # held by the thread of the read under way
_given_up: threading.Thread | None = None  # the last read's thread that was not waited out


class DatabaseTimeout(DatabaseError):
    """The database did not answer a bounded read in time."""


def read(fn: Callable[[], T], *, name: str = "delayjobs-database-read") -> T:
    """``fn()`` run in a thread of its own (called ``name``); ``DatabaseTimeout`` if it
    has not returned within ``DATABASE_TIMEOUT_SECONDS`` (it goes on, and ends when the
    database answers)."""
    global _given_up
    seconds = DATABASE_TIMEOUT_SECONDS  # read when it runs: tests shorten it
    deadline = time.monotonic() + seconds
    given_up = _given_up
    if given_up is not None and given_up.is_alive():
        raise DatabaseTimeout(f"the database did not answer within {seconds:g} s (an "
                              "earlier read is still waiting for it)")  # fmt: skip
    if not _slot.acquire(timeout=seconds):
        raise DatabaseTimeout(f"the database did not answer within {seconds:g} s (an "
                              "earlier read is still waiting for it)")  # fmt: skip
    answer: list[tuple[T | None, Exception | None]] = []

    def run() -> None:
        try:
            answer.append((fn(), None))
        except Exception as exc:  # given to the caller
            answer.append((None, exc))
        finally:
            with contextlib.suppress(DatabaseError):
                connections.close_all()  # this thread's connections only
            _slot.release()

    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
    except BaseException:  # no thread started ("can't start new thread")
        _slot.release()
        raise
    thread.join(max(0.0, deadline - time.monotonic()))
    if not answer:
        _given_up = thread
        raise DatabaseTimeout(f"the database did not answer within {seconds:g} s")
    value, error = answer[0]
    if error is not None:
        raise error
    return value  # type: ignore[return-value]
