"""Audit of the admin and the API under hostile requests and least privilege: each test
fails on the code it was written against (its docstring says what is wrong)."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Count
from django.urls import reverse
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.models import EventKind, JobEvent
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


def listed(response) -> list[str]:
    return [job.queue for job in response.context["cl"].result_list]


def test_run_now_across_every_job_moves_each_once(admin_client):
    """Run now on "select all" (select_across) walked the list ordered by run_at while
    moving each job's run_at: on SQLite the cursor met the moved rows again, so 2,100
    jobs were reported as 4,100 due now and 2,000 got two "rescheduled" events."""
    now = timezone.now()
    jobs = [build_job(tasks.record, at=now + datetime.timedelta(hours=1, seconds=i), args=[i])
            for i in range(2100)]  # fmt: skip
    schedule_many(jobs)
    data = {"action": "run_now", ACTION_CHECKBOX_NAME: [str(jobs[0].pk)], "select_across": "1",
            "index": "0"}  # fmt: skip
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["2100 jobs are due now."]
    twice = (
        JobEvent.objects.filter(kind=EventKind.RESCHEDULED)
        .values("job").annotate(n=Count("id")).filter(n__gt=1)
    )  # fmt: skip
    assert not twice.exists()


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue"])
def test_options_does_not_offer_a_write_to_a_user_who_may_only_read(verb):
    """OPTIONS on jobs/<id>/cancel/ (reschedule/, requeue/) answered a view_job holder with
    "actions": {"POST": ...}, as if it could POST: the permissions were those of the
    "metadata" action (a read), not of the verb the method names."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    viewer = client_for(make_user("viewer", perms=("view_job",)))
    response = viewer.options(url("jobs", job.pk, verb))
    assert response.status_code == 200
    assert "actions" not in response.json()
    operator = client_for(make_user("operator", perms=("change_job",)))
    assert "POST" in operator.options(url("jobs", job.pk, verb)).json()["actions"]
