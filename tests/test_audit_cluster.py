"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import pytest

from django_delayjobs.engine import Engine, EngineUnavailable
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from tests.test_cluster_failover import SHARDS, engine, lonely_cluster, master_of  # noqa: F401
from tests.testapp import tasks

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.mark.django_db
def test_a_full_reconcile_repairs_every_chunk_while_the_directory_s_master_is_down(
    lonely_cluster,  # noqa: F811
    engine,  # noqa: F811
    settings,
):
    """``delayjobs_reconcile`` (a new process: it has never read the directory of queues)
    while the master that holds the directory is down: the shards of older counts cannot
    be listed, yet the shards on the other masters are repaired, every chunk of them."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    jobs = schedule_many(
        build_job(tasks.record, in_=0, args=[str(n)], queue="q") for n in range(2500)
    )
    address = engine.client.get_node_from_key(engine.queues_key).name
    victim = next(node for node in lonely_cluster.nodes if node.address == address)
    healthy = {s for s in engine.shards("q") if master_of(lonely_cluster, engine, s) is not victim}
    wanted = {str(job.pk) for job in jobs if engine.home("q", str(job.pk)) in healthy}

    lonely_cluster.kill(victim)
    fresh = Engine(engine.client, prefix="audit", shards=SHARDS)
    with pytest.raises(EngineUnavailable):
        reconcile(fresh)
    held = {
        i.decode()
        for shard in healthy
        for i in engine.client.smembers(engine.keys(shard).ready_set)
    }
    assert len(held) == len(wanted) and held == wanted
