"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from django_delayjobs.embedded_cluster import free_base_port
from tests.test_health import URL, health, names


@pytest.fixture
def unreachable_cluster():
    """Settings naming a Redis Cluster whose seed node does not answer: the client cannot
    even be made (it reads the slot table from the seed when it is made)."""
    from django.conf import settings

    url = f"redis://127.0.0.1:{free_base_port(1)}/0"
    dj = {**settings.DELAYJOBS, "REDIS_URL": url, "REDIS_CLUSTER": True}
    with override_settings(DELAYJOBS=dj):
        yield url


@pytest.mark.django_db
def test_an_unreachable_cluster_fails_the_redis_checks_it_is_no_bad_option(unreachable_cluster):
    code, lines = health("--queues", "a")  # exit 2 (a bad option) raises here
    assert code == 1
    assert names(lines, "FAIL") == ["redis", "workers:a", "overdue:a"], lines
    assert "unavailable: cannot reach a Redis Cluster at 127.0.0.1:" in lines[0]


@pytest.mark.django_db
def test_the_view_says_an_unreachable_cluster_is_redis_not_the_settings(
    client, unreachable_cluster
):
    response = client.get(URL)
    assert response.status_code == 503
    assert json.loads(response.content)["checks"] == {
        "redis": "fail",
        "database": "ok",
        "workers:default": "fail",
        "overdue:default": "fail",
    }
