"""The reconcile sweep: what it reads from the database, and when, while Redis is down,
frozen, or moved by others in the middle of a sweep; rows it cannot read."""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.utils import timezone

from django_delayjobs import reconcile as sweep
from django_delayjobs import schedule, services, sql
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, EngineUnavailable
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from tests.helpers import age_rows, in_thread, unreachable_engine, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

sqlite_only = pytest.mark.skipif("connection.vendor != 'sqlite'")


def waiting_rows(n: int, queue: str = "default", status: str = Status.SCHEDULED) -> list[str]:
    """``n`` rows due in a minute that Redis does not hold (written as by a lost add), by id."""
    due = timezone.now() + timedelta(minutes=1)
    jobs = Job.objects.bulk_create(
        Job(queue=queue, action="tests.nothing", run_at=due, status=status) for _ in range(n)
    )
    age_rows()
    return sorted(str(job.pk) for job in jobs)


def table() -> str:
    return connection.ops.quote_name(Job._meta.db_table)


def test_a_sweep_reads_no_row_while_redis_is_down(monkeypatch):
    """Each retry of the sweep (every 5 s at most) read and parsed every row of the
    horizon, for nothing: Redis was known down after the first chunk."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    waiting_rows(10)
    read: list[None] = []
    with pytest.raises(EngineUnavailable):
        reconcile(unreachable_engine(), horizon=timedelta(minutes=5),
                  progress=lambda: read.append(None))  # fmt: skip
    assert read == []


def test_a_redis_frozen_in_the_middle_of_a_sweep_costs_one_timeout_and_no_more_reads(
    own_jobs_redis, monkeypatch
):
    """The first chunk to meet a frozen Redis waited for each of its calls' timeouts
    (adopt, requeue, add: 3 s), then every other row was still read."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    ids = waiting_rows(10)
    Job.objects.filter(pk=ids[0]).update(status=Status.RUNNING)  # adopt, then requeue, add
    engine = get_engine()
    engine.known_queues()  # connected while it answers
    assert own_jobs_redis.pid is not None
    read: list[None] = []

    def progress() -> None:
        read.append(None)
        if len(read) == 1:  # the sweep's probe has passed: Redis freezes now
            os.kill(own_jobs_redis.pid, signal.SIGSTOP)

    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="unreachable"):
        reconcile(engine, horizon=timedelta(minutes=5), progress=progress)
    elapsed = time.monotonic() - started
    os.kill(own_jobs_redis.pid, signal.SIGCONT)
    assert len(read) <= 2  # the first page
    assert elapsed < 1.9, elapsed  # one 1 s timeout


def test_a_dead_job_buried_during_a_long_sweep_stays_in_garbage(monkeypatch):
    """The rows were one snapshot taken as the sweep began: a job read waiting that died
    (and was buried) before its chunk came was "revived" out of garbage into ready, where
    no worker can run it, and vanished from the dead jobs Redis shows."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    ids = waiting_rows(6)
    engine = get_engine()
    last = ids[-1]

    def dies() -> None:  # a worker's outcome, on a connection of its own
        Job.objects.filter(pk=last).update(status=Status.DEAD)
        engine.client.zadd(engine.keys("default").garbage, {last: 1})
        connections.close_all()

    read: list[None] = []

    def progress() -> None:
        read.append(None)
        if len(read) == 1:
            in_thread(dies, []).join()

    reconcile(engine, horizon=timedelta(minutes=5), progress=progress)
    assert engine.client.zscore(engine.keys("default").garbage, last) is not None
    assert last.encode() not in engine.client.lrange(engine.keys("default").ready, 0, -1)
    assert engine.stats("default").pending == 5


def test_a_requeue_between_the_sweeps_read_and_its_bury_is_not_left_in_garbage(redis_client):
    """A running job the sweep put back in flight had died meanwhile, so the sweep buried
    it; a requeue committed in between found the id in flight (its own Redis step left it
    there) and the bury then left the waiting job in garbage until the next sweep."""
    base = get_engine()
    job = schedule(tasks.record, in_=0, args=["x"])
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, attempts=1)
    age_rows()
    redis_client.flushdb()  # Redis lost the running job's lease

    class Racing(Engine):
        def adopt(self, queue, ids, lease_ms):  # type: ignore[no-untyped-def]
            adopted = super().adopt(queue, ids, lease_ms)
            Job.objects.filter(pk=job.pk).update(status=Status.DEAD)  # its worker's outcome
            return adopted

        def bury(self, queue, ids):  # type: ignore[no-untyped-def]
            assert services.requeue(job)  # the admin's requeue commits first
            return super().bury(queue, ids)

    reconcile(Racing(base.client, prefix=base.prefix), horizon=timedelta(minutes=5))
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    keys = base.keys("default")
    assert redis_client.zscore(keys.garbage, str(job.pk)) is None
    assert wait_for(lambda: (base.promote("default"), base.claim("default", 1))[1]) == [
        str(job.pk)
    ]  # a worker gets it now


@sqlite_only
def test_rows_with_text_that_is_not_utf8_are_skipped_and_the_rest_repaired(monkeypatch):
    """One row written by raw SQL with bytes that are not UTF-8 stopped every sweep for
    good ("Could not decode to UTF-8 column")."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    ids = waiting_rows(6)
    bad_queue, bad_id = ids[1], ids[3]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table()} SET queue = CAST(X'6f72ff' AS TEXT) WHERE id = %s",
                       [uuid.UUID(bad_queue).hex])  # fmt: skip
        cursor.execute(
            f"UPDATE {table()} SET id = CAST(X'{uuid.UUID(bad_id).hex[:30].encode().hex()}ff'"
            f" AS TEXT) WHERE id = %s",
            [uuid.UUID(bad_id).hex],
        )
    result = reconcile(get_engine(), horizon=timedelta(minutes=5))
    assert result == {"default": 4}
    assert set(result.skipped) == {bad_queue, f"{uuid.UUID(bad_id).hex[:30]}\\xff"}
    assert all("UTF-8" in why or "not a job id" in why for why in result.skipped.values())


@sqlite_only
def test_a_job_id_stored_with_dashes_is_reported_not_handed_to_redis():
    """SQLite keeps a UUID as 32 hex digits; an id written by raw SQL in the dashed form
    was added to Redis, where no worker could claim it (its claim looks the row up by the
    hex form): it was never run and never reported."""
    [kept, dashed] = waiting_rows(2)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table()} SET id = %s WHERE id = %s",
                       [dashed, uuid.UUID(dashed).hex])  # fmt: skip
    result = reconcile(get_engine(), horizon=timedelta(minutes=5))
    assert result == {"default": 1}
    assert list(result.skipped) == [dashed]
    assert "32 hex digits" in result.skipped[dashed]
    assert [i for i, _ in get_engine().next_due("default", 10)] == [kept]


def test_a_running_row_with_an_unusable_due_time_is_not_reported_as_handed_to_a_worker(
    monkeypatch,
):
    """A running row goes back in flight (adopt) whatever its due time: it was reported
    "handed to a worker due now", which it was not. (Paged past such due times too.)"""
    monkeypatch.setattr(sweep, "CHUNK", 1)
    waiting_rows(3, status=Status.RUNNING)
    bad = "'infinity'" if connection.vendor == "postgresql" else "'soon'"
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table()} SET run_at = {bad}")
    result = reconcile(get_engine(), horizon=timedelta(minutes=5))
    assert result == {"default": 3} and result.unusable == {}
    assert get_engine().stats("default").in_flight == 3


def test_the_command_prints_what_it_repaired_before_redis_failed(own_jobs_redis, monkeypatch):
    """A pass that Redis failed partway lost what it had done: only the error was shown."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    waiting_rows(2, queue="a")
    waiting_rows(2, queue="b")
    engine = get_engine()
    engine.known_queues()
    assert own_jobs_redis.pid is not None

    class FreezingAfterA(Engine):
        def add(self, queue, items, priorities=None, **options):  # type: ignore[no-untyped-def]
            if queue == "b":
                os.kill(own_jobs_redis.pid, signal.SIGSTOP)
            return super().add(queue, items, priorities, **options)

    monkeypatch.setattr(
        "django_delayjobs.management.commands.delayjobs_reconcile.get_engine",
        lambda: FreezingAfterA(engine.client, prefix=engine.prefix),
    )
    out = StringIO()
    try:
        with pytest.raises(CommandError, match="unreachable"):
            call_command("delayjobs_reconcile", stdout=out)
    finally:
        os.kill(own_jobs_redis.pid, signal.SIGCONT)
    assert "a: re-added 2 job(s)" in out.getvalue()
    assert "repaired 2 job(s)" in out.getvalue()


def test_the_sweep_reads_its_rows_page_by_page(monkeypatch):
    """Each page is a short query of its own: no cursor, no read transaction held open for
    the whole sweep (on SQLite one blocked WAL checkpoints)."""
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(sweep, "CHUNK", 2)
    waiting_rows(5)
    with CaptureQueriesContext(connections[sql.db()]) as queries:
        reconcile(get_engine(), horizon=timedelta(minutes=5))
    pages = [q["sql"] for q in queries.captured_queries if "LIMIT" in q["sql"].upper()]
    # scheduled: 2 + 2 + 1; retrying and running: none
    assert len(pages) == 5, queries.captured_queries


def test_queues_interleaved_across_pages_are_repaired_a_chunk_at_a_time(monkeypatch):
    """Each page was repaired per queue present in it: rows of many queues interleaved by
    due time cost one round of Redis calls (and database reads) per queue per page, where
    batches of CHUNK rows per queue cost one per CHUNK rows of each queue."""
    monkeypatch.setattr(sweep, "CHUNK", 4)
    due = timezone.now() + timedelta(minutes=1)
    Job.objects.bulk_create(
        Job(queue=f"q{n % 5}", action="tests.nothing", run_at=due + timedelta(seconds=n),
            status=Status.SCHEDULED)
        for n in range(40)
    )  # fmt: skip
    age_rows()
    engine = get_engine()
    calls: list[str] = []

    class Counting(Engine):
        def add(self, queue, items, priorities=None, **options):  # type: ignore[no-untyped-def]
            calls.append(queue)
            return super().add(queue, items, priorities, **options)

    result = reconcile(Counting(engine.client, prefix=engine.prefix),
                       horizon=timedelta(minutes=5))  # fmt: skip
    assert result == {f"q{n}": 8 for n in range(5)}
    # 8 rows per queue, 4 per batch: 2 adds per queue (one per page held each: 8 or 10)
    assert sorted(calls) == sorted([f"q{n}" for n in range(5)] * 2)


@pytest.mark.parametrize(("ties", "expected"), [(100, 5), (10, 7)])
def test_a_group_of_rows_due_at_one_time_is_read_once_not_once_per_page(
    monkeypatch, ties, expected
):
    """The (status, run_at) index holds no id: each page past a row of a large group due at
    one time (orders scheduled at midnight) fetched and sorted the whole group again, its
    size squared over CHUNK rows per sweep. The rest of such a group is read at once (in
    pieces of ``TIES`` rows), then the rows due after it."""
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(sweep, "CHUNK", 5)
    monkeypatch.setattr(sweep, "TIES", ties)
    due = timezone.now() + timedelta(minutes=1)
    Job.objects.bulk_create(
        Job(queue="default", action="tests.nothing", run_at=when, status=Status.SCHEDULED)
        for when in [due - timedelta(seconds=n) for n in (3, 2, 1)]
        + [due] * 23
        + [due + timedelta(seconds=n) for n in (1, 2, 3, 4)]
    )
    age_rows()
    ids = {str(pk) for pk in Job.objects.values_list("pk", flat=True)}
    handed: list[str] = []

    class Counting(Engine):
        def add(self, queue, items, priorities=None, **options):  # type: ignore[no-untyped-def]
            handed.extend(items)
            return super().add(queue, items, priorities, **options)

    engine = get_engine()
    with CaptureQueriesContext(connections[sql.db()]) as queries:
        result = reconcile(Counting(engine.client, prefix=engine.prefix),
                           horizon=timedelta(minutes=5))  # fmt: skip
    assert result == {"default": 30}
    assert sorted(handed) == sorted(ids)  # each row once
    reads = [q["sql"] for q in queries.captured_queries if "LIMIT" in q["sql"].upper()]
    # a page: 3 rows + 2 of the group (full); the rest of the group, 21 rows, in pieces of
    # TIES (1 or 3 queries); a page of the 4 rows after it; retrying and running: 1 each.
    # Paged as before: 7 pages of the group's rows, each reading the group from its start.
    assert len(reads) == expected, reads


@sqlite_only
def test_a_priority_that_is_not_utf8_text_is_read_as_0_and_the_rest_repaired(
    monkeypatch, redis_client
):
    """The priority was the one column read as it is: a row whose priority is text that is
    not UTF-8 (raw SQL; SQLite keeps it in an integer column) failed its whole page, on
    every sweep. Such a priority, or any that is no number, counts as 0 (the default)."""
    monkeypatch.setattr(sweep, "CHUNK", 2)
    ids = waiting_rows(5)
    bad, text, ranked = ids[1], ids[2], ids[3]
    with connection.cursor() as cursor:  # past the range's CHECK, as a table made before it
        cursor.execute("PRAGMA ignore_check_constraints = ON")
        cursor.execute(f"UPDATE {table()} SET priority = CAST(X'ff' AS TEXT) WHERE id = %s",
                       [uuid.UUID(bad).hex])  # fmt: skip
        cursor.execute(f"UPDATE {table()} SET priority = 'high' WHERE id = %s",
                       [uuid.UUID(text).hex])  # fmt: skip
        cursor.execute(f"UPDATE {table()} SET priority = 7 WHERE id = %s",
                       [uuid.UUID(ranked).hex])  # fmt: skip
        cursor.execute("PRAGMA ignore_check_constraints = OFF")
    result = reconcile(get_engine(), horizon=timedelta(minutes=5))
    assert result == {"default": 5} and not result.skipped
    assert redis_client.hgetall(get_engine().keys("default").priority) == {ranked.encode(): b"7"}
