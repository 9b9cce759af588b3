"""Audit of lease ownership, third pass: what a worker cut off from Redis still starts.

A worker thread claims a batch and runs its jobs one by one; the housekeeping thread
extends their leases. An extension that finds a waiting id under another worker's lease
marks it lost, and it is not started. But an extension that fails (Redis frozen, or cut
off) marks nothing: once the lease had ended and another worker had claimed the id, the
first worker, its database still answering, started it all the same when the job before
it ended, beside the other worker."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from django_delayjobs import schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import MAX_BATCH, Engine
from django_delayjobs.engine.claims import Claimer
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from django_delayjobs.worker import Backoff, Options, WorkerProcess
from tests.helpers import in_thread, wait_for
from tests.test_audit_lse import another
from tests.testapp import tasks
from tests.testapp.models import Record

Q = "default"
HOUR = 3_600_000


def status(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_id_whose_lease_may_have_ended_unnoticed_is_not_started(
    settings, tmp_path, caplog
):
    """The batch's first job runs past the lease while no extension reaches Redis (here,
    none is sent: a frozen Redis fails them, which marks nothing lost). The second id's
    lease ends, and another worker claims it; once the first job is over, the worker must
    not start the second one: its lease was last confirmed more than a lease ago."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}
    engine = get_engine()
    go = tmp_path / "go"
    a = build_job(tasks.wait_for_file_outside, in_=0, args=[str(go), 60.0])
    b = build_job(tasks.record, in_=0, args=["b"])
    schedule_many([a, b])
    wait_for(lambda: engine.promote(Q) and engine.stats(Q).ready == 2)
    process = WorkerProcess(engine, Options(queues=[Q]))

    def work() -> None:  # claimed in the thread that runs them, as a worker thread does
        claimed = process.claim([Q])
        assert claimed is not None and claimed[1] == [str(a.pk), str(b.pk)]
        process.run_batch(*claimed, Backoff(process.stopping, "test"))

    done: list[Any] = []
    worker = in_thread(work, done)
    try:
        wait_for(lambda: status(a) == Status.RUNNING)
        assert sorted(wait_for(lambda: engine.recover_expired(Q), timeout=5)) == sorted(
            [str(a.pk), str(b.pk)]
        )
        assert str(b.pk) in another(engine).claim(Q, 2, lease_ms=HOUR)  # another worker's
    finally:
        go.touch()
        worker.join(30)
    assert done == [None]
    assert status(a) == Status.SUCCEEDED
    assert not Record.objects.filter(label="b").exists()  # left to the other worker
    assert status(b) == Status.SCHEDULED
    assert f"job {b.pk}: its lease was lost before it started" in caplog.text
    assert engine.stats(Q).in_flight == 1  # b, under the other worker's lease


def test_a_claim_sent_again_counts_its_leases_from_its_first_sending(engine, settings):
    """A claim whose reply was lost is sent again as the same call, which returns the ids
    the first sending took, under the lease it set then: up to the claim record's life (two
    thirds of the lease) earlier. Counted from the second sending, the worker trusted them
    for that much longer than their lease could last."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 3}
    process = WorkerProcess(engine, Options(queues=[Q]))
    claimer = Claimer()
    engine.add(Q, {str(uuid.uuid4()): 0})
    first = time.monotonic()
    taken = engine.claim(Q, 1, lease_ms=3000, token=claimer.token(Q))  # its reply lost
    wait_for(lambda: time.monotonic() - first > 1.5)  # sent again later
    claimed = process.claim([Q], claimer)
    assert claimed is not None and claimed[1] == taken
    (job_id,) = claimed[1]
    thread = threading.get_ident()
    # Trusted for the three quarters of the lease from the first sending (0.75 s left),
    # not from the second (2.25 s).
    wait_for(lambda: not process.holds(job_id, thread), timeout=1.2)


# -- smaller lease items ------------------------------------------------------------------


def test_an_extension_given_a_claims_reply_keeps_only_the_leases_it_names(engine):
    """What a claim returns (a ``Leased``) passed to ``extend_lease`` as it is, rather than
    its ``.leases``: as a list it meant "whoever holds them", and took over the lease of
    the worker that claimed the id once the first claimer's had ended."""
    engine.add(Q, {"a": 0})
    claimed = engine.claim(Q, 1, lease_ms=0)
    assert engine.recover_expired(Q) == ["a"]
    assert another(engine).claim(Q, 1, lease_ms=HOUR) == ["a"]
    assert engine.extend_lease(Q, claimed, HOUR) == []
    assert engine.extend_lease(Q, ["a"], HOUR) == ["a"]  # a plain list: whoever holds it


def test_a_worker_holding_more_than_a_call_takes_extends_and_hands_back_them_all(engine):
    """Two worker threads with ``PREFETCH`` 5000 hold more ids of one queue than one engine
    call takes (``MAX_BATCH``): the extension raised ValueError, which killed the
    housekeeping thread (and the process), and so did handing them back at exit."""
    ids = [str(uuid.uuid4()) for _ in range(MAX_BATCH + 1)]
    engine.add(Q, dict.fromkeys(ids[:MAX_BATCH], 0))
    engine.add(Q, dict.fromkeys(ids[MAX_BATCH:], 0))
    worker = WorkerProcess(engine, Options(queues=[Q]))
    held = worker.hold(Q, engine.claim(Q, MAX_BATCH, lease_ms=1))
    held += worker.hold(Q, engine.claim(Q, 1, lease_ms=1))
    assert sorted(held) == sorted(ids)
    wait_for(lambda: engine.stats(Q).expired_leases == len(ids))
    worker.extend_leases()
    assert engine.stats(Q).expired_leases == 0
    worker.hand_back_waiting()
    stats = engine.stats(Q)
    assert (stats.in_flight, stats.pending + stats.ready) == (0, len(ids))


@pytest.mark.parametrize("by", ["worker", "engine"])
def test_ids_claimed_from_a_shard_of_an_older_count_keep_their_lease(redis_client, by):
    """``QUEUE_SHARDS`` of a queue changed from 2 to 1: a worker claims by the queue's name
    (its shard of 1), which claims from the older shards too while they hold ids. It held
    them under that name, and extended them by it, which looks in the shard of 1 only:
    every id was found lost and none started (each left in flight until its lease ended).
    The worker now claims each shard alone, the old ones by their own names, in turn;
    claimed as ``Engine.claim`` by the queue's name does, each id is held under the shard
    it came from (``Leased.shards``)."""
    ids = [str(uuid.uuid4()) for _ in range(6)]
    before = Engine(redis_client, prefix="t", shards={Q: 2})
    before.add(Q, dict.fromkeys(ids, 0))
    before.promote(Q)
    engine = Engine(redis_client, prefix="t", shards=1)
    worker = WorkerProcess(engine, Options(queues=[Q]))
    claimed: list[str] = []
    if by == "worker":
        for _ in engine.shards(Q):  # every shard's turn
            found = worker.claim([Q])
            claimed += found[1] if found is not None else []
    else:
        leased = engine.claim(Q, 10)
        assert leased.shards == {i: before.home(Q, i) for i in ids}  # old shards' names
        claimed = worker.hold(Q, leased)
    assert sorted(claimed) == sorted(ids)
    worker.extend_leases()
    assert [i for i in ids if not worker.holds(i, threading.get_ident())] == []
    worker.hand_back_waiting()
    assert engine.stats(Q).in_flight == 0
