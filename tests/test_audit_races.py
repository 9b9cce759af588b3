"""Audit: races and failures of the public verbs at the Django layer (failing reproductions)."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, Status
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
