"""The admin, second audit: selections larger than a page, long histories, big values."""

from __future__ import annotations

import datetime

import pytest
from django.urls import reverse

from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks

from .test_rest_helpers import dead_job

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


def waiting_jobs(n: int, after: Job) -> list[Job]:
    """``n`` scheduled jobs listed before ``after`` (the list shows the latest due first)."""
    jobs = schedule_many([build_job(tasks.record, in_=3600, args=["x"]) for _ in range(n)])
    later = after.run_at + datetime.timedelta(hours=1)
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(run_at=later)
    return jobs


# -- purge: the confirmation of a selection larger than what it lists -----------------------


def test_purge_of_a_selection_whose_first_jobs_are_not_dead_offers_its_dead_ones(admin_client):
    """The confirmation read the first 101 selected jobs and listed the dead ones among
    them: with 101 waiting jobs listed first it said "None of the selected jobs is dead"
    and offered no button, though the selection held a dead job."""
    dead = dead_job()
    waiting = waiting_jobs(101, after=dead)
    selection = {"action": "purge_dead", "_selected_action": [str(dead.pk)], "index": "0"}
    response = admin_client.post(reverse(CHANGELIST), {**selection, "select_across": "1"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "nothing to purge" not in html
    assert str(dead.pk) in html and "Yes, purge them" in html
    assert "More than 100 selected jobs are not dead" in html
    admin_client.post(reverse(CHANGELIST), {**selection, "select_across": "1", "post": "yes"})
    assert not Job.objects.filter(pk=dead.pk).exists()
    alive = Job.objects.filter(pk__in=[job.pk for job in waiting], status=Status.SCHEDULED)
    assert alive.count() == 101
