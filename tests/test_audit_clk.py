"""Audit of the takeover of a running row whose start lies ahead of this host's clock.

A worker host whose clock was far ahead wrote ``started_at`` and died (or the value was
written by hand). Redis handed the id out again once its lease ended, but the claim takes
over a running row only half a lease after its start, and each deferral counted that
half lease from the deferring host's now again: a start a day ahead waited that day, with
a warning every half lease. The first delivery that finds the start ahead now has the
database write its time as the start (the worker started before Redis handed the id out
again): the row is taken over half a lease later, and not sooner, so a live worker whose
clock is only a little ahead is still never overtaken within half a lease. The rewrite is
fenced by the delivery it read; a database that fails it hands the delivery back.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import OperationalError, connections
from django.utils import timezone

from django_delayjobs import sql
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import HAND_BACK_DELAY, Execution, success
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, Result
from django_delayjobs.services import schedule
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"
#: SQLite's clock counts whole milliseconds: the start it writes may be up to 1 ms behind.
MS = timedelta(milliseconds=1)


def started_by_a(label: str, ahead: timedelta) -> Job:
    """A job that worker A claimed (in Redis too, under its lease) with its clock
    ``ahead`` of this host's, and runs with no outcome yet."""
    job = schedule(tasks.record, in_=0, args=[label])
    engine = get_engine()
    engine.promote(Q)
    leased = engine.claim(Q, lease_ms=delayjobs_settings.LEASE_SECONDS * 1000)
    assert list(leased) == [str(job.pk)]
    claimed = sql.claim(str(job.pk), "A", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
    assert claimed is not None
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() + ahead)
    claimed.refresh_from_db()
    return claimed


def deferred(result: object) -> datetime:
    assert isinstance(result, Result) and result.outcome == Outcome.DEFERRED, result
    assert result.retry_at is not None
    return result.retry_at


def test_a_start_a_day_ahead_whose_worker_is_gone_runs_within_a_few_leases(
    settings, caplog, monkeypatch
):
    """A is gone: its lease ends, the id is handed out again, and the job runs half a
    lease after the delivery that found its start ahead, not before."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}  # half a lease: 0.5 s
    job = started_by_a("late", timedelta(days=1))
    restarted: list[Job | None] = []
    restart = sql.restart

    def spied(job: Job, **options: bool) -> Job | None:
        restarted.append(row := restart(job, **options))
        return row

    monkeypatch.setattr(sql, "restart", spied)

    def ran() -> bool:
        call_command("run_delayworker", "--burst", "-v", "0")
        return Record.objects.filter(label="late").exists()

    with caplog.at_level(logging.WARNING, logger="django_delayjobs"):
        wait_for(ran, timeout=10, every=0.1)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 2)
    assert job.worker != "A"
    history = list(job.events.order_by("id").values_list("kind", "attempt"))
    assert history == [("scheduled", 0), ("started", 1), ("succeeded", 1)]
    [found] = restarted
    assert found is not None and found.started_at is not None and job.started_at is not None
    takeover_at = found.started_at + sql.takeover_delay()
    # The claim compares with its cutoff rounded up to the next hundredth of a second.
    assert takeover_at - sql._HUNDREDTH <= job.started_at <= takeover_at + timedelta(seconds=3)
    warned = [r for r in caplog.records if "ahead of this host's clock" in r.getMessage()]
    assert len(warned) == 1


def test_a_start_a_little_ahead_is_not_taken_over_before_half_a_lease(settings):
    """A live worker a few seconds ahead, whose lease Redis lost: the delivery that finds
    it counts half a lease from the database's time, a second look at once defers it
    again, and A's outcome, fenced by attempt and delivery, still lands."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 60}  # half: 30 s
    job = started_by_a("live", timedelta(seconds=5))
    before = timezone.now()
    first = deferred(Execution(Q, str(job.pk), "B").claim())
    assert before - MS + sql.takeover_delay() <= first <= timezone.now() + sql.takeover_delay()
    again = deferred(Execution(Q, str(job.pk), "C").claim())
    assert again == first  # counted from the first look, not from now
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.deliveries, row.worker) == (Status.RUNNING, 1, "A")
    assert sql.update_fenced(job, success("live"))


@pytest.mark.parametrize("year", [None, 9999], ids=["a year ahead", "near the year 9999"])
def test_a_start_ahead_is_taken_over_half_a_lease_after_it_was_first_found(settings, year):
    """Each delivery used to count the half lease from its own now: never taken over
    before that start (a row edited near the year 9999: never)."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}  # half a lease: 0.5 s
    job = started_by_a("found", timedelta(days=365))
    if year is not None:
        edited = datetime.max.replace(tzinfo=UTC) - timedelta(minutes=1)
        Job.objects.filter(pk=job.pk).update(started_at=edited)
    before = timezone.now()
    first = deferred(Execution(Q, str(job.pk), "B").claim())
    after = timezone.now()
    assert before - MS + sql.takeover_delay() <= first <= after + sql.takeover_delay()
    assert deferred(Execution(Q, str(job.pk), "C").claim()) == first  # not before
    wait_for(lambda: timezone.now() > first, every=0.05)
    claimed = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(claimed, Job)
    assert (claimed.status, claimed.attempts, claimed.deliveries, claimed.worker) == (
        Status.RUNNING, 1, 2, "B"
    )  # fmt: skip
    assert claimed.started_at is not None and claimed.started_at > first


@pytest.mark.parametrize(
    "change",
    [
        {"deliveries": 2, "worker": "C"},  # taken over by C, whose clock is ahead too
        {"attempts": 2, "worker": "C"},  # its next attempt, on C
        {"status": Status.SUCCEEDED},  # A's outcome landed
    ],
    ids=["taken over", "next attempt", "finished"],
)
def test_a_row_changed_after_it_was_read_keeps_its_start(monkeypatch, change):
    """The start is written only while the row runs the delivery that was read: a row
    changed in between is left as it is, and the delivery looked at again shortly."""
    job = started_by_a("changed", timedelta(days=1))
    stale = Job.objects.get(pk=job.pk)
    Job.objects.filter(pk=job.pk).update(**change)
    changed = Job.objects.get(pk=job.pk)
    monkeypatch.setattr(sql, "fetch", lambda job_id: stale)  # read before the change
    before = timezone.now()
    retry_at = deferred(Execution(Q, str(job.pk), "B").claim())
    assert before + HAND_BACK_DELAY <= retry_at <= timezone.now() + HAND_BACK_DELAY
    row = Job.objects.get(pk=job.pk)
    assert row.started_at == job.started_at
    fence = ("status", "attempts", "deliveries", "worker")
    assert [getattr(row, name) for name in fence] == [getattr(changed, name) for name in fence]


def test_a_start_the_database_fails_to_write_hands_the_delivery_back():
    job = started_by_a("refused", timedelta(days=1))
    conn = connections[sql.db()]
    restart = f"SET {conn.ops.quote_name('started_at')} ="

    def refuse(execute, statement, params, many, context):  # type: ignore[no-untyped-def]
        if statement.startswith("UPDATE") and restart in statement:
            raise OperationalError("server closed the connection unexpectedly")
        return execute(statement, params, many, context)

    with conn.execute_wrapper(refuse):
        result = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(result, Result) and result.outcome == Outcome.HANDED_BACK
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.deliveries, row.worker, row.started_at) == (
        Status.RUNNING, 1, 1, "A", job.started_at
    )  # fmt: skip
