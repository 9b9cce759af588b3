"""The Django layer on the session's Redis Cluster (``-m cluster``): settings, start-up
checks and banner, the verbs through shards, per-shard state in the admin, the API and
``delayjobs_stats``, a django-redis cache that is a cluster client, and how a sharded queue
spreads over the masters.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_delayjobs import schedule, timing
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, close_client
from django_delayjobs.models import Job, Status
from django_delayjobs.preflight import check_redis, describe_redis
from django_delayjobs.services import build_job, schedule_many
from tests.conftest import cluster_client
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

from .test_rest_helpers import client_for, due_in_redis, make_user, redis_state, url

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

SHARDS = {"orders": 6}


@pytest.fixture
def on_cluster(redis_cluster, settings) -> Iterator[Any]:
    """The Django layer on the cluster, with the queue ``orders`` in 6 shards."""
    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster.url)
    client.flushall()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": redis_cluster.url,
                          "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}  # fmt: skip
    yield client
    close_client(client)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def test_the_worker_banner_says_cluster_and_how_many_masters(on_cluster, capsys):
    job = schedule(tasks.record, in_=0, args=["banner"], queue="orders")
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "1")
    out = capsys.readouterr().out
    assert "(cluster, 3 masters)" in out
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    engine = get_engine()
    assert engine.is_cluster and describe_redis(engine).endswith("(cluster, 3 masters)")


def test_start_up_checks_look_at_every_master(on_cluster, redis_cluster, settings):
    engine = get_engine()
    assert check_redis(engine) == []
    victim = redis_cluster.master_nodes()[1]
    with victim.client() as node:
        node.config_set("maxmemory-policy", "allkeys-lru")
        try:
            (warning,) = check_redis(engine)
            assert f"(master {victim.address})" in warning
            settings.DELAYJOBS = {**settings.DELAYJOBS, "REFUSE_EVICTING_REDIS": True}
            with pytest.raises(Exception, match="noeviction"):
                check_redis(get_engine())
        finally:
            node.config_set("maxmemory-policy", "noeviction")


def test_the_health_check_looks_at_every_master(on_cluster, redis_cluster):
    from django_delayjobs import health

    engine = get_engine()
    assert health.check_redis(engine)[0].ok
    victim = redis_cluster.master_nodes()[2]
    with victim.client() as node:
        node.config_set("maxmemory", 1)
        try:
            check, reachable = health.check_redis(engine)
        finally:
            node.config_set("maxmemory", 0)
    assert not check.ok and reachable
    assert check.detail.startswith(f"full (master {victim.address}): used_memory")


@contextlib.contextmanager
def short_of_replicas(node: Any) -> Iterator[None]:
    """More replicas to write than the master has (one): it refuses writes (NOREPLICAS)
    yet answers INFO and PING."""
    node.config_set("min-replicas-to-write", 2)
    try:
        yield
    finally:
        node.config_set("min-replicas-to-write", 0)


@contextlib.contextmanager
def unable_to_persist(node: Any) -> Iterator[None]:
    """Its last RDB save failed (its directory is gone): it refuses writes (MISCONF)."""
    home = node.config_get("dir")["dir"]
    gone = os.path.join(home, "gone")
    os.mkdir(gone)
    node.config_set("save", "3600 1")
    node.config_set("dir", gone)
    os.rmdir(gone)
    try:
        node.bgsave()
        wait_for(lambda: node.info("persistence")["rdb_last_bgsave_status"] == "err")
        yield
    finally:
        node.config_set("dir", home)
        node.bgsave()
        wait_for(lambda: node.info("persistence")["rdb_last_bgsave_status"] == "ok")
        node.config_set("save", "")


@pytest.mark.parametrize(
    ("refusal", "error"), [(short_of_replicas, "NOREPLICAS"), (unable_to_persist, "MISCONF")]
)
def test_the_health_check_names_a_master_that_refuses_writes(
    on_cluster, redis_cluster, refusal, error
):
    """Every add, claim and ack on the shards of a master that refuses writes fails, while
    its INFO reads as usual: the check asks every master to write, and names the one that
    refuses (a master short of replicas passed it: the check only PINGed)."""
    from django_delayjobs import health

    engine = get_engine()
    victim = redis_cluster.master_nodes()[1]
    with victim.client() as node, refusal(node):
        check, reachable = health.check_redis(engine)
    assert not check.ok and reachable, check
    assert check.detail.startswith(f"refuses writes (master {victim.address}): "), check.detail
    assert error in check.detail
    assert health.check_redis(engine)[0].ok


def test_the_verbs_find_each_job_in_its_shard(on_cluster):
    engine = get_engine()
    jobs = [schedule(tasks.record, in_=3600, args=[str(n)], queue="orders") for n in range(30)]
    homes = {engine.home("orders", str(job.pk)) for job in jobs}
    assert len(homes) > 3  # the jobs went to several shards
    for job in jobs:
        assert redis_state(job) == "pending"
    assert jobs[0].cancel() is True
    assert redis_state(jobs[0]) is None
    assert jobs[1].reschedule(in_=7200) is True
    jobs[1].refresh_from_db()
    assert due_in_redis(jobs[1]) == timing.to_ms(jobs[1].run_at)
    assert engine.stats("orders").pending == 29
    assert sorted(engine.known_queues()) == ["orders"]


def test_requeue_and_purge_reach_the_shard_of_a_dead_job(on_cluster):
    from django_delayjobs.services import purge, requeue

    dead = [schedule(tasks.fail, in_=0, args=[str(n)], max_attempts=1, queue="orders")
            for n in range(8)]  # fmt: skip
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    assert {Job.objects.get(pk=j.pk).status for j in dead} == {Status.DEAD}
    assert get_engine().stats("orders").garbage == 8
    assert all(redis_state(j) == "garbage" for j in dead)
    assert requeue(dead[0]) is True
    assert redis_state(dead[0]) in ("ready", "pending")
    assert purge(dead[1]) is True
    assert redis_state(dead[1]) is None
    assert get_engine().stats("orders").garbage == 6


def test_stats_api_and_admin_show_totals_and_each_shard_with_its_master(
    on_cluster, capsys, admin_client
):
    schedule_many([build_job(tasks.record, in_=3600, args=[str(n)], queue="orders")
                   for n in range(60)])  # fmt: skip
    schedule(tasks.record, in_=3600, args=["d"])
    engine = get_engine()
    masters = {engine.node_of(name) for name in engine.shards("orders")}
    assert len(masters) == 3

    call_command("delayjobs_stats")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[1] == "pending" and lines[0].split()[-1] == "master"
    rows = {line.split()[0]: line.split() for line in lines[1:]}  # queue, pending, ..., master
    assert rows["orders"][1] == "60"
    assert sum(int(rows[name][1]) for name in engine.shards("orders")) == 60
    assert {rows[name][-1] for name in engine.shards("orders")} == masters
    assert rows["default"][-1] == engine.node_of("default")

    api = client_for(make_user(superuser=True))
    response = api.get(url("queues"))
    assert response.status_code == 200, response.data
    queues = {q["queue"]: q for q in response.data["queues"]}
    orders = queues["orders"]
    assert orders["pending"] == 60
    assert [s["shard"] for s in orders["shards"]] == engine.shards("orders")
    assert sum(s["pending"] for s in orders["shards"]) == 60
    assert {s["master"] for s in orders["shards"]} == masters
    assert [s["shard"] for s in queues["default"]["shards"]] == ["default"]

    page = admin_client.get(reverse("admin:django_delayjobs_queues"))
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="shards-orders"' in html and "6 shards" in html
    for name in engine.shards("orders"):
        assert f'data-shard="{name}"' in html
    for master in masters:
        assert master in html


def test_a_cache_that_is_a_cluster_client_is_shared(on_cluster, redis_cluster, settings):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jobs": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_cluster.url,
            "OPTIONS": {"CONNECTION_FACTORY": "tests.cluster_cache.ClusterConnectionFactory"},
        },
    }
    settings.DELAYJOBS = {"CACHE_ALIAS": "jobs", "REDIS_CLUSTER": True, "QUEUE_SHARDS": SHARDS}
    from django_redis import get_redis_connection

    assert get_engine().client is get_redis_connection("jobs")
    job = schedule(tasks.record, in_=0, args=["via-cache"], queue="orders")
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert Record.objects.filter(label="via-cache").count() == 1
    settings.DELAYJOBS = {"CACHE_ALIAS": "jobs"}  # the cache is a cluster: the flag must say so
    with pytest.raises(Exception, match="set DELAYJOBS\\['REDIS_CLUSTER'\\] = True"):
        get_engine()


def test_on_3_masters_a_queue_of_6_puts_2_shards_on_each(on_cluster):
    engine = Engine(on_cluster, prefix="t", shards={"q": 6})
    masters = Counter(engine.node_of(name) for name in engine.shards("q"))
    assert len(masters) == 3
    assert set(masters.values()) == {2}


def test_a_queue_of_6_shards_spreads_100k_pending_jobs_evenly_over_3_masters(on_cluster):
    """Each master holds its share within 10% in practice (2 shards each, ids spread by
    jump hash); the assertion allows 25%, so that it fails only if spreading breaks."""
    engine = Engine(on_cluster, prefix="spread", shards={"orders": 6})
    n = 100_000
    due = engine.server_time_ms() + 3_600_000
    ids = [str(uuid.uuid4()) for _ in range(n)]
    for lo in range(0, n, 5000):
        engine.add("orders", dict.fromkeys(ids[lo : lo + 5000], due))
    per_master: Counter[str] = Counter()
    for shard in engine.stats("orders").shards:
        per_master[engine.node_of(shard.queue)] += shard.pending
    assert sum(per_master.values()) == n
    assert len(per_master) == 3
    shares = sorted(count / n for count in per_master.values())
    print(f"share of the 100,000 pending ids per master: {shares}")
    assert all(abs(share - 1 / 3) < 0.25 / 3 for share in shares), shares


def _node_id(node: Any) -> str:
    raw = node.execute_command("CLUSTER MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _move_slot(slot: int, source: Any, target: Any, everyone: list[Any], *, finish: bool) -> None:
    """Migrate ``slot`` as redis-cli --cluster reshard does; stop half way unless ``finish``."""
    src, dst = _node_id(source), _node_id(target)
    target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src)
    source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst)
    keys = source.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    port = target.connection_pool.connection_kwargs["port"]
    for key in keys if finish else keys[: len(keys) // 2]:
        source.execute_command("MIGRATE", "127.0.0.1", port, key, 0, 5000)
    if finish:
        for node in [target, source, *everyone]:
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", dst)


def test_the_engine_follows_a_shard_whose_slot_moves_to_another_master(on_cluster, redis_cluster):
    """MOVED and ASK are followed by redis-py; while the slot is half moved a script that
    needs keys on both sides gets TRYAGAIN until redis-py gives up, and the engine raises
    EngineUnavailable (its callers back off); once the slot is moved, nothing is lost."""
    from django_delayjobs.engine import EngineUnavailable
    from django_delayjobs.engine.sharding import slot

    engine = Engine(on_cluster, prefix="move", shards={"orders": 6})
    now = engine.server_time_ms()
    shard = engine.shards("orders")[0]
    ids = [i for i in (str(uuid.uuid4()) for _ in range(400)) if engine.home("orders", i) == shard]
    engine.add("orders", dict.fromkeys(ids[:20], 0))  # ready
    engine.add("orders", {i: now + 3_600_000 for i in ids[20:]})  # pending
    the_slot = slot(engine.keys(shard).pending.split("}")[0][1:])
    masters = {n.address: n for n in redis_cluster.master_nodes()}
    source_node = masters[engine.node_of(shard)]
    target_node = next(n for a, n in masters.items() if a != source_node.address)
    with source_node.client() as source, target_node.client() as target:
        others = [n.client() for n in masters.values() if n not in (source_node, target_node)]
        try:
            _move_slot(the_slot, source, target, others, finish=False)
            for call in (lambda: engine.stats(shard), lambda: engine.claim(shard, 1, 60_000)):
                started = time.monotonic()
                # redis-py answers TRYAGAIN by retrying (16 times at most), then gives up:
                with contextlib.suppress(EngineUnavailable):
                    call()
                assert time.monotonic() - started < 5  # bounded, never a hang
            # A one-key read works on either side of the move (redis-py follows ASK).
            assert len(engine.next_due(shard, 5)) == 5
            assert len(engine.garbage(shard, 5)) == 0
            _move_slot(the_slot, source, target, others, finish=True)
            claimed = engine.claim(shard, 20, 60_000)  # MOVED: redis-py reads the new owner
            assert engine.node_of(shard) == target_node.address
            stats = engine.stats(shard)
            assert stats.pending == len(ids) - 20
            assert stats.ready + stats.in_flight == 20
            assert engine.ack(shard, claimed) == len(claimed)
        finally:  # put the slot back: the other tests count shards per master
            if engine.node_of(shard) != source_node.address:
                _move_slot(the_slot, target, source, others, finish=True)
            for client in others:
                client.close()
    redis_cluster.wait_healthy()


def test_metrics_are_flushed_and_read_on_the_cluster(on_cluster):
    """The recorder's MULTI/EXEC per queue stays in the queue's slot; the snapshot sums
    the shards' counters, which live on several masters."""
    from django_delayjobs.metrics import store
    from django_delayjobs.metrics.recorder import Recorder
    from django_delayjobs.outcomes import Outcome, Result

    engine = Engine(on_cluster, prefix="m", shards={"orders": 6})
    engine.add("orders", dict.fromkeys((str(uuid.uuid4()) for _ in range(60)), 10**13))
    job = Job(attempts=1)  # no run_at/started_at: no lateness, just the outcome
    recorder = Recorder()
    for _ in range(3):
        recorder.record("orders", Result(Outcome.SUCCEEDED, job, duration=0.01))
    now = time.time()
    recorder.flush(engine, ["orders"], now=now)
    assert store.totals(engine, ["orders"])["orders"]["jobs:succeeded"] == 3
    minute = int(now // 60)
    assert store.minutes(engine, "orders", minute, minute)[minute]["snap:added"] == 60


def test_a_cluster_is_also_made_without_redis_cli():
    """What the fixtures do when no redis-cli is found: CLUSTER ADDSLOTS, MEET and
    REPLICATE from Python, then the same health check (every slot served, replicas up)."""
    from django_delayjobs.embedded_cluster import EmbeddedCluster

    with EmbeddedCluster(masters=3, replicas=1, use_redis_cli=False) as cluster:
        assert len(cluster.master_nodes()) == 3
        pids = [node.pid for node in cluster.nodes]
        client = cluster_client(cluster.url)
        try:
            assert len(client.get_primaries()) == 3 and len(client.get_replicas()) == 3
            engine = Engine(client, prefix="byhand", shards={"q": 6})
            assert engine.add("q", {"a": 0, "b": 0}) == ["a", "b"]
            assert sorted(engine.claim("q", 2, 1000)) == ["a", "b"]
        finally:
            close_client(client)
    for pid in pids:  # stopped by pid, and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
