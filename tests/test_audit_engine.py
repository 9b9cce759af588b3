"""Audit of the engine's timing and the Django layer's time handling: each test is a
failing reproduction of one bug (see its docstring for what is wrong and what is right)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from django_delayjobs import schedule
from django_delayjobs.connection import SOCKET_TIMEOUT
from django_delayjobs.engine import Engine, close_client
from django_delayjobs.promoter import Promoter


def test_promoter_is_woken_by_an_earlier_job_after_its_blpop_was_cut_short(redis_url):
    """The package's client has ``socket_timeout=1`` s, so ``wait_for_wake`` blocks at most
    0.5 s and returns False. ``Promoter.sleep`` (promoter.py:78-87) then sleeps the rest of
    the wait on ``self.stop.wait(remaining)``, where no wake token can reach it: with
    ``TICK_SECONDS = 5`` (allowed up to 60) a job scheduled 1 s into an idle promoter's
    sleep, due 100 ms later, is promoted about 4 s late (up to a whole tick). The design
    promises the promoter "is woken early when a job with an earlier due time is
    scheduled". Right: keep waiting on the wake list (in a loop) until the deadline less
    ``PRECISE_STRETCH``, so a wake token ends the sleep at any moment."""
    client = redis.Redis.from_url(redis_url, socket_timeout=SOCKET_TIMEOUT)
    engine = Engine(client, prefix="audit")
    stop = threading.Event()
    promoter = Promoter(engine, ["q"], tick=5.0, stop=stop)

    def loop() -> None:
        while not stop.is_set():
            promoter.sleep(promoter.step())

    thread = threading.Thread(target=loop, daemon=True)
    try:
        thread.start()
        time.sleep(1.0)  # the promoter is idle, sleeping one tick (nothing is pending)
        due = engine.server_time_ms() + 100
        engine.add("q", {"job": due})  # the earliest pending id: pushes a wake token
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and not client.sismember(
            engine.keys("q").ready_set, "job"
        ):
            time.sleep(0.01)
        late_ms = engine.server_time_ms() - due
        assert client.sismember(engine.keys("q").ready_set, "job"), (
            f"due 100 ms after it was added, still not promoted {late_ms} ms after its due time"
        )
    finally:
        stop.set()
        thread.join(10)
        close_client(client)


@pytest.mark.django_db(transaction=True)
def test_a_reschedule_between_a_failure_and_its_nack_is_not_overwritten(settings):
    """A failed attempt commits ``status='retrying', run_at=<retry time>`` first, and the
    worker nacks the id into pending afterwards, with the retry time it computed
    (outcomes.py:153-155: ``result.retry_at``). A ``job.reschedule(in_=0)`` committed in
    between wins in the database (the row is ``retrying``) and returns True, but its
    ``add`` finds the id in flight and leaves it alone; then the nack puts the id in
    pending at the *old* retry time. The job rescheduled to "now" runs only at the old
    retry time or when the next reconcile sweep re-adds it (up to ``RECONCILE_SECONDS``,
    60 s, later), not within tens of ms. Right: the nack (or reschedule) must leave Redis
    due at the row's current ``run_at``, e.g. nack with the due time read back from the
    row, or have reschedule of an in-flight id take effect when it is nacked."""
    from django_delayjobs.connection import get_engine
    from django_delayjobs.execution import Execution
    from django_delayjobs.models import Job
    from django_delayjobs.outcomes import Outcome, settle
    from django_delayjobs.timing import to_ms
    from tests.testapp import tasks

    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}
    engine = get_engine()
    job = schedule(tasks.fail, in_=0, max_attempts=3)
    (job_id,) = _wait(lambda: engine.promote("default") and engine.claim("default", 1))
    result = Execution("default", job_id, "w").run()  # the failure is committed
    assert result.outcome == Outcome.RETRYING
    assert job.reschedule(in_=5) is True  # a user asks for the retry sooner
    settle(engine, "default", job_id, result)  # the worker nacks its delivery
    row = Job.objects.get(pk=job.pk)
    score = engine.client.zscore(engine.keys("default").pending, job_id)
    assert score is not None
    late_s = (score - to_ms(row.run_at)) / 1000
    assert late_s <= 1, f"the row is due at {row.run_at}, Redis holds it {late_s:.1f} s later"


def _wait(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "still false"
        time.sleep(0.005)
    return value


def _places(engine, queue: str, job_id: str) -> list[str]:
    """Every (shard, structure) of ``queue`` that holds ``job_id``."""
    found = []
    for shard in engine.shards(queue):
        k = engine.keys(shard)
        for name, held in (
            ("pending", engine.client.zscore(k.pending, job_id) is not None),
            ("ready", engine.client.sismember(k.ready_set, job_id)),
            ("unack", engine.client.zscore(k.unack, job_id) is not None),
            ("garbage", engine.client.zscore(k.garbage, job_id) is not None),
        ):
            if held:
                found.append(f"{shard}:{name}")
    return found


@pytest.mark.django_db(transaction=True)
def test_reconcile_after_a_shard_count_change_does_not_copy_an_id_in_flight(settings):
    """After ``QUEUE_SHARDS`` changes, reconcile moves each waiting job to its shard under
    the new count: ``add`` there, then ``remove`` from the old shards (reconcile.py:151-158).
    A waiting row whose id is *in flight* in an old shard (claimed by a worker in a batch
    it has not reached yet, or the id of a running job past its lease, which reconcile
    also re-adds while its worker extends the lease) is not held by the new shard, so
    ``add`` puts a second copy there, and ``remove`` cannot take the in-flight one: Redis
    now holds the id twice. Two workers receive it; the second finds the row ``running``
    with ``deliveries < MAX_DELIVERIES`` and delivers the same attempt again while the
    first still runs it: the action runs twice. Right: an id held in flight (or ready) in
    an old shard is left there, as ``add`` leaves one held in its own shard: one place
    at a time, as the engine promises."""
    from django_delayjobs.connection import get_engine
    from django_delayjobs.reconcile import reconcile
    from tests.testapp import tasks

    job = schedule(tasks.record, in_=0, args=["once"], queue="orders")
    engine = get_engine()
    job_id = str(job.pk)
    (claimed,) = _wait(lambda: engine.promote("orders") and engine.claim("orders", 1))
    assert claimed == job_id  # a worker holds it in its batch; the row is still waiting
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 3}}
    engine = get_engine()
    assert engine.shard_count("orders") == 3
    reconcile(engine, horizon=None)
    assert _places(engine, "orders", job_id) == ["orders#0/1:unack"]


@pytest.mark.django_db(transaction=True)
def test_a_reschedule_after_a_shard_count_change_leaves_one_copy(settings):
    """``job.reschedule()`` hands the new due time to Redis with ``push`` -> ``Engine.add``
    (services.py:359), which routes the id to its shard under the *current* count and never
    looks at the shard of the old count that still holds it (``Engine.reschedule`` and
    ``Engine.remove`` do try those shards). After a ``QUEUE_SHARDS`` change the id is then
    pending twice: at the old time in the old shard, at the new time in the new one, and
    reconcile does not merge them (the new shard already holds it, so it is not "added"
    and not removed from the old one). The old copy fires at the old time and is deferred
    to the new ``run_at`` in the old shard; at that time both copies are delivered, and the
    second worker finds the row ``running`` with ``deliveries < MAX_DELIVERIES`` and runs
    the same attempt again. Right: one copy, due at the new time (move the id out of the
    old shard, as cancel finds it there)."""
    from django_delayjobs.connection import get_engine
    from tests.testapp import tasks

    job = schedule(tasks.record, in_=60, args=["once"], queue="orders")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 3}}
    engine = get_engine()
    assert engine.shard_count("orders") == 3
    assert job.reschedule(in_=120) is True
    places = _places(engine, "orders", str(job.pk))
    assert len(places) == 1, f"held {len(places)} times: {places}"
