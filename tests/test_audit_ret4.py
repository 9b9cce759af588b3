"""The statements that read a row back after an UPDATE, on a database without
``UPDATE ... RETURNING`` (SQLite 3.31 to 3.34, which Django 5.2 still supports: Ubuntu
20.04, Debian 11): the UPDATE, then a read of the row (``sql._update_row``,
``sql.cancel_waiting``), against the real database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from django_delayjobs import schedule, schedule_many, sql
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import EventKind, Job, Status
from django_delayjobs.services import build_job, cancel
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def fields(job: Job) -> dict[str, object]:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@pytest.fixture
def no_returning(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """The statements are made without RETURNING, as on an SQLite older than 3.35, and
    run against the real database. Yields whether each plan asked for used RETURNING
    (none may), to show that they went through the fallback.

    On SQLite the connections look as an older SQLite's do, for Django's own statements
    too (``schedule_many``'s ``bulk_create``, an action's ``create()``): on the features
    class, as each worker thread opens a connection of its own (a new features object),
    and on the objects already made, as the value is a ``cached_property`` that a first
    read stores in the object. PostgreSQL always has RETURNING, and Django needs it
    there: without it, an insert reads the new id from ``cursor.lastrowid``, which
    psycopg has not (every ``Record.objects.create()`` of an action failed). So there only
    our plans are made without it: the fallback runs on PostgreSQL all the same."""
    if connection.vendor == "sqlite":
        for conn in connections.all():
            for name in ("can_return_columns_from_insert", "can_return_rows_from_bulk_insert"):
                monkeypatch.setattr(type(conn.features), name, False)
                monkeypatch.setattr(conn.features, name, False)
    else:
        init = sql._RowPlan.__init__

        def without_returning(self, conn):  # type: ignore[no-untyped-def]
            init(self, conn)
            self.returning = False

        monkeypatch.setattr(sql._RowPlan, "__init__", without_returning)
    sql._row_plans.clear()
    seen: list[bool] = []
    row_plan = sql._row_plan

    def spied(conn):  # type: ignore[no-untyped-def]
        plan = row_plan(conn)
        seen.append(plan.returning)
        return plan

    monkeypatch.setattr(sql, "_row_plan", spied)
    yield seen
    assert seen and not any(seen)
    sql._row_plans.clear()


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def started(job: Job) -> list[str]:
    return list(job.events.filter(kind=EventKind.STARTED).values_list("message", flat=True))


def test_a_worker_claims_runs_and_claims_the_next_job_ahead(no_returning, monkeypatch):
    """The claim (in its own transaction) and the claim of the batch's next job in the
    first one's outcome transaction, each an UPDATE and a read of the row."""
    past = timezone.now() - timedelta(seconds=1)
    first = build_job(tasks.record, at=past, args=["first"])
    second = build_job(tasks.record, at=past, args=["second"])
    schedule_many([first, second])  # Django's bulk_create without RETURNING; one batch
    ahead: list[dict[str, object]] = []  # the rows as claimed (the worker goes on with them)
    claim_ahead = Execution.claim_ahead

    def spied(self):  # type: ignore[no-untyped-def]
        if (claimed := claim_ahead(self)) is not None:
            ahead.append(fields(claimed))
        return claimed

    monkeypatch.setattr(Execution, "claim_ahead", spied)
    burst()
    [claimed] = ahead  # the row as that claim wrote it
    assert claimed["id"] == second.pk
    assert (claimed["status"], claimed["attempts"], claimed["deliveries"]) == (
        Status.RUNNING, 1, 1,
    )  # fmt: skip
    assert claimed["worker"] and claimed["started_at"] is not None
    for job in (first, second):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1)
        assert job.result == job.args[0]
        assert list(job.events.values_list("kind", flat=True)) == [
            "scheduled", "started", "succeeded",
        ]  # fmt: skip
        assert started(job) == [f"attempt 1 of {job.max_attempts}"]
    assert sorted(Record.objects.values_list("label", flat=True)) == ["first", "second"]
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)


def test_a_retry_is_claimed_as_its_next_attempt(no_returning, settings):
    """Each claim's message is written from the row it read back: a row read before the
    UPDATE, or another's, would name another attempt."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 0.01}
    job = schedule(tasks.fail, in_=0, max_attempts=2)
    for _ in range(20):
        burst()
        if Job.objects.get(pk=job.pk).status == Status.DEAD:
            break
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.DEAD, 2, 1)
    assert started(job) == ["attempt 1 of 2", "attempt 2 of 2"]
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.count("failed") == 2 and kinds[-1] == "dead"


def test_cancel_of_a_waiting_job_returns_the_queue_its_row_names(no_returning):
    job = schedule(tasks.record, in_=60, args=["x"], queue="other")
    assert get_engine().stats("other").pending == 1
    stale = Job.objects.get(pk=job.pk)
    stale.queue = "default"  # the caller's copy is wrong: Redis holds the id in "other"
    assert cancel(stale) is True
    row = Job.objects.get(pk=job.pk)
    assert row.status == Status.CANCELLED and row.finished_at is not None
    assert get_engine().stats("other").pending == 0  # removed on commit, from its queue
    assert cancel(job) is False
    waiting = schedule(tasks.record, in_=60, args=["y"], queue="other")
    now = timezone.now()
    with transaction.atomic():
        assert sql.cancel_waiting(waiting.pk, now) == "other"
        assert sql.cancel_waiting(waiting.pk, now) is None
    row = Job.objects.get(pk=waiting.pk)
    assert (row.status, row.finished_at) == (Status.CANCELLED, now)


def test_cancel_of_a_running_job_is_refused(no_returning):
    job = schedule(tasks.record, in_=0, args=["x"])
    at = timezone.now() + timedelta(seconds=1)
    with transaction.atomic():
        claimed = sql.claim(str(job.pk), "w", at, 3)
    assert claimed is not None
    assert fields(claimed) == fields(Job.objects.get(pk=job.pk))
    assert (claimed.status, claimed.attempts, claimed.worker, claimed.started_at) == (
        Status.RUNNING, 1, "w", at,
    )  # fmt: skip
    assert cancel(job) is False
    with transaction.atomic():
        assert sql.cancel_waiting(job.pk, timezone.now()) is None
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.finished_at) == (Status.RUNNING, None)


@pytest.mark.parametrize("atomic", [True, False], ids=["in-transaction", "autocommit"])
def test_restart_returns_the_row_as_it_wrote_it_or_none(no_returning, atomic):
    job = schedule(tasks.record, in_=0, args=["x"])
    t0 = timezone.now()
    claimed = sql.claim(str(job.pk), "w", t0 + timedelta(seconds=1), 3)
    assert claimed is not None

    def restart(job: Job, at: object = None, **kw: bool) -> Job | None:
        if not atomic:
            return sql.restart(job, at, **kw)  # type: ignore[arg-type]
        with transaction.atomic():
            return sql.restart(job, at, **kw)  # type: ignore[arg-type]

    def check(row: Job | None) -> Job:
        assert row is not None
        assert fields(row) == fields(Job.objects.get(pk=job.pk))
        assert (row.status, row.attempts, row.deliveries, row.worker) == (
            Status.RUNNING, 1, 1, "w",
        )  # fmt: skip
        return row

    assert check(restart(claimed, t0 + timedelta(seconds=5))).started_at == t0 + timedelta(
        seconds=5
    )
    # only if ahead: a later time leaves the start as it is, an earlier one writes it
    row = check(restart(claimed, t0 + timedelta(seconds=10), only_if_ahead=True))
    assert row.started_at == t0 + timedelta(seconds=5)
    row = check(restart(claimed, t0 + timedelta(seconds=2), only_if_ahead=True))
    assert row.started_at == t0 + timedelta(seconds=2)
    # the database's time
    check(restart(claimed, t0 + timedelta(days=1)))
    row = check(restart(claimed, only_if_ahead=True))
    assert row.started_at is not None and abs(row.started_at - timezone.now()) < timedelta(
        seconds=5
    )
    row = check(restart(claimed, only_if_ahead=True))  # not ahead now: left as it is
    assert row.started_at == Job.objects.get(pk=job.pk).started_at
    check(restart(claimed, t0 + timedelta(days=1)))
    row = check(restart(claimed))
    assert row.started_at is not None and abs(row.started_at - timezone.now()) < timedelta(
        seconds=5
    )
    # a delivery, an attempt or a worker that the row no longer runs: None, nothing written
    before = fields(Job.objects.get(pk=job.pk))
    for name, value in (("deliveries", 2), ("attempts", 2), ("worker", "other")):
        stale = Job.objects.get(pk=job.pk)
        setattr(stale, name, value)
        assert restart(stale, t0) is None
        assert restart(stale, None, only_if_ahead=True) is None
    assert fields(Job.objects.get(pk=job.pk)) == before


def test_a_restart_outside_a_transaction_reads_back_its_own_write(no_returning, monkeypatch):
    """``Execution.found_ahead`` restarts a row ahead of its clock outside any transaction.
    Between the UPDATE and the read of the row, a worker whose clock is far ahead takes
    the row over (its start, now the database's time, is half a lease behind that clock):
    the read-back must still be the row as the restart wrote it, not that takeover."""
    job = schedule(tasks.record, in_=0, args=["x"])
    now = timezone.now()
    claimed = sql.claim(str(job.pk), "ahead", now + timedelta(days=1), 3)
    assert claimed is not None
    taken: list[Job | None] = []
    threads: list[threading.Thread] = []
    fetch = sql.fetch

    def take_over() -> None:
        try:
            taken.append(sql.claim(str(job.pk), "far ahead", now + timedelta(days=2), 3))
        finally:
            connection.close()

    def fetch_after_a_takeover(job_id: str) -> Job | None:
        if threads:  # the takeover's own read-back
            return fetch(job_id)
        threads.append(thread := threading.Thread(target=take_over))
        thread.start()
        thread.join(timeout=1)  # it waits for the restart's transaction, if there is one
        return fetch(job_id)

    monkeypatch.setattr(sql, "fetch", fetch_after_a_takeover)
    assert not connection.in_atomic_block
    row = sql.restart(claimed, only_if_ahead=True)
    threads[0].join()
    assert row is not None
    assert (row.worker, row.attempts, row.deliveries) == ("ahead", 1, 1)
    assert row.started_at is not None and abs(row.started_at - now) < timedelta(seconds=5)
    [other] = taken  # the takeover came after it, as it may
    assert other is not None and (other.worker, other.deliveries) == ("far ahead", 2)


def test_a_cancel_outside_a_transaction_reads_the_queue_in_its_update_s(no_returning):
    """Outside a transaction the UPDATE committed at once, and the row could change (a
    purge) before its queue was read: both statements now share one transaction."""
    job = schedule(tasks.record, in_=60, args=["x"], queue="other")
    seen: list[tuple[str, bool]] = []

    def spy(execute, sql_text, params, many, context):  # type: ignore[no-untyped-def]
        seen.append((sql_text.split()[0], connection.in_atomic_block))
        return execute(sql_text, params, many, context)

    assert not connection.in_atomic_block
    with connection.execute_wrapper(spy):
        assert sql.cancel_waiting(job.pk, timezone.now()) == "other"
    assert [s for s in seen if s[0] != "BEGIN"] == [("UPDATE", True), ("SELECT", True)]
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
