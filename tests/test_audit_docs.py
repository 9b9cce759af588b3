"""Audit of the documentation against the code: each test quotes a statement of the docs
that the code does not keep, and fails until one of the two changes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_delayjobs import schedule, signals
from django_delayjobs.models import Job, Status
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst(*args: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", *args)


def test_expired_job_is_skipped_instead_of_started():
    """docs/scheduling.md:91: ``expires`` -- "past it the job is `skipped` instead of
    started" (and docs/scheduling.md:79, "never start more than 1 h late").

    The code claims the row first (execution.py:131-135: ``claim()`` sets status
    ``running``, ``attempts + 1``, ``started_at``, writes a ``started`` event and sends
    ``job_started``) and only then looks at ``expires_at`` (execution.py:136) and settles
    the job ``skipped``: a job past its expiry is started (attempt 1, a ``started`` event,
    the ``job_started`` signal, and through it django.tasks' ``task_started``)."""
    now = timezone.now()
    # Due two hours ago, expired an hour ago: the door accepts it (expiry after the due time).
    job = schedule(tasks.record, at=now - timedelta(hours=2), args=["late"],
                   expires=timedelta(hours=1))  # fmt: skip
    started: list[str] = []

    def on_started(sender, job, **kwargs):
        started.append(str(job.pk))

    signals.job_started.connect(on_started, dispatch_uid="audit-docs-started")
    try:
        burst()
    finally:
        signals.job_started.disconnect(dispatch_uid="audit-docs-started")
    job.refresh_from_db()
    assert job.status == Status.SKIPPED
    assert not Record.objects.exists()
    kinds = list(job.events.values_list("kind", flat=True))
    assert (kinds, job.attempts, job.started_at, started) == (
        ["scheduled", "skipped"], 0, None, []
    ), f"an expired job was started: events {kinds}, attempts {job.attempts}, job_started {started}"
