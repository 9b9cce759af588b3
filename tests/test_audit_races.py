"""Audit: races and failures of the public verbs at the Django layer (failing reproductions)."""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models.signals import pre_delete

from django_delayjobs import schedule, services, signals
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import ACTIVE, Job, Status
from django_delayjobs.services import purge, requeue
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    pass


def _dead_keyed_job(key: str) -> Job:
    job = schedule(tasks.fail, in_=0, key=key, max_attempts=1)
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.DEAD
    return job


def test_requeue_of_a_dead_job_whose_key_is_held_again_is_refused_cleanly():
    """A dead job's key is free again (only active jobs hold a key), so a new job may take
    it. Requeueing the dead one then violates the one-active-job-per-key constraint:
    ``requeue`` lets the database's IntegrityError escape (a 500 from the admin and the
    API, which document 200 or 409). It should refuse with a clear answer (False, or
    ``InvalidSchedule``), leaving both jobs as they are."""
    dead = _dead_keyed_job("order-1-autocancel")
    fresh = schedule(tasks.record, in_=60, args=["x"], key="order-1-autocancel")
    assert fresh.pk != dead.pk
    try:
        won = dead.requeue()
    except InvalidSchedule:
        won = False
    assert won is False
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    assert Job.objects.get(pk=fresh.pk).status == Status.SCHEDULED


def _plant_queue(job: Job, queue: str) -> None:
    """Give ``job`` a queue no Redis key can carry, with raw SQL (an older version's)."""
    table, quote = connection.ops.quote_name(Job._meta.db_table), connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {quote('queue')} = %s WHERE {quote('id')} = %s",
            [queue, Job._meta.pk.get_db_prep_value(job.pk, connection)],
        )


def test_cancel_of_a_row_whose_queue_cannot_name_redis_keys_does_not_raise_after_commit():
    """docs/scheduling.md ("Rows that did not pass the door"): such a job can be cancelled.
    The cancel commits, but its on-commit Redis hook (services.cancel -> ``_redis``) only
    catches ``EngineUnavailable``: the engine's ``ValueError`` for the queue name escapes
    from the caller's ``atomic()`` after the commit, and Django then drops every later
    on-commit hook of that transaction: the caller's own and ``job_cancelled``. The cancel
    should return True, nothing should be raised, and the other hooks should run."""
    job = schedule(tasks.record, in_=60, args=["poison"])
    _plant_queue(job, "old queue")
    ran: list[str] = []

    def cancelled(sender, job, **kwargs):
        ran.append("job_cancelled")

    signals.job_cancelled.connect(cancelled, weak=False, dispatch_uid="audit-cancelled")
    try:
        with transaction.atomic():
            won = Job.objects.get(pk=job.pk).cancel()
            transaction.on_commit(lambda: ran.append("caller's hook"))
    finally:
        signals.job_cancelled.disconnect(dispatch_uid="audit-cancelled")
    assert won is True
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    assert sorted(ran) == ["caller's hook", "job_cancelled"]


def test_purge_racing_a_requeue_never_deletes_the_requeued_job():
    """``purge`` is ``Job.objects.filter(pk=..., status=DEAD).delete()``: Django's collector
    SELECTs the dead row, then DELETEs by primary key alone, without the status condition
    and without a row lock. A ``requeue`` that commits in between (PostgreSQL, two
    connections) returns True, and then purge deletes the job it revived, with its
    ``requeued`` event: the admin said "requeued" and the job is silently gone. The verbs
    are conditional UPDATEs judged by the row: exactly one of the two should win (requeue
    True leaves a scheduled row; purge True means requeue found nothing dead).

    The interleaving is forced with a ``pre_delete`` receiver, which Django's collector
    calls after its SELECT and before its DELETEs."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's IMMEDIATE transactions serialize purge and requeue")
    dead = _dead_keyed_job("purge-vs-requeue")
    requeued: list[bool] = []

    def requeue_in_another_connection() -> None:
        try:
            requeued.append(requeue(dead.pk, actor="admin:other"))
        finally:
            connection.close()

    def between_select_and_delete(sender, instance, **kwargs):
        if instance.pk == dead.pk and not requeued:
            other = threading.Thread(target=requeue_in_another_connection)
            other.start()
            other.join(30)

    pre_delete.connect(between_select_and_delete, sender=Job, weak=False,
                       dispatch_uid="audit-purge-race")  # fmt: skip
    try:
        purged = purge(dead.pk)
    finally:
        pre_delete.disconnect(sender=Job, dispatch_uid="audit-purge-race")
    assert requeued == [True]  # it committed before purge's DELETE
    assert not purged, "purge deleted a job that a committed requeue had just revived"
    assert Job.objects.get(pk=dead.pk).status == Status.SCHEDULED


def test_two_replacing_schedules_with_one_key_never_return_a_cancelled_job(monkeypatch):
    """``schedule(key=..., replace=True)`` reads the job holding the key (``_existing``),
    then cancels it. When another replacing schedule commits in between (PostgreSQL, two
    connections: it cancels the same old job and inserts its own), this call's cancel
    finds the old job already cancelled, returns False, and ``_insert`` returns that
    *cancelled* job as if it held the key: the caller's schedule silently did nothing and
    it is handed a dead-end job. It should return the job that holds the key now (the
    other call's, or its own replacing it), an active one.

    The interleaving is forced by pausing this call right after its ``_existing`` read."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's IMMEDIATE transactions serialize the two schedules")
    old = schedule(tasks.record, in_=60, args=["old"], key="replaced")
    read, other_done = threading.Event(), threading.Event()
    real_existing = services._existing

    def existing(job: Job) -> Job | None:
        found = real_existing(job)
        if threading.current_thread().name == "paused" and not read.is_set():
            read.set()
            assert other_done.wait(30)
        return found

    monkeypatch.setattr(services, "_existing", existing)
    returned: list[Job] = []

    def paused() -> None:
        try:
            returned.append(
                schedule(tasks.record, in_=60, args=["mine"], key="replaced", replace=True)
            )
        finally:
            connection.close()

    thread = threading.Thread(target=paused, name="paused")
    thread.start()
    assert read.wait(30)
    try:
        other = schedule(tasks.record, in_=60, args=["other"], key="replaced", replace=True)
    finally:
        other_done.set()
        thread.join(30)
    assert other.pk != old.pk
    (mine,) = returned
    mine.refresh_from_db()
    assert mine.pk != old.pk, "a replacing schedule returned the job it meant to replace"
    assert mine.status in ACTIVE
    assert Job.objects.filter(key="replaced", status__in=ACTIVE).count() == 1


def test_cancel_through_the_job_schedule_returned_records_the_attempt_the_row_is_at():
    """The usual code keeps the Job that ``schedule()`` returned and later calls
    ``job.cancel()``. By then the job may have failed and be ``retrying`` (attempts 1),
    but ``services.cancel`` writes its ``cancelled`` event with the attempt number of the
    caller's in-memory copy (``_event(job, ...)`` -> ``sql.insert_events`` reads
    ``job.attempts``, 0): the history goes "started 1, failed 1, cancelled 0". Every
    event should carry the row's attempt (1), whatever copy the caller holds."""
    job = schedule(tasks.fail, in_=0, max_attempts=3)
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.RETRYING
    assert job.cancel() is True
    history = list(job.events.values_list("kind", "attempt"))
    assert history == [("scheduled", 0), ("started", 1), ("failed", 1), ("cancelled", 1)]


def test_a_keyed_schedule_whose_rival_finished_meanwhile_does_not_raise_integrity_error(
    monkeypatch,
):
    """``_insert`` (services.py) reads no active job for the key, then its INSERT hits the
    constraint because a concurrent schedule committed one first; it reads the key again
    and, if that job has meanwhile left the active statuses (cancelled, or run by a fast
    worker), re-raises the ``IntegrityError`` out of ``schedule()``: an undocumented
    database error for a valid call. The key is free at that point: the schedule should
    insert its own job (or return the job holding the key), never raise.

    The interleaving (PostgreSQL, two connections) is forced by pausing the schedule
    before each of its two reads of the key."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's IMMEDIATE transactions serialize the two schedules")
    first_read, rival_committed = threading.Event(), threading.Event()
    second_read, rival_cancelled = threading.Event(), threading.Event()
    real_existing = services._existing
    reads = 0

    def existing(job: Job) -> Job | None:
        nonlocal reads
        if threading.current_thread().name == "paused":
            reads += 1
            if reads == 1:
                found = real_existing(job)  # nothing holds the key yet
                first_read.set()
                assert rival_committed.wait(30)
                return found
            second_read.set()
            assert rival_cancelled.wait(30)
        return real_existing(job)

    monkeypatch.setattr(services, "_existing", existing)
    outcome: list[object] = []

    def paused() -> None:
        try:
            outcome.append(schedule(tasks.record, in_=60, args=["mine"], key="contested"))
        except Exception as exc:
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=paused, name="paused")
    thread.start()
    try:
        assert first_read.wait(30)
        rival = schedule(tasks.record, in_=60, args=["rival"], key="contested")
        rival_committed.set()
        assert second_read.wait(30)  # its INSERT failed on the rival's committed row
        assert rival.cancel() is True
        rival_cancelled.set()
    finally:
        rival_committed.set()
        rival_cancelled.set()
        thread.join(30)
    (mine,) = outcome
    assert isinstance(mine, Job), f"schedule() raised {mine!r}"
    assert Job.objects.filter(key="contested", status__in=ACTIVE).count() == 1
