"""Audit of the engine on Redis Cluster: failing reproductions of bugs (``-m cluster``).

These tests use a private cluster of their own, 3 masters and no replicas with a long
``cluster-node-timeout``: a master that is killed stays down (its slots unserved) while the
other two keep serving theirs, which is the window a real failover (15 s by default) leaves.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest

from django_delayjobs.embedded_cluster import EmbeddedCluster, Node
from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.promoter import Promoter
from tests.conftest import cluster_client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SHARDS = {"q": 6}


@pytest.fixture(scope="module")
def lonely_cluster() -> Iterator[EmbeddedCluster]:
    """3 masters, no replicas; a dead master is not declared failed for 60 s."""
    cluster = EmbeddedCluster(masters=3, replicas=0, node_timeout_ms=60_000)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def engine(lonely_cluster: EmbeddedCluster) -> Iterator[Engine]:
    """An engine on the private cluster (queue ``q`` in 6 shards), every master flushed;
    any master a test killed is started again afterwards."""
    lonely_cluster.wait_healthy()
    client = cluster_client(lonely_cluster.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    client.flushall()
    engine = Engine(client, prefix="audit", shards=SHARDS)
    try:
        yield engine
    finally:
        engine.close()
        close_client(client)
        for node in lonely_cluster.nodes:
            lonely_cluster.restart(node)


def master_of(cluster: EmbeddedCluster, engine: Engine, shard: str) -> Node:
    address = engine.node_of(shard)
    return next(node for node in cluster.nodes if node.address == address)


def test_promoter_keeps_promoting_shards_on_healthy_masters_while_one_master_is_down(
    lonely_cluster, engine, settings
):
    """One master down must not stop promotion on the others (docs/cluster.md, Failover:
    "a sharded queue keeps running on the other masters").

    ``Promoter.step`` (promoter.py) runs ``recover_expired`` and then ``promote`` shard after
    shard with no per-shard error handling: the first shard whose master is down raises
    ``EngineUnavailable`` and every shard after it (here: all of them, since
    ``recover_expired`` on shard 0 fails before any promote) is left unpromoted; the worker's
    promote loop backs off and does the same again. Due jobs on the healthy masters then
    never reach ``ready`` until the dead master is back or replaced. Right: pass over the
    unreachable shard (as ``WorkerProcess.claim`` does) and promote the others.
    """
    shards = engine.shards("q")
    now = engine.server_time_ms()
    ids = [str(uuid.uuid4()) for _ in range(600)]
    engine.add("q", dict.fromkeys(ids, now + 1000))  # pending, due in 1 s
    held = {shard: engine.stats(shard).pending for shard in shards}
    victim = master_of(lonely_cluster, engine, shards[0])
    healthy = [s for s in shards if master_of(lonely_cluster, engine, s) is not victim]
    assert healthy and all(held[s] for s in healthy)  # 600 ids over 6 shards

    lonely_cluster.kill(victim)
    promoter = Promoter(engine, ["q"], tick=0.2)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # what promote_loop does, minus the backoff's sleep
        with contextlib.suppress(EngineUnavailable):
            promoter.step()
        if all(engine.stats(s).ready == held[s] for s in healthy):
            break
        time.sleep(0.1)
    ready = {s: engine.stats(s).ready for s in healthy}
    assert ready == {s: held[s] for s in healthy}
