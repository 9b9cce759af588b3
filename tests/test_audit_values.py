"""Audit of the values the public entry points accept: each test here fails on the code
it was written against, and its docstring says what is wrong."""

from __future__ import annotations

import datetime

import pytest
from django.urls import reverse

from django_delayjobs import schedule, schedule_many
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, JobEvent
from django_delayjobs.services import build_job
from tests.testapp import tasks
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


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (datetime.datetime.max.replace(tzinfo=MINUS_5), "100 years"),
        (datetime.datetime.min.replace(tzinfo=PLUS_5), "1970"),
        (datetime.datetime(2030, 1, 1), "naive"),
        ("2030-01-01", "datetime"),
        (None, "datetime"),
    ],
)
def test_schedule_many_checks_created_at(redis_client, value, match):
    """A built job's created_at is not checked: year 9999 -05:00 is an OverflowError on
    SQLite and a row PostgreSQL stores in year 10000 and cannot read back; a naive one is
    silently read in the default zone; a str is Django's ValidationError; None an
    IntegrityError."""
    job = build_job(tasks.echo, in_=60)
    job.created_at = value
    with pytest.raises((TypeError, InvalidSchedule), match=match) as info:
        schedule_many([build_job(tasks.echo, in_=60), job])
    assert type(info.value) in (TypeError, InvalidSchedule), repr(info.value)
    nothing_written(redis_client)


@pytest.mark.parametrize("value", ["not-a-uuid", None, 42])
def test_schedule_many_checks_the_id(redis_client, value):
    """A built job's id is not checked: a str is Django's ValidationError, None an
    IntegrityError, an int a ValidationError."""
    job = build_job(tasks.echo, in_=60)
    job.id = value
    with pytest.raises((TypeError, InvalidSchedule)) as info:
        schedule_many([job])
    assert type(info.value) in (TypeError, InvalidSchedule), repr(info.value)
    nothing_written(redis_client)


def test_schedule_many_refuses_the_id_of_a_job_already_in_the_table(redis_client):
    """A built job given the id of a stored job: IntegrityError from the INSERT instead of
    InvalidSchedule."""
    stored = schedule(tasks.echo, in_=60)
    job = build_job(tasks.echo, in_=60)
    job.id = stored.pk
    with pytest.raises(InvalidSchedule, match="already"):
        schedule_many([build_job(tasks.echo, in_=60), job])
    assert Job.objects.count() == 1


def test_admin_action_on_a_selected_id_that_is_not_a_uuid_is_no_500(admin_client, thing):
    """The changelist's action form posts ids; one that is not a UUID makes Django's
    filter(pk__in=...) raise ValidationError: a 500."""
    job = schedule(thing.touch, in_=60)
    data = {"action": "cancel_jobs", "_selected_action": [str(job.pk), "nope"], "index": "0"}
    response = admin_client.post(reverse("admin:django_delayjobs_job_changelist"), data)
    assert response.status_code < 500
