"""Audit of the takeover of a running row whose start lies ahead of this host's clock.

A worker host whose clock was far ahead wrote ``started_at`` and died (or the value was
written by hand). Redis handed the id out again once its lease ended, but the claim takes
over a running row only half a lease after its start, and each deferral counted that
half lease from the deferring host's now again: a start a day ahead waited that day, with
a warning every half lease. The first delivery that finds the start ahead now has the
database write its time as the start (the worker started before Redis handed the id out
again): the row is taken over half a lease later, and not sooner, so a live worker whose
clock is only a little ahead is still never overtaken within half a lease.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import sql
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import Execution, success
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


def test_a_start_a_day_ahead_whose_worker_is_gone_runs_within_a_few_leases(settings, caplog):
    """A is gone: its lease ends, the id is handed out again, and the job runs."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}  # half a lease: 0.5 s
    job = started_by_a("late", timedelta(days=1))

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
    assert job.started_at is not None and job.started_at <= timezone.now()
    warned = [r for r in caplog.records if "ahead of this host's clock" in r.getMessage()]
    assert len(warned) == 1


def test_a_start_a_little_ahead_is_not_taken_over_before_half_a_lease(settings):
    """A live worker a few seconds ahead, whose lease Redis lost: the delivery that finds
    it counts half a lease from the database's time, a second look at once defers it
    again, and A's outcome, fenced by attempt and delivery, still lands."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 60}  # half: 30 s
    job = started_by_a("live", timedelta(seconds=5))
    before = timezone.now()
    first = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(first, Result) and first.outcome == Outcome.DEFERRED
    assert first.retry_at is not None
    assert before - MS + sql.takeover_delay() <= first.retry_at
    assert first.retry_at <= timezone.now() + sql.takeover_delay()
    again = Execution(Q, str(job.pk), "C").claim()
    assert isinstance(again, Result) and again.outcome == Outcome.DEFERRED
    assert again.retry_at == first.retry_at  # counted from the first look, not from now
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
    first = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(first, Result) and first.outcome == Outcome.DEFERRED
    assert first.retry_at is not None
    wait_for(lambda: timezone.now() > first.retry_at, every=0.05)
    claimed = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(claimed, Job)
    assert (claimed.status, claimed.attempts, claimed.deliveries, claimed.worker) == (
        Status.RUNNING, 1, 2, "B"
    )  # fmt: skip
