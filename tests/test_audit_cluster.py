"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

from typing import Any

import pytest

from django_delayjobs import health
from django_delayjobs.embedded_cluster import EmbeddedCluster, Node
from django_delayjobs.engine import Engine
from tests.test_cluster_failover import SHARDS, engine, lonely_cluster, master_of  # noqa: F401

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


class DiesAfterInfo(Engine):
    """An engine on which a master dies once every master's ``INFO`` has been read."""

    cluster: EmbeddedCluster
    victim: Node

    def masters(self) -> dict[str, dict[str, Any]]:
        found = super().masters()
        self.cluster.kill(self.victim)
        return found


def test_a_master_that_dies_between_info_and_ping_is_unavailable(lonely_cluster, engine):  # noqa: F811
    """Health reads every master's INFO, then probes that they take writes: a master that
    died in between does not answer at all, it does not "refuse writes"; and the queue
    checks, which would only meet the same dead master, are not run."""
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    dying = DiesAfterInfo(engine.client, prefix="audit", shards=SHARDS)
    dying.cluster, dying.victim = lonely_cluster, victim

    check, reachable = health.check_redis(dying)
    assert not check.ok and not reachable, check
    assert check.detail.startswith("unavailable: Redis is unreachable"), check.detail


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
