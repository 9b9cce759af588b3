"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import uuid

import pytest

from django_delayjobs.engine import Engine
from tests.test_cluster_failover import SHARDS, engine, lonely_cluster, master_of  # noqa: F401

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_reschedule_reaches_its_shard_while_the_directory_s_master_is_down(
    lonely_cluster,  # noqa: F811
    engine,  # noqa: F811
):
    """``Engine.reschedule`` looks in the shards of older counts only for an id its own
    shard does not hold: a new process moved no id at all while the master of the
    directory (which lists those shards) was down, wherever the id was."""
    address = engine.client.get_node_from_key(engine.queues_key).name
    victim = next(node for node in lonely_cluster.nodes if node.address == address)
    now = engine.server_time_ms()
    ids = [str(uuid.uuid4()) for _ in range(30)]
    engine.add("q", dict.fromkeys(ids, now + 3_600_000))
    job_id = next(
        i for i in ids if master_of(lonely_cluster, engine, engine.home("q", i)) is not victim
    )

    lonely_cluster.kill(victim)
    fresh = Engine(engine.client, prefix="audit", shards=SHARDS)
    assert fresh.reschedule("q", job_id, now + 60_000) is True
    assert fresh.next_due(engine.home("q", job_id), 100)[0] == (job_id, now + 60_000)
