"""One delivery of a job: claim the row, run the action, write the outcome. Returns a
``Result``; Redis and signals are ``outcomes.settle``'s business.

The database decides. The claim is a conditional UPDATE; the action runs inside
``transaction.atomic()`` whose last statement is the ``succeeded`` UPDATE fenced by the
row's (attempt, delivery), so a worker that was overtaken (its lease expired and another
worker took the row) cannot commit a second outcome: its effects roll back.

Who is to blame decides what a failure costs. Anything the action raises, ``SystemExit``
and ``KeyboardInterrupt`` included, is the action's failure: an attempt is used. So is
what it does to the transaction it runs in: closing the connection inside it, leaving an
atomic block open or autocommit off, deleting or changing its own job's row. A lost
database connection is not: the delivery is handed back and the same attempt runs again
(at most ``MAX_DELIVERIES`` times), except after a non-atomic action, whose outcome is
tried again for a while first, on a new connection if need be (running it again would
repeat its outside effect). A row that cannot be read or run at all is dead at once.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.contrib.contenttypes.models import ContentType
from django.db import (
    DatabaseError,
    DataError,
    InterfaceError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError
from django.utils import timezone, translation

from . import serialization, signals, sql
from .conf import delayjobs_settings
from .exceptions import GiveUp, Retry, TimeLimitExceeded, UnknownAction
from .logs import job_fields, one_line
from .models import ACTIVE, EventKind, Job, JobEvent, Status
from .outcomes import Outcome, Result, after_failure, leaves
from .registry import resolve

logger = logging.getLogger("django_delayjobs.worker")

#: The job whose action is running in this thread (for actions that want their attempt):
#: a copy (``handed_out``), so that the action cannot move its outcome's fence.
current_job: ContextVar[Job | None] = ContextVar("current_job", default=None)
_notes: ContextVar[list[str] | None] = ContextVar("delayjobs_notes", default=None)

#: A job promoted this close to its due time (Redis and this host's clocks may differ by
#: a little, and due times are whole ms) waits here instead of going back to Redis.
EARLY_WAIT = timedelta(seconds=1)
#: How long a delivery handed back for a lost database connection waits in Redis (and one
#: that its claim did not match though its row looks claimable: ``not_claimed_yet``).
HAND_BACK_DELAY = timedelta(seconds=1)
#: How long the outcome of a non-atomic action is tried again while the database fails it
#: (SQLite's write lock held past the busy timeout, a restart), and the pause between tries.
OUTCOME_PATIENCE = timedelta(seconds=60)
OUTCOME_PAUSE = timedelta(seconds=0.5)
#: PostgreSQL's SQLSTATEs of a failure that passes, besides class 08 (connection
#: exceptions): a restart or a failover (admin or crash shutdown, cannot connect now, too
#: many connections) and contention (serialization failure, deadlock, lock or statement
#: timeout).
PASSING_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300",
                               "40001", "40P01", "55P03", "57014"})  # fmt: skip
#: PostgreSQL's read-only transaction: a standby's session, or one set so.
READ_ONLY_SQLSTATE = "25006"
#: SQLite's primary result codes of a failure that passes: SQLITE_BUSY, SQLITE_LOCKED.
PASSING_SQLITE_CODES = (5, 6)
#: Longest text one ``note()`` keeps.
NOTE_LIMIT = 4096

T = TypeVar("T")


def note(text: str) -> None:
    """Add a line to the history event of the attempt running in this thread (an HTTP
    callback's status and latency, say). Only inside an action run by a worker."""
    notes = _notes.get()
    if notes is None:
        raise RuntimeError("note() works only inside an action run by a worker")
    notes.append(sql.clean_text(str(text), NOTE_LIMIT))


class _Overtaken(Exception):
    """The fenced outcome UPDATE matched no row: another delivery owns the job, or the
    action changed its row. ``row``: its (status, attempt, delivery) as the outcome's
    transaction read it."""

    def __init__(self, row: tuple[str, int, int]) -> None:
        super().__init__(row)
        self.row = row


class JobRowChanged(Exception):
    """The action changed the status, attempt or delivery of the row of the job running
    it (the worker's to write): an atomic action's attempt failed (the change rolled
    back with its other writes)."""


class ResultNotStored(GiveUp):
    """A non-atomic action returned a value that cannot be stored: its job is dead, not
    retried, since its outside effect has happened and running it again would repeat it."""


class JobRowDeleted(Exception):
    """The action deleted the row of the job running it: an atomic action's attempt
    failed (the deletion rolled back with its other writes)."""


class _ClaimAheadFailed(Exception):
    """The database refused the claim of the next job inside this job's outcome
    transaction, so that transaction (the action's effects with it) is lost."""


#: The session settings PostgreSQL reports to its client as they change, read without a
#: query. A ``SET`` an action runs outlives the action (it commits with its transaction, or
#: runs outside one), and some would fail the next job's claim on the connection: its
#: row unreadable (``DateStyle``, ``client_encoding``), or refused (read-only).
REPORTED_SETTINGS = (
    "DateStyle", "IntervalStyle", "TimeZone", "client_encoding", "search_path",
    "standard_conforming_strings", "default_transaction_read_only", "session_authorization",
)  # fmt: skip


_REPORTED_BYTES = tuple(name.encode() for name in REPORTED_SETTINGS)


def session_settings(raw: Any) -> tuple[object, ...]:
    """What ``raw`` (a driver's connection) reports of ``REPORTED_SETTINGS``; () for a
    driver that reports none (SQLite)."""
    try:
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is not None:  # psycopg 3's libpq connection: about 2 us, 10 times less
            return tuple(map(pgconn.parameter_status, _REPORTED_BYTES))
        status = getattr(getattr(raw, "info", None), "parameter_status", None)  # psycopg2
        return () if status is None else tuple(map(status, REPORTED_SETTINGS))
    except Exception:  # a connection the action closed: not the session it started on
        return ("?",)


class Connection:
    """The database connection a step starts on, to tell afterwards whether it was lost,
    or whether its session's settings were changed. ``wrapper``: this thread's
    ``connections[alias]``, which stays the same object while the raw connection under
    it is closed and opened again."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.wrapper = wrapper
        self.raw = wrapper.connection
        self.settings = session_settings(self.raw)

    def changed(self) -> bool:
        """Whether the session this step started on now reports other settings."""
        raw = self.wrapper.connection
        return (raw is self.raw and raw is not None and self.settings != ()
                and session_settings(raw) != self.settings)  # fmt: skip

    def lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the connection failing, not the job: an operational or
        interface error (alone, or in an exception group: an asyncio ``TaskGroup``'s)
        after which the connection is gone, replaced or unusable. (When a rollback fails
        Django drops the connection, and may have opened a new one by the time the error
        arrives here.)"""
        if not any(isinstance(leaf, OperationalError | InterfaceError) for leaf in leaves(exc)):
            return False
        raw = self.wrapper.connection
        return raw is None or raw is not self.raw or not self.wrapper.is_usable()

    def passing(self, exc: DatabaseError) -> bool:
        """Whether ``exc`` is a failure that time mends: the connection lost or a new one
        refused (a restart, a failover, a network cut), contention (a lock, SQLite's busy
        database), or a read-only transaction on a session opened since this step began (a
        failover that reached a standby; the session it began on was set so, by the action
        say). Not a statement the database refuses for good (a missing table or column, a
        trigger's error), which no wait mends."""
        cause = exc.__cause__
        state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None) or ""
        if state.startswith("08") or state in PASSING_SQLSTATES:
            return True
        if state == READ_ONLY_SQLSTATE:
            return self.wrapper.connection is not self.raw
        if getattr(cause, "sqlite_errorcode", 0) & 0xFF in PASSING_SQLITE_CODES:
            return True
        return self.wrapper.connection is None or not self.wrapper.is_usable()


def class_path(exc: BaseException) -> str:
    """The dotted path of ``exc``'s class, builtins included (``builtins.ValueError``)."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def describe(exc: BaseException, notes: list[str] | tuple[str, ...] = ()) -> str:
    """The history's text for a failure.

    Its first line is written here and nowhere else: the raised exception's class path and
    the first line of its message (``builtins.ValueError: boom``). The task backend reads
    the class from it and the worker logs it, so a message or a note that quotes another
    traceback cannot pass for the failure. Then the action's notes; then, for anything but
    a deliberate ``Retry``/``GiveUp`` and a ``TimeLimitExceeded`` (whose message is the
    reason), the traceback as Python formats it.
    """
    try:
        message = str(exc)
    except BaseException:  # as traceback does: a __str__ may raise anything, SystemExit too
        message = "<exception str() failed>"
    deliberate = isinstance(exc, Retry | GiveUp | TimeLimitExceeded)
    head = message if deliberate else next(iter(message.splitlines()), "")
    lines = [f"{class_path(exc)}: {head}" if head else class_path(exc), *notes]
    if not deliberate:
        lines.append("".join(traceback.format_exception(exc)))
    return "\n".join(lines)


def restore_autocommit(conn: BaseDatabaseWrapper) -> bool:
    """Roll back and turn autocommit on again if an action left it off outside an atomic
    block (``transaction.set_autocommit(False)``); True if it did. Left off, every later
    outcome and claim of the thread would go into a transaction that never commits."""
    if conn.connection is None or conn.in_atomic_block or conn.get_autocommit():
        return False
    conn.rollback()
    conn.set_autocommit(True)
    return True


def close_atomic_blocks(conn: BaseDatabaseWrapper, depth: int) -> int:
    """Exit, rolling back, the atomic blocks beyond the first ``depth`` that an action
    entered and never exited (``transaction.atomic().__enter__()``); return how many.
    Left open, their transaction never commits: every later claim and outcome of the
    thread would go into it and be lost with it."""
    left_open = len(conn.atomic_blocks) - depth
    while len(conn.atomic_blocks) > depth:
        error = TransactionManagementError("left open by the action")
        # Each exit pops the innermost block, so the loop ends whatever the database says.
        with contextlib.suppress(DatabaseError):
            conn.atomic_blocks[-1].__exit__(type(error), error, None)
    return max(left_open, 0)


#: The event kinds of a success, as written (an enum member's ``.value`` is a call).
_SUCCEEDED, _STARTED = EventKind.SUCCEEDED.value, EventKind.STARTED.value


#: Per database alias whose connection this thread has set up: how many atomic blocks it
#: has open, and whether it was closed inside one (``transaction_states``).
TransactionStates = dict[str, tuple[int, bool]]


def transaction_states() -> TransactionStates:
    """The state of this thread's connections to every database, to repair afterwards
    what user code (an action) did to them (``left_behind``)."""
    return {conn.alias: (len(conn.atomic_blocks), conn.closed_in_transaction)
            for conn in connections.all(initialized_only=True)}  # fmt: skip


def left_behind(
    before: TransactionStates, first: BaseDatabaseWrapper
) -> list[tuple[BaseDatabaseWrapper, str]]:
    """Repair what user code did to this thread's connections since ``before`` that would
    cost the worker's later jobs (see ``close_atomic_blocks`` and ``restore_autocommit``),
    on every database: left so on another than the jobs', the later jobs' writes there
    would be lost. Return each connection it found so with what was done to it, ``first``
    (the jobs' database) first. Then raise the ``DatabaseError`` of a rollback that
    failed, if one did (a lost connection: closed, the next query opens a new one)."""
    found = []
    failed: DatabaseError | None = None
    for conn in sorted(connections.all(initialized_only=True), key=lambda c: c is not first):
        depth, closed_before = before.get(conn.alias, (0, False))
        # Set by close() inside an atomic block only (until the next connect): a lost
        # connection never sets it, so user code's close() is not taken for the database
        # failing (and handed back).
        closed = conn.closed_in_transaction and not closed_before
        left_open = close_atomic_blocks(conn, depth)
        try:
            left_off = restore_autocommit(conn)
        except DatabaseError as exc:  # the others are repaired all the same
            failed = failed or exc
            with contextlib.suppress(DatabaseError):
                conn.close()
            continue
        on = "" if conn is first else f" on the database {conn.alias!r}"
        if closed:
            what = (f"closed the database connection{on} inside a transaction "
                    "(connection.close(), or close_old_connections(), which closes one that "
                    "is in a transaction): what it wrote in that transaction was rolled "
                    "back")  # fmt: skip
        elif left_open:
            blocks = "block" if left_open == 1 else "blocks"
            what = (f"left {left_open} transaction.atomic() {blocks} open{on} (entered and "
                    "never exited): what it wrote was rolled back")  # fmt: skip
        elif left_off:
            what = (f"left autocommit off{on} (transaction.set_autocommit(False)) without "
                    "turning it back on: what it wrote uncommitted was rolled back")  # fmt: skip
        else:
            continue
        found.append((conn, what))
    if failed is not None:
        raise failed
    return found


def receivers_left_behind(first: BaseDatabaseWrapper) -> None:
    """Repair what signal receivers did to this thread's connections (``left_behind``; the
    worker holds no transaction while it sends signals), and log it. Never raises."""
    try:
        found = left_behind({}, first)
    except DatabaseError:  # a lost connection: closed, and the next query opens a new one
        return
    for _, what in found:
        logger.error("a receiver of a django-delayjobs signal %s; repaired", what)


def handed_out(job: Job) -> Job:
    """A copy of ``job`` for user code (the action, through ``current_job``, and the
    receivers of ``job_started``). The worker's own copy holds the fence (id, attempt,
    delivery) that its outcome is written under: user code that changed it, or copied the
    job as Django copies an instance (``pk = None``, ``save()``), left the job running,
    its effects rolled back as if it had been overtaken, or its outcome in another row.
    Made as ``Model.__getstate__`` copies an instance, at a third of ``copy.copy``'s cost."""
    clone = Job.__new__(Job)
    clone.__dict__.update(job.__dict__)
    state = clone._state = copy.copy(job._state)
    state.fields_cache = state.fields_cache.copy()
    return clone


def end_forked_child(pid: int, exc: BaseException | None) -> None:
    """End this process here if it is not ``pid``, the worker, but a child that the action
    forked (``os.fork()``) and that came back from it, raising (``sys.exit()``, an error)
    or returning instead of ending by ``os._exit()``. It must not go on as the worker: it
    would write the job's outcome over its parent's database connection, then claim jobs
    with no heartbeat. It exits with the code ``sys.exit`` would give it (1 and the
    traceback for an error), without the at-exit handlers, which are its parent's."""
    if os.getpid() == pid:
        return
    code = 0
    with contextlib.suppress(BaseException):  # nothing may keep it from exiting
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        elif exc is not None:
            code = 1
            traceback.print_exception(exc)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code & 0xFF)  # as the system keeps it (and never too large for _exit)


async def _await(awaitable: Awaitable[Any], pid: int) -> Any:
    """Await ``awaitable`` in the event loop's thread, which a child the coroutine forked
    would come back to: it ends there (``end_forked_child``), or it would wait forever for
    work that only its parent's threads give."""
    try:
        value = await awaitable
    except BaseException as exc:
        end_forked_child(pid, exc)
        raise
    end_forked_child(pid, None)
    return value


def success(stored: Any) -> dict[str, Any]:
    """The columns a success writes, ``stored`` being the action's return value."""
    return {"status": Status.SUCCEEDED, "finished_at": timezone.now(), "result": stored}


def settled(job: Job, values: dict[str, Any]) -> None:
    """Give the worker's copy of ``job`` the outcome just committed, as the row has it:
    the receivers of the outcome's signals (and ``task_finished``'s result) read it.
    Except ``run_at``, the next due time of a retry: the copy keeps the due time of the
    attempt that ran, which its lateness is measured from."""
    for name, value in values.items():
        if name != "run_at":
            setattr(job, name, value)


def unclaim(job: Job, worker_id: str, wait: float | None = None) -> bool:
    """Undo ``worker_id``'s claim of ``job`` (its row as that claim returned it), handed
    back before its action started: the row waits again, claimable at once, and the
    hand-back costs the job neither an attempt nor a delivery (an attempt is counted
    before its action runs, not for one that never did). A new attempt goes back to
    waiting in the status it waited in (``_waited_as``); a running row taken over keeps running
    for its next delivery, its start cleared so that no worker waits half a lease for it.
    One UPDATE fenced by that very claim (attempt, delivery, worker and start: another
    claim of this worker's, of the same attempt and delivery once this one is undone, has
    a start of its own), and a
    ``handed_back`` event that answers its ``started`` one, in one transaction; False if
    the row no longer holds that claim. ``wait``: the longest its statements may wait for
    the database (``sql.waiting_at_most``)."""
    values: dict[str, Any] = {"deliveries": job.deliveries - 1, "started_at": None,
                              "worker": ""}  # fmt: skip
    what = "delivery" if job.deliveries > 1 else "attempt"
    with sql.waiting_at_most(wait):
        if job.deliveries <= 1:
            status = _waited_as(job) if job.attempts > 1 else Status.SCHEDULED
            values.update(status=status, attempts=job.attempts - 1, deliveries=0)
        mine = Job.objects.using(sql.db()).filter(
            pk=job.pk, attempts=job.attempts, deliveries=job.deliveries,
            status=Status.RUNNING, worker=worker_id[:128], started_at=job.started_at,
        )  # fmt: skip
        if not mine.update(**values):
            return False
        sql.insert_event(job, EventKind.HANDED_BACK.value, f"worker:{worker_id}",
                         f"handed back before its action started: this {what} is not "
                         "counted")  # fmt: skip
    return True


def _waited_as(job: Job) -> Status:
    """The status ``job`` waited in before its claim of an attempt after the first:
    ``retrying`` if an attempt failed since it was last requeued (a requeue keeps the
    attempts, which fence the outcomes, and makes the job ``scheduled``)."""
    last = (
        JobEvent.objects.using(sql.db())
        .filter(job_id=job.pk, kind__in=[EventKind.FAILED, EventKind.REQUEUED])
        .order_by("-id").values_list("kind", flat=True).first()
    )  # fmt: skip
    return Status.RETRYING if last == EventKind.FAILED else Status.SCHEDULED


class Execution:
    """Everything that happens to one id a worker took from Redis."""

    def __init__(
        self,
        queue: str,
        job_id: str,
        worker_id: str,
        *,
        claimed: Job | None = None,
        then: Callable[[], str | None] | None = None,
        starts: Callable[[Execution], bool] | None = None,
    ) -> None:
        """``claimed``: this job's row, already claimed by the previous job's outcome
        transaction. ``then``: gives the id this worker runs next (asked when this job
        has succeeded: None once the worker is stopping); a success claims it in the
        same transaction that records this job's outcome (``next_job``), which saves a
        commit per job and still claims each job only when the one before it is done,
        so a cancel wins until then. ``starts``: asked as soon as the row is claimed,
        sets ``kept``, or says that the worker handed the job back meanwhile (its claim
        is then undone here: ``unclaim``)."""
        self.queue = queue
        self.job_id = job_id
        self.worker_id = worker_id
        self.actor = f"worker:{worker_id}"
        self.job: Job | None = None
        #: Whether this delivery claimed the row (its action is to run here): ``job`` is
        #: set as well while a claim that matched nothing decides the job's fate.
        self.row_claimed = False
        #: The time the last claim of the row compared it with (None before the first).
        self.claimed_at: datetime | None = None
        self.claimed = claimed
        self.then = then
        self.starts = starts
        self.next_job: Job | None = None
        #: When the action started (``time.monotonic()``), while it runs; else None.
        self.running_since: float | None = None
        #: While the action does not run, when this stretch without it started (the
        #: claim, the signals): else None.
        self.outside_since: float | None = time.monotonic()
        #: Whether the action was called (a failure before that is never the action's).
        self.called = False
        #: Whether the worker kept this delivery's claim (``starts``), just after it: a
        #: hand-back undoes only a claim that never got this far (``unstarted``).
        self.kept = False
        #: The connection a non-atomic action began with (see ``until_written``).
        self.outside: Connection | None = None
        #: Whether an earlier try of this outcome may have committed (its connection was
        #: cut at COMMIT): a row that holds this very outcome is then that try's.
        self.rewriting = False
        #: The next job as this outcome's last try claimed it (``claim_ahead``), if it did.
        self.ahead: Job | None = None
        #: The connection the job started on, once claimed (to see its session changed).
        self.connection: Connection | None = None
        #: This thread's connection to the jobs' database (Django's wrapper).
        self.db = connections[sql.db()]

    def run(self) -> Result:
        """Process the job and return what became of it. Never raises for the job's sake."""
        # Each job starts in the project's time zone and language, as a worker thread
        # does: one an earlier action (or a receiver) activated for the rest of the thread
        # (``activate()``, not ``override()``) would be the next job's, another customer's.
        timezone.deactivate()
        translation.deactivate()
        claimed = self.claimed or self.claim()
        if isinstance(claimed, Result):
            return claimed
        job = self.job = claimed
        self.row_claimed = True
        # Kept (or given up) at once: from here on a receiver, the arguments or the action
        # may hang, and a claim that got this far counts its delivery, as any lost one.
        if self.starts is not None and not self.starts(self):
            return self.not_started(job)
        self.kept = True  # (``starts`` set it already, in the worker's lock)
        self.connection = Connection(self.db)  # before the receivers: they may change it too
        # The copy for them costs a few us. Asked for sender=Job, as sent: without a
        # sender, only the receivers of any sender count, not those connected for Job.
        if signals.job_started.has_listeners(Job):
            signals.send(signals.job_started, handed_out(job))
            receivers_left_behind(self.db)
        if job.expires_at is not None and timezone.now() > job.expires_at:
            return self.finish(Outcome.SKIPPED, f"expired at {job.expires_at.isoformat()}")
        connection = Connection(self.db)
        try:
            fn = self.resolve(job)
            args, kwargs = serialization.load(job.args), serialization.load(job.kwargs)
        except Exception as exc:
            if connection.lost(exc):
                return self.hand_back(exc)
            if isinstance(exc, OperationalError | InterfaceError):  # the target's database:
                return self.failed(exc, [], 0.0)  # an attempt failed, as in the action
            return self.finish(Outcome.DEAD, f"cannot run this job: {exc}")
        if fn is None:
            return self.finish(Outcome.SKIPPED, "the target object no longer exists")
        return self.execute(fn, args, kwargs)

    # -- claim -------------------------------------------------------------------

    def claim(self) -> Job | Result:
        """Claim the row for a delivery, or say why there is nothing to run."""
        try:
            with transaction.atomic(using=sql.db()):
                at = self.claimed_at = timezone.now()
                job = sql.claim(self.job_id, self.worker_id, at,
                                delayjobs_settings.MAX_DELIVERIES,
                                commit_without_waiting=True)  # fmt: skip
                if job is not None:
                    self.event(job, EventKind.STARTED, self.started_message(job))
                    return job
            return self.not_claimed()
        except (OperationalError, InterfaceError) as exc:
            return self.hand_back(exc)  # nothing was written: no attempt, no delivery used
        except Exception as exc:
            if self.poisoned():
                return self.bury_unreadable(exc)
            if isinstance(exc, DatabaseError):  # it refuses writes (read-only, permissions)
                return self.hand_back(exc)
            raise  # a bug here, not the row's fault

    def started_message(self, job: Job) -> str:
        text = f"attempt {job.attempts} of {job.max_attempts}"
        if job.deliveries > 1:
            text += (f", delivery {job.deliveries} of {delayjobs_settings.MAX_DELIVERIES}"
                     " (an earlier delivery never recorded an outcome)")  # fmt: skip
        return text

    def not_claimed(self) -> Job | Result:
        """The claim matched nothing: finished, not due yet, running too recently to be
        taken over, or out of deliveries."""
        job = sql.fetch(self.job_id)
        if job is None or job.status not in ACTIVE:
            return Result(Outcome.DROPPED, job)  # cancelled, finished or deleted
        now = timezone.now()
        early = (job.run_at - now).total_seconds()
        if early > EARLY_WAIT.total_seconds():  # rescheduled after Redis promoted it
            return Result(Outcome.DEFERRED, job, retry_at=job.run_at)
        if early > 0:  # this host's clock is behind Redis's: never start before run_at
            time.sleep(early)
            return self.claim()
        running = job.status == Status.RUNNING
        if running and job.started_at is not None and job.worker != self.worker_id[:128]:
            # Its worker may be alive (see sql.takeover_delay): neither taken over nor
            # buried, even out of deliveries (its last delivery may be the one running).
            if job.started_at > now:
                return self.found_ahead(job, now)
            takeover_at = job.started_at + sql.takeover_delay()
            if takeover_at > now:
                return self.not_taken_over(job, takeover_at)
        self.job = job
        if running and job.deliveries >= delayjobs_settings.MAX_DELIVERIES:
            return self.finish(Outcome.DEAD, (
                f"attempt {job.attempts} was delivered {job.deliveries} time(s) and never "
                "recorded an outcome: its worker was lost each time (killed, out of memory, "
                "stopped when the action ran past MAX_RUN_SECONDS, or the action ends the "
                "process), or the database refused to record it. Requeue it once the cause "
                "is fixed."
            ))  # fmt: skip
        if not running and job.attempts >= job.max_attempts:
            return self.finish(Outcome.DEAD, "no attempts left", fence=False)
        if self.claimable_only_since(job, now):
            return self.claim()
        return self.not_claimed_yet(job)

    def claimable_only_since(self, job: Job, now: datetime) -> bool:
        """Whether the row became claimable between the claim's time and ``now`` (due, or
        its takeover time come, in between: the claim saw it before): claimed again at
        once, as the next claim's time is later. Not a row the claim saw claimable."""
        at = self.claimed_at
        if at is None or at >= now:
            return False
        if job.status != Status.RUNNING:
            return job.run_at > at
        if job.started_at is None or job.worker == self.worker_id[:128]:
            return False  # claimable whatever the time
        return min(job.started_at, at) + sql.takeover_delay() > at

    def not_claimed_yet(self, job: Job) -> Result:
        """Defer the delivery of a row that the claim did not match though the checks
        above find it claimable: it changed between the claim and the read (a running row
        reaching its takeover time, a reschedule), or the two disagree about it for good
        (a time written by hand in a form the SQL compares otherwise, such as ISO text
        with a 'T' in SQLite): looked at again in ``HAND_BACK_DELAY``, not at once, so a
        disagreement costs one claim a second, not a tight loop; said each time."""
        if job.status == Status.RUNNING:
            at = "an unknown time" if job.started_at is None else job.started_at.isoformat()
            state = f"running since {at} on {job.worker!r}"
        else:
            state = f"{job.status}, due at {job.run_at.isoformat()}"
        logger.info("job %s: %s, not claimed: looked at again in %.0f s", self.job_id,
                    state, HAND_BACK_DELAY.total_seconds(),
                    extra=job_fields(self.job_id, self.queue, job, "deferred"))  # fmt: skip
        return Result(Outcome.DEFERRED, job, retry_at=timezone.now() + HAND_BACK_DELAY)

    def found_ahead(self, job: Job, now: datetime) -> Result:
        """Defer the delivery of a running row whose start lies ahead of this host's clock
        (written by a worker host whose clock is ahead, or by hand), and have the database
        write its own time as the start if it is ahead of that too (``sql.restart``). Its
        claim came before the read that found it running, so half a lease from that time
        is as safe as from its real start, and every later delivery counts from it: each
        counting from its own now, a start a day ahead was taken over only a day later,
        with a warning every half lease. A start ahead of this host's clock only (this
        host's is behind) is left as it is. A row that no longer runs that delivery is
        looked at again shortly."""
        row = sql.restart(job, only_if_ahead=True)
        if row is None:
            return self.not_claimed_yet(job)
        assert job.started_at is not None and row.started_at is not None
        clocks = ""
        if (ahead := (job.started_at - now).total_seconds()) > 1:
            clocks = (f"; it started {ahead:.0f} s ahead of this host's clock (the clocks of "
                      "the worker hosts disagree)")  # fmt: skip
            if row.started_at != job.started_at:
                clocks += ": its start is rewritten to now"
        return self.not_taken_over(job, row.started_at + sql.takeover_delay(), clocks)

    def not_taken_over(self, job: Job, takeover_at: datetime, clocks: str = "") -> Result:
        """Defer the delivery of a row running since less than half a lease: said, as it
        means that Redis lost the lease of a live worker (its data, a failover), or that an
        outcome write failed; with a warning if ``clocks`` says that the hosts' clocks
        disagree (``found_ahead``)."""
        assert job.started_at is not None
        logger.log(logging.WARNING if clocks else logging.INFO, "job %s: running since %s "
                   "on %r, which may still run it: not delivered again before %s%s",
                   self.job_id, job.started_at.isoformat(), job.worker,
                   takeover_at.isoformat(), clocks,
                   extra=job_fields(self.job_id, self.queue, job, "deferred"))  # fmt: skip
        return Result(Outcome.DEFERRED, job, retry_at=takeover_at)

    def poisoned(self) -> bool:
        """Whether the row cannot be read back faithfully: a value Python cannot hold (a
        timestamp past year 9999) or one its field refuses (text that is not a date reads
        as None). Such a row got in by hand or through an older version."""
        try:
            job = sql.fetch(self.job_id)
            if job is not None:
                job.clean_fields(exclude=["target_type"])  # no query: the FK is not checked
        except (OperationalError, InterfaceError):
            raise
        except DataError:  # a value the driver cannot convert
            return True
        except DatabaseError:  # the statement was refused (a column not migrated yet, a
            return False  # grant): any row would be, so this one is no poison row
        except Exception:
            return True
        return False

    def bury_unreadable(self, exc: BaseException) -> Result:
        error = sql.clean_text(f"this job's row cannot be read back, so it cannot run: {exc!r}")
        logger.error("job %s: %s", self.job_id, error,
                     extra=job_fields(self.job_id, self.queue, outcome="dead"))  # fmt: skip
        now = timezone.now()
        try:
            with transaction.atomic(using=sql.db()):
                buried = sql.bury_unreadable(self.job_id, error, self.actor, now)
        except (OperationalError, InterfaceError) as db_exc:
            return self.hand_back(db_exc)
        # What ``job_dead``'s receivers can read of it: the columns that need no conversion,
        # and the outcome just written. Any other field is read from the row when asked.
        job = Job.objects.only("id", "queue", "action", "status").filter(pk=self.job_id).first()
        if buried and job is not None:
            settled(job, {"status": Status.DEAD, "finished_at": now, "last_error": error})
        return Result(Outcome.DEAD if buried else Outcome.DROPPED, job, error=error)

    def resolve(self, job: Job) -> Callable[..., Any] | None:
        """Return the callable to run; None if its target row is gone."""
        target = None
        if job.target_type_id is not None:
            model = ContentType.objects.get_for_id(job.target_type_id).model_class()
            if model is None:
                raise UnknownAction(f"the model of {job.action!r} is not installed")
            # Read where it is written: on a replica that lags, a row created a moment
            # ago would be missing, and the job skipped for good.
            using = router.db_for_write(model)
            target = model._base_manager.using(using).filter(pk=job.target_id).first()
            if target is None:
                return None
        return resolve(job.action, target)

    # -- run -----------------------------------------------------------------------

    def execute(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Result:
        job = self.job
        assert job is not None
        started = time.perf_counter()
        notes: list[str] = []
        connection = Connection(self.db)
        self.connection = self.connection or connection
        committed: list[bool] = []
        atomic = getattr(fn, "delayable_atomic", True)
        try:
            if atomic:
                # The action and its outcome commit together, or not at all.
                with transaction.atomic(using=self.db.alias):
                    # The first on-commit callback: it runs before any the action leaves,
                    # so one of those that raises cannot pass for a failure of the job.
                    transaction.on_commit(partial(committed.append, True), using=self.db.alias)
                    done = success(self.call(fn, args, kwargs, notes))
                    claimed = self.succeeded(job, done, notes)
            else:  # an outside call: no transaction is held open while it runs
                self.outside = connection
                done = success(self.call(fn, args, kwargs, notes))
                claimed = self.until_written(lambda: self.record_success(job, done, notes))
        except _Overtaken as exc:
            return self.overtaken(job, exc.row, atomic, time.perf_counter() - started)
        except _ClaimAheadFailed as exc:  # not the action's fault: run it again
            return self.hand_back(exc.__cause__ or exc)
        except BaseException as exc:  # anything the action raised (atomic: rolled back)
            if committed:  # no: the success is the database's; a callback raised after it
                logger.error("job %s succeeded; an on-commit callback of its action then "
                             "raised %s (the callbacks after it did not run)", job.pk,
                             class_path(exc), exc_info=exc,
                             extra=job_fields(job.pk, self.queue, job, "succeeded"))  # fmt: skip
                return self.committed(job, done, claimed, started)
            duration = time.perf_counter() - started
            if isinstance(exc, JobRowDeleted) and not atomic:
                return self.row_deleted()
            # A lost connection, or a database that refused to begin the action's
            # transaction (SQLite's write lock held past the busy timeout): not the action.
            if connection.lost(exc) or (not self.called and isinstance(exc, DatabaseError)):
                return self.hand_back(exc)
            return self.failed(exc, notes, duration)
        return self.committed(job, done, claimed, started)

    def not_started(self, job: Job) -> Result:
        """The worker handed this job back before it kept the claim (it is stopping, or a
        thread died): undo the claim, which the hand-back could not (``unclaim``; a claim
        that landed after it), and leave the id to the hand-back's move."""
        try:
            unclaim(job, self.worker_id)
        except DatabaseError as exc:  # left to the takeover, as a lost delivery
            logger.warning("job %s: could not undo the claim of a job handed back before it "
                           "started (%s): it runs again half a lease after its claim",
                           self.job_id, exc,
                           extra=job_fields(self.job_id, self.queue, job))  # fmt: skip
        return Result(Outcome.UNCLAIMED, job, error="handed back before its action started")

    def overtaken(
        self, job: Job, row: tuple[str, int, int], atomic: bool, duration: float
    ) -> Result:
        """The outcome's fence found ``row`` (status, attempt, delivery) changed. Rolled
        back, an atomic action's row that is this delivery's again was changed by the
        action itself, in its transaction: its attempt failed. Otherwise another delivery
        owns the job now (its lease was lost), and writes its outcome."""
        try:
            own = atomic and sql.holds_fence(job)
        except DatabaseError as exc:
            return self.hand_back(exc)
        changed = (f"status {job.status!r}, attempt {job.attempts}, delivery {job.deliveries}"
                   f" to {row[0]!r}, {row[1]}, {row[2]}")  # fmt: skip
        if own:
            error = JobRowChanged(
                f"the action changed its own job's row ({changed}): the worker writes those "
                "fields; the change was rolled back with the action's other writes"
            )
            return self.failed(error, [], duration)
        fields = job_fields(job.pk, self.queue, job, "overtaken")
        if atomic:
            logger.warning("job %s attempt %s was taken over (%s); rolled back", job.pk,
                           job.attempts, changed, extra=fields)  # fmt: skip
        else:
            logger.warning("job %s attempt %s: its row changed while its action ran outside "
                           "a transaction (%s: taken over, or changed by the action or by "
                           "hand); its outcome is not recorded", job.pk, job.attempts, changed,
                           extra=fields)  # fmt: skip
        return Result(Outcome.OVERTAKEN, job)

    def row_deleted(self) -> Result:
        """The row of a non-atomic action's job was deleted while it ran (by the action, or
        by hand): the deletion stands, and there is no row left to record an outcome in."""
        error = (
            "the job's row was deleted while its action ran outside any transaction (by the "
            "action itself, or by hand): nothing is left to record its outcome in"
        )
        logger.warning("job %s: %s", self.job_id, error,
                       extra=job_fields(self.job_id, self.queue, self.job, "dropped"))  # fmt: skip
        return Result(Outcome.DROPPED, self.job, error=error)

    def committed(
        self, job: Job, done: dict[str, Any], claimed: Job | None, started: float
    ) -> Result:
        """The success as committed. Only now: a next job claimed in an outcome transaction
        that did not commit (refused at COMMIT, or its connection lost) is left to its own
        claim."""
        self.next_job = claimed
        settled(job, done)
        return Result(Outcome.SUCCEEDED, job, duration=time.perf_counter() - started)

    def succeeded(self, job: Job, done: dict[str, Any], notes: list[str]) -> Job | None:
        """Record success, fenced by this delivery, and claim the next job (returned);
        their events go in one statement."""
        if transaction.get_rollback(using=self.db.alias):  # the outcome would roll back with it
            raise TransactionManagementError(
                "the action returned with its transaction marked for rollback "
                "(transaction.set_rollback(True), or a database error caught inside an atomic "
                "block that has no savepoint): its writes were rolled back"
            )
        if not sql.update_fenced(job, done):
            # Read in the action's own transaction: a row another worker took is still
            # there; one the action deleted is not (a redelivery would delete it again).
            row = Job.objects.filter(pk=job.pk).values_list("status", "attempts", "deliveries")
            if (found := row.first()) is None:
                raise JobRowDeleted("the action deleted its own job row")
            if self.landed(job, done):
                return self.landed_ahead()  # with its events
            raise _Overtaken(found)
        events = [(job, _SUCCEEDED, self.actor, "\n".join(notes))]
        claimed = self.ahead = self.claim_ahead()
        if claimed is not None:
            message = self.started_message(claimed)
            events.append((claimed, _STARTED, self.actor, message))
        sql.insert_events(events)
        return claimed

    def record_success(self, job: Job, done: dict[str, Any], notes: list[str]) -> Job | None:
        """Record a non-atomic action's success. If the database refused the claim of the
        next job in that transaction, record it again alone: handing the job back would
        run the action again, and its outside effect has happened."""
        try:
            with transaction.atomic(using=self.db.alias):
                return self.succeeded(job, done, notes)
        except _ClaimAheadFailed:
            self.then = None  # the next job is left to its own claim
            with transaction.atomic(using=self.db.alias):
                return self.succeeded(job, done, notes)

    def until_written(self, write: Callable[[], T]) -> T:
        """Run ``write``, an outcome's transaction. After a non-atomic action, whose
        outside effect has happened (a hand-back would repeat it: an HTTP callback sent
        again), run it again while the database fails it, at once, then every
        ``OUTCOME_PAUSE`` for up to ``OUTCOME_PATIENCE``, each time on a new connection,
        as long as the failure is one that passes (``Connection.passing``): the connection
        was lost while the action ran (ended by the server while idle; a restart or a
        failover, whose new connections are refused or reach a standby for a while), or
        the database refuses the write for now (SQLite's write lock held past the busy
        timeout). Then raise the last failure; raise any other at once."""
        outside = self.outside
        db = connections[sql.db()]  # this thread's (MAX_RUN_SECONDS's watcher writes too)
        ran_on = None
        try:
            db.ensure_connection()
            ran_on = db.connection
            return write()
        except DatabaseError as exc:
            if outside is None or outside.wrapper is not db:
                raise
            if not (self.cut(exc, db, ran_on) or outside.passing(exc)):
                raise
            failure = exc
        give_up = time.monotonic() + OUTCOME_PATIENCE.total_seconds()
        while True:
            with contextlib.suppress(DatabaseError):
                db.close()  # a lost one, or a standby's: the write opens a new one
            ran_on = None
            try:
                db.ensure_connection()
                ran_on = db.connection
                return write()
            except DatabaseError as exc:
                if not (self.cut(exc, db, ran_on) or outside.passing(exc)):
                    raise
                failure = exc
            if time.monotonic() >= give_up:
                raise failure
            time.sleep(OUTCOME_PAUSE.total_seconds())

    def cut(self, exc: DatabaseError, db: BaseDatabaseWrapper, ran_on: object) -> bool:
        """Whether ``exc`` cut the connection the write ran on (``ran_on``): Django dropped
        it, and at a COMMIT opened another at once (turning autocommit back on), which
        ``passing`` cannot tell from a sound one. Whether a COMMIT landed is then unknown:
        the write is tried again, and a row that holds this very outcome is this one
        (``landed``)."""
        if not isinstance(exc, OperationalError | InterfaceError) or ran_on is None:
            return False
        if db.connection is ran_on:
            return False
        self.rewriting = True
        return True

    def landed(self, job: Job, values: dict[str, Any]) -> bool:
        """Whether the row, which the fence did not match, holds this outcome as an
        earlier try wrote it, its COMMIT cut (``cut``): the same status at this delivery of
        this attempt, with this outcome's own times (the ``MAX_RUN_SECONDS`` watcher may
        have failed the same attempt with its own)."""
        if not self.rewriting:
            return False
        stamps = {name: values[name] for name in ("run_at", "finished_at") if name in values}
        return Job.objects.filter(
            pk=job.pk, status=values["status"], attempts=job.attempts,
            deliveries=job.deliveries, **stamps,
        ).exists()  # fmt: skip

    def landed_ahead(self) -> Job | None:
        """The next job as the landed outcome transaction claimed it, if it did and this
        worker still holds it (``then``): that claim is its delivery (claimed again, it
        would count a second one, with a second ``started`` event). Started now: the claim
        may be as old as ``OUTCOME_PATIENCE``, and its start tells others when they may
        take it over (this host's time, as every claim's). Only while the row still runs
        that very delivery."""
        ahead = self.ahead
        if ahead is None or self.then is None or self.then() != str(ahead.pk):
            return None
        return sql.restart(ahead, timezone.now())

    def unstarted(self) -> Job | None:
        """This delivery's row as claimed, until the worker keeps that claim (None before
        the claim, and once ``starts`` kept it: no signal, no argument, no action ran
        before that); or the next job's row, claimed by this job's outcome transaction,
        until that job's own delivery takes it over."""
        if not self.kept and (self.row_claimed or self.claimed is not None):
            return self.job if self.row_claimed else self.claimed
        return self.next_job

    def changed_session(self) -> bool:
        """Whether the action left its database session with other settings than it found
        (a ``SET`` on PostgreSQL): the worker then closes the connection after this job,
        so that the next one runs on a session as Django opens it."""
        return self.connection is not None and self.connection.changed()

    def claim_ahead(self) -> Job | None:
        """Claim ``then`` inside this job's outcome transaction; None if it cannot start
        now (the normal claim then says why) or its row cannot be read (the normal claim
        finds it running and settles it)."""
        then = self.then() if self.then is not None else None
        if then is None or self.changed_session():  # it runs on a new connection instead
            return None
        try:
            # Skipping a locked row: waiting for it would hold this action's row locks
            # until, say, a payment that cancels it commits (a deadlock, if the payment
            # then locks one of them); its own claim waits instead, holding none.
            return sql.claim(then, self.worker_id, timezone.now(),
                             delayjobs_settings.MAX_DELIVERIES, skip_locked=True)  # fmt: skip
        except DatabaseError as exc:
            if not sql.transaction_usable():  # the database refused: the transaction is lost
                raise _ClaimAheadFailed from exc
            return None  # the row was claimed but read back wrong: a poison row
        except Exception:
            return None

    def call(
        self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], notes: list[str]
    ) -> Any:
        """Run the action; return its value as stored (JSON), or raise."""
        assert self.job is not None
        job_token, notes_token = current_job.set(handed_out(self.job)), _notes.set(notes)
        self.outside_since, self.running_since, self.called = None, time.monotonic(), True
        before = transaction_states()  # the jobs' database: 1 block in its transaction
        pid = os.getpid()
        try:
            try:
                value = fn(*args, **kwargs)
                end_forked_child(pid, None)
                if inspect.isawaitable(value):
                    # async_to_sync, not a private event loop: the coroutine's
                    # sync_to_async() ORM calls then run back in this thread, inside this
                    # transaction.
                    value = async_to_sync(_await)(value, pid)
            except BaseException as exc:
                end_forked_child(pid, exc)
                found = left_behind(before, self.db)
                closed_before = before.get(self.db.alias, (0, False))[1]
                if found and self.db.closed_in_transaction and not closed_before:
                    # its close() is the cause of what it raised
                    raise TransactionManagementError(f"the action {found[0][1]}") from exc
                raise
            found = left_behind(before, self.db)
            if found:
                raise TransactionManagementError(f"the action {found[0][1]}")
            return self.stored(value)
        finally:
            self.running_since, self.outside_since = None, time.monotonic()
            current_job.reset(job_token)
            _notes.reset(notes_token)

    def stored(self, value: Any) -> Any:
        """The action's return value as stored (JSON). One that cannot be fails the
        attempt; after a non-atomic action, for good (``ResultNotStored``)."""
        what = "the action's return value"
        try:
            stored = serialization.dump(value, what)
            serialization.check_size((stored,), what, delayjobs_settings.MAX_JSON_BYTES)
        except (TypeError, ValueError) as exc:
            if self.outside is None:  # atomic: its writes roll back, it may run again
                raise
            raise ResultNotStored(
                f"{exc}. Not run again: the action ran outside a transaction, so its effects "
                "stay, and another attempt would repeat them"
            ) from exc
        return stored

    def overran(self, limit: float, gone_in: timedelta) -> Result:
        """Fail this attempt from another thread: its action has run for more than
        ``limit`` seconds and is still running, until its process exits (in ``gone_in`` at
        the latest): the retry is not due before then, or another worker would run it
        beside this one. Fenced like every outcome, so whichever of this and the action's
        own outcome comes second is overtaken (and, for the action, rolled back)."""
        error = TimeLimitExceeded(
            f"the action ran for more than {limit:g} s (MAX_RUN_SECONDS); the attempt was "
            "failed and the worker process exited, for its supervisor to start a new one "
            "(a running action cannot be stopped)"
        )
        return self.failed(error, [], limit, at_least=gone_in)

    # -- outcomes ------------------------------------------------------------------

    def failed(
        self, exc: BaseException, notes: list[str], duration: float,
        at_least: timedelta = timedelta(0),
    ) -> Result:  # fmt: skip
        job = self.job
        assert job is not None
        # The exception's text (a receiver's header, say) as the database can store it: a
        # NUL or a lone surrogate must not turn the action's failure into a refused write.
        error = sql.clean_text(describe(exc, notes))
        outcome, retry_at = after_failure(job, exc, at_least)
        if outcome == Outcome.DEAD:
            return self.finish(Outcome.DEAD, error, failed=True, duration=duration)
        if outcome == Outcome.SKIPPED:
            assert job.expires_at is not None and retry_at is not None
            why = (f"expires at {job.expires_at.isoformat()}, before its next attempt would "
                   f"be due ({retry_at.isoformat()})")  # fmt: skip
            return self.finish(Outcome.SKIPPED, error, failed=True, duration=duration, why=why)
        retry = {"status": Status.RETRYING, "run_at": retry_at, "last_error": error}
        result = Result(Outcome.RETRYING, job, error, True, retry_at, duration)
        return self.write(job, retry, [(EventKind.FAILED, error)], result)

    def finish(
        self,
        outcome: Outcome,
        message: str,
        *,
        failed: bool = False,
        duration: float | None = None,
        fence: bool = True,
        why: str = "",
    ) -> Result:
        """Record a final outcome other than success (skipped or dead). After a failed
        attempt (``failed``), ``message`` is the failure's event and ``why`` the outcome's."""
        job = self.job
        assert job is not None
        message = sql.clean_text(message)  # it may quote an exception
        final = {"status": Status(outcome.value), "finished_at": timezone.now(),
                 "last_error": message}  # fmt: skip
        events: list[tuple[str, str]] = [(EventKind.FAILED, message)] if failed else []
        events.append((EventKind(outcome.value), why if failed else message))
        result = Result(outcome, job, message, failed, None, duration)
        return self.write(job, final, events, result, fence=fence)

    def write(
        self,
        job: Job,
        values: dict[str, Any],
        events: list[tuple[str, str]],
        result: Result,
        *,
        fence: bool = True,
    ) -> Result:
        """Write an outcome and its events in one transaction; the fence decides."""

        def write() -> bool:
            with transaction.atomic(using=sql.db()):
                if fence:
                    won = sql.update_fenced(job, values)
                else:  # a waiting row that cannot start (no attempts left)
                    won = bool(Job.objects.filter(pk=job.pk, status__in=ACTIVE).update(**values))
                if won:
                    for kind, message in events:
                        self.event(job, kind, message)
                else:  # an earlier try's COMMIT, cut, may have landed
                    return self.landed(job, values)
            return won

        try:
            won = self.until_written(write)
        except DatabaseError as exc:  # lost, or refusing writes: the outcome is not the job's
            return self.hand_back(exc)
        if not won:
            return Result(Outcome.OVERTAKEN, job)
        settled(job, values)
        return result

    def hand_back(self, exc: BaseException) -> Result:
        """The database failed, not the job: the same attempt is delivered again later (a
        row its claim left running, once that delivery started half a lease ago:
        ``sql.takeover_delay``; the next claim defers it until then)."""
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        # One line per delivery at INFO: the worker's loop warns once per outage, with why
        # (a database that stays away, or read-only, would warn for every job every second).
        fields = job_fields(self.job_id, self.queue, self.job, "handed_back")
        logger.info("job %s: the database is unavailable (%s); handed back", self.job_id,
                    one_line(why), extra=fields)  # fmt: skip
        return Result(Outcome.HANDED_BACK, self.job, error=why,
                      retry_at=timezone.now() + HAND_BACK_DELAY)  # fmt: skip

    def event(self, job: Job, kind: str, message: str = "") -> None:
        sql.insert_event(job, kind, self.actor, message)
