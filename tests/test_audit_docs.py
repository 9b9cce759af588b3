"""Audit: failing tests for docs/docstring claims the code does not keep."""

from __future__ import annotations

import pytest

from django_delayjobs import cancel_for, schedule, signals
from django_delayjobs.exceptions import AlreadyRunning
from django_delayjobs.models import Job, Status
from tests.testapp.models import Thing


@pytest.mark.django_db(transaction=True)
def test_cancel_for_that_refuses_cancels_nothing_outside_a_transaction():
    """cancel_for(fail_if_running=True) cancelled the waiting jobs (each in its own commit,
    job_cancelled sent) and then raised AlreadyRunning: outside a caller's transaction
    nothing rolled the cancels back, so a refused call had changed jobs."""
    thing = Thing.objects.create(name="t")
    waiting = schedule(thing.touch, in_=60)
    running = schedule(thing.expire, in_=60)
    Job.objects.filter(pk=running.pk).update(status=Status.RUNNING)
    seen: list[Job] = []

    def on_cancelled(sender, job, **kwargs):
        seen.append(job)

    signals.job_cancelled.connect(on_cancelled)
    try:
        with pytest.raises(AlreadyRunning):
            cancel_for(thing, fail_if_running=True)
    finally:
        signals.job_cancelled.disconnect(on_cancelled)
    assert Job.objects.get(pk=waiting.pk).status == Status.SCHEDULED
    assert seen == []
