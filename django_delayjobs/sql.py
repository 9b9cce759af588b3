"""The statements written out instead of built by the ORM: the per-job statements of the
hot path, and the prune's (``retention`` decides what to delete; these say how, per
database).

Building a query costs the ORM several times what running it costs. On the bench machine
a worker's claim transaction took about 1.1 ms through the ORM and takes about 0.26 ms
with these statements (``bench/hotpath.py``, docs/performance.md). They are plain SQL
over the models' own table and column names, every value is adapted by its model field,
and each means exactly what the ORM call it replaces meant.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from functools import cache
from operator import attrgetter
from typing import Any
from weakref import WeakKeyDictionary

from django.db import DatabaseError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import DateField, DateTimeField, F, Field, Q
from django.db.models.functions import Now
from django.utils import timezone

from .conf import delayjobs_settings
from .models import ACTIVE, FINISHED, WAITING, Job, JobEvent, Status

_JOB = Job._meta
_EVENT = JobEvent._meta
#: The statuses as the hot path's statements take them (an enum member's ``.value`` is a
#: Python call each time).
_RUNNING = Status.RUNNING.value
_ACTIVE = tuple(s.value for s in ACTIVE)


def db() -> str:
    """The database alias that Job rows are written to (and read from, by the worker)."""
    return router.db_for_write(Job)


def close_stale(*, between_jobs: bool = False) -> None:
    """Django's ``close_old_connections()`` for a worker's threads, which must not die of
    it: closing a broken connection can itself raise ``DatabaseError``, and the next
    query opens a new connection all the same.

    ``between_jobs``: keep a connection for the next job unless it saw an error or
    ``CONN_MAX_AGE`` gives it an age. ``CONN_MAX_AGE = 0`` means one connection per
    request; a worker's "request" lasts until it has had no work for a whole tick (a plain
    ``close_stale()`` then), since a new connection per job costs more than a short job.

    A connection that saw an error is closed, not checked: Django's check (a ``SELECT
    1``) waited for good on a connection left half-open, in an idle thread that nothing
    watches, and a new connection costs about what the check does.
    """
    for conn in connections.all(initialized_only=True):
        if between_jobs and not (conn.errors_occurred or conn.settings_dict["CONN_MAX_AGE"]):
            continue
        with contextlib.suppress(DatabaseError):
            if conn.errors_occurred:
                conn.close()
            else:
                conn.close_if_unusable_or_obsolete()


def _q(conn: BaseDatabaseWrapper, model_meta: Any, name: str) -> str:
    return conn.ops.quote_name(model_meta.get_field(name).column)


def _prep(conn: BaseDatabaseWrapper, model_meta: Any, name: str, value: Any) -> Any:
    return model_meta.get_field(name).get_db_prep_save(value, conn)


@cache
def _claim_sql(alias: str, skip_locked: bool) -> str:
    conn = connections[alias]
    table = conn.ops.quote_name(_JOB.db_table)

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    running = f"{c('status')} = %s"
    # A running row is one whose delivery never recorded an outcome (its worker was lost,
    # or lost its database): it is delivered again as the same attempt, at most
    # MAX_DELIVERIES times, once it started half a lease ago (``takeover_delay``), or at
    # once by the worker process that started it (it runs no id twice at once) or for a
    # row from before started_at was written (NULL). Any other active row starts its next
    # attempt. SET and WHERE both read the row as it was before this UPDATE.
    started = c("started_at")
    sql = (
        f"UPDATE {table}"
        f" SET {c('status')} = %s, {started} = %s, {c('worker')} = %s,"
        f" {c('attempts')} = CASE WHEN {running} THEN {c('attempts')}"
        f" ELSE {c('attempts')} + 1 END,"
        f" {c('deliveries')} = CASE WHEN {running} THEN {c('deliveries')} + 1 ELSE 1 END"
        f" WHERE {c('id')} = %s AND {c('status')} IN ({', '.join(['%s'] * len(ACTIVE))})"
        f" AND {c('run_at')} <= %s AND CASE WHEN {running} THEN {c('deliveries')} < %s"
        f" AND ({started} IS NULL OR {started} <= %s OR {c('worker')} = %s)"
        f" ELSE {c('attempts')} < {c('max_attempts')} END"
    )
    if skip_locked:  # the row is locked first, or left out if another transaction holds it
        sql += f" AND {c('id')} IN (SELECT {c('id')} FROM {table} WHERE {c('id')} = %s"
        sql += " FOR UPDATE SKIP LOCKED)"
    return sql


#: A running row is taken over (delivered again) only once its delivery started this share
#: of ``LEASE_SECONDS`` ago (``takeover_delay``).
TAKEOVER_SHARE = 0.5


def takeover_delay() -> timedelta:
    """How long after its start a running row may be taken over, its delivery read as lost.

    A worker that died is overtaken only once its Redis lease ended: it extended the
    lease every third of a lease, so the last extension came at most a third of a lease
    before it died, and the lease then ran its whole length: the id comes back at least
    about two thirds of a lease after the row started (while its extensions succeeded;
    one that started the job on a lease ``LEASE_TRUSTED`` kept on time alone may lose it
    sooner, and that delivery then waits for the half lease). Waiting for half a lease
    delays no such recovery (the sixth between the two covers a late extension and the
    clocks of two worker hosts, which write and read ``started_at``; a start ahead of the
    reader's clock is the database's time once a delivery finds it: ``restart``).
    A running row younger than that may have a live worker: one whose lease Redis lost (a
    restart without persistence, a failover to a lagging replica: the reconcile sweep
    re-adds the id of a row it read as waiting just before that worker started it), or
    one that started it on a lease trusted on time alone (``LEASE_TRUSTED``) that Redis
    had lost. Taken over, its action would run twice at once. A delivery handed back after
    its claim committed (the database failed, the row left running) waits the rest of the
    half lease too, unless the worker process that started it claims it again (it runs no
    id twice at once). An action that runs longer than half a lease is not covered: that
    would take a heartbeat in the row.
    """
    return timedelta(seconds=delayjobs_settings.LEASE_SECONDS * TAKEOVER_SHARE)


_HUNDREDTH = timedelta(microseconds=10_000)
_last_cutoff: tuple[tuple[str, datetime] | None, Any] = (None, None)


def _takeover_cutoff(conn: BaseDatabaseWrapper, now: datetime) -> Any:
    """``now - takeover_delay()`` as the ``started_at`` column takes it, rounded up to the
    next hundredth of a second (a takeover may come that much sooner): prepared once in
    each hundredth at most, not once a claim (about 27 Python calls)."""
    global _last_cutoff
    at = now - takeover_delay()
    key = (conn.alias, at.replace(microsecond=at.microsecond - at.microsecond % 10_000))
    last = _last_cutoff  # read once: another thread may replace it meanwhile
    if last[0] != key:
        last = _last_cutoff = (key, _prep(conn, _JOB, "started_at", key[1] + _HUNDREDTH))
    return last[1]


def claim(
    job_id: str, worker: str, now: datetime, max_deliveries: int,
    *, commit_without_waiting: bool = False, skip_locked: bool = False,
) -> Job | None:  # fmt: skip
    """Start the next attempt of an active job that is due and has attempts left, or
    deliver the current attempt again if it never recorded an outcome (fewer than
    ``max_deliveries`` times, once it started ``takeover_delay()`` before ``now`` or if
    ``worker`` started it); return the row as it is now, or None if it did not qualify.

    One statement where the database can return the updated row (PostgreSQL, SQLite from
    3.35); an UPDATE and a SELECT elsewhere.

    ``commit_without_waiting``, for a claim in a transaction of its own (never inside an
    outcome's): on PostgreSQL the same statement sets ``synchronous_commit`` off for the
    transaction, so that its COMMIT returns without waiting for the disk, which saves
    the worker a flush between a job's due time and its start. A claim acknowledged this
    way is lost only if the database server itself crashes within a fraction of a second
    (a worker's crash loses nothing: the server flushes it soon after), and then it is
    lost together with every later transaction (the WAL is flushed in order, so the
    action's outcome, which waits, flushes the claim first): the job is claimed again as
    if that claim never happened. Other databases are left as they are.

    ``skip_locked``, for a claim inside a transaction that holds other locks (an outcome's,
    whose action's row locks are held until it commits): a row another transaction has
    locked (a cancel not yet committed, in a payment that may go on to lock a row the
    action holds) is not waited for, and not claimed. PostgreSQL only: SQLite serializes
    writers anyway (and MySQL would refuse the subquery on the table it updates).
    """
    alias = db()
    conn = connections[alias]
    stamp = _prep(conn, _JOB, "started_at", now)
    running = _RUNNING
    pk = _prep(conn, _JOB, "id", job_id)
    cutoff = _takeover_cutoff(conn, now)
    params = [
        running, stamp, worker[:128], running, running,
        pk, *_ACTIVE, stamp, running, max_deliveries, cutoff, worker[:128],
    ]  # fmt: skip
    skip_locked = skip_locked and conn.vendor == "postgresql"
    if skip_locked:
        params.append(pk)
    also = ""
    if commit_without_waiting and conn.vendor == "postgresql":
        # Evaluated once per claimed row (at most one): SET LOCAL's effect, without a
        # round trip of its own.
        also = ", set_config('synchronous_commit', 'off', true)"
    return _update_row(alias, conn, job_id, _claim_sql(alias, skip_locked), params, also)


def _update_row(
    alias: str, conn: BaseDatabaseWrapper, job_id: str, statement: str, params: list[Any],
    also: str = "",
) -> Job | None:  # fmt: skip
    """Run ``statement``, an UPDATE of the row ``job_id`` at most, and return the row as it
    is now, or None if it matched nothing: in the same statement where the database can
    return the updated row (``also``: more to return after its columns), else read after
    it."""
    plan = _row_plan(conn)
    if plan.returning:
        with conn.cursor() as cursor:
            cursor.execute(f"{statement} RETURNING {plan.columns}{also}", params)
            row = cursor.fetchone()
        return None if row is None else plan.job(alias, conn, row[: len(plan.attnames)])
    # Called outside a transaction (``Execution.found_ahead``'s restart), the UPDATE would
    # commit at once, and another worker could take the row over before the read, which
    # would return its claim instead.
    with _one_transaction(conn, alias):
        with conn.cursor() as cursor:
            cursor.execute(statement, params)
            matched = cursor.rowcount
        return fetch(job_id) if matched else None


def _one_transaction(conn: BaseDatabaseWrapper, alias: str) -> Any:
    """A transaction for a fallback's UPDATE and the read after it, in which the row read
    back is the one updated (the UPDATE holds it until the end): the caller's, with no
    savepoint (two statements more on a hot path), or a new one outside it."""
    return contextlib.nullcontext() if conn.in_atomic_block else transaction.atomic(using=alias)


def _fence(conn: BaseDatabaseWrapper) -> str:
    """The condition of a statement fenced by a job's delivery of its attempt: the row's
    id, attempts, deliveries and status ``running``, in that order."""

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    return (
        f" WHERE {c('id')} = %s AND {c('attempts')} = %s AND {c('deliveries')} = %s"
        f" AND {c('status')} = %s"
    )


@cache
def _fenced_sql(alias: str, fields: tuple[str, ...]) -> str:
    conn = connections[alias]
    assignments = ", ".join(f"{_q(conn, _JOB, name)} = %s" for name in fields)
    return f"UPDATE {conn.ops.quote_name(_JOB.db_table)} SET {assignments}{_fence(conn)}"


def update_fenced(job: Job, values: Mapping[str, Any]) -> bool:
    """Write ``values`` only if the row is still running ``job``'s delivery of its attempt:
    the one fence every outcome passes."""
    alias = db()
    conn = connections[alias]
    fields = tuple(values)
    params = [_prep(conn, _JOB, name, values[name]) for name in fields]
    params += [_prep(conn, _JOB, "id", job.pk), job.attempts, job.deliveries]
    params.append(_RUNNING)
    with conn.cursor() as cursor:
        cursor.execute(_fenced_sql(alias, fields), params)
        return bool(cursor.rowcount)


@cache
def _restart_sql(alias: str, only_if_ahead: bool, by_database: bool) -> str:
    conn = connections[alias]
    started = _q(conn, _JOB, "started_at")
    now = "%s"  # a time given, as Django writes it
    if by_database:  # Django's Now(): the statement's time on PostgreSQL; UTC text to the
        # millisecond on SQLite (a database stored in UTC), which compares with Django's
        now, _ = Job.objects.using(alias).query.get_compiler(alias).compile(Now())
    if only_if_ahead:  # both read the same time (one statement)
        now = f"CASE WHEN {started} > {now} THEN {now} ELSE {started} END"
    return (
        f"UPDATE {conn.ops.quote_name(_JOB.db_table)} SET {started} = {now}{_fence(conn)}"
        f" AND {_q(conn, _JOB, 'worker')} = %s"
    )


def restart(job: Job, at: datetime | None = None, *, only_if_ahead: bool = False) -> Job | None:
    """Write ``at``, or with None the database's time, as the start of ``job``'s delivery
    (``only_if_ahead``: only if its start is ahead of that time), if the row still runs
    that delivery of its attempt on the same worker; return the row as it is now, or None
    if it does not.

    The database's clock, not the caller's, for a start rewritten because it lies ahead
    of the caller's clock (``Execution.found_ahead``): a caller whose clock is behind
    would move it back by as much, on every live row it is handed, and a worker with a
    right clock would take each over that much sooner. Other starts are the claiming
    host's time (``claim``), so the database's clock must agree with the worker hosts' as
    theirs do with each other. Only where the database's time is written as Django writes
    times (PostgreSQL; SQLite stored in UTC, which runs on the callers' own host): else,
    a database that stores local time (its ``TIME_ZONE``), the caller's."""
    alias = db()
    conn = connections[alias]
    by_database = at is None and (
        conn.vendor == "postgresql" or (conn.vendor == "sqlite" and conn.timezone_name == "UTC")
    )
    times = [] if by_database else [_prep(conn, _JOB, "started_at", at or timezone.now())]
    params = [*times * (2 if only_if_ahead else 1), _prep(conn, _JOB, "id", job.pk),
              job.attempts, job.deliveries, _RUNNING, job.worker]  # fmt: skip
    sql = _restart_sql(alias, only_if_ahead, by_database)
    return _update_row(alias, conn, str(job.pk), sql, params)


def cancel_waiting(job_id: object, now: datetime) -> str | None:
    """Cancel the job if it waits (scheduled or retrying); return the queue its row names
    (where Redis holds its id, whatever a caller's copy of the job says), or None if it
    was not waiting. One statement where the database can return the row's values."""
    alias = db()
    conn = connections[alias]
    table = conn.ops.quote_name(_JOB.db_table)
    queue, pk, status = (_q(conn, _JOB, name) for name in ("queue", "id", "status"))
    sql = (f"UPDATE {table} SET {status} = %s, {_q(conn, _JOB, 'finished_at')} = %s"
           f" WHERE {pk} = %s AND {status} IN ({', '.join(['%s'] * len(WAITING))})")  # fmt: skip
    key = _prep(conn, _JOB, "id", job_id)
    params = [Status.CANCELLED.value, _prep(conn, _JOB, "finished_at", now), key,
              *(s.value for s in WAITING)]  # fmt: skip
    with _one_transaction(conn, alias), conn.cursor() as cursor:
        if _row_plan(conn).returning:
            cursor.execute(f"{sql} RETURNING {queue}", params)
        else:
            cursor.execute(sql, params)
            if not cursor.rowcount:
                return None
            cursor.execute(f"SELECT {queue} FROM {table} WHERE {pk} = %s", [key])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def holds_fence(job: Job) -> bool:
    """Whether the row is still running ``job``'s delivery of its attempt (as the
    committed row says, outside a transaction): ``update_fenced``'s condition."""
    return (
        Job.objects.using(db())
        .filter(pk=job.pk, attempts=job.attempts, deliveries=job.deliveries)
        .filter(status=Status.RUNNING)
        .exists()
    )


def take_a_write() -> None:
    """Write to the job table, matching no row; raise ``DatabaseError`` if the database
    refuses. One that answers reads may refuse every write: a standby, a read-only file,
    SQLite's write lock held past the busy timeout."""
    Job.objects.using(db()).filter(pk=uuid.UUID(int=0)).update(status=F("status"))


@contextlib.contextmanager
def waiting_at_most(seconds: float | None) -> Iterator[None]:
    """A transaction on the jobs' database whose statements wait at most ``seconds`` (for
    a lock, or a slow server; None: as long as the session's settings say). PostgreSQL:
    its statement timeout, for this transaction only (``set_config(..., true)``: a pooled
    connection, or one a transaction-mode pgbouncer shares, keeps its own). SQLite: the
    connection's busy timeout, set before its BEGIN, which is what waits for the write
    lock: for a thread of its own, whose connection is closed when it ends. Other
    databases are left as they are."""
    alias = db()
    conn = connections[alias]
    ms = None if seconds is None else max(1, math.ceil(seconds * 1000))
    if ms is not None and conn.vendor == "sqlite":
        with conn.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {ms}")
    with transaction.atomic(using=alias):
        if ms is not None and conn.vendor == "postgresql":
            with conn.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(ms)])
        yield


def transaction_usable() -> bool:
    """Whether the current transaction still takes statements (after an error PostgreSQL
    refuses every statement until the rollback; a value that failed to convert on the
    client leaves it usable)."""
    try:
        with connections[db()].cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        return False
    return True


def bury_unreadable(job_id: str, error: str, actor: str, now: datetime) -> bool:
    """Settle an active row that cannot be read back (a poison row) as dead, touching
    only columns that need no conversion; True if it was active."""
    alias = db()
    conn = connections[alias]
    table, events = conn.ops.quote_name(_JOB.db_table), conn.ops.quote_name(_EVENT.db_table)

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    def e(name: str) -> str:
        return _q(conn, _EVENT, name)

    pk = _prep(conn, _JOB, "id", job_id)
    stamp = _prep(conn, _JOB, "finished_at", now)
    active = [s.value for s in ACTIVE]
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {c('status')} = %s, {c('finished_at')} = %s,"
            f" {c('last_error')} = %s WHERE {c('id')} = %s"
            f" AND {c('status')} IN ({', '.join(['%s'] * len(active))})",
            [Status.DEAD.value, stamp, error, pk, *active],
        )
        if not cursor.rowcount:
            return False
        cursor.execute(
            f"INSERT INTO {events} ({e('job')}, {e('kind')}, {e('at')}, {e('attempt')},"
            f" {e('actor')}, {e('message')}) SELECT {c('id')}, %s, %s, {c('attempts')}, %s, %s"
            f" FROM {table} WHERE {c('id')} = %s",
            ["dead", _prep(conn, _EVENT, "at", now), actor, error, pk],
        )
    return True


def clean_text(text: str, limit: int = 65_536) -> str:
    """``text`` as any database can store it: no NUL, no lone surrogates, at most
    ``limit`` characters (the head and the tail of a longer one). Cleaning it again
    changes nothing, so each writer may clean what it writes."""
    if type(text) is str and len(text) <= limit and text.isascii() and "\x00" not in text:
        return text  # nothing to clean (two calls, where cleaning takes four)
    text = text.replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        kept = max(0, limit - 64)  # room for the line that says how much was cut
        head, tail = kept // 2, kept - kept // 2
        cut = f"\n[... {len(text) - kept} characters cut ...]\n"
        text = f"{text[:head]}{cut}{text[len(text) - tail :]}"
    return text


@cache
def _insert_job_sql(alias: str) -> str:
    conn = connections[alias]
    columns = ", ".join(_q(conn, _JOB, f.name) for f in _JOB.concrete_fields)
    placeholders = ", ".join(["%s"] * len(_JOB.concrete_fields))
    return f"INSERT INTO {conn.ops.quote_name(_JOB.db_table)} ({columns}) VALUES ({placeholders})"


def _reads_attribute(field: Field[Any, Any]) -> bool:
    """Whether ``field.pre_save`` of an insert returns the instance's attribute as it is
    (no ``auto_now``/``auto_now_add``, nor a field class of its own kind)."""
    pre_save = type(field).pre_save
    if pre_save is Field.pre_save:
        return True
    if isinstance(field, DateField) and pre_save in (DateField.pre_save, DateTimeField.pre_save):
        return not (field.auto_now or field.auto_now_add)
    return False


class _InsertPlan:
    """How to turn a new Job into the values of its INSERT on one connection, as
    ``save()`` would: each column's ``pre_save`` then ``get_db_prep_save``. Found once
    per connection (the fields' adaptations may depend on it): a column whose
    ``pre_save`` is a plain read of the attribute is read with the others in one
    ``attrgetter`` call, and None is passed as is to a column that adapts None to None
    (every one of Job's here), which skips the field's calls for the empty columns."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        self.fields = tuple(_JOB.concrete_fields)
        self.read = (
            attrgetter(*(f.attname for f in self.fields))
            if all(_reads_attribute(f) for f in self.fields)
            else None
        )
        self.steps = tuple(
            (f.get_db_prep_save, f.get_db_prep_save(None, conn) is None) for f in self.fields
        )

    def row(self, job: Job, conn: BaseDatabaseWrapper) -> list[Any]:
        if self.read is None:
            return [f.get_db_prep_save(f.pre_save(job, add=True), conn) for f in self.fields]
        return [
            None if value is None and null else prep(value, conn)
            for value, (prep, null) in zip(self.read(job), self.steps, strict=True)
        ]


_insert_plans: WeakKeyDictionary[BaseDatabaseWrapper, _InsertPlan] = WeakKeyDictionary()


def insert_jobs(
    jobs: Sequence[Job], events: Iterable[tuple[Job, str, str, str]] | None = None
) -> None:
    """INSERT new Job rows built in Python (``build_job``): what ``save(force_insert=True)``
    and ``bulk_create`` would write, without building the query each time (the ORM's
    INSERT compiler cost ``schedule()`` about 200 us a job). No model signals are sent.

    ``events``: then append these JobEvents (``insert_events``) through the same cursor,
    which saves the second cursor's setup (about 30 Python calls a ``schedule()``)."""
    alias = db()
    conn = connections[alias]
    plan = _insert_plans.get(conn)
    if plan is None:
        plan = _insert_plans[conn] = _InsertPlan(conn)
    rows = [plan.row(job, conn) for job in jobs]
    with conn.cursor() as cursor:
        cursor.executemany(_insert_job_sql(alias), rows)
        for job in jobs:
            job._state.adding, job._state.db = False, alias
        if events is not None:
            insert_events(events, cursor)


_EVENT_FIELDS = ("job", "kind", "at", "attempt", "actor", "message")


@cache
def _event_sql(alias: str) -> str:
    conn = connections[alias]
    columns = ", ".join(_q(conn, _EVENT, name) for name in _EVENT_FIELDS)
    placeholders = ", ".join(["%s"] * len(_EVENT_FIELDS))
    return f"INSERT INTO {conn.ops.quote_name(_EVENT.db_table)} ({columns}) VALUES ({placeholders})"


def insert_event(job: Job, kind: str, actor: str, message: str = "") -> None:
    """Append one JobEvent for ``job`` at its current attempt."""
    insert_events([(job, kind, actor, message)])


def insert_events(
    events: Iterable[tuple[Job, str, str, str]], cursor: CursorWrapper | None = None
) -> None:
    """Append JobEvents given as (job, kind, actor, message), each at its job's attempt
    (through ``cursor``, one open on the jobs' database, if given)."""
    if cursor is not None:
        conn, alias = cursor.db, cursor.db.alias
    else:
        alias = db()
        conn = connections[alias]
    at = _prep(conn, _EVENT, "at", timezone.now())
    job_field = _EVENT.get_field("job")
    rows = [
        (
            job_field.get_db_prep_save(job.pk, conn),
            kind,
            at,
            job.attempts,
            clean_text(actor, 150),
            clean_text(message),
        )
        for job, kind, actor, message in events
    ]
    if cursor is not None:
        cursor.executemany(_event_sql(alias), rows)
        return
    with conn.cursor() as cursor:
        cursor.executemany(_event_sql(alias), rows)


@cache
def _row_event_sql(alias: str) -> str:
    conn = connections[alias]
    columns = ", ".join(_q(conn, _EVENT, name) for name in _EVENT_FIELDS)
    values = ", ".join("%s" if name != "attempt" else _q(conn, _JOB, "attempts")
                       for name in _EVENT_FIELDS)  # fmt: skip
    events, jobs = conn.ops.quote_name(_EVENT.db_table), conn.ops.quote_name(_JOB.db_table)
    return (f"INSERT INTO {events} ({columns}) SELECT {values} FROM {jobs} "
            f"WHERE {_q(conn, _JOB, 'id')} = %s")  # fmt: skip


def insert_event_at_row(job: Job, kind: str, actor: str, message: str = "") -> None:
    """Append one JobEvent for ``job`` at the attempt its row holds, in the same statement:
    the caller's copy of the job may be older than the row (``schedule()``'s return value,
    kept while a worker ran an attempt)."""
    alias = db()
    conn = connections[alias]
    pk = _JOB.pk.get_db_prep_save(job.pk, conn)
    params = [_EVENT.get_field("job").get_db_prep_save(job.pk, conn), kind,
              _prep(conn, _EVENT, "at", timezone.now()), clean_text(actor, 150),
              clean_text(message), pk]  # fmt: skip
    with conn.cursor() as cursor:
        cursor.execute(_row_event_sql(alias), params)


class _RowPlan:
    """How to read whole Job rows on one connection: the column list, and per column the
    converters the ORM would apply (they may be bound to the connection, and each thread
    has its own connection, hence one plan per connection object)."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        fields = _JOB.concrete_fields
        self.columns = ", ".join(_q(conn, _JOB, f.name) for f in fields)
        self.attnames = [f.attname for f in fields]
        self.converting = []  # (index, column, converters) of the columns that have any
        for i, field in enumerate(fields):
            col = field.get_col(_JOB.db_table)
            functions = conn.ops.get_db_converters(col) + field.get_db_converters(conn)
            if functions:
                self.converting.append((i, col, functions))
        # UPDATE ... RETURNING: PostgreSQL, and SQLite since 3.35, the release that also
        # brought INSERT ... RETURNING (the feature Django checks). Not MariaDB's UPDATE.
        self.returning = conn.vendor in ("postgresql", "sqlite") and bool(
            conn.features.can_return_columns_from_insert
        )

    def job(self, alias: str, conn: BaseDatabaseWrapper, row: Sequence[Any]) -> Job:
        if len(row) != len(self.attnames):
            raise ValueError(f"a row of {len(row)} columns, not {len(self.attnames)}")
        values = list(row)
        for i, col, functions in self.converting:
            value = values[i]
            for convert in functions:
                value = convert(value, col, conn)
            values[i] = value
        return Job.from_db(alias, self.attnames, values)


_row_plans: WeakKeyDictionary[BaseDatabaseWrapper, _RowPlan] = WeakKeyDictionary()


def _row_plan(conn: BaseDatabaseWrapper) -> _RowPlan:
    plan = _row_plans.get(conn)
    if plan is None:
        plan = _row_plans[conn] = _RowPlan(conn)
    return plan


def fetch(job_id: str) -> Job | None:
    """Return the Job row with this id, or None."""
    alias = db()
    conn = connections[alias]
    plan = _row_plan(conn)
    query = (
        f"SELECT {plan.columns} FROM {conn.ops.quote_name(_JOB.db_table)}"
        f" WHERE {_q(conn, _JOB, 'id')} = %s"
    )
    with conn.cursor() as cursor:
        cursor.execute(query, [_prep(conn, _JOB, "id", job_id)])
        row = cursor.fetchone()
    return None if row is None else plan.job(alias, conn, row)


# -- retention: the prune's statements ---------------------------------------------------
#
# A prune walks the finished jobs in (finished_at, id) order. Its position is the last
# job's pair as the database holds it (on SQLite the text, which it compares as text), not
# read into Python and written back: '... 00:30:58.502' (Django's ``Now()`` on SQLite) came
# back as '... 00:30:58.502000', which sorts after every job of that time.

#: A keyset position on (``finished_at``, id), in the database's own values.
Position = tuple[Any, Any]


def unreferenced_sql(alias: str, fks: Iterable[Any]) -> str:
    """Conditions on the job table: no row of the foreign keys ``fks`` refers to the job."""
    conn = connections[alias]
    job = conn.ops.quote_name(_JOB.db_table)
    conditions = []
    for fk in fks:
        table = conn.ops.quote_name(fk.model._meta.db_table)
        column = _q(conn, fk.model._meta, fk.name)
        target = _q(conn, _JOB, fk.target_field.name)
        conditions.append(
            f" AND NOT EXISTS (SELECT 1 FROM {table} WHERE {table}.{column} = {job}.{target})"
        )
    return "".join(conditions)


@cache
def _finished_sql(alias: str, statuses: int, after: bool, referenced: str) -> str:
    """``FROM ... WHERE ...``: the jobs of ``statuses`` finished before a cutoff (past a
    position), through the partial ``finished_at`` index.

    SQLite's planner, which has no statistics, reads "status IN (...)" through the
    (status, run_at) index, i.e. every finished job, kept ones too, and sorts them; and it
    takes a partial index only for a query that repeats the index's condition with the
    same literal values. So on SQLite the query repeats it and names the index."""
    conn = connections[alias]

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    source = conn.ops.quote_name(_JOB.db_table)
    where = f"{c('status')} IN ({', '.join(['%s'] * statuses)}) AND {c('finished_at')} < %s"
    if conn.vendor == "sqlite":
        [index] = [i for i in _JOB.indexes if i.name == "delayjobs_finished_at"]
        assert index.condition == Q(status__in=FINISHED)  # the literal values below
        finished = ", ".join(f"'{s.value}'" for s in FINISHED)  # our constants, not input
        source += f" INDEXED BY {conn.ops.quote_name(index.name)}"
        where = f"{c('status')} IN ({finished}) AND {where}"
    if after:  # the first term lets the index find where to start (a row value alone not)
        where += f" AND {c('finished_at')} >= %s AND ({c('finished_at')}, {c('id')}) > (%s, %s)"
    return f"FROM {source} WHERE {where}{referenced}"


def _finished_params(
    conn: BaseDatabaseWrapper, statuses: Sequence[str], cutoff: datetime, after: Position | None
) -> list[Any]:
    past = [] if after is None else [after[0], *after]
    return [*statuses, _prep(conn, _JOB, "finished_at", cutoff), *past]


@cache
def _choose_sql(alias: str, statuses: int, after: bool, referenced: str, lock: bool) -> str:
    conn = connections[alias]
    # As text on SQLite: what it orders by, and a row written by hand whose time is not one
    # (the connection's converter raises for it) is deleted all the same.
    finished_at = _q(conn, _JOB, "finished_at")
    if conn.vendor == "sqlite":
        finished_at = f"CAST({finished_at} AS TEXT)"
    elif conn.vendor == "postgresql":
        # A time Python cannot read ('-infinity', a date BC) as the earliest it can, in
        # any session time zone: read back as the position, it raised DataError, so every
        # prune stopped at that batch. The jobs before it that the batch left wait for the
        # next pass, which starts again at the oldest.
        finished_at = f"GREATEST({finished_at}, '0001-01-02 00:00:00+00')"
    statement = (
        f"SELECT {finished_at}, {_q(conn, _JOB, 'id')}"
        f" {_finished_sql(alias, statuses, after, referenced)}"
        f" ORDER BY {_q(conn, _JOB, 'finished_at')}, {_q(conn, _JOB, 'id')} LIMIT %s"
    )
    if lock and conn.features.has_select_for_update:
        statement += " FOR UPDATE"
        if conn.features.has_select_for_update_skip_locked:
            statement += " SKIP LOCKED"
    return statement


def choose_finished(
    cutoff: datetime, statuses: Sequence[str], size: int, after: Position | None,
    referenced: str, *, lock: bool,
) -> list[Position]:  # fmt: skip
    """The positions of up to ``size`` jobs of ``statuses`` finished before ``cutoff``,
    oldest first, past ``after`` (``lock``: locked, those another transaction holds
    skipped, where the database can)."""
    alias = db()
    conn = connections[alias]
    statement = _choose_sql(alias, len(statuses), after is not None, referenced, lock)
    with conn.cursor() as cursor:
        cursor.execute(statement, [*_finished_params(conn, statuses, cutoff, after), size])
        return [(finished_at, pk) for finished_at, pk in cursor.fetchall()]


def count_finished(cutoff: datetime, statuses: Sequence[str], referenced: str) -> tuple[int, int]:
    """How many jobs ``choose_finished`` would give from the start, and their events: by
    the same index."""
    alias = db()
    conn = connections[alias]
    found = _finished_sql(alias, len(statuses), False, referenced)
    events, job_id = conn.ops.quote_name(_EVENT.db_table), _q(conn, _EVENT, "job")
    with conn.cursor() as cursor:
        cursor.execute(
            f"WITH chosen AS (SELECT {_q(conn, _JOB, 'id')} AS id {found})"
            f" SELECT (SELECT count(*) FROM chosen), (SELECT count(*) FROM {events}"
            f" WHERE {job_id} IN (SELECT id FROM chosen))",
            _finished_params(conn, statuses, cutoff, None),
        )
        jobs, found_events = cursor.fetchone()
    return jobs, found_events


def count_referenced(cutoff: datetime, statuses: Sequence[str], referenced: str) -> int:
    """How many jobs of ``statuses`` finished before ``cutoff`` the conditions
    ``referenced`` (``unreferenced_sql``) leave out: by the index ``choose_finished``
    walks."""
    alias = db()
    conn = connections[alias]
    found = _finished_sql(alias, len(statuses), False, "")
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) {found} AND NOT (1 = 1{referenced})",
            _finished_params(conn, statuses, cutoff, None),
        )
        (jobs,) = cursor.fetchone()
    return int(jobs)


@cache
def _prune_sql(alias: str, statuses: int, after: bool, referenced: str) -> str:
    conn = connections[alias]
    job, event = conn.ops.quote_name(_JOB.db_table), conn.ops.quote_name(_EVENT.db_table)

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    chosen = _choose_sql(alias, statuses, after, referenced, True)
    return (
        f"WITH chosen (finished_at, id) AS ({chosen}),"
        f" events AS (DELETE FROM {event} WHERE {_q(conn, _EVENT, 'job')} IN"
        f" (SELECT id FROM chosen) RETURNING 1),"
        f" jobs AS (DELETE FROM {job} WHERE {c('id')} IN (SELECT id FROM chosen)"
        f" RETURNING {c('id')}, {c('queue')}, {c('status')})"
        f" SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM events),"
        # The dead jobs only (few), for their ids in Redis's garbage: [[queue, id], ...].
        f" ARRAY(SELECT ARRAY[{c('queue')}::text, {c('id')}::text] FROM jobs"
        f" WHERE {c('status')} = %s),"
        # Where the next batch starts.
        f" (SELECT finished_at FROM chosen ORDER BY 1 DESC, id DESC LIMIT 1),"
        f" (SELECT id FROM chosen ORDER BY finished_at DESC, 1 DESC LIMIT 1)"
    )


def prune_batch(
    cutoff: datetime, statuses: Sequence[str], size: int, after: Position | None, referenced: str
) -> tuple[int, int, list[tuple[str, str]], Position | None]:
    """PostgreSQL: choose, lock (skipping locked rows) and delete a batch with its events in
    one statement; return the jobs and events deleted, the dead ones' (queue, id), and the
    last job's position (None: no job chosen)."""
    alias = db()
    conn = connections[alias]
    statement = _prune_sql(alias, len(statuses), after is not None, referenced)
    params = [*_finished_params(conn, statuses, cutoff, after), size, Status.DEAD.value]
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        jobs, events, dead, finished_at, pk = cursor.fetchone()
    last = None if pk is None else (finished_at, pk)
    return jobs, events, [(q, i) for q, i in dead], last
