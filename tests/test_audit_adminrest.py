"""Audit of the admin and the API under hostile requests and least privilege, third
round: each test fails on the code it was written against (its docstring says what is
wrong)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_delayjobs import schedule
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


@pytest.mark.parametrize(
    "query",
    [
        {"run_at__gte": "0001-01-01T00:00:00+05:00"},
        {"run_at__lt": "9999-12-31T23:59:59.999999-05:00"},
        {"run_at__gte": "2030-01-01T00:00:00Z"},
    ],
)
def test_the_job_list_takes_run_at_bounds_only_from_the_date_drill_down(admin_client, query):
    """?run_at__gte= and ?run_at__lt= straight from the query string reached the database
    as given: a time whose UTC is outside years 1-9999 was an OverflowError on SQLite (a
    500). The bounds are the drill-down's (year, month, day), which are checked; given
    directly they are refused like any other lookup (400)."""
    schedule(tasks.record, in_=3600, args=["x"])
    response = admin_client.get(reverse("admin:django_delayjobs_job_changelist"), query)
    assert response.status_code == 400
