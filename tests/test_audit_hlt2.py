"""Audit of the health check (``delayjobs_health`` and the ``health/`` view): a Redis
that is full with an evicting policy and nothing left to evict."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_delayjobs.connection import get_engine
from django_delayjobs.engine import EngineUnavailable
from tests.test_health import health, names, private_redis  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "noeviction"])
def test_a_full_redis_that_has_nothing_to_evict_fails(request: Any, policy: str) -> None:
    """At ``maxmemory`` with a ``volatile-*`` policy and no key with a time to live (the
    jobs' keys have none), Redis evicts nothing and refuses every new job with OOM: the
    check said ok (it took only ``noeviction`` for full, and its probe was a ``DEL``,
    which Redis runs even when full). Its probe is now a write that Redis refuses when
    full, and it still changes nothing."""
    client: redis.Redis = request.getfixturevalue("private_redis")
    client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(EngineUnavailable, match="maxmemory"):
            get_engine().add("default", {"job": 1})
        code, lines = health()
    finally:
        client.config_set("maxmemory", 0)
    assert code == 1 and names(lines, "FAIL") == ["redis"], lines
    assert "refuses writes" in lines[0] or "full" in lines[0], lines[0]
    assert "maxmemory" in lines[0], lines[0]
    assert names(lines, "ok") == ["database", "workers:default", "overdue:default"]
    assert health()[0] == 0
    assert client.keys("*write-probe*") == []  # the probe wrote nothing


def test_the_write_probe_changes_nothing(request: Any) -> None:
    """The probe leaves no key behind, and is not replicated (nothing changed)."""
    client: redis.Redis = request.getfixturevalue("private_redis")
    before = client.info("stats")["total_commands_processed"]
    dirty = client.info("persistence")["rdb_changes_since_last_save"]
    assert health()[0] == 0
    assert client.info("stats")["total_commands_processed"] > before
    assert client.info("persistence")["rdb_changes_since_last_save"] == dirty
    assert client.keys("*write-probe*") == []
