"""Audit of the Redis Cluster operations views (round 4): the queue page and the metrics
while the directory's master, or one shard's, is down; redis-py giving up on redirects.

Every test here needs a Redis Cluster (``pytest -m cluster``).
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_delayjobs import queues
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded_cluster import EmbeddedCluster, Node
from django_delayjobs.engine import Engine, EngineUnavailable
from tests.conftest import cluster_client
from tests.test_metrics import TOKEN, get

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

PREFIX = "delayjobs"


def owner(client: Any, key: str) -> str:
    return str(client.get_node_from_key(key).name)


def node(cluster: EmbeddedCluster, address: str) -> Node:
    return next(n for n in cluster.nodes if n.address == address)


def settings_for(cluster: EmbeddedCluster, **more: Any) -> dict[str, Any]:
    return {**settings.DELAYJOBS, "REDIS_URL": cluster.url, "REDIS_CLUSTER": True,
            "PREFIX": PREFIX, "METRICS_TOKEN": TOKEN, **more}  # fmt: skip


def page(admin_client: Client) -> str:
    response = admin_client.get(reverse("admin:django_delayjobs_queues"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="delayjobs-redis-error"' not in html
    return html


def scrape() -> str:
    response = get(Client(), TOKEN)
    assert response.status_code == 200, response.content
    return response.content.decode()


def test_the_page_and_a_scrape_show_the_queues_that_answer_while_the_directory_is_down(
    on_lonely, admin_client
):
    """The directory of queues lives on one master. With it down, the queue page said
    only "Redis is unreachable" and a scrape answered 503: no queue at all, though every
    other master answered. They show the queues of the settings (QUEUE_SHARDS, the
    default queue), of active jobs (the page) and of the directory as last read, each read
    as usual, and say that a queue may be missing."""
    cluster, client = on_lonely
    directory = owner(client, f"{{{PREFIX}}}:queues")
    names = [f"q{n}" for n in range(200)]
    elsewhere = [q for q in names if owner(client, f"{{{PREFIX}:{q}}}:pending") != directory]
    on_directory = next(q for q in names if q not in elsewhere)
    configured, seen = elsewhere[:2]
    victim = node(cluster, directory)
    dj = settings_for(cluster, QUEUE_SHARDS={configured: 1}, DEFAULT_QUEUE=on_directory)
    try:
        with override_settings(DELAYJOBS=dj):
            engine = get_engine()
            for queue in (configured, seen):
                engine.add(queue, {"a": 0})
            assert set(engine.known_queues()) >= {configured, seen}  # read while it answers
            cluster.kill(victim)

            states, errors, unlisted = queues.readable_queue_states()
            assert {s.name for s in states} == {configured, seen}
            assert set(errors) == {on_directory}
            assert "directory of queues" in unlisted

            html = page(admin_client)
            assert 'id="delayjobs-unlisted"' in html and "may be missing" in html
            for queue in (configured, seen):
                assert f'<tr data-queue="{queue}">' in html
            assert f'data-queue-error="{on_directory}"' in html
            api = admin_client.get("/api/delayjobs/queues/").json()
            assert "directory of queues" in api["unlisted"]
            assert {q["queue"] for q in api["queues"]} == {configured, seen}

            text = scrape()
            for queue in (configured, seen):
                assert f'delayjobs_queue_jobs{{queue="{queue}",state="ready"}} 1.0' in text
                assert f'delayjobs_queue_readable{{queue="{queue}"}} 1.0' in text
            assert f'delayjobs_queue_readable{{queue="{on_directory}"}} 0.0' in text
            assert "delayjobs_directory_readable 0.0" in text
    finally:
        cluster.restart(victim)
    with override_settings(DELAYJOBS=dj):
        assert "delayjobs_directory_readable 1.0" in scrape()


def test_a_queue_with_a_dead_shard_shows_the_counts_of_the_shards_that_answer(
    on_lonely, admin_client
):
    """A queue split into 6 shards, one master of which is down, was one error on the
    queue page and in a scrape: its 4 live shards' jobs were invisible. Their counts are
    shown, the queue marked partial with its missing shards named; a scrape has their
    gauges, ``delayjobs_queue_readable`` 0, and none of its counters (a sum short of two
    shards would read as a counter reset)."""
    cluster, client = on_lonely
    queue = "split"
    directory = owner(client, f"{{{PREFIX}}}:queues")
    home = owner(client, f"{{{PREFIX}:{queue}}}:pending")  # its workers and metrics keys
    dj = settings_for(cluster, QUEUE_SHARDS={queue: 6})
    with override_settings(DELAYJOBS=dj):
        engine = get_engine()
        shards = engine.shards(queue)
        victim = node(cluster, next(engine.node_of(s) for s in shards
                                    if engine.node_of(s) not in (directory, home)))  # fmt: skip
        lost = [s for s in shards if engine.node_of(s) == victim.address]
        later = engine.server_time_ms() + 3_600_000
        for n, shard in enumerate(shards):
            engine.add(shard, {f"id{n}": later})
        assert engine.stats(queue).pending == 6
        try:
            cluster.kill(victim)

            states, errors, _ = queues.readable_queue_states()
            state = next(s for s in states if s.name == queue)
            assert queue not in errors
            assert state.stats.pending == 6 - len(lost)
            assert sorted(state.missing) == sorted(lost) and "unreachable" in state.partial
            assert {s.name for s in state.shards} == set(shards) - set(lost)
            assert len(state.next_due) == 6 - len(lost)

            html = page(admin_client)
            assert f'<tr data-queue="{queue}">' in html
            assert f'data-queue-partial="{queue}"' in html
            assert f"Queue “{queue}” is shown in part" in html  # the name was left out
            assert all(shard in html for shard in lost)
            [api] = [q for q in admin_client.get("/api/delayjobs/queues/").json()["queues"]
                     if q["queue"] == queue]  # fmt: skip
            assert api["pending"] == 6 - len(lost) and "unreachable" in api["incomplete"]
            assert sorted(api["missing_shards"]) == sorted(lost)

            text = scrape()
            pending = 6 - len(lost)
            assert f'delayjobs_queue_jobs{{queue="{queue}",state="pending"}} {pending}.0' in text
            assert f'delayjobs_queue_readable{{queue="{queue}"}} 0.0' in text
            assert f'delayjobs_jobs_total{{outcome="scheduled",queue="{queue}"}}' not in text
            assert f'delayjobs_jobs_total{{queue="{queue}",' not in text

            # delayjobs_stats shows the shards that answer, and ends naming the others.
            out = io.StringIO()
            with pytest.raises(CommandError, match=f"queue {queue} is shown in part"):
                call_command("delayjobs_stats", queue, stdout=out)
            lines = out.getvalue().splitlines()
            assert lines[1].split()[:2] == [queue, str(pending)], lines
            assert {line.split()[0] for line in lines[2:]} == set(shards) - set(lost)
        finally:
            cluster.restart(victim)
        assert f'delayjobs_queue_readable{{queue="{queue}"}} 1.0' in scrape()


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
