"""Audit of the Redis Cluster operations views (round 4): the queue page and the metrics
while the directory's master, or one shard's, is down; redis-py giving up on redirects.

Every test here needs a Redis Cluster (``pytest -m cluster``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_delayjobs.embedded_cluster import EmbeddedCluster
from django_delayjobs.engine import Engine, EngineUnavailable
from tests.conftest import cluster_client

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


@pytest.fixture(scope="module")
def lonely() -> Iterator[EmbeddedCluster]:
    """3 masters, no replicas; a dead master is not declared failed for 60 s."""
    with EmbeddedCluster(masters=3, replicas=0, node_timeout_ms=60_000) as cluster:
        yield cluster


@pytest.fixture
def on_lonely(lonely: EmbeddedCluster) -> Iterator[tuple[EmbeddedCluster, Any]]:
    """The cluster flushed and healthy, and a client of it (master of a key: ``owner``)."""
    lonely.wait_healthy()
    client = cluster_client(lonely.url)
    client.flushall()
    yield lonely, client
    client.close()


def test_redis_py_giving_up_on_redirects_says_what_happened(on_lonely):
    """A slot that one master says is migrating to another that does not import it
    bounces every command between them (ASK, then MOVED) until redis-py gives up with a
    bare "TTL exhausted.", which reached users as "the Redis Cluster cannot serve: TTL
    exhausted.". The ``EngineUnavailable`` says what happened and which node it last
    tried."""
    cluster, client = on_lonely
    engine = Engine(cluster_client(cluster.url), prefix="t")
    key = engine.keys("q").pending
    source = client.get_node_from_key(key)
    target = next(n for n in client.get_primaries() if n.name != source.name)
    slot = client.keyslot(key)
    target_id = client.cluster_myid(target)
    client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id, target_nodes=source)
    try:
        with pytest.raises(EngineUnavailable) as raised:
            engine.stats("q")
    finally:
        client.execute_command("CLUSTER SETSLOT", slot, "STABLE", target_nodes=source)
        engine.close()
    message = str(raised.value)
    assert "slots moving" in message and "gave up" in message, message
    assert source.name in message or target.name in message, message
