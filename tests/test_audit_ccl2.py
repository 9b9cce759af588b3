"""Audit of a Redis Cluster with one master down (``pytest -m cluster``): reconcile's
adopt, the admin's charts and the reads of one queue. The tests start their own cluster of
3 masters and no replicas (``lonely``) and kill or freeze one master by its pid."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.urls import reverse

from django_delayjobs import queues, schedule
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine
from django_delayjobs.engine import Engine, EngineUnavailable, PartlyUnavailable
from django_delayjobs.metrics import store
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from tests.test_admin_charts import QUEUES, column_sums, table
from tests.test_audit_ccl import ids_in
from tests.test_audit_cls3 import PREFIX, node, page, settings_for
from tests.test_audit_hlt import frozen, off_directory
from tests.testapp import tasks

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

Q = "split"


def test_an_adopt_with_a_master_down_keeps_what_it_did_on_the_others(on_lonely):
    """``Engine.adopt`` (reconcile putting running jobs Redis lost back in flight) raised
    the failure of a shard whose master is down as a plain ``EngineUnavailable``: the ids
    it had put in flight on the shards before it were lost from its result, so reconcile
    neither counted them nor checked them against their rows. It goes on past that shard,
    as ``add`` does, and raises ``PartlyUnavailable`` with the ids it adopted."""
    cluster, client = on_lonely
    address, _, _ = off_directory(client, 0, 0)
    engine = Engine(client, prefix=PREFIX, shards={Q: 6})
    ids = [job_id for shard in engine.shards(Q) for job_id in ids_in(engine, Q, shard, 2)]
    healthy = [i for i in ids if engine.node_of(engine.home(Q, i)) != address]
    assert 0 < len(healthy) < len(ids)
    cluster.kill(node(cluster, address))
    try:
        with pytest.raises(PartlyUnavailable) as failed:
            engine.adopt(Q, ids, 60_000)
        flying = {i for i in healthy if client.zscore(engine.keys(engine.home(Q, i)).unack, i)}
    finally:
        cluster.restart(node(cluster, address))
    assert sorted(failed.value.done) == sorted(healthy)
    assert flying == set(healthy)


def test_reconcile_with_a_master_down_counts_the_running_jobs_it_adopted(on_lonely):
    """Reconcile of running jobs Redis lost, with one master down: the jobs put back in
    flight on the other masters were counted as none (and the sweep's failure read as if
    no shard had answered). They are counted, in ``PartlyUnavailable.done``."""
    cluster, client = on_lonely
    address, _, _ = off_directory(client, 0, 0)
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={Q: 6})):
        engine = get_engine()
        lost: list[str] = []
        healthy: list[str] = []
        while len(lost) < 2 or len(healthy) < 2:  # the on-commit add never runs here
            job = schedule(tasks.record, in_=timedelta(hours=1), args=["x"], queue=Q)
            on_it = engine.node_of(engine.home(Q, str(job.pk))) == address
            (lost if on_it else healthy).append(str(job.pk))
        Job.objects.update(status=Status.RUNNING, attempts=1, deliveries=1)
        cluster.kill(node(cluster, address))
        try:
            with pytest.raises(PartlyUnavailable) as failed:
                reconcile(engine, ids=lost + healthy)
            flying = {i for i in healthy if client.zscore(engine.keys(engine.home(Q, i)).unack, i)}
        finally:
            cluster.restart(node(cluster, address))
    assert failed.value.done[Q] == len(healthy)
    assert flying == set(healthy)


def test_the_charts_draw_the_queues_of_the_masters_that_answer(on_lonely, admin_client):
    """With one master down, the queue page's charts were replaced for every queue by
    "The charts cannot be drawn": their history was read in one Cluster pipeline, which
    fails whole. They draw the queues whose history can be read and name those whose
    cannot. A queue split into shards, one of them on that master, has its history (kept
    under its own name) drawn, but not this minute's scheduled and cancelled jobs: they
    are its counters now less those at the minute's start, and its counters summed over
    the shards that answer are short of the down shard's (the chart showed the rest of
    them, all the jobs ever scheduled there, as scheduled this minute)."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 2, 2)
    split = next(q for q in healthy if q != healthy[0])
    healthy.remove(split)
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={split: 6})):
        engine = get_engine()
        assert address in {engine.node_of(s) for s in engine.shards(split)}
        for queue in lost + healthy:
            engine.add(queue, {f"{queue}-job": engine.server_time_ms() + 3_600_000})
        for n, shard in enumerate(engine.shards(split)):
            engine.add(shard, {f"{split}-{n}": engine.server_time_ms() + 3_600_000})
        minute = engine.server_time_ms() // 60_000
        done = {(q, minute): {"jobs:succeeded": 3} for q in lost + healthy + [split]}
        store.write(engine, done, [split], minute, ttl=600, written=set())
        cluster.kill(node(cluster, address))
        try:
            html = page(admin_client)
        finally:
            cluster.restart(node(cluster, address))
    assert 'id="delayjobs-charts-error"' not in html
    head, rows = table(html, "delayjobs-throughput")
    sums = column_sums(head, rows)
    assert sums["succeeded"] == 3 * len([*healthy, split]), sums
    assert sums["scheduled"] == 0, sums
    for queue in lost:
        assert f'data-charts-missing="{queue}"' in html, queue
    for queue in [*healthy, split]:
        assert f'data-charts-missing="{queue}"' not in html, queue


def test_the_queue_page_waits_for_a_frozen_master_once_with_its_charts(on_lonely, admin_client):
    """With a master frozen, the queue page waited for it once to read the queues and
    again to read the charts' history (and the counters of the queues not on the page):
    the reads share the masters found not answering, so the page waits once."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 3, 2)
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        for queue in lost + healthy:
            engine.add(queue, {f"{queue}-job": engine.server_time_ms() + 3_600_000})
        page(admin_client)  # connections open, scripts loaded
        with frozen(node(cluster, address)):
            started = time.monotonic()
            html = page(admin_client)
            took = time.monotonic() - started
            started = time.monotonic()  # the charts of one queue there
            one = admin_client.get(reverse(QUEUES), {"charts": lost[0]}).content.decode()
            took_one = time.monotonic() - started
    for queue in lost:
        assert f'data-queue-error="{queue}"' in html, queue
        assert f'data-charts-missing="{queue}"' in html, queue
    assert 'id="delayjobs-throughput"' in html
    assert took < 4 * SOCKET_TIMEOUT, took
    assert 'id="delayjobs-charts-error"' in one and "not asked again" in one
    assert took_one < 4 * SOCKET_TIMEOUT, took_one


def test_queue_state_shares_the_masters_found_down(on_lonely):
    """``queues.queue_state`` (one queue) took no ``down``, which the other reads share so
    that a caller reading several queues waits for a frozen master once: each queue on it,
    and each queue with a shard there, waited again. With one ``down``, only the first
    read waits; a queue on another master is read as usual, a split one in part."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 3, 1)
    split = healthy.pop()
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={split: 6})):
        engine = get_engine()
        for queue in lost + healthy + engine.shards(split):
            engine.add(queue, {f"{queue}-job": engine.server_time_ms() + 3_600_000})
        assert address in {engine.node_of(s) for s in engine.shards(split)}
        down: dict[str, str] = {}
        with frozen(node(cluster, address)):
            with pytest.raises(EngineUnavailable):
                queues.queue_state(lost[0], down=down)
            assert address in down
            started = time.monotonic()
            for queue in lost[1:]:
                with pytest.raises(EngineUnavailable, match="not asked again"):
                    queues.queue_state(queue, down=down)
            state = queues.queue_state(split, down=down)
            took = time.monotonic() - started
            assert all(queues.queue_state(q, down=down).stats.pending == 1 for q in healthy)
    assert state.partial and state.missing and state.stats.pending == 6 - len(state.missing)
    assert took < SOCKET_TIMEOUT / 2, took
