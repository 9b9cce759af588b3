"""GET queues/: the admin's queue state over HTTP; 503 when Redis cannot be reached."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.queues import all_queue_states
from django_delayjobs.rest.serializers import QueueStateSerializer
from tests.testapp import tasks

from .test_rest_helpers import client_for, dead_job, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api():
    return client_for(make_user(superuser=True))


def by_name(response) -> dict[str, dict]:
    assert response.status_code == 200, response.data
    return {q["queue"]: q for q in response.data["queues"]}


def test_queues_show_what_redis_and_the_database_hold(api):
    first = schedule(tasks.record, in_=60, args=["a"])
    schedule(tasks.record, in_=120, args=["b"])
    schedule(tasks.record, in_=60, args=["c"], queue="mail")
    dead_job()
    get_engine().heartbeat("mail", "w1", 30_000, {"host": "web-1", "pid": 7, "queues": ["mail"]})
    queues = by_name(api.get(url("queues")))
    assert set(queues) == {"default", "mail"}
    default, mail = queues["default"], queues["mail"]
    assert (default["pending"], default["garbage"], default["retrying"]) == (2, 1, 0)
    assert default["counters"] == {"added": 3, "buried": 1}  # a, b and the dead job
    assert default["next_due"][0] == {
        "id": str(first.pk),
        "action": "tests.testapp.tasks.record",
        "run_at": default["next_due_at"],
    }
    assert (mail["pending"], mail["live_workers"]) == (1, 1)
    worker = mail["workers"][0]
    assert (worker["id"], worker["host"], worker["pid"], worker["queues"]) == (
        "w1",
        "web-1",
        7,
        ["mail"],
    )
    assert worker["expires_at"].endswith("Z")


def test_queue_fields_are_exactly_those_the_admin_gets():
    """The serializer must follow ``QueueState.as_dict()`` if that ever grows a field."""
    schedule(tasks.record, in_=60, args=["a"])
    for state in all_queue_states():
        assert set(QueueStateSerializer().fields) == set(state.as_dict())


def test_redis_down_is_503_with_a_clear_detail(api, settings):
    schedule(tasks.record, in_=60, args=["a"])
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://127.0.0.1:1/0"}
    response = api.get(url("queues"))
    assert response.status_code == 503
    assert response.data["detail"].startswith("Redis is unreachable")
    # the jobs endpoints answer from the database meanwhile
    assert api.get(url("jobs")).status_code == 200
