"""Audit (chaos): failing tests for the worker under hostile actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import schedule_many
from django_delayjobs.models import Status
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_action_that_leaves_autocommit_off_fails_and_the_next_jobs_commit():
    """Its write was never committed: rolled back, the attempt failed, saying why. Left
    off, every later outcome and claim of the thread would go into one transaction that
    never commits, while the worker reported them done (and Redis acked them)."""
    past = timezone.now() - timedelta(seconds=1)
    manual = build_job(tasks.autocommit_off_then_record, at=past, args=["manual"],
                       max_attempts=2)  # fmt: skip
    after = [build_job(tasks.record, at=past, args=[f"after {n}"]) for n in range(2)]
    schedule_many([manual, *after])
    call_command("run_delayworker", "--burst", "-v", "0")
    manual.refresh_from_db()
    assert (manual.status, manual.attempts) == (Status.RETRYING, 1)
    assert "autocommit" in manual.last_error.splitlines()[0], manual.last_error
    for job in after:
        job.refresh_from_db()
        assert (job.status, job.deliveries) == (Status.SUCCEEDED, 1)
    assert sorted(Record.objects.values_list("label", flat=True)) == ["after 0", "after 1"]
