"""Audit of the Redis Cluster paths (round 2): folding counters, waits, promote and claim.

Every test marked ``cluster`` needs the session's Redis Cluster (``pytest -m cluster``);
the others run on one Redis too, for comparison.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayjobs.embedded_cluster import EmbeddedCluster
from django_delayjobs.engine import Engine, EngineUnavailable, PartlyUnavailable, close_client
from tests.conftest import cluster_client
from tests.engine.conftest import Backend, on_cluster, open_backend

Q = "q"
OLD = [f"q#{k}/2" for k in range(2)]  # the shards of an older count of q
INTO = "q#0/3"  # the shard of the current count that counters are folded into
COUNTS = {"added": 7, "acked": 4, "removed": 3}


@pytest.fixture(params=["single", on_cluster("cluster")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


@pytest.fixture
def client(backend: Backend) -> Iterator[Any]:
    made = backend.client()
    made.flushall()
    yield made
    close_client(made)


def counters(engine: Engine, shard: str) -> dict[str, int]:
    raw = engine.client.hgetall(engine.keys(shard).counters)
    return {k.decode(): int(v) for k, v in raw.items() if v.lstrip(b"-").isdigit() and int(v)}


def test_a_field_of_the_new_shard_that_holds_no_integer_counts_nothing_twice(client):
    """The new shard's ``acked`` holds another program's text. On one Redis the fold moves
    the other counts and leaves ``acked`` in the old shard. On a Cluster the counts were
    taken, then added in a MULTI, where the ``acked`` HINCRBY failed but the others were
    applied (Redis does not roll a transaction back): the put-back gave them to the old
    shard again, so they were counted twice, and again at every promoter pass."""
    engine = Engine(client, prefix="t", shards={Q: 3})
    for shard in OLD:
        client.hset(engine.keys(shard).counters, mapping=COUNTS)
        client.sadd(engine.queues_key, shard)
    client.hset(engine.keys(INTO).counters, "acked", "x")
    for _ in range(3):  # every promoter pass forgets the empty shards
        with contextlib.suppress(EngineUnavailable):  # it was raised on a Cluster
            engine.forget_empty_shards(Q)
    moved = {"added": 14, "removed": 6}
    assert counters(engine, INTO) == moved
    assert client.hget(engine.keys(INTO).counters, "acked") == b"x"
    left = [counters(engine, shard) for shard in OLD]
    assert left == [{"acked": 4}, {"acked": 4}]


def test_a_wait_on_a_client_with_a_very_short_socket_timeout_neither_fails_nor_spins(backend):
    """Redis answers a blocking pop that timed out on its next tick, up to 100 ms late
    (hz 10). One Redis polls the token lists for a client whose socket timeout is shorter
    than that; a Cluster's doorbells still blocked, each BLPOP cut to 12 ms by the 50 ms
    timeout: about half the waits failed with a read timeout (an outage to the worker and
    the promoter each time)."""
    client = backend.client(socket_timeout=0.05)
    try:
        engine = Engine(client, prefix="t", shards={"q": 3})
        client.flushall()
        for _ in range(10):
            started = time.monotonic()
            assert engine.wait_for_work(["q", "r"], 0.1) is False
            assert time.monotonic() - started >= 0.01  # it waited: a loop around it does not spin
        engine.add("q", {"a": 0})
        assert engine.wait_for_work(["q", "r"], 0.2) is True
        due = engine.server_time_ms() + 100
        engine.add("r", {"b": due})  # the earliest pending id: a wake token
        assert engine.wait_for_wake(["q", "r"], 0.2) is True
    finally:
        engine.close()


@pytest.mark.cluster
def test_a_wait_follows_a_shard_whose_slot_moved_to_another_master(redis_cluster):
    """A doorbell blocks on the master of its list by the client's slot table. After the
    slot moved, that master answered MOVED, which every waiter got as an outage (the worker
    and the promoter logged it and backed off), and again at every wait until some other
    command of the process met a MOVED and corrected the table: a process that only
    waited never did. The doorbell follows the redirection, as redis-py's commands do."""
    from django_delayjobs.engine.sharding import slot
    from tests.test_cluster import _move_slot

    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster.url)
    client.flushall()
    engine = Engine(client, prefix="move")
    the_slot = slot(engine.keys(Q).notify.split("}")[0][1:])
    masters = {n.address: n for n in redis_cluster.master_nodes()}
    source_node = masters[engine.node_of(Q)]
    target_node = next(n for a, n in masters.items() if a != source_node.address)
    with source_node.client() as source, target_node.client() as target:
        others = [n.client() for n in masters.values() if n not in (source_node, target_node)]
        try:
            assert engine.wait_for_work([Q], 0.1) is False  # a doorbell on the source
            time.sleep(1.2)  # it ends: nobody waits
            _move_slot(the_slot, source, target, others, finish=True)
            for _ in range(3):
                assert engine.wait_for_work([Q], 0.1) is False
            target.rpush(engine.keys(Q).notify, "1")
            assert engine.wait_for_work([Q], 0.5) is True
        finally:  # put the slot back: other tests count shards per master
            engine.close()
            with source_node.client() as check:
                if _node_id_of_slot(check, the_slot) != _node_id_of(source):
                    _move_slot(the_slot, target, source, others, finish=True)
            for other in others:
                other.close()
    redis_cluster.wait_healthy()


def _node_id_of(node: Any) -> str:
    return node.execute_command("CLUSTER MYID").decode()


def _node_id_of_slot(node: Any, the_slot: int) -> str:
    for start, end, master, *_ in node.execute_command("CLUSTER SLOTS"):
        if start <= the_slot <= end:
            return master[2].decode()
    raise AssertionError(f"slot {the_slot} has no master")


@pytest.fixture(scope="module")
def one_master() -> Iterator[EmbeddedCluster]:
    """A Redis Cluster of a single master (a managed cluster of one shard, say)."""
    with EmbeddedCluster(masters=1, replicas=0) as cluster:
        yield cluster


@pytest.mark.cluster
def test_the_start_up_and_health_checks_read_a_cluster_of_one_master(one_master):
    """redis-py gives a command sent to several nodes as {node: reply}, but to one node as
    the bare reply: on a Cluster of one master, ``masters()`` read INFO's fields as
    masters, and the worker's start-up checks and the health check failed with an
    AttributeError ('str' object has no attribute 'get')."""
    from django_delayjobs import health, preflight

    client = cluster_client(one_master.url)
    try:
        engine = Engine(client, prefix="t")
        found = engine.masters()
        assert list(found) == [one_master.nodes[0].address]
        assert found[one_master.nodes[0].address]["role"] == "master"
        assert preflight.check_redis(engine) == []
        assert health.check_redis(engine) == (health.Check("redis", True, "answers"), True)
    finally:
        close_client(client)


def test_a_polling_wait_keeps_the_token_it_took_beside_a_list_of_the_wrong_type(backend):
    """A polling client takes a token of each list in one round trip. When another
    queue's list held another program's STRING, the wait raised its WRONGTYPE with the
    token of ``r`` already taken; the engine waited again on the good lists, where it was
    gone: the worker slept a whole wait (a tick) with a job ready."""
    client = backend.client(socket_timeout=0.05)
    engine = Engine(client, prefix="t")
    try:
        client.flushall()
        client.set(engine.keys("q").notify, "another program's")
        engine.add("r", {"a": 0})  # ready now: a notify token
        assert engine.wait_for_work(["q", "r"], 0.2) is True
        assert engine.wait_for_work(["q", "r"], 0.1) is False  # the WRONGTYPE is passed over
    finally:
        engine.close()


@pytest.fixture(scope="module")
def lonely() -> Iterator[EmbeddedCluster]:
    """3 masters, no replicas; a dead master is not declared failed for 60 s."""
    with EmbeddedCluster(masters=3, replicas=0, node_timeout_ms=60_000) as cluster:
        yield cluster


@pytest.mark.cluster
def test_an_idle_worker_waits_on_the_healthy_masters_while_one_is_down(lonely):
    """With one master down (until its failover, or for good without a replica), an idle
    worker's claim passed over its shards but raised, the others being empty, and its
    wait raised as soon as that master's doorbell failed: the worker slept its backoff
    (0.2 s doubling to 5 s) instead of waiting, and a job that became ready on a healthy
    master waited up to 5 s. Both now fail only when no master answers."""
    from django_delayjobs.worker import Options, WorkerProcess

    lonely.wait_healthy()
    client = cluster_client(lonely.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    client.flushall()
    engine = Engine(client, prefix="t", shards={Q: 6})
    shards = engine.shards(Q)
    directory = engine.node_of(Q)  # the directory's and the workers' master: kept alive
    victim = next(n for n in lonely.nodes if n.address != directory
                  and n.address in {engine.node_of(s) for s in shards})  # fmt: skip
    healthy = [s for s in shards if engine.node_of(s) != victim.address]
    try:
        lonely.kill(victim)
        process = WorkerProcess(engine, Options(queues=[Q], tick=0.1))
        for _ in range(len(shards) + 1):  # every shard in turn, the dead ones too
            with pytest.raises(PartlyUnavailable):  # the loop waits, then claims again
                process.claim([Q])
        started = time.monotonic()
        assert engine.wait_for_work([Q], 0.3) is False
        assert time.monotonic() - started >= 0.25
        engine.add(healthy[0], {"a": 0})  # ready now: a notify token on a healthy master
        assert engine.wait_for_work([Q], 1.0) is True
        assert process.claim([Q]) == (healthy[0], ["a"])
        with pytest.raises(EngineUnavailable):  # none of its masters answers
            engine.wait_for_work([s for s in shards if s not in healthy], 0.3)
    finally:
        engine.close()
        lonely.restart(victim)


@pytest.mark.cluster
def test_the_promoter_is_woken_by_an_earlier_job_while_a_master_is_down(lonely):
    """While a pass could not reach one master, the promoter slept until the next due time
    (up to the tick) without waiting on the wake lists, as their wait failed with that
    master's: a job scheduled earlier, on a healthy master, was promoted up to a tick
    late. It waits on the lists of the masters that answer."""
    from django_delayjobs.worker import Options, WorkerProcess

    lonely.wait_healthy()
    client = cluster_client(lonely.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    client.flushall()
    engine = Engine(client, prefix="t", shards={Q: 6})
    shards = engine.shards(Q)
    directory = engine.node_of(Q)
    victim = next(n for n in lonely.nodes if n.address != directory
                  and n.address in {engine.node_of(s) for s in shards})  # fmt: skip
    healthy = [s for s in shards if engine.node_of(s) != victim.address]
    process = WorkerProcess(engine, Options(queues=[Q], tick=3.0))
    thread = threading.Thread(target=process.promote_loop)
    try:
        lonely.kill(victim)
        thread.start()
        time.sleep(0.5)  # its first pass met the dead master: it sleeps (a tick: 3 s)
        engine.add(healthy[0], {"a": engine.server_time_ms() + 100})  # a wake token
        started = time.monotonic()
        while engine.stats(healthy[0]).ready == 0:
            assert time.monotonic() - started < 1.0, "not promoted within 1 s"
            time.sleep(0.02)
    finally:
        process.stopping.set()
        thread.join()
        engine.close()
        lonely.restart(victim)


@pytest.mark.cluster
def test_a_process_started_while_the_directory_master_is_down_serves_the_others(lonely):
    """The directory of queues lives on one master. A process that started while that
    master was down (failing over, say) could never read it, and every promote and claim,
    on every queue, raised until it was back: the queues on the other masters stopped
    too. It serves its queues' current shards meanwhile, and reads the directory again
    within ``DIRECTORY_TTL``, as after a failed read of one it had read before."""
    lonely.wait_healthy()
    seed = cluster_client(lonely.url)
    directory = seed.get_node_from_key("{t}:queues").name
    queue = next(q for q in (f"q{n}" for n in range(100))
                 if seed.get_node_from_key(f"{{t:{q}}}:pending").name != directory)  # fmt: skip
    close_client(seed)
    victim = next(n for n in lonely.nodes if n.address == directory)
    alive = next(n for n in lonely.nodes if n is not victim)
    client = cluster_client(f"redis://{alive.address}/0", socket_timeout=1.0,
                            socket_connect_timeout=1.0)  # fmt: skip
    engine = Engine(client, prefix="t")
    try:
        lonely.kill(victim)
        client.zadd(engine.keys(queue).pending, {"a": 0})  # due: the add lists it, here not
        assert engine.promote(queue).moved == 1
        assert engine.claim(queue, 1, 60_000) == ["a"]
    finally:
        engine.close()
        lonely.restart(victim)


@pytest.mark.cluster
def test_an_adopt_while_the_directory_master_is_down_puts_no_second_copy_in_flight(lonely):
    """``q`` went from 2 shards to 3 while a worker ran job ``a``, claimed from its shard
    of 2. Reconcile adopts every running job; in a process that had not read the directory
    of queues (it started while the directory's master was down) the adopt found no shard
    of 2 to look in, and put ``a`` in flight in its shard of 3 too: when that lease ran out
    it was delivered to a second worker while the first still ran it. It raises instead
    (the next sweep tries again), and adopts nothing."""
    lonely.wait_healthy()
    seed = cluster_client(lonely.url)
    seed.flushall()
    directory = seed.get_node_from_key("{t}:queues").name
    old = Engine(seed, prefix="t", shards={Q: 2})
    new = Engine(cluster_client(lonely.url), prefix="t", shards={Q: 3})  # never read it
    job = next(i for i in (f"a{n}" for n in range(1000))
               if directory not in (old.node_of(old.home(Q, i)),
                                    new.node_of(new.home(Q, i))))  # fmt: skip
    victim = next(n for n in lonely.nodes if n.address == directory)
    try:
        old.add(Q, {job: 0})
        assert old.claim(old.home(Q, job), 1, 60_000) == [job]
        lonely.kill(victim)
        with pytest.raises(EngineUnavailable, match="unreachable"):
            new.adopt(Q, [job], 60_000)
        assert seed.zscore(new.keys(new.home(Q, job)).unack, job) is None
    finally:
        new.close()
        old.close()
        lonely.restart(victim)


@pytest.mark.cluster
@pytest.mark.django_db
def test_a_sharded_queue_whose_home_master_is_down_shows_its_live_workers_as_unknown(
    on_lonely, admin_client
):
    """A queue split into shards records its live workers in the keys of its own name.
    With that master down and the shards' masters up, the queue page, ``queues/`` and
    ``delayjobs_stats`` showed 0 live workers: an operator was paged for dead workers when
    a master was down. They show the count as unknown (``null`` in the API), and the
    health check says the count cannot be read."""
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    from django_delayjobs import health
    from django_delayjobs.connection import get_engine
    from tests.test_audit_cls3 import PREFIX, node, owner, page, settings_for

    cluster, client = on_lonely
    queue = next(q for q in (f"s{n}" for n in range(300))
                 if owner(client, f"{{{PREFIX}:{q}}}:pending")
                 != owner(client, f"{{{PREFIX}}}:queues"))  # fmt: skip
    home = node(cluster, owner(client, f"{{{PREFIX}:{queue}}}:pending"))
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={queue: 6})):
        engine = get_engine()
        later = engine.server_time_ms() + 3_600_000
        for n, shard in enumerate(engine.shards(queue)):
            engine.add(shard, {f"id{n}": later})
        cluster.kill(home)
        try:
            html = page(admin_client)
            out = io.StringIO()
            with pytest.raises(CommandError, match="its live workers"):
                call_command("delayjobs_stats", queue, stdout=out)
            [api] = [q for q in admin_client.get("/api/delayjobs/queues/").json()["queues"]
                     if q["queue"] == queue]  # fmt: skip
            limits = health.Limits((queue,), min_workers=0)
            checks = {c.name: c for c in health.check_queue(engine, queue, limits)}
        finally:
            cluster.restart(home)
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row is not None
    assert re.search(r'data-count="live_workers"><span [^>]*>unknown<', row.group(1)), row
    assert "their master does not answer" in html  # not "No live worker serves this queue."
    assert api["live_workers"] is None
    [line] = [line for line in out.getvalue().splitlines() if line.startswith(queue)]
    assert line.split()[-2:] == ["?", "-"], line  # workers, master (of no shard: the totals)
    workers = checks[f"workers:{queue}"]
    assert not workers.ok and "live workers cannot be read" in workers.detail, workers
