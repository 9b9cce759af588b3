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

from django_delayjobs.connection import get_engine
from django_delayjobs.embedded_cluster import EmbeddedCluster, Node
from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.promoter import Promoter
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from django_delayjobs.worker import Options, WorkerProcess
from tests.conftest import cluster_client
from tests.testapp import tasks

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


@pytest.mark.django_db
def test_reconcile_repairs_the_shards_on_healthy_masters_while_one_master_is_down(
    lonely_cluster, engine, settings
):
    """DESIGN.md rule 5 and docs/cluster.md (Failover): "schedule() keeps committing: a job
    whose add failed is added by reconcile", and a sharded queue keeps running on the
    other masters.

    ``reconcile._repair`` calls ``engine.requeue`` and ``engine.add`` for a whole chunk of
    ids at once, and ``Engine.add`` / ``Engine._garbage_op`` (engine/engine.py) run one
    script per shard with no per-shard error handling: the first shard whose master is
    down raises ``EngineUnavailable``, the sweep ends there, and no id of any other shard
    (nor of any later queue) is re-added, sweep after sweep, for as long as that master is
    down. Jobs whose shard lives on a healthy master wait for a master they have nothing
    to do with. Right: repair every shard that can be reached, then report the failure.
    """
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    # django_db without transaction=True: the on-commit adds never run, so Redis holds
    # none of these jobs (as after adds that failed, or a Redis that lost its data).
    jobs = schedule_many(
        build_job(tasks.record, in_=0, args=[str(n)], queue="q") for n in range(200)
    )
    homes = {str(job.pk): engine.home("q", str(job.pk)) for job in jobs}
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    healthy = {s for s in engine.shards("q") if master_of(lonely_cluster, engine, s) is not victim}
    wanted = {id_ for id_, shard in homes.items() if shard in healthy}
    assert wanted

    lonely_cluster.kill(victim)
    with contextlib.suppress(EngineUnavailable):
        reconcile(engine)
    held = {id_ for shard in healthy for id_, _ in engine.next_due(shard, 1000)}
    held |= {
        i.decode()
        for shard in healthy
        for i in engine.client.smembers(engine.keys(shard).ready_set)
    }
    assert held == wanted


def test_lease_extension_goes_on_for_shards_on_healthy_masters_while_one_master_is_down(
    lonely_cluster, engine
):
    """DESIGN.md: "A worker's lease is extended while its action runs, so a long action is
    not redelivered to a second worker"; docs/cluster.md: the worker keeps serving the
    shards on the other masters while one is down.

    ``WorkerProcess.extend_leases`` (worker.py) calls ``engine.extend_lease`` shard after
    shard with no per-shard error handling: while a running job's shard is on a dead master,
    every pass raises ``EngineUnavailable`` at that shard, and the jobs held from shards
    after it (on healthy masters) never get their lease extended; the housekeeping loop
    also skips its heartbeat and metrics flush in the same ``try``. Once the lease ends,
    ``recover_expired`` hands those still-running jobs to another worker. Right: extend
    every lease that can be reached, then report the failure.
    """
    shards = engine.shards("q")
    victim = master_of(lonely_cluster, engine, shards[0])
    healthy = next(s for s in shards if master_of(lonely_cluster, engine, s) is not victim)
    now = engine.server_time_ms()
    held = {}
    for shard in (shards[0], healthy):  # the dead master's shard first
        job_id = str(uuid.uuid4())
        engine.add(shard, {job_id: now})
        assert engine.claim(shard, 1, lease_ms=2000) == [job_id]
        held[job_id] = shard
    process = WorkerProcess(engine, Options(queues=["q"]))
    process.lease_ms = 600_000
    process.held.update({job_id: (shard, 0) for job_id, shard in held.items()})

    lonely_cluster.kill(victim)
    with contextlib.suppress(EngineUnavailable):
        process.extend_leases()
    (healthy_id,) = [i for i, s in held.items() if s == healthy]
    deadline = engine.client.zscore(engine.keys(healthy).unack, healthy_id)
    assert deadline is not None and deadline > now + 300_000  # extended, not 2 s


@pytest.mark.django_db(transaction=True)
def test_schedule_many_hands_the_jobs_of_healthy_masters_to_redis_while_one_master_is_down(
    lonely_cluster, engine, settings
):
    """docs/cluster.md (Failover): while a master is down "commands to its slots fail" and
    the shards on the other masters keep running; ``schedule()`` keeps committing.

    ``services.push`` (the on-commit add) calls ``Engine.add`` once per queue, and
    ``Engine.add`` (engine/engine.py) runs the add script shard after shard with no
    per-shard error handling: the first group of ids whose shard is on the dead master
    raises ``EngineUnavailable`` and the ids of every later group, on healthy masters, are
    never added. They are left to reconcile, which stops at the dead master the same way,
    so jobs that belong to healthy masters do not run until the dead one is back. Right:
    add every group that can be reached, and leave only the unreachable shards' ids to
    reconcile.
    """
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": lonely_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    assert get_engine().shards("q")  # the process's engine has read the slot table
    victim = master_of(lonely_cluster, engine, engine.shards("q")[0])
    healthy = {s for s in engine.shards("q") if master_of(lonely_cluster, engine, s) is not victim}

    lonely_cluster.kill(victim)
    built = [build_job(tasks.record, in_=3600, args=[str(n)], queue="q") for n in range(200)]
    # The first id on the dead master (the ids are grouped by shard in order of appearance).
    built.sort(key=lambda job: engine.home("q", str(job.pk)) in healthy)
    jobs = schedule_many(built)
    wanted = {str(job.pk) for job in jobs if engine.home("q", str(job.pk)) in healthy}
    assert len(wanted) > 100
    held = {id_ for shard in healthy for id_, _ in get_engine().next_due(shard, 1000)}
    assert held == wanted
