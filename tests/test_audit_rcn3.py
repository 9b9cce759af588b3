"""The reconcile sweep, third pass: a job that dies between the sweep's read of its row and
its queue's repair; due times SQLite holds as a REAL or a BLOB; the partial report of
``delayjobs_reconcile``."""

from __future__ import annotations

import io
import time
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection, connections
from django.utils import timezone

from django_delayjobs import reconcile as sweep
from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from tests.helpers import age_rows, in_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def dies_after_its_row_is_read(redis_client, job: Job):  # type: ignore[no-untyped-def]
    """A sweep's ``progress`` that, at the first row read, has ``job`` claimed, run and
    buried by a worker (on a connection of its own): after the sweep read its row waiting,
    before its chunk is repaired."""
    engine = get_engine()
    keys, job_id = engine.keys("default"), str(job.pk)

    def dies() -> None:
        Job.objects.filter(pk=job.pk).update(status=Status.DEAD, attempts=1)
        redis_client.zrem(keys.pending, job_id)
        redis_client.zadd(keys.unack, {job_id: 0})
        assert engine.bury("default", [job_id]) == 1  # scored by Redis's clock, as a worker's
        connections.close_all()

    read: list[None] = []

    def progress() -> None:
        read.append(None)
        if len(read) == 1:
            out: list[object] = []
            in_thread(dies, out).join()
            assert out == [None]

    return progress


def in_garbage_only(redis_client, job: Job) -> bool:  # type: ignore[no-untyped-def]
    keys, job_id = get_engine().keys("default"), str(job.pk)
    return (
        redis_client.zscore(keys.garbage, job_id) is not None
        and not redis_client.sismember(keys.ready_set, job_id)
        and redis_client.zscore(keys.pending, job_id) is None
        and redis_client.zscore(keys.unack, job_id) is None
    )


def test_a_job_that_dies_after_the_sweep_read_it_waiting_stays_in_garbage(redis_client):
    """The row was read waiting; its job then ran, died and was buried before the queue's
    batch was repaired: the repair's requeue took the id out of garbage into ready, where
    no worker runs it, and the dead job was missing from Redis's dead jobs."""
    job = schedule(tasks.record, in_=60, args=["x"])
    age_rows()
    progress = dies_after_its_row_is_read(redis_client, job)
    result = reconcile(get_engine(), horizon=timedelta(minutes=5), progress=progress)
    assert sum(result.values()) == 0
    assert in_garbage_only(redis_client, job)


def test_a_job_requeued_while_redis_was_down_is_still_taken_out_of_garbage(redis_client):
    """The repair's requeue is there for a job requeued whose own Redis step was lost."""
    job = schedule(tasks.record, in_=0, args=["x"])
    engine = get_engine()
    keys, job_id = engine.keys("default"), str(job.pk)
    assert engine.claim("default", 1, 60_000) == [job_id]
    assert engine.bury("default", [job_id]) == 1
    Job.objects.filter(pk=job.pk).update(status=Status.SCHEDULED)
    age_rows()
    time.sleep(0.005)  # the sweep reads the row a whole ms after the bury, as Redis counts
    assert reconcile(engine, horizon=timedelta(minutes=5)) == {"default": 1}
    assert redis_client.zscore(keys.garbage, job_id) is None
    assert redis_client.sismember(keys.ready_set, job_id)


@pytest.mark.parametrize(
    ("value", "reported"),
    [("0.1 + 0.2", "unusable"), ("X'01'", "skipped"), ("9007199254740993", "unusable")],
)
def test_due_times_sqlite_holds_as_a_real_or_a_blob_end_the_sweep_and_are_reported(
    monkeypatch, value, reported
):
    """SQLite keeps any type in its datetime column: a due time written by raw SQL as a
    REAL (read as text, it lost digits) or a BLOB (read as text, it became text) matched
    no row as a page's position, and a full page of such rows was read again, for ever."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    due = timezone.now() + timedelta(minutes=1)
    jobs = Job.objects.bulk_create(
        Job(queue="default", action="tests.nothing", run_at=due, status=Status.SCHEDULED)
        for _ in range(7)
    )
    age_rows()
    odd = sorted(str(job.pk) for job in jobs[:5])
    if connection.vendor == "sqlite":
        table = connection.ops.quote_name(Job._meta.db_table)
        with connection.cursor() as cursor:
            marks = ", ".join(["%s"] * 5)
            cursor.execute(f"UPDATE {table} SET run_at = {value} WHERE id IN ({marks})",
                           [uuid.UUID(i).hex for i in odd])  # fmt: skip
    read: list[None] = []

    def progress() -> None:
        read.append(None)
        assert len(read) <= 7, "the sweep reads its rows again"

    result = reconcile(get_engine(), horizon=None, progress=progress)
    if connection.vendor != "sqlite":  # PostgreSQL holds only timestamps: nothing odd
        assert result == {"default": 7}
        return
    assert len(read) == 7
    assert sorted(getattr(result, reported)) == odd
    assert result["default"] == (7 if reported == "unusable" else 2)
    if reported == "skipped":
        assert all("BLOB" in why for why in result.skipped.values())


def test_the_partial_report_says_what_was_taken_out_of_garbage_before_the_database_failed(
    monkeypatch, redis_client
):
    """A database failure partway printed the repair so far only if a job was re-added
    (or skipped): ids already taken out of garbage, those of the queue under way too, were
    left out, as if nothing had been done."""
    monkeypatch.setattr(sweep, "CHUNK", 100)
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["x"])  # lists the queue; then finished
    Job.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
    engine.remove("default", [str(job.pk)])
    garbage = engine.keys("default").garbage
    # ids whose rows are gone; more than a small sorted set, which ZSCAN reads at once
    redis_client.zadd(garbage, {str(uuid.uuid4()): n for n in range(300)})
    reads: list[str] = []

    def failing(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if "LIMIT" not in sql.upper() and '"status"' in sql and " IN (" in sql.upper():
            reads.append(sql)
            if len(reads) == 2:  # the second chunk of garbage: the database went away
                raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    out = io.StringIO()
    with connection.execute_wrapper(failing), pytest.raises(CommandError):
        call_command("delayjobs_reconcile", stdout=out)
    cleared = 300 - redis_client.zcard(garbage)
    assert len(reads) == 2 and 0 < cleared < 300
    assert f"default: took {cleared} id(s) out of garbage whose job is not dead" in out.getvalue()
