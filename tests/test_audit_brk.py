"""Audit of the Cluster's claim breaker (``pytest -m cluster``): a queue whose shard count
changed spans shards on several masters, and the master of one old shard freezes.

The worker claimed such a queue by its name, which the engine serves from every shard it
has, the old ones too: a claim that met the frozen shard after another had given ids came
back with the failure inside ``Leased.failure``, tripped no breaker, and every claim that
reached that shard waited for the client's timeout. One that met it first raised, and
opened the breaker of the queue's own master (the healthy one). The promoter promoted and
recovered the queue's shard of 1 by the queue's name too, and opened that breaker the
same way, for the worker's claims as well (they share it)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_delayjobs import promoter, schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, EngineUnavailable
from django_delayjobs.engine.claims import Claimer
from django_delayjobs.engine.engine import checked_source
from django_delayjobs.models import Job, Status
from django_delayjobs.worker import Backoff, Options, WorkerProcess
from tests.test_audit_cls3 import PREFIX, node, settings_for
from tests.test_audit_hlt import frozen
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

#: A claim slower than this met a master that did not answer (the timeout is 1 s).
SLOW = 0.9

#: How long a master that did not answer is passed over, here: the 5 s of the setting
#: might end, on a loaded machine, before the healthy shards' jobs have all run.
SKIP = 12.0


def split_queue(client: Any) -> tuple[str, str]:
    """A queue name and one of its shards of 2 whose master holds neither its shard of 1
    nor the directory of queues (read again every few seconds)."""
    directory = client.get_node_from_key(f"{{{PREFIX}}}:queues").name
    for n in range(1000):
        queue = f"split{n}"
        engine = Engine(client, prefix=PREFIX, shards={queue: 2})
        for old in (f"{queue}#0/2", f"{queue}#1/2"):
            master = engine.node_of(old)
            if master not in (directory, engine.node_of(f"{queue}#0/1")):
                return queue, old
    raise AssertionError("no such queue")


def claim_and_run(process: WorkerProcess, queue: str, claimer: Claimer) -> tuple[float, list[str]]:
    """One claim of the worker, and the run of what it took; return how long the claim
    took and the ids it returned."""
    started = time.monotonic()
    try:
        found = process.claim([queue], claimer)
    except EngineUnavailable:
        found = None
    took = time.monotonic() - started
    if found is None:
        return took, []
    process.run_batch(*found, Backoff(process.stopping, "worker", process.database))
    return took, found[1]


def split_with_jobs(cluster: Any, client: Any) -> tuple[str, str, Any]:
    """A queue split in 2 with jobs, then back to 1 (its old shards still listed), and the
    node of the master of an old shard that holds neither its shard of 1 nor the
    directory (see ``split_queue``)."""
    queue, old = split_queue(client)
    victim = node(cluster, Engine(client, prefix=PREFIX, shards={queue: 2}).node_of(old))
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={queue: 2})):
        for n in range(30):
            schedule(tasks.record, in_=0, args=[f"old-{n}"], queue=queue)
    return queue, old, victim


def test_a_frozen_old_shard_costs_one_claim_its_timeout_then_is_passed_over(on_lonely, monkeypatch):
    """A queue split in 2 then back to 1: its shard of 1 and its old shards are served
    together. The master of one old shard freezes: the first claim that meets it waits
    for the timeout, the next ones pass over it (its master's breaker) and return the
    other shards' ids at once. Once it answers again, after the breaker's cool-down, its
    ids are claimed and run: none lost, none run twice (the ids its timed-out claim took
    once Redis ran it come back with that claim's token, not after their lease)."""
    monkeypatch.setattr(promoter, "SKIP_SECONDS", SKIP)
    cluster, client = on_lonely
    queue, old = split_queue(client)
    victim = node(cluster, Engine(client, prefix=PREFIX, shards={queue: 2}).node_of(old))
    with override_settings(DELAYJOBS=settings_for(cluster, QUEUE_SHARDS={queue: 2})):
        jobs = [schedule(tasks.record, in_=0, args=[f"old-{n}"], queue=queue) for n in range(30)]
        stuck = {str(j.pk) for j in jobs if get_engine().home(queue, str(j.pk)) == old}
    with override_settings(DELAYJOBS=settings_for(cluster)):  # back to 1 shard
        jobs += [schedule(tasks.record, in_=0, args=[f"new-{n}"], queue=queue) for n in range(20)]
        engine = get_engine()
        assert set(engine.shards(queue)) == {queue, f"{queue}#0/2", f"{queue}#1/2"}
        assert 0 < len(stuck) < 30
        process = WorkerProcess(engine, Options(queues=[queue]))
        process.prefetch = 4  # several claims, each meeting the shards in turn
        claimer = Claimer()
        everyone = {str(j.pk) for j in jobs}
        claimed: list[str] = []
        slow = 0
        with victim.client() as direct:  # as once any worker has claimed there
            direct.script_load(checked_source("claim"))
        with frozen(victim):
            started = time.monotonic()
            while set(claimed) != everyone - stuck:
                took, ids = claim_and_run(process, queue, claimer)
                claimed += ids
                slow += took > SLOW
                assert time.monotonic() - started < 60, (slow, len(claimed))
            passed = time.monotonic() - started
            assert slow == 1, f"{slow} claims waited for the frozen master ({passed:.1f} s)"
            assert passed < SKIP  # all within the breaker's first opening
        deadline = time.monotonic() + SKIP + 15
        while set(claimed) != everyone:
            claimed += claim_and_run(process, queue, claimer)[1]
            assert time.monotonic() < deadline, f"missing: {everyone - set(claimed)}"
            time.sleep(0.05)
        assert Counter(claimed) == Counter(everyone)  # each claimed once
        labels = Counter(Record.objects.values_list("label", flat=True))
        assert labels == Counter([f"old-{n}" for n in range(30)] + [f"new-{n}" for n in range(20)])
        assert set(Job.objects.values_list("status", flat=True)) == {Status.SUCCEEDED}
        assert all(engine.stats(s).in_flight == 0 for s in engine.shards(queue))


def test_the_guard_opens_the_breaker_on_a_failure_handed_to_it(on_lonely):
    """A call that returned a failure with its results (``Leased.failure``) "succeeded":
    the guard around it opens its master's breaker if the block hands it that failure,
    and a failure that says nothing of the master's reach (a key of the wrong type) opens
    nothing."""
    cluster, client = on_lonely
    queue, old = split_queue(client)
    with override_settings(DELAYJOBS=settings_for(cluster)):
        breaker = promoter.Breaker(get_engine())
        wrong = EngineUnavailable("WRONGTYPE Operation against a key holding the wrong kind")
        with breaker.guard(old) as trip:
            trip(wrong)
        with breaker.guard(old):  # not passed over
            pass
        timeout = EngineUnavailable("Redis is unreachable: Timeout reading from socket")
        timeout.__cause__ = redis.TimeoutError("Timeout reading from socket")
        with breaker.guard(old) as trip:
            trip(timeout)
        with pytest.raises(EngineUnavailable, match="passed over"), breaker.guard(old):
            pass
        with breaker.guard(queue):  # another master's shard: not passed over
            pass


def test_a_claim_whose_drop_was_not_answered_opens_its_masters_breaker(on_lonely, monkeypatch):
    """The worker's claim of a shard took another program's member with the jobs' ids, and
    its master froze before the second call, which takes that member out of flight again:
    the claim returned the ids with the timeout (``Leased.failure``), and the next claims
    met the frozen master again. The worker hands that failure to the guard: the master
    is passed over."""
    monkeypatch.setattr(promoter, "SKIP_SECONDS", SKIP)
    cluster, client = on_lonely
    queue = split_queue(client)[0]
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        shard = f"{queue}#0/1"
        victim = node(cluster, engine.node_of(shard))
        ids = [str(schedule(tasks.record, in_=0, args=["a"], queue=queue).pk) for _ in range(2)]
        k = engine.keys(shard)
        client.rpush(k.ready, b"bad id")
        client.sadd(k.ready_set, b"bad id")
        run = engine._run

        def freezing(name: str, *args: Any) -> Any:
            if name == "ack":  # the drop, right after the claim answered
                os.kill(victim.pid, signal.SIGSTOP)
            return run(name, *args)

        monkeypatch.setattr(engine, "_run", freezing)
        process = WorkerProcess(engine, Options(queues=[queue]))
        process.prefetch = 10  # the two ids and the member, in one claim
        try:
            found = process.claim([queue], Claimer())
            assert found is not None and sorted(found[1]) == sorted(ids)
            breaker = process.promoter.breaker
            with pytest.raises(EngineUnavailable, match="passed over"), breaker.guard(queue):
                pass
        finally:
            os.kill(victim.pid, signal.SIGCONT)


def test_the_promoter_passes_over_the_frozen_master_of_an_old_shard_alone(on_lonely, monkeypatch):
    """The promoter promoted, and recovered the expired leases of, the queue's shard of 1
    by the queue's name, which the engine serves from its old shards too: the frozen old
    shard's timeout opened the breaker of the healthy master of the shard of 1, which the
    worker's claims share, and that shard's jobs were passed over with it. Its look for
    empty old shards, each second, was guarded by no breaker: it waited for the timeout
    at each pass."""
    monkeypatch.setattr(promoter, "SKIP_SECONDS", SKIP)
    cluster, client = on_lonely
    queue, old, victim = split_with_jobs(cluster, client)
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        assert set(engine.shards(queue)) == {queue, f"{queue}#0/2", f"{queue}#1/2"}
        process = WorkerProcess(engine, Options(queues=[queue]))
        breaker = process.promoter.breaker
        with frozen(victim):
            with pytest.raises(EngineUnavailable):
                process.promoter.promote_due()
            started = time.monotonic()  # recovers leases, forgets empty old shards
            process.promoter.housekeeping(started, process.promoter.new_pass())
            assert time.monotonic() - started < SLOW  # passed over: no 1 s timeout
            with pytest.raises(EngineUnavailable, match="passed over"), breaker.guard(old):
                pass
            with breaker.guard(queue):  # the healthy master of the shard of 1
                pass


def test_looking_for_empty_old_shards_blames_no_healthy_master(on_lonely):
    """An empty old shard is forgotten after its counters are folded into the queue's
    current shard, on another master: that master frozen, the fold's timeout was blamed
    on the old shard's (healthy) master, whose shards the worker's claims then passed
    over too. The guard covers the look at the old shard alone. (The shard is listed by
    the add of an engine of its count.)"""
    cluster, client = on_lonely
    directory = client.get_node_from_key(f"{{{PREFIX}}}:queues").name
    for n in range(1000):
        queue = f"fold{n}"
        engine = Engine(client, prefix=PREFIX, shards={queue: 2})
        current = engine.node_of(f"{queue}#0/1")
        olds = [s for s in (f"{queue}#0/2", f"{queue}#1/2") if engine.node_of(s) != current]
        if current != directory and any(engine.node_of(s) != directory for s in olds):
            old = next(s for s in olds if engine.node_of(s) != directory)
            break
    else:
        raise AssertionError("no such queue")
    job_id = next(
        i for i in (str(uuid.uuid4()) for _ in range(100)) if engine.home(queue, i) == old
    )
    engine.add(queue, {job_id: 0})  # run and acked there: empty, with counters to fold
    engine.promote(old)
    assert engine.claim(old, 1) == [job_id]
    engine.ack(old, [job_id])
    with override_settings(DELAYJOBS=settings_for(cluster)):
        engine = get_engine()
        assert old in engine.shards(queue)
        process = WorkerProcess(engine, Options(queues=[queue]))
        with frozen(node(cluster, current)):
            process.promoter.housekeeping(time.monotonic(), process.promoter.new_pass())
            with process.promoter.breaker.guard(old):  # its master answered: not passed over
                pass
