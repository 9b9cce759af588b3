"""Audit of failure paths on a Redis Cluster (``pytest -m cluster``): the health check
and the reads of the admin and the API with one master down or frozen. The tests start
their own cluster of 3 masters and no replicas (``lonely``) and stop one master by its
pid."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.backends.signals import connection_created
from django.test import override_settings

from django_delayjobs import health, queues
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine, redis_client
from django_delayjobs.engine import Engine
from tests.test_audit_cls3 import PREFIX, node, owner, settings_for
from tests.test_audit_hlt import apart, frozen, off_directory, queues_by_master

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

SPLIT = {f"s{n}": 6 for n in range(10)}


def ids_in(engine: Any, queue: str, shard: str, count: int = 1) -> list[str]:
    """``count`` job ids whose home in ``queue`` is ``shard``."""
    found: list[str] = []
    while len(found) < count:
        job_id = str(uuid.uuid4())
        if engine.home(queue, job_id) == shard:
            found.append(job_id)
    return found


def test_health_names_only_the_master_that_froze_under_a_sharded_queue(on_lonely):
    """A master that froze while a queue split over every master was checked (its ready
    list read after its stats) was reported with every other master of that queue as not
    answering: the queues checked after it, on healthy masters, failed "a key of it is on
    master <healthy>, which does not answer". Only the frozen master is named now, and the
    queues on the others pass."""
    cluster, client = on_lonely
    directory = owner(client, f"{{{PREFIX}}}:queues")
    by_master = queues_by_master(client)
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS=SPLIT)):
        engine = get_engine()
        # A split queue, and a master (not the directory's nor the queue's own name's)
        # holding one of its shards after a shard on another master.
        queue, first, second, address = next(
            (q, shards[i], shards[j], engine.node_of(shards[j]))
            for q in SPLIT
            if (shards := engine.shards(q))
            for i in range(len(shards))
            for j in range(i + 1, len(shards))
            if engine.node_of(shards[j]) not in {directory, engine.node_of(q)}
            and engine.node_of(shards[i]) != engine.node_of(shards[j])
        )
        victim = node(cluster, address)
        assert victim.pid is not None
        lost, healthy = apart(by_master, address, 1, 2)
        now = engine.server_time_ms()
        for shard in (first, second):
            engine.add(queue, dict.fromkeys(ids_in(engine, queue, shard), now - 1000))
        engine.promote(queue)
        assert engine.stats(first).ready == engine.stats(second).ready == 1

        def freeze(sender: object, **kwargs: Any) -> None:
            # The due time of the first shard's ready job is read from the database:
            # the victim stops before its own shard's ready list is read.
            if threading.current_thread().name == "delayjobs-database-read":
                connection_created.disconnect(freeze)
                os.kill(victim.pid, signal.SIGSTOP)

        limits = health.Limits(queues=(queue, *healthy, *lost), min_workers=0)
        connection_created.connect(freeze)
        try:
            checks = {c.name: c for c in health.run(engine, limits)}
        finally:
            connection_created.disconnect(freeze)
            os.kill(victim.pid, signal.SIGCONT)
    assert checks["redis"].ok and checks["database"].ok, checks
    assert not checks[f"overdue:{queue}"].ok
    for name in (f"{kind}:{q}" for q in healthy for kind in ("workers", "overdue")):
        assert checks[name].ok, checks[name]
    for name in (f"{kind}:{q}" for q in lost for kind in ("workers", "overdue")):
        assert not checks[name].ok, checks[name]
    others = {n.address for n in cluster.nodes} - {address}
    for check in checks.values():
        assert not any(other in check.detail for other in others), check


def test_the_queue_page_waits_for_a_frozen_master_once_not_once_per_queue(on_lonely):
    """The reads of the admin's queue page and the API's ``queues/`` with a master frozen
    (it takes connections and answers nothing): the pipeline of every queue fails, then
    each queue is read alone, and each one on the frozen master, or with a shard there,
    must not wait for it again (a page of many queues there outlasts the web server's
    timeout: a 502 where the queues of the other masters should show)."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 6, 2)
    split = ["s0", "s1"]
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS=SPLIT)):
        engine = get_engine()
        for queue in lost + healthy + split:
            engine.add(queue, {str(uuid.uuid4()): engine.server_time_ms() + 3_600_000})
        assert all(address in {engine.node_of(s) for s in engine.shards(q)} for q in split)
        names = sorted(lost + healthy + split)
        assert len(queues.readable_queue_states(names=names)[0]) == len(names)
        with frozen(node(cluster, address)):
            started = time.monotonic()
            states, errors, _ = queues.readable_queue_states(names=names)
            took = time.monotonic() - started
    assert {s.name for s in states} == set(healthy + split)
    assert set(errors) == set(lost)
    assert all(s.partial for s in states if s.name in split)
    assert took < 8 * SOCKET_TIMEOUT, took


def test_a_failed_read_of_the_directory_is_not_made_again_at_once(on_lonely):
    """With the directory's master frozen, the queue page's list of queues (a read of the
    directory that must name its failure) waited the client's timeout and retry, and the
    first read of the queues' shards right after waited for it again: a read that failed
    counts as a read for ``DIRECTORY_TTL``, as it does when it need not name its
    failure."""
    cluster, client = on_lonely
    directory = owner(client, f"{{{PREFIX}}}:queues")
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS=SPLIT)):
        get_engine().add("s0", {str(uuid.uuid4()): get_engine().server_time_ms() + 3_600_000})
        # A process that has not read the directory yet (a web process's first page).
        engine = Engine(redis_client(), prefix=PREFIX, shards=SPLIT)
        with frozen(node(cluster, directory)), contextlib.closing(engine):
            _, unlisted = queues.listed_queues(engine)
            assert "cannot be read" in unlisted
            started = time.monotonic()
            shards = engine.shards("s0")
            took = time.monotonic() - started
    assert len(shards) == 6
    assert took < SOCKET_TIMEOUT / 2, took  # a read of the frozen master waits it at least


def test_delayjobs_stats_shows_the_queues_of_the_masters_that_answer(on_lonely):
    """``delayjobs_stats`` with a master down printed no row at all, only that Redis is
    unreachable, when a queue of one shard had its keys there: the rows of the queues on
    the other masters are printed, the queue that cannot be read is named, exit 1."""
    cluster, client = on_lonely
    address, lost, healthy = off_directory(client, 1, 1)
    victim = node(cluster, address)
    out = io.StringIO()
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        for queue in lost + healthy:
            engine.add(queue, {str(uuid.uuid4()): engine.server_time_ms() + 3_600_000})
        cluster.kill(victim)
        try:
            with pytest.raises(CommandError) as failed:
                call_command("delayjobs_stats", *lost, *healthy, stdout=out)
        finally:
            cluster.restart(victim)
    printed = {line.split()[0] for line in out.getvalue().splitlines()[1:]}
    assert printed == set(healthy), out.getvalue()
    assert f"queue {lost[0]}" in str(failed.value) and address in str(failed.value)


@pytest.mark.parametrize("named", [True, False])
def test_delayjobs_stats_while_the_directory_s_master_is_down(on_lonely, named):
    """With the master of the directory of queues down, ``delayjobs_stats`` printed no row,
    even of a queue it was given by name on another master: the directory's read ended
    it. The queues named (or, unnamed, those last listed and those of the settings) are
    printed, and the command says the directory cannot be read (exit 1)."""
    cluster, client = on_lonely
    by_master = queues_by_master(client)
    directory = owner(client, f"{{{PREFIX}}}:queues")
    queue = next(q for a, qs in by_master.items() if a != directory for q in qs)
    victim = node(cluster, directory)
    out = io.StringIO()
    with override_settings(DELAYJOBS=settings_for(cluster, DEFAULT_QUEUE=queue)):
        engine = get_engine()
        engine.add(queue, {str(uuid.uuid4()): engine.server_time_ms() + 3_600_000})
        cluster.kill(victim)
        try:
            with pytest.raises(CommandError) as failed:
                call_command("delayjobs_stats", *([queue] if named else []), stdout=out)
        finally:
            cluster.restart(victim)
    printed = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert printed == [queue], out.getvalue()
    assert "directory of queues" in str(failed.value), failed.value
