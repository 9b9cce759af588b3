"""Audit of the health check and the metrics on a Redis Cluster with one master down (and
of the health check on one frozen Redis, which must still cost one timeout).

The Cluster tests need a Redis Cluster (``pytest -m cluster``); they start their own, of
3 masters and no replicas, and kill or freeze (SIGSTOP) one master.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.backends.signals import connection_created
from django.test import Client, override_settings

from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine
from django_delayjobs.embedded_cluster import Node
from django_delayjobs.metrics import store
from tests.test_audit_cls3 import PREFIX, node, owner, scrape, settings_for
from tests.test_metrics import TOKEN, get

pytestmark = [pytest.mark.django_db]


@contextlib.contextmanager
def frozen(victim: Node) -> Iterator[None]:
    """The master stopped with SIGSTOP: it takes connections and answers nothing."""
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(victim.pid, signal.SIGCONT)


def queues_by_master(client: Any, count: int = 300) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for n in range(count):
        queue = f"q{n}"
        found.setdefault(owner(client, f"{{{PREFIX}:{queue}}}:pending"), []).append(queue)
    return found


def apart(
    by_master: dict[str, list[str]], address: str, lost: int, healthy: int
) -> tuple[list[str], list[str]]:
    """``lost`` queues on the master at ``address``, and ``healthy`` of each other one."""
    others = [q for a, qs in by_master.items() if a != address for q in qs[:healthy]]
    return by_master[address][:lost], others


def off_directory(client: Any, lost: int, healthy: int) -> tuple[str, list[str], list[str]]:
    """A master that does not hold the directory of queues, and ``apart``'s queues."""
    by_master = queues_by_master(client)
    directory = owner(client, f"{{{PREFIX}}}:queues")
    address = next(a for a in by_master if a != directory)
    return address, *apart(by_master, address, lost, healthy)


def health(queues: list[str]) -> tuple[dict[str, tuple[bool, str]], bool]:
    """``delayjobs_health`` of ``queues`` (no worker wanted): each check, and whether it
    exited 0."""
    out = io.StringIO()
    failure: CommandError | None = None
    try:
        call_command("delayjobs_health", queues=",".join(queues), min_workers="0", stdout=out)
    except CommandError as exc:
        failure = exc
    assert failure is None or failure.returncode == 1, failure
    checks = {}
    for line in out.getvalue().splitlines():
        mark, name, detail = line.split(None, 2)
        checks[name] = (mark == "ok", detail)
    return checks, failure is None


@pytest.mark.cluster
@pytest.mark.parametrize("outage", ["killed", "frozen"])
def test_health_with_one_master_down_fails_only_the_queues_on_it(on_lonely, outage):
    """With one master of a Cluster down (no replica to take over), every queue check
    failed with "Redis is unavailable", the queues of the two masters that answer too:
    the short-cut for one Redis that does not answer took the Cluster for one. Now the
    ``redis`` check names the master that does not answer, the queues on the other
    masters are checked as usual (and pass), those on it fail; exit 1, and 503 from
    ``health/``. A frozen master costs one timeout, not one per queue on it."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 4, 2)
    victim = node(cluster, address)
    lost.append("split")  # a queue split into 6 has a shard there
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={"split": 6})):
        engine = get_engine()
        assert address in {engine.node_of(shard) for shard in engine.shards("split")}
        for queue in lost + healthy:
            engine.add(queue, {f"{queue}-job": engine.server_time_ms() + 3_600_000})
        assert health(lost + healthy)[1]
        with frozen(victim) if outage == "frozen" else contextlib.nullcontext():
            if outage == "killed":
                cluster.kill(victim)
            try:
                started = time.monotonic()
                checks, passed = health(lost + healthy)
                took = time.monotonic() - started
                response = Client().get(
                    "/delayjobs/health/", {"queues": ",".join(lost + healthy), "min_workers": "0"}
                )
            finally:
                if outage == "killed":
                    cluster.restart(victim)
    assert not passed
    assert not checks["redis"][0] and address in checks["redis"][1], checks["redis"]
    assert checks["database"][0], checks["database"]
    for queue in healthy:
        for kind in ("workers", "overdue"):
            assert checks[f"{kind}:{queue}"][0], (queue, checks[f"{kind}:{queue}"])
    for queue in lost:
        for kind in ("workers", "overdue"):
            ok, detail = checks[f"{kind}:{queue}"]
            assert not ok and address in detail, (queue, detail)
    assert took < 8 * SOCKET_TIMEOUT, took  # the frozen master waited for once or twice
    assert response.status_code == 503
    states = response.json()["checks"]
    assert {n for n, v in states.items() if v == "fail"} == {"redis"} | {
        f"{kind}:{q}" for q in lost for kind in ("workers", "overdue")
    }


@pytest.mark.cluster
@pytest.mark.django_db(transaction=True)
def test_health_with_a_master_that_freezes_during_the_queue_checks(on_lonely):
    """A master that answered the ``redis`` check and stopped answering before the queue
    checks (frozen while the database was checked) failed every queue not yet checked,
    on every master ("not checked"): the single-Redis short-cut again. Only the queues on
    it fail now, after one wait for it; the others are checked as usual."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 4, 2)
    victim = node(cluster, address)
    assert victim.pid is not None
    queues = [q for pair in zip(lost, healthy, strict=False) for q in pair] + healthy[4:]

    def freeze(sender: object, **kwargs: Any) -> None:
        if threading.current_thread().name == "delayjobs-health-database":
            os.kill(victim.pid, signal.SIGSTOP)  # after the redis check, before the queues'

    with override_settings(DELAYJOBS=settings_for(cluster)):
        get_engine().add(healthy[0], {"a-job": get_engine().server_time_ms() + 3_600_000})
        connection_created.connect(freeze)
        try:
            started = time.monotonic()
            checks, passed = health(queues)
            took = time.monotonic() - started
        finally:
            connection_created.disconnect(freeze)
            os.kill(victim.pid, signal.SIGCONT)
    assert not passed
    assert checks["redis"][0] and checks["database"][0], checks
    for queue in healthy:
        assert checks[f"workers:{queue}"][0] and checks[f"overdue:{queue}"][0], queue
    for queue in lost:
        assert not checks[f"workers:{queue}"][0] and not checks[f"overdue:{queue}"][0], queue
    assert "not checked" not in str(checks)
    assert took < 8 * SOCKET_TIMEOUT, took  # one wait for it, not one per queue on it


def test_health_on_one_frozen_redis_waits_for_it_once_not_once_per_queue(frozen_redis, settings):
    """The Cluster's per-master checks keep the short-cut for one Redis that does not
    answer: 20 queues cost one read timeout, not 20; every check but the database's fails."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": frozen_redis}
    queues = [f"q{n}" for n in range(20)]
    started = time.monotonic()
    checks, passed = health(queues)
    took = time.monotonic() - started
    assert not passed
    assert took < 4 * SOCKET_TIMEOUT, took
    assert {name for name, (ok, _) in checks.items() if ok} == {"database"}
    assert len(checks) == 2 + 2 * len(queues)


@pytest.mark.cluster
def test_a_scrape_shows_a_sharded_queue_whose_totals_master_is_down(on_lonely):
    """A queue split into shards keeps its metrics totals (and its live workers) in the
    keys of its own name's hash tag. With that master down, the scrape left the queue out
    whole: not even ``delayjobs_queue_readable 0`` said it was missing, though its shards
    on the other masters answered. Its shards that answer are shown, the queue is marked
    unreadable, and neither its counters (a sum short of them would read as a reset) nor
    a worker count it could not read are given."""
    cluster, client = on_lonely
    queue = next(q for q in (f"s{n}" for n in range(300))
                 if owner(client, f"{{{PREFIX}:{q}}}:pending")
                 != owner(client, f"{{{PREFIX}}}:queues"))  # fmt: skip
    home = owner(client, f"{{{PREFIX}:{queue}}}:pending")
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={queue: 6})):
        engine = get_engine()
        assert owner(client, store.totals_key(engine, queue)) == home
        shards = engine.shards(queue)
        later = engine.server_time_ms() + 3_600_000
        for n, shard in enumerate(shards):
            engine.add(shard, {f"id{n}": later})
        lost = [s for s in shards if engine.node_of(s) == home]
        assert 0 < len(lost) < 6
        assert f'delayjobs_workers{{queue="{queue}"}} 0.0' in scrape()
        victim = node(cluster, home)
        cluster.kill(victim)
        try:
            text = scrape()
        finally:
            cluster.restart(victim)
        pending = 6 - len(lost)
        assert f'delayjobs_queue_readable{{queue="{queue}"}} 0.0' in text
        assert f'delayjobs_queue_jobs{{queue="{queue}",state="pending"}} {pending}.0' in text
        for shard in set(shards) - set(lost):
            assert f'shard="{shard}",state="pending"}} 1.0' in text, shard
        assert f'delayjobs_jobs_total{{outcome="scheduled",queue="{queue}"}}' not in text
        assert f'delayjobs_workers{{queue="{queue}"}}' not in text
        assert f'delayjobs_queue_readable{{queue="{queue}"}} 1.0' in scrape()


def test_a_scrape_names_a_queue_whose_totals_key_is_another_programs(
    redis_client, settings, caplog
):
    """A queue whose metrics totals key held another type (another program's) was left
    out of the scrape without a word: no ``delayjobs_queue_readable 0``, no log line, its
    gauges gone though every key of its jobs could be read. Its gauges are shown, the
    queue marked unreadable and named in the log; its counters are left out."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}
    engine = get_engine()
    for queue in ("a", "b"):
        engine.add(queue, {f"{queue}-job": 0})
    redis_client.set(store.totals_key(engine, "b"), "another program's")
    response = get(Client(), TOKEN)
    assert response.status_code == 200
    text = response.content.decode()
    assert 'delayjobs_queue_readable{queue="a"} 1.0' in text
    assert 'delayjobs_queue_readable{queue="b"} 0.0' in text
    assert 'delayjobs_queue_jobs{queue="b",state="ready"} 1.0' in text
    assert 'delayjobs_workers{queue="b"} 0.0' in text
    assert 'delayjobs_jobs_total{outcome="scheduled",queue="a"}' in text
    assert 'delayjobs_jobs_total{outcome="scheduled",queue="b"}' not in text
    assert "queue 'b' could not be read (its metrics totals key" in caplog.text


@pytest.mark.cluster
def test_a_scrape_with_a_frozen_master_waits_for_it_once_not_once_per_queue(on_lonely):
    """With a master frozen, a scrape read the totals of every queue on it one at a time
    (redis-py sends each command of a pipeline that timed out again, alone), each waiting
    the client's timeout and retry: 6 queues there held the scrape 27 s, past Prometheus's
    10 s, so every queue's series were lost; and each shard there of a queue split into
    several waited too. The first key of a master is read alone, and a master that does
    not answer is not asked again in that scrape."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 6, 2)
    split = ["split0", "split1", "split2"]  # 6 shards each, 2 of them on the frozen master
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS=dict.fromkeys(split, 6))):
        engine = get_engine()
        for queue in lost + healthy:
            engine.add(queue, {f"{queue}-job": 0})
        for queue in split:
            for n, shard in enumerate(engine.shards(queue)):
                engine.add(shard, {f"{shard}-{n}": 0})
            assert address in {engine.node_of(shard) for shard in engine.shards(queue)}
        with frozen(node(cluster, address)):
            started = time.monotonic()
            text = scrape()
            took = time.monotonic() - started
    for queue in healthy:
        assert f'delayjobs_queue_readable{{queue="{queue}"}} 1.0' in text, queue
    for queue in lost + split:
        assert f'delayjobs_queue_readable{{queue="{queue}"}} 0.0' in text, queue
    for queue in split:  # the shards of the masters that answer
        assert f'delayjobs_queue_jobs{{queue="{queue}",state="ready"}} 4.0' in text, queue
    assert took < 8 * SOCKET_TIMEOUT, took  # 6 queues there took 27 s; 6 shards, 12 s
