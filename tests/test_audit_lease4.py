"""Audit of lease ownership, fourth pass: a waiting id that went unconfirmed for a while.

A waiting id of a batch whose lease no call has confirmed for ``LEASE_TRUSTED`` of the
lease is not started blind. It was let go at once: but while Redis still had it in flight
under this worker's own lease (extensions held back by a short Redis freeze, a stalled
housekeeping thread, one extension timing out), nobody extended that lease any more, a
burst's reconcile found it in flight and added nothing, and the burst exited 0 with the
job still waiting, for its lease to end and some later process to recover it."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import deque

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs import schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, close_client
from django_delayjobs.engine.claims import Claimer
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.testapp import tasks
from tests.testapp.models import Record

Q = "default"
HOUR = 3_600_000


def status(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


@pytest.mark.django_db(transaction=True)
def test_a_burst_runs_a_waiting_id_still_in_flight_under_its_own_lease(settings, monkeypatch):
    """The housekeeping thread sends no extension (stalled) while the batch's first job
    runs 1.7 s of a 2 s lease: the second id goes unconfirmed past the trusted 1.5 s, yet
    Redis still has it in flight under this worker's lease. It must be confirmed by one
    call and run, not let go and left in flight by a burst that exits 0."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 2}
    monkeypatch.setattr(WorkerProcess, "extend_leases", lambda self: None)
    a = build_job(tasks.slow, in_=0, args=["a", 1.7])
    b = build_job(tasks.record, in_=0, args=["b"])
    schedule_many([a, b])  # one add: one batch, in this order
    WorkerProcess(get_engine(), Options(queues=[Q], burst=True)).run()
    assert (status(a), status(b)) == (Status.SUCCEEDED, Status.SUCCEEDED)
    assert sorted(Record.objects.values_list("label", flat=True)) == ["a", "b"]
    assert get_engine().stats(Q).in_flight == 0


def test_a_stop_hands_back_waiting_ids_that_were_only_unconfirmed_for_long(engine):
    """A burst stopped by a signal hands back the ids its batch had not started. Those
    whose lease had gone unconfirmed for long were let go instead, though Redis still had
    them in flight under this worker's lease: left there, and the burst raised WorkerDied
    ("not put back in Redis") for jobs that were never lost."""
    ids = [str(uuid.uuid4()) for _ in range(2)]
    engine.add(Q, dict.fromkeys(ids, 0))
    worker = WorkerProcess(engine, Options(queues=[Q], burst=True))
    thread = threading.get_ident()
    worker.hold(Q, engine.claim(Q, 2, lease_ms=HOUR), sent=time.monotonic() - HOUR)
    assert [i for i in ids if worker.holds(i, thread)] == []  # unconfirmed for long
    assert worker.hand_back(Q, ids, thread)
    stats = engine.stats(Q)
    assert (stats.in_flight, stats.pending + stats.ready) == (0, 2)
    assert worker.let_gone == set()
    assert worker.held == {}


@pytest.mark.django_db(transaction=True)
def test_an_id_whose_lease_redis_cannot_confirm_is_not_taken_for_lost(own_redis):
    """The one call that asks about an id unconfirmed for long gets no answer (Redis
    frozen): the id is not run, nor counted as lost (a reconcile would find it in flight
    and add nothing); it may wait in flight under this worker's lease, and a burst must not
    end as if all was done."""
    assert own_redis.pid is not None
    client = redis.Redis.from_url(own_redis.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        engine = Engine(client, prefix="t")
        engine.add(Q, {"a": 0})
        worker = WorkerProcess(engine, Options(queues=[Q], burst=True))
        thread = threading.get_ident()
        worker.hold(Q, engine.claim(Q, 1, lease_ms=HOUR), sent=time.monotonic() - HOUR)
        engine.extend_lease(Q, ["b"], HOUR)  # its script loaded
        os.kill(own_redis.pid, signal.SIGSTOP)
        try:
            worker.hand_back(Q, ["a"], thread)
        finally:
            os.kill(own_redis.pid, signal.SIGCONT)
        assert (worker.let_gone, worker.unconfirmed, worker.held) == (set(), {"a"}, {})
        assert engine.stats(Q).in_flight == 1  # under this worker's lease
        with pytest.raises(WorkerDied, match="did not answer to confirm their lease"):
            worker.run()  # nothing else to do: the burst ends at once, non-zero
    finally:
        close_client(client)


def test_an_exit_counts_only_the_ids_it_handed_back(engine, caplog):
    """An exit hands back the ids never started, but not one whose lease was lost: it
    said "handed back 2" for the two ids of the queue when it had handed back one."""
    ids = [str(uuid.uuid4()) for _ in range(2)]
    engine.add(Q, dict.fromkeys(ids, 0))
    worker = WorkerProcess(engine, Options(queues=[Q]))
    worker.hold(Q, engine.claim(Q, 2, lease_ms=HOUR))
    with worker.held_lock:
        worker.lost.add(ids[0])  # an extension found it out of flight
    worker.hand_back_waiting()
    assert "handed back 1 job(s) that had not started" in caplog.text
    assert "handed back 2" not in caplog.text


# -- a held id's shard ----------------------------------------------------------------------


def held_from_an_old_shard(redis_client):  # type: ignore[no-untyped-def]
    """A worker of a queue now of 1 shard that claimed an id from one of its 2 old shards:
    the engine of the old count, the worker's engine, the worker and the id."""
    job_id = str(uuid.uuid4())
    before = Engine(redis_client, prefix="t", shards={Q: 2})
    before.add(Q, {job_id: 0})
    before.promote(Q)
    engine = Engine(redis_client, prefix="t", shards=1)
    worker = WorkerProcess(engine, Options(queues=[Q]))
    claimed = worker.claim([Q])
    assert claimed is not None and claimed[1] == [job_id]
    return before, engine, worker, job_id


def test_an_id_claimed_again_from_another_shard_is_held_by_that_one(redis_client):
    """An id held by an old shard of its queue, back in flight in its home shard (its
    lease ended there and the reconcile sweep added it again, or a claim by the queue's
    name took it there): held by the shard it was first claimed from, every extension
    looked for it there and found it lost."""
    before, engine, worker, job_id = held_from_an_old_shard(redis_client)
    old = worker.held[job_id][0]
    assert old.startswith(f"{Q}#")
    assert before.ack(old, [job_id]) == 1  # out of the old shard
    engine.add(Q, {job_id: 0})  # in its home shard now
    engine.promote(Q)
    assert worker.hold(Q, engine.claim(Q, 1, lease_ms=HOUR)) == []  # held already
    assert worker.held[job_id][0] == Q
    worker.extend_leases()
    assert job_id not in worker.lost


def test_a_running_id_adopted_in_its_home_shard_keeps_its_lease(redis_client):
    """An id claimed from an old shard runs here when Redis loses its data; the reconcile
    sweep adopts the running job in its home shard. Extended in the old shard (whoever
    holds it), it was found lost there, and its lease in the home shard, extended by
    nobody, ended: another worker ran it beside this one."""
    before, engine, worker, job_id = held_from_an_old_shard(redis_client)
    old = worker.held[job_id][0]
    execution = Execution(Q, job_id, worker.id)
    execution.row_claimed = True  # its row claimed: it runs
    worker.running[threading.get_ident()] = execution
    assert before.ack(old, [job_id]) == 1  # Redis lost it
    assert engine.adopt(Q, [job_id], lease_ms=1) == [job_id]  # in its home shard
    worker.extend_leases()
    assert job_id not in worker.lost
    assert worker.held[job_id][0] == Q
    time.sleep(0.01)
    assert engine.recover_expired(Q) == []  # its lease was extended
    assert engine.stats(Q).in_flight == 1


# -- a claim sent again -------------------------------------------------------------------


def test_a_claim_after_a_failed_one_that_takes_new_ids_trusts_them_from_its_sending(
    engine, settings
):
    """A claim failed (Redis never ran it), and the next one from that shard, sent again
    as the same call, took new ids: their leases were set by this sending, yet they were
    counted from the record's life before it (two thirds of the lease), and trusted for a
    twelfth of the lease rather than three quarters."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 3}
    process = WorkerProcess(engine, Options(queues=[Q]))
    claimer = Claimer()
    claimer.token(Q)  # a claim was sent, and failed before Redis ran it
    first = time.monotonic()
    while time.monotonic() - first < 2.5:  # sent again much later
        time.sleep(0.05)
    engine.add(Q, {str(uuid.uuid4()): 0})
    claimed = process.claim([Q], claimer)
    assert claimed is not None
    (job_id,) = claimed[1]
    time.sleep(0.5)  # past a twelfth of the lease (0.25 s), well within three quarters
    assert process.holds(job_id, threading.get_ident())


def test_a_claim_tells_the_ids_a_call_sent_again_returns(engine):
    """``Leased.replayed``: the ids a call sent again returned as its first sending took
    them, and none of those a call takes afresh."""
    claimer = Claimer()
    engine.add(Q, {"a": 0})
    token = claimer.token(Q)
    first = engine.claim(Q, 1, lease_ms=HOUR, token=token)
    assert (first, first.replayed) == (["a"], frozenset())
    again = engine.claim(Q, 1, lease_ms=HOUR, token=token)
    assert (again, again.replayed, again.leases) == (["a"], {"a"}, first.leases)


# -- second read: what a reconfirmation meets meanwhile -------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_burst_that_runs_an_id_it_had_left_unconfirmed_exits_0():
    """An id left unconfirmed (Redis did not answer the one call that asked about it) whose
    lease then ended is claimed again by the same burst and run: the burst did everything
    and must not exit non-zero for it (it was kept in ``unconfirmed`` for ever)."""
    (job,) = schedule_many([build_job(tasks.record, in_=0, args=["again"])])
    engine = get_engine()
    worker = WorkerProcess(engine, Options(queues=[Q], burst=True))
    worker.hold(Q, engine.claim(Q, 1, lease_ms=0))  # a lease that ended at once
    asked = {str(job.pk): worker.leases[str(job.pk)]}
    worker.leave(asked, threading.get_ident())  # as after a call with no answer
    assert worker.unconfirmed == {str(job.pk)}
    worker.run()  # recovers the lease, claims the id again and runs it: no WorkerDied
    assert status(job) == Status.SUCCEEDED
    assert worker.unconfirmed == set()


def stale_batch(
    engine: Engine, worker: WorkerProcess, ids: list[str], lease_ms: int = HOUR
) -> None:
    """Claim ``ids`` for ``worker`` as if an hour ago (no call has confirmed them since)."""
    engine.add(Q, dict.fromkeys(ids, 0))
    worker.hold(Q, engine.claim(Q, len(ids), lease_ms=lease_ms), sent=time.monotonic() - HOUR)


def test_an_id_claimed_again_while_it_was_asked_about_is_not_taken_for_lost(engine, monkeypatch):
    """The call that asks about an id unconfirmed for long finds it out of flight (its
    lease ended and was recovered); before its answer is recorded, this process claims the
    id again. That claim's lease is this process's: the id must be taken up, not marked
    lost and let go (left in flight under a lease nobody extends)."""
    worker = WorkerProcess(engine, Options(queues=[Q]))
    thread = threading.get_ident()
    stale_batch(engine, worker, ["a"], lease_ms=0)
    time.sleep(0.01)  # past the ms its lease ends in
    assert engine.recover_expired(Q) == ["a"]
    real = engine.extend_lease

    def extend_then_claimed_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        extended = real(*args, **kwargs)
        worker.hold(Q, engine.claim(Q, 1, lease_ms=HOUR))  # another thread's claim, here
        return extended

    monkeypatch.setattr(engine, "extend_lease", extend_then_claimed_again)
    assert worker.takes_up(Q, "a", thread, deque())
    assert "a" not in worker.lost


def test_an_id_found_lost_while_it_was_asked_about_is_not_started(engine, monkeypatch):
    """An extension of the housekeeping thread finds the id lost while the call asking
    about it is under way: the worker thread must not start it on that call's answer."""
    worker = WorkerProcess(engine, Options(queues=[Q]))
    thread = threading.get_ident()
    stale_batch(engine, worker, ["a"])
    real = engine.extend_lease

    def extend_then_found_lost(*args, **kwargs):  # type: ignore[no-untyped-def]
        extended = real(*args, **kwargs)
        with worker.held_lock:
            worker.lost.add("a")
        return extended

    monkeypatch.setattr(engine, "extend_lease", extend_then_found_lost)
    assert not worker.takes_up(Q, "a", thread, deque())


def test_a_batch_unconfirmed_for_long_is_asked_about_in_one_call(own_redis, monkeypatch):
    """Every id of a batch was claimed at once, so all go unconfirmed together: they are
    asked about in one call, and if Redis does not answer, left together (one timeout, not
    one per id of a batch of up to PREFETCH)."""
    assert own_redis.pid is not None
    client = redis.Redis.from_url(own_redis.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        engine = Engine(client, prefix="t")
        worker = WorkerProcess(engine, Options(queues=[Q], burst=True))
        thread = threading.get_ident()
        stale_batch(engine, worker, ["a", "b", "c"])
        calls = []
        real = engine.extend_lease
        monkeypatch.setattr(
            engine, "extend_lease", lambda *a, **k: calls.append(a) or real(*a, **k)
        )
        waiting = deque(["b", "c"])
        os.kill(own_redis.pid, signal.SIGSTOP)
        try:
            assert not worker.takes_up(Q, "a", thread, waiting)
        finally:
            os.kill(own_redis.pid, signal.SIGCONT)
        assert len(calls) == 1 and sorted(calls[0][1]) == ["a", "b", "c"]
        assert (list(waiting), worker.unconfirmed, worker.held) == ([], {"a", "b", "c"}, {})
    finally:
        close_client(client)
