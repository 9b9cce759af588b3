"""Races the database must judge: cancel vs. claim, concurrent keyed schedules, purge vs.
requeue.

Run on SQLite by default and on PostgreSQL when DATABASE_URL is set (CI does both);
PostgreSQL is where the row locks really interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.signals import pre_delete

from django_delayjobs import schedule, services
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import ACTIVE, Job, Status
from django_delayjobs.outcomes import Outcome, settle
from django_delayjobs.services import purge, requeue
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(*fns: Callable[[], Any]) -> list[Any]:
    """Run each function in its own thread, released together; return their results."""
    barrier = threading.Barrier(len(fns))
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def test_cancel_returns_true_exactly_when_the_job_never_runs():
    engine = get_engine()
    outcomes = {True: 0, False: 0}
    for n in range(40):
        job = schedule(tasks.record, in_=0, args=[f"run{n}"])
        # Due times round up to the next ms, so the id may sit in pending for 1 ms.
        (job_id,) = wait_for(lambda: engine.promote("default") and engine.claim("default", 1))

        def work(job_id: str = job_id) -> str:
            result = Execution("default", job_id, "racer").run()
            settle(engine, "default", job_id, result)
            return result.outcome

        def cancel(job: Job = job) -> bool:
            return Job.objects.get(pk=job.pk).cancel()

        ran, cancelled = in_threads(work, cancel)
        job.refresh_from_db()
        runs = Record.objects.filter(label=f"run{n}").count()
        if cancelled:
            assert (job.status, runs, ran) == (Status.CANCELLED, 0, Outcome.DROPPED)
        else:
            assert (job.status, runs, ran) == (Status.SUCCEEDED, 1, Outcome.SUCCEEDED)
        outcomes[cancelled] += 1
    assert sum(outcomes.values()) == 40
    assert engine.stats("default").in_flight == 0


def test_concurrent_schedules_with_one_key_make_one_row():
    def attempt() -> str:
        return str(schedule(tasks.record, in_=60, args=["x"], key="only-one").pk)

    ids = in_threads(*[attempt] * 8)
    assert len(set(ids)) == 1
    assert Job.objects.filter(key="only-one").count() == 1
    assert get_engine().stats("default").pending == 1


def test_reschedule_after_the_job_ran_returns_false_and_does_not_run_it_twice():
    job = schedule(tasks.record, in_=0, args=["once"])
    call_command("run_delayworker", "--burst", "-v", "0")
    assert job.reschedule(in_=0) is False
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Record.objects.filter(label="once").count() == 1
    assert Job.objects.get(pk=job.pk).attempts == 1


# -- the verbs against each other (PostgreSQL: SQLite's IMMEDIATE transactions serialize them)


def _dead_keyed_job(key: str) -> Job:
    job = schedule(tasks.fail, in_=0, key=key, max_attempts=1)
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.DEAD
    return job


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
    other = threading.Thread(target=lambda: requeued.append(requeue_in_another_connection()))

    def requeue_in_another_connection() -> bool:
        try:
            return requeue(dead.pk, actor="admin:other")
        finally:
            connection.close()

    def between_select_and_delete(sender, instance, **kwargs):
        if instance.pk == dead.pk and not other.is_alive():
            other.start()
            other.join(0.5)  # the purge holds the row: the requeue waits for it
            assert requeued == []

    pre_delete.connect(between_select_and_delete, sender=Job, weak=False,
                       dispatch_uid="audit-purge-race")  # fmt: skip
    try:
        purged = purge(dead.pk)
    finally:
        pre_delete.disconnect(sender=Job, dispatch_uid="audit-purge-race")
    other.join(30)
    assert (purged, requeued) == (True, [False])  # the requeue found nothing dead
    assert not Job.objects.filter(pk=dead.pk).exists()


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
