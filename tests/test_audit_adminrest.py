"""Audit of the admin and the API under hostile requests and least privilege: each test
fails on the code it was written against (its docstring says what is wrong)."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


def listed(response) -> list[str]:
    return [job.queue for job in response.context["cl"].result_list]


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
