"""The per-job statements of the hot path, written out instead of built by the ORM.

Building a query costs the ORM several times what running it costs. On the bench machine
a worker's claim transaction took about 1.1 ms through the ORM and takes about 0.26 ms
with these statements (``bench/hotpath.py``, docs/performance.md). They are plain SQL
over the models' own table and column names, every value is adapted by its model field,
and each means exactly what the ORM call it replaces meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any
from weakref import WeakKeyDictionary

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .models import ACTIVE, Job, JobEvent, Status

_JOB = Job._meta
_EVENT = JobEvent._meta


def db() -> str:
    """The database alias that Job rows are written to (and read from, by the worker)."""
    return router.db_for_write(Job)


def _q(conn: BaseDatabaseWrapper, model_meta: Any, name: str) -> str:
    return conn.ops.quote_name(model_meta.get_field(name).column)


def _prep(conn: BaseDatabaseWrapper, model_meta: Any, name: str, value: Any) -> Any:
    return model_meta.get_field(name).get_db_prep_save(value, conn)


@cache
def _claim_sql(alias: str) -> str:
    conn = connections[alias]

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    return (
        f"UPDATE {conn.ops.quote_name(_JOB.db_table)}"
        f" SET {c('status')} = %s, {c('attempts')} = {c('attempts')} + 1,"
        f" {c('started_at')} = %s, {c('worker')} = %s"
        f" WHERE {c('id')} = %s AND {c('status')} IN ({', '.join(['%s'] * len(ACTIVE))})"
        f" AND {c('run_at')} <= %s AND {c('attempts')} < {c('max_attempts')}"
    )


def claim(job_id: str, worker: str, now: datetime) -> Job | None:
    """Start a new attempt of an active job that is due and has attempts left; return the
    row as it is now, or None if it did not qualify.

    One statement where the database can return the updated row (PostgreSQL, SQLite from
    3.35); an UPDATE and a SELECT elsewhere.
    """
    alias = db()
    conn = connections[alias]
    stamp = _prep(conn, _JOB, "started_at", now)
    params = [
        Status.RUNNING.value, stamp, worker[:128], _prep(conn, _JOB, "id", job_id),
        *(s.value for s in ACTIVE), stamp,
    ]  # fmt: skip
    plan = _row_plan(conn)
    with conn.cursor() as cursor:
        if plan.returning:
            cursor.execute(f"{_claim_sql(alias)} RETURNING {plan.columns}", params)
            row = cursor.fetchone()
            return None if row is None else plan.job(alias, conn, row)
        cursor.execute(_claim_sql(alias), params)
        matched = cursor.rowcount
    return fetch(job_id) if matched else None


@cache
def _fenced_sql(alias: str, fields: tuple[str, ...]) -> str:
    conn = connections[alias]

    def c(name: str) -> str:
        return _q(conn, _JOB, name)

    assignments = ", ".join(f"{c(name)} = %s" for name in fields)
    return (
        f"UPDATE {conn.ops.quote_name(_JOB.db_table)} SET {assignments}"
        f" WHERE {c('id')} = %s AND {c('attempts')} = %s AND {c('status')} = %s"
    )


def update_fenced(job: Job, values: Mapping[str, Any]) -> bool:
    """Write ``values`` only if the row is still running ``job``'s attempt."""
    alias = db()
    conn = connections[alias]
    fields = tuple(values)
    params = [_prep(conn, _JOB, name, values[name]) for name in fields]
    params += [_prep(conn, _JOB, "id", job.pk), job.attempts, Status.RUNNING.value]
    with conn.cursor() as cursor:
        cursor.execute(_fenced_sql(alias, fields), params)
        return bool(cursor.rowcount)


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


def insert_events(events: Iterable[tuple[Job, str, str, str]]) -> None:
    """Append JobEvents given as (job, kind, actor, message), each at its job's attempt."""
    alias = db()
    conn = connections[alias]
    at = _prep(conn, _EVENT, "at", timezone.now())
    job_field = _EVENT.get_field("job")
    rows = [
        (job_field.get_db_prep_save(job.pk, conn), kind, at, job.attempts, actor, message)
        for job, kind, actor, message in events
    ]
    with conn.cursor() as cursor:
        cursor.executemany(_event_sql(alias), rows)


class _RowPlan:
    """How to read whole Job rows on one connection: the column list, and per column the
    converters the ORM would apply (they may be bound to the connection, and each thread
    has its own connection, hence one plan per connection object)."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        fields = _JOB.concrete_fields
        self.columns = ", ".join(_q(conn, _JOB, f.name) for f in fields)
        self.attnames = [f.attname for f in fields]
        self.converters = []
        for field in fields:
            col = field.get_col(_JOB.db_table)
            functions = conn.ops.get_db_converters(col) + field.get_db_converters(conn)
            self.converters.append((col, functions))
        # UPDATE ... RETURNING: PostgreSQL, and SQLite since 3.35, the release that also
        # brought INSERT ... RETURNING (the feature Django checks). Not MariaDB's UPDATE.
        self.returning = conn.vendor in ("postgresql", "sqlite") and bool(
            conn.features.can_return_columns_from_insert
        )

    def job(self, alias: str, conn: BaseDatabaseWrapper, row: Sequence[Any]) -> Job:
        values = []
        for value, (col, functions) in zip(row, self.converters, strict=True):
            for convert in functions:
                value = convert(value, col, conn)
            values.append(value)
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
