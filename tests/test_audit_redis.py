"""Audit of the engine facing a Redis in hostile or unusual states (moved once fixed)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_delayjobs.connection import get_engine

from .test_rest_helpers import client_for, make_user, url

QUEUES = "admin:django_delayjobs_queues"
#: Descriptions of live workers that no worker of this version writes.
ODD_INFO = [
    b"not json",
    b"\xff\xfe",
    b"[1, 2]",
    b'{"pid": "abc", "roles": 5, "concurrency": "x", "queues": "default", "host": null}',
    b'{"expires_ms": "soon", "id": 7, "roles": [1, null]}',
]


@pytest.mark.parametrize("info", ODD_INFO)
def test_the_pages_that_show_queues_answer_with_a_worker_description_no_worker_wrote(
    client, redis_client, settings, info, db
):
    """The queue page and queues/ read each live worker's description as JSON and used
    its fields as they found them: a value that is not a JSON object, or a field of
    another type, was a 500 (JSONDecodeError, TypeError, ValueError)."""
    user = make_user("root", superuser=True)
    client.force_login(user)
    engine = get_engine()
    engine.heartbeat("default", "w1", 60_000, {"pid": 1})
    redis_client.hset(engine.keys("default").worker_info, "w1", info)
    admin = client.get(reverse(QUEUES))
    api = client_for(user).get(url("queues"))
    assert admin.status_code == 200, admin.content[:300]
    assert admin.context["redis_error"] == ""
    assert api.status_code == 200, api.content[:300]
    [worker] = api.json()["queues"][0]["workers"]
    assert worker["id"] == "w1" and worker["expires_at"] is not None


@pytest.mark.parametrize("value", [b"abc", b"1.5", b""])
def test_the_pages_that_show_queues_answer_with_a_counter_no_script_wrote(
    client, redis_client, settings, value, db
):
    """Stats read the queue's counters hash with int(): a value of another program's that
    is not an integer made stats raise ValueError, a 500 from the queue page, queues/,
    health/ and metrics/."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}
    user = make_user("root", superuser=True)
    client.force_login(user)
    engine = get_engine()
    engine.add("default", {"00000000-0000-4000-8000-000000000001": 1.0})
    redis_client.hset(engine.keys("default").counters, "odd", value)
    pages = {
        "admin queues": client.get(reverse(QUEUES)),
        "api queues": client_for(user).get(url("queues")),
        "health": client.get(reverse("delayjobs_health")),
        "metrics": client.get(
            reverse("delayjobs_metrics"), HTTP_AUTHORIZATION="Bearer " + "t" * 32
        ),
    }
    for page, response in pages.items():
        assert response.status_code in (200, 503), (page, response.content[:300])
    [queue] = client_for(user).get(url("queues")).json()["queues"]
    assert queue["counters"] == {"added": 1}
