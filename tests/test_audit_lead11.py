"""Audit of a row that becomes claimable between the claim and the read that follows it.

The claim compares the row with its own time; when it matches nothing, the row is read
again and judged with a later time. A row due (or past its takeover time) only in
between looked claimable to that read, which took it for a claim and its check that
disagree for good and deferred it by a second (``HAND_BACK_DELAY``). Under load, a job
Redis handed out a millisecond before its row's due time (a deferral's due time is moved
to Redis's clock) started a second late. It is now claimed again at once.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_delayjobs import sql
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome
from django_delayjobs.services import schedule
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"


def slow_reads(monkeypatch, until) -> None:  # type: ignore[no-untyped-def]
    """The read after the claim comes once ``until`` has passed (a loaded machine)."""
    fetch = sql.fetch

    def late(job_id: str) -> Job | None:
        time.sleep(max(0.0, (until - timezone.now()).total_seconds()) + 0.01)
        return fetch(job_id)

    monkeypatch.setattr(sql, "fetch", late)


def test_a_row_due_between_the_claim_and_the_read_is_claimed_at_once(monkeypatch):
    due = timezone.now() + timedelta(milliseconds=300)
    job = schedule(tasks.record, at=due, args=["ran"])
    slow_reads(monkeypatch, due)
    result = Execution(Q, str(job.pk), "w1").run()
    assert result.outcome == Outcome.SUCCEEDED
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_a_running_row_past_its_takeover_time_since_the_claim_is_taken_over_at_once(
    monkeypatch,
):
    job = schedule(tasks.record, in_=0, args=["ran"])
    takeover_at = timezone.now() + timedelta(milliseconds=300)
    started = takeover_at - sql.takeover_delay()
    Job.objects.filter(pk=job.pk).update(
        status=Status.RUNNING, started_at=started, worker="w0", attempts=1, deliveries=1
    )
    slow_reads(monkeypatch, takeover_at)
    result = Execution(Q, str(job.pk), "w1").run()
    assert result.outcome == Outcome.SUCCEEDED
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, row.deliveries) == (Status.SUCCEEDED, 1, 2)
