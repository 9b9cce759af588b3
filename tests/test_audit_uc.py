"""Audit of the undo of an unstarted claim (``execution.unclaim``): the status it restores.

An undone claim of a new attempt gave the row back as ``retrying`` whenever an earlier
attempt existed. A dead job requeued keeps its attempts (they fence its outcomes), so it
waits as ``scheduled`` with attempts already counted: a worker stopping between its
claim and its start handed it back as ``retrying``, as if that attempt had failed. The
undo now restores the status the row waited in: ``retrying`` only when an attempt failed
since the job was last requeued.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_delayjobs import schedule, sql
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.execution import Execution, unclaim
from django_delayjobs.models import Job, Status
from django_delayjobs.services import requeue
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"


def run_once(job: Job) -> Job:
    Execution(Q, str(job.pk), "w0").run()
    job.refresh_from_db()
    return job


def claim_and_undo(job: Job) -> Job:
    """Claim ``job``'s next attempt (its retry backoff skipped), undo that claim, and
    return the row as the undo left it."""
    later = timezone.now() + timedelta(days=1)
    with transaction.atomic():
        row = sql.claim(str(job.pk), "w1", later, delayjobs_settings.MAX_DELIVERIES)
    assert row is not None and (row.status, row.deliveries) == (Status.RUNNING, 1)
    assert unclaim(row, "w1")
    job.refresh_from_db()
    return job


def test_an_undone_claim_of_a_requeued_job_leaves_it_scheduled():
    job = run_once(schedule(tasks.fail, in_=0, max_attempts=1))
    assert (job.status, job.attempts) == (Status.DEAD, 1)
    assert requeue(job)
    job = claim_and_undo(job)
    assert (job.status, job.attempts, job.deliveries) == (Status.SCHEDULED, 1, 0)
    kinds = list(job.events.order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["dead", "requeued", "handed_back"]


def test_an_undone_claim_of_a_retry_leaves_it_retrying():
    job = run_once(schedule(tasks.fail, in_=0, max_attempts=2))
    assert (job.status, job.attempts) == (Status.RETRYING, 1)
    job = claim_and_undo(job)
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 0)


def test_an_undone_claim_after_a_requeued_job_failed_again_leaves_it_retrying():
    job = run_once(schedule(tasks.fail, in_=0, max_attempts=1))
    assert requeue(job, attempts=2)
    job = run_once(job)
    assert (job.status, job.attempts) == (Status.RETRYING, 2)
    job = claim_and_undo(job)
    assert (job.status, job.attempts) == (Status.RETRYING, 2)


def test_an_undone_first_attempt_leaves_it_scheduled():
    job = claim_and_undo(schedule(tasks.record, in_=0, args=["x"]))
    assert (job.status, job.attempts, job.deliveries) == (Status.SCHEDULED, 0, 0)
