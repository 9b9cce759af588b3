"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import pytest

from django_delayjobs import health
from django_delayjobs.engine import Engine, close_client
from tests.conftest import cluster_client
from tests.helpers import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_health_after_a_failover_checks_the_new_masters(redis_cluster):
    """A long-lived process (a web process answering ``health/``) checked every master;
    one fails over, its replica takes over, it comes back as a replica: the check must
    look at the masters there are now, not at the old one (now a replica) forever."""
    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    engine = Engine(client, prefix="audit")
    try:
        assert health.check_redis(engine)[0].ok
        victim = redis_cluster.master_nodes()[0]
        redis_cluster.kill(victim)
        wait_for(
            lambda: (
                len(redis_cluster.master_nodes()) == 3
                and victim not in redis_cluster.master_nodes()
            ),
            timeout=60,
            every=0.1,
        )
        redis_cluster.restart(victim)  # rejoins as a replica
        wait_for(lambda: victim.client().info("replication")["role"] == "slave", 60)
        check, _ = health.check_redis(engine)
        assert check.ok, check
    finally:
        engine.close()
        close_client(client)
