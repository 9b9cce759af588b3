"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import pytest

from django_delayjobs import health
from tests.test_cluster_failover import SHARDS, engine, lonely_cluster, master_of  # noqa: F401

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_a_master_short_of_replicas_to_write_fails_the_health_check(lonely_cluster, engine):  # noqa: F811
    """A master with ``min-replicas-to-write`` and fewer good replicas refuses every write
    (NOREPLICAS: every add, claim and ack on its shards) while it answers INFO and PING."""
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    assert health.check_redis(engine)[0].ok
    with victim.client() as node:
        node.config_set("min-replicas-to-write", 1)
        try:
            check, reachable = health.check_redis(engine)
        finally:
            node.config_set("min-replicas-to-write", 0)
    assert not check.ok and reachable, check
    assert check.detail.startswith(f"refuses writes (master {victim.address}): "), check.detail
    assert "NOREPLICAS" in check.detail
