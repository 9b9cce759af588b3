"""Audit of the Redis Cluster paths (round 3): what the queue page and the metrics show
while one master is down.

Every test here needs a Redis Cluster (``pytest -m cluster``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings

from django_delayjobs import queues
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded_cluster import EmbeddedCluster
from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.metrics import snapshot
from tests.conftest import cluster_client
from tests.test_metrics import TOKEN, get

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


@pytest.fixture
def one_master_down(lonely: EmbeddedCluster) -> Iterator[tuple[str, str]]:
    """The Django settings on ``lonely``, a job in a queue on the directory's master and
    one in a queue on another master, which is then killed: (healthy queue, lost queue)."""
    lonely.wait_healthy()
    seed = cluster_client(lonely.url)
    seed.flushall()
    prefix = settings.DELAYJOBS.get("PREFIX", "delayjobs")
    directory = seed.get_node_from_key(f"{{{prefix}}}:queues").name

    def master(queue: str) -> str:
        return str(seed.get_node_from_key(f"{{{prefix}:{queue}}}:pending").name)

    names = [f"q{n}" for n in range(100)]
    healthy = next(q for q in names if master(q) == directory)
    lost = next(q for q in names if master(q) != directory)
    victim = next(n for n in lonely.nodes if n.address == master(lost))
    close_client(seed)
    dj = {**settings.DELAYJOBS, "REDIS_URL": lonely.url, "REDIS_CLUSTER": True}
    try:
        with override_settings(DELAYJOBS=dj):
            engine = get_engine()
            engine.add(healthy, {"a": 0})
            engine.add(lost, {"b": 0})
            lonely.kill(victim)
            yield healthy, lost
    finally:
        lonely.restart(victim)


def test_the_queue_page_shows_the_queues_of_the_masters_that_answer(one_master_down):
    """With one master of a Cluster down, the queue page showed no queue at all, only
    "Redis is unavailable": the queues of the healthy masters are shown, and each queue
    that cannot be read is named with its error."""
    healthy, lost = one_master_down
    states, errors, _ = queues.readable_queue_states()
    assert [s.name for s in states if s.name in (healthy, lost)] == [healthy]
    assert lost in errors and "unreachable" in errors[lost]


def test_a_scrape_shows_the_queues_of_the_masters_that_answer(one_master_down, caplog):
    """A scrape with one master down answered 503, so every queue's series were gone; it
    has those of the healthy masters, and says which queues it could not read."""
    healthy, lost = one_master_down
    unreadable: dict[str, str] = {}
    readings = snapshot.read(get_engine(), unreadable)
    assert [r.name for r in readings if r.name in (healthy, lost)] == [healthy]
    assert lost in unreadable and "unreachable" in unreadable[lost]
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}):
        response = get(Client(), TOKEN)
    assert response.status_code == 200
    text = response.content.decode()
    assert f'delayjobs_queue_jobs{{queue="{healthy}",state="ready"}} 1.0' in text
    assert f'delayjobs_queue_readable{{queue="{healthy}"}} 1.0' in text
    assert f'delayjobs_queue_readable{{queue="{lost}"}} 0.0' in text
    assert f'queue="{lost}",' not in text
    assert f"queue {lost!r} could not be read" in caplog.text


def test_a_polling_wait_waits_on_the_masters_that_answer(lonely):
    """A client whose socket timeout is too short for BLPOP polls the token lists, one
    pipeline of LPOPs over every master. With one master down the whole pipeline failed,
    so every wait raised at once (the worker slept its backoff, up to 5 s, with a job ready
    on a healthy master), where the doorbells wait on the lists of the masters that
    answer. It polls those, and fails only when none answers."""
    lonely.wait_healthy()
    client = cluster_client(lonely.url, socket_timeout=0.05, socket_connect_timeout=0.05)
    client.flushall()
    engine = Engine(client, prefix="t", shards={"q": 6})
    shards = engine.shards("q")
    directory = engine.node_of("q")
    victim = next(n for n in lonely.nodes if n.address != directory
                  and n.address in {engine.node_of(s) for s in shards})  # fmt: skip
    healthy = [s for s in shards if engine.node_of(s) != victim.address]
    try:
        lonely.kill(victim)
        started = time.monotonic()
        assert engine.wait_for_work(["q"], 0.3) is False
        assert time.monotonic() - started >= 0.25
        engine.add(healthy[0], {"a": 0})  # ready now: a notify token on a healthy master
        assert engine.wait_for_work(["q"], 1.0) is True
        with pytest.raises(EngineUnavailable):  # none of its masters answers
            engine.wait_for_work([s for s in shards if s not in healthy], 0.3)
    finally:
        engine.close()
        lonely.restart(victim)


def _start_move(nodes: dict[str, Any], slot: int, source: str, target: str) -> None:
    """Mark ``slot`` as moving from the master ``source`` to ``target`` (their clients in
    ``nodes`` by address); no key moves yet."""
    ids = {a: str(c.execute_command("CLUSTER MYID"), "utf-8") for a, c in nodes.items()}
    nodes[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
    nodes[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])


def _migrate(nodes: dict[str, Any], slot: int, source: str, target: str, *keys: str) -> None:
    """MIGRATE ``keys`` of ``slot`` (every key left in it if none is named) to ``target``."""
    host, port = target.split(":")
    found = keys or nodes[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if found:
        nodes[source].execute_command("MIGRATE", host, port, "", 0, 5000, "KEYS", *found)


def _finish_move(nodes: dict[str, Any], slot: int, source: str, target: str) -> None:
    _migrate(nodes, slot, source, target)
    owner = str(nodes[target].execute_command("CLUSTER MYID"), "utf-8")
    for node in nodes.values():
        node.execute_command("CLUSTER SETSLOT", slot, "NODE", owner)


def test_a_queue_whose_slot_is_migrating_fails_visibly_and_loses_no_id(lonely):
    """While a queue's slot migrates, Redis refuses a multi-key command one of whose keys
    is missing (TRYAGAIN), and a queue's scripts always name some that are (an empty
    unack or garbage): redis-py retries for about 0.1 s, then every move raises
    ``EngineUnavailable``, having changed nothing. Once the slot has moved, every id is
    where it was, on the new master."""
    lonely.wait_healthy()
    client = cluster_client(lonely.url)
    client.flushall()
    engine = Engine(client, prefix="t")
    keys = engine.keys("q")
    slot = client.keyslot(keys.pending)
    source = engine.node_of("q")
    target = next(n.address for n in lonely.nodes if n.address != source)
    nodes = {n.address: n.client() for n in lonely.nodes if n.address in (source, target)}
    try:
        now = engine.server_time_ms()
        engine.add("q", {"later": now + 600_000, "now": 0})
        _start_move(nodes, slot, source, target)
        _migrate(nodes, slot, source, target, keys.ready)
        moves = [lambda: engine.claim("q", 1, 60_000), lambda: engine.add("q", {"x": 0}),
                 lambda: engine.promote("q"), lambda: engine.remove("q", ["later"])]  # fmt: skip
        for move in moves:
            with pytest.raises(EngineUnavailable):
                move()
        _finish_move(nodes, slot, source, target)
        assert [job for job, _ in engine.next_due("q")] == ["later"]
        assert engine.claim("q", 10, 60_000) == ["now"]
    finally:
        engine.close()
        _finish_move(nodes, slot, source, target)  # then back: the cluster as it was
        _start_move(nodes, slot, target, source)
        _finish_move(nodes, slot, target, source)
        for node in nodes.values():
            node.close()
