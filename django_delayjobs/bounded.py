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


class DatabaseTimeout(DatabaseError):
    """The database did not answer a bounded read in time."""


class TimedOut(Exception):
    """A call of ``OneAtATime`` did not return in time. ``earlier``: it was not made,
    since an earlier call, given up on, still runs (or one under way did not end in time)."""

    def __init__(self, earlier: bool) -> None:
        super().__init__("an earlier call still runs" if earlier else "no answer in time")
        self.earlier = earlier


class OneAtATime:
    """Calls that may wait on a socket, each run in a thread of its own and waited for at
    most so long, one at a time: a call waits for the one under way (within its own
    bound), and fails at once while one that was given up on still runs."""

    def __init__(self) -> None:
        self._slot = threading.Semaphore(1)  # held by the thread of the call under way
        self._given_up: threading.Thread | None = None  # the last call's, not waited out

    def call(self, fn: Callable[[], T], seconds: float, name: str) -> T:
        """``fn()`` in a thread called ``name``; ``TimedOut`` if it has not returned within
        ``seconds`` (it goes on, and ends when what it waits on answers). The thread closes
        its own database connections when it ends."""
        deadline = time.monotonic() + seconds
        given_up = self._given_up
        if given_up is not None and given_up.is_alive():
            raise TimedOut(earlier=True)
        if not self._slot.acquire(timeout=seconds):
            raise TimedOut(earlier=True)
        answer: list[tuple[T | None, Exception | None]] = []

        def run() -> None:
            try:
                answer.append((fn(), None))
            except Exception as exc:  # given to the caller
                answer.append((None, exc))
            finally:
                with contextlib.suppress(DatabaseError):
                    connections.close_all()  # this thread's connections only
                self._slot.release()

        thread = threading.Thread(target=run, name=name, daemon=True)
        try:
            thread.start()
        except BaseException:  # no thread started ("can't start new thread")
            self._slot.release()
            raise
        thread.join(max(0.0, deadline - time.monotonic()))
        if not answer:
            self._given_up = thread
            raise TimedOut(earlier=False)
        value, error = answer[0]
        if error is not None:
            raise error
        return value  # type: ignore[return-value]


_reads = OneAtATime()


def read(fn: Callable[[], T], *, name: str = "delayjobs-database-read") -> T:
    """``fn()`` run in a thread of its own (called ``name``); ``DatabaseTimeout`` if it
    has not returned within ``DATABASE_TIMEOUT_SECONDS`` (it goes on, and ends when the
    database answers)."""
    seconds = DATABASE_TIMEOUT_SECONDS  # read when it runs: tests shorten it
    try:
        return _reads.call(fn, seconds, name)
    except TimedOut as exc:
        earlier = " (an earlier read is still waiting for it)" if exc.earlier else ""
        message = f"the database did not answer within {seconds:g} s{earlier}"
        raise DatabaseTimeout(message) from None
