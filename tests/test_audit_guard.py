"""Audit of the takeover of a running row: a double run after Redis lost data.

The claim took over a ``running`` row at once, reading it as a delivery whose worker was
lost. After Redis lost its data, the reconcile sweep re-adds the id of a row it read as
waiting; a live worker that had the id in its claimed batch may start it before the
sweep's add, and a second worker that then claims the re-added id took the row over and
ran the action beside the first. A running row is now taken over only once it started
half a lease ago (a worker that died lets its lease end two thirds of a lease after the
start at the earliest); a younger one is deferred until then, never buried nor dropped.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import sql, timing
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.execution import Execution, success
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, Result
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import schedule
from tests.helpers import age_rows
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def half_lease() -> timedelta:
    return timedelta(seconds=delayjobs_settings.LEASE_SECONDS / 2)


def started_by_a(label: str = "once", **options: object) -> Job:
    """A job that worker A claimed in the database just now and runs (no outcome yet)."""
    job = schedule(tasks.record, in_=0, args=[label], **options)  # type: ignore[arg-type]
    claimed = sql.claim(str(job.pk), "A", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
    assert claimed is not None and claimed.status == Status.RUNNING
    return claimed


def row(job: Job) -> tuple[str, int, int, str]:
    job.refresh_from_db()
    return job.status, job.attempts, job.deliveries, job.worker


def started_events(job: Job) -> int:
    return job.events.filter(kind="started").count()


def test_a_row_started_just_now_is_deferred_not_taken_over(caplog):
    job = started_by_a()
    before = (row(job), started_events(job))
    with caplog.at_level(logging.INFO, logger="django_delayjobs"):
        result = Execution(Q, str(job.pk), "B").claim()
    [record] = [r for r in caplog.records if "may still run it" in r.getMessage()]
    assert record.levelno == logging.INFO and "on 'A'," in record.getMessage()
    assert isinstance(result, Result) and result.outcome == Outcome.DEFERRED
    assert result.retry_at is not None and job.started_at is not None
    assert abs((result.retry_at - (job.started_at + half_lease())).total_seconds()) < 0.01
    assert (row(job), started_events(job)) == before == ((Status.RUNNING, 1, 1, "A"), 0)


def test_a_row_started_ahead_of_this_hosts_clock_says_the_clocks_disagree(caplog):
    """Host A's clock is an hour fast: the delivery that finds its running row's start
    ahead defers it half a lease from this host's time, which a warning says (the rest:
    test_audit_clk)."""
    job = started_by_a()
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() + timedelta(hours=1))
    with caplog.at_level(logging.INFO, logger="django_delayjobs"):
        result = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(result, Result) and result.outcome == Outcome.DEFERRED
    [record] = [r for r in caplog.records if "may still run it" in r.getMessage()]
    assert record.levelno == logging.WARNING and "clocks" in record.getMessage()
    assert row(job) == (Status.RUNNING, 1, 1, "A")


def test_a_row_started_near_the_year_9999_is_deferred_with_a_warning(caplog):
    """A start time no takeover time can follow (a row edited by hand): looked at again
    half a lease later, with the clocks' warning; not a crash of the claim."""
    job = started_by_a()
    edited = datetime.max.replace(tzinfo=UTC) - timedelta(minutes=1)
    Job.objects.filter(pk=job.pk).update(started_at=edited)
    with caplog.at_level(logging.INFO, logger="django_delayjobs"):
        result = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(result, Result) and result.outcome == Outcome.DEFERRED
    assert result.retry_at is not None and result.retry_at - timezone.now() <= half_lease()
    [record] = [r for r in caplog.records if "may still run it" in r.getMessage()]
    assert record.levelno == logging.WARNING and "clocks" in record.getMessage()


def test_a_young_row_out_of_deliveries_is_deferred_not_buried():
    """Its last delivery may be running now: burying it would overtake that delivery."""
    job = started_by_a()
    Job.objects.filter(pk=job.pk).update(deliveries=delayjobs_settings.MAX_DELIVERIES)
    result = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(result, Result) and result.outcome == Outcome.DEFERRED
    assert row(job)[0] == Status.RUNNING


def test_a_row_started_over_half_a_lease_ago_is_taken_over():
    job = started_by_a()
    assert started_events(job) == 0  # A's claim was made by hand
    Job.objects.filter(pk=job.pk).update(
        started_at=timezone.now() - half_lease() - timedelta(seconds=1)
    )
    claimed = Execution(Q, str(job.pk), "B").claim()
    assert isinstance(claimed, Job)
    assert (claimed.attempts, claimed.deliveries, claimed.worker) == (1, 2, "B")
    assert row(job) == (Status.RUNNING, 1, 2, "B") and started_events(job) == 1


def test_the_worker_process_that_started_a_row_takes_it_over_at_once():
    """It runs no id twice at once (``WorkerProcess.hold``): a row it started and left
    running (its database failed after the claim: handed back) is its to deliver again."""
    job = started_by_a()
    claimed = Execution(Q, str(job.pk), "A").claim()
    assert isinstance(claimed, Job) and (claimed.deliveries, claimed.worker) == (2, "A")


def test_a_running_row_with_no_start_time_is_taken_over_as_before():
    job = started_by_a()
    Job.objects.filter(pk=job.pk).update(started_at=None)
    claimed = sql.claim(str(job.pk), "B", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
    assert claimed is not None and (claimed.deliveries, claimed.worker) == (2, "B")


def test_the_next_job_of_a_batch_is_not_taken_over_in_the_outcome_transaction():
    """The claim a success makes of its batch's next job (``claim_ahead``) matches no young
    running row either: that job's own claim then defers it."""
    job = started_by_a()
    assert sql.claim(str(job.pk), "B", timezone.now(), 3, skip_locked=True) is None
    assert row(job) == (Status.RUNNING, 1, 1, "A")


def test_a_deferred_delivery_runs_once_its_row_is_half_a_lease_old():
    """The delivery of a row whose worker recorded no outcome (its outcome write failed and
    it handed the id back, or it died) waits, then runs: once, as the same attempt."""
    job = started_by_a("handed back")
    get_engine().add(Q, {str(job.pk): 0})  # A's hand-back: due now
    burst()  # deferred: A may still be running it
    assert row(job) == (Status.RUNNING, 1, 1, "A")
    assert not Record.objects.filter(label="handed back").exists()
    [(_, due)] = get_engine().next_due(Q, 10)
    assert job.started_at is not None
    assert due >= timing.to_ms(job.started_at + half_lease()) - 5  # by Redis's clock
    # Half a lease later: its start moved back, its id due now.
    Job.objects.filter(pk=job.pk).update(started_at=job.started_at - half_lease())
    assert get_engine().reschedule(Q, str(job.pk), 0)
    burst()
    assert row(job) == (Status.SUCCEEDED, 1, 2, row(job)[3])
    assert row(job)[3] != "A"
    assert Record.objects.filter(label="handed back").count() == 1


class StartedBeforeTheAdd(Engine):
    """An engine whose add lets worker A start the job (it held the id in its claimed
    batch) after the reconcile sweep read its row as waiting, before the sweep adds it."""

    started: list[Job]

    def add(self, queue, items, priorities=None, **options):  # type: ignore[no-untyped-def]
        for pk in items:
            claimed = sql.claim(pk, "A", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
            assert claimed is not None
            self.started.append(claimed)
        return super().add(queue, items, priorities, **options)


def test_a_job_started_as_reconcile_re_adds_it_is_not_run_by_a_second_worker(redis_client):
    job = schedule(tasks.record, in_=0, args=["beside"])
    age_rows()
    redis_client.flushdb()  # Redis lost its data, A's claim of the id with it
    base = get_engine()
    engine = StartedBeforeTheAdd(base.client, prefix=base.prefix)
    engine.started = []
    assert reconcile(engine, horizon=timedelta(minutes=5)) == {Q: 1}
    [started] = engine.started
    assert base.stats(Q).ready + base.stats(Q).pending == 1  # re-added: the row is active
    burst()  # worker B claims the re-added id
    assert not Record.objects.filter(label="beside").exists()  # B did not run it
    assert row(job) == (Status.RUNNING, 1, 1, "A") and started_events(job) == 0
    [(_, due)] = base.next_due(Q, 10)  # deferred to half a lease after A's start
    assert started.started_at is not None
    assert due >= timing.to_ms(started.started_at + half_lease()) - 5
    # A's outcome commits; the deferred id, once due, finds the row finished.
    assert sql.update_fenced(started, success("beside"))
    assert row(job)[0] == Status.SUCCEEDED
