"""Audit of the values the public entry points accept: each test here fails on the code
it was written against, and its docstring says what is wrong."""

from __future__ import annotations

import datetime

import pytest
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.models import Job, JobEvent
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC
MINUS_5 = datetime.timezone(datetime.timedelta(hours=-5))
PLUS_5 = datetime.timezone(datetime.timedelta(hours=5))
HUGE = 10**5000  # more digits than int.__str__ writes (4,300)
HOOK = "https://hooks.example.com/orders/42/expire"


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


@pytest.fixture
def thing():
    return Thing.objects.create(name="t")


def nothing_written(redis_client) -> None:
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()
    assert redis_client.dbsize() == 0


def test_admin_action_on_a_selected_id_that_is_not_a_uuid_is_no_500(admin_client, thing):
    """The changelist's action form posts ids; one that is not a UUID makes Django's
    filter(pk__in=...) raise ValidationError: a 500."""
    job = schedule(thing.touch, in_=60)
    data = {"action": "cancel_jobs", "_selected_action": [str(job.pk), "nope"], "index": "0"}
    response = admin_client.post(reverse("admin:django_delayjobs_job_changelist"), data)
    assert response.status_code < 500
