"""Audit of sharded queues, second round: races right after a change of a queue's shard
count (``QUEUE_SHARDS``), between a worker's or reconcile's move and the sweep's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, Result, settle
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import reschedule
from django_delayjobs.timing import to_ms
from tests.test_audit_rv4 import HOUR, Q, any_client, now_ms
from tests.test_audit_shd import holders, shards
from tests.testapp import tasks

__all__ = ["any_client"]  # a fixture, used by name


def resharded(cls: type[Engine], claimer: Engine | None = None) -> Engine:
    """An engine of ``cls`` with "orders" split 4 ways, on the session's Redis; given the
    engine that claimed an id, with its holder: the worker that claimed the id nacks it (a
    nack moves only an id under its own engine's lease, see test_audit_nack)."""
    base = get_engine()
    engine = cls(base.client, prefix=base.prefix, shards={"orders": 4})
    if claimer is not None:
        engine._holder = claimer._holder
    return engine


def claimed_in_the_old_shard(settings: Any) -> tuple[Job, Engine]:
    """A job of "orders" claimed (in flight) in its shard of 1, and the engine that
    claimed it; then "orders" has 4."""
    job = schedule(tasks.record, in_=0, args=["x"], queue="orders")
    claimer = get_engine()
    assert claimer.claim("orders", 1, HOUR) == [str(job.pk)]
    shards(settings, 4)
    return job, claimer


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [Status.RETRYING, Status.CANCELLED])
def test_a_nack_followed_in_an_old_shard_leaves_the_id_in_one_shard_at_most(settings, status):
    """The worker's nack of a retry goes to the old shard the id was claimed from; the
    read of the row after it added (or removed) the id there by the shard's name. A sweep
    that moved the id to its new shard in between left a second copy pending (a second
    delivery, of a job that may be running by then) or, for a job cancelled meanwhile, a
    stray one."""
    job, claimer = claimed_in_the_old_shard(settings)
    job_id = str(job.pk)
    run_at = timezone.now() + timedelta(hours=2)  # rescheduled after the attempt committed
    Job.objects.filter(pk=job.pk).update(status=status, attempts=1, run_at=run_at)
    nacked = timezone.now() + timedelta(minutes=1)

    class SweptAfterNack(Engine):
        def nack(self, queue: str, items: Any) -> int:
            moved = super().nack(queue, items)
            # the sweep's add, of the row as it read it before the reschedule or cancel
            assert self.add("orders", {job_id: to_ms(nacked)}).moved == [job_id]
            return moved

    engine = resharded(SweptAfterNack, claimer)
    settle(engine, "orders#0/1", job_id, Result(Outcome.RETRYING, job, retry_at=nacked))
    assert len(holders(job_id)) == (status == Status.RETRYING)
    if status == Status.RETRYING:
        assert engine.next_due("orders") == [(job_id, int(to_ms(run_at)))]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [Status.SCHEDULED, Status.DEAD, Status.SUCCEEDED])
def test_reconcile_settles_an_id_it_adopted_in_an_old_shard_there(settings, status):
    """A running job whose id an old shard holds in garbage is put in flight there
    (``adopt``). If its row has changed since the sweep read it (requeued, dead, done),
    the sweep's nack, bury or ack went to the id's new shard, missed it, and the id stayed
    in flight until its lease ended: a requeued job ran 5 minutes late, in silence."""
    job = schedule(tasks.record, in_=0, args=["x"], queue="orders")
    job_id = str(job.pk)
    assert get_engine().claim("orders", 1, HOUR) == [job_id]
    assert get_engine().bury("orders", [job_id]) == 1  # a snapshot from while it was dead
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, attempts=1, deliveries=1)
    shards(settings, 4)

    class ChangedAfterAdopt(Engine):
        def adopt(self, queue: str, ids: Any, lease_ms: float) -> list[str]:
            adopted = super().adopt(queue, ids, lease_ms)
            Job.objects.filter(pk=job.pk).update(status=status)
            return adopted

    engine = resharded(ChangedAfterAdopt)
    reconcile(engine, ids=[job_id])
    stats = engine.stats("orders")
    assert stats.in_flight == 0
    assert (stats.pending + stats.ready, stats.garbage) == (
        status == Status.SCHEDULED,
        status == Status.DEAD,
    )


@pytest.mark.parametrize("move", ["ack", "nack", "bury"])
def test_moves_by_queue_name_reach_an_id_in_flight_in_an_old_shard(any_client, move):
    """The engine's side of the test above, on one Redis and on a Cluster."""
    old = Engine(any_client, prefix="t")
    old.add(Q, {"X": 0})
    assert old.claim(Q, 1, HOUR) == ["X"]
    new = Engine(any_client, prefix="t", shards={Q: 4})
    new._holder = old._holder  # the claimer's: a nack moves only its own engine's ids
    done = {"ack": lambda: new.ack(Q, ["X", "Y"]), "nack": lambda: new.nack(Q, {"X": 0}),
            "bury": lambda: new.bury(Q, ["X"])}[move]()  # fmt: skip
    assert done == 1
    stats = new.stats(Q)
    assert (stats.in_flight, stats.pending, stats.garbage) == (0, move == "nack", move == "bury")


@pytest.mark.django_db(transaction=True)
def test_a_reschedule_pushed_before_a_retry_s_follow_up_add_is_not_undone():
    """After a retry's nack, the row's due time (rescheduled while the attempt ran) is read
    and added. A reschedule that committed and pushed between that read and that add was
    undone by it: Redis held the older time (the job ran late, until a reconcile sweep,
    or early, and was deferred). The add is read back too now, as a reschedule's push is
    (one rule, ``follow_row``, for both)."""
    job = schedule(tasks.record, in_=0, args=["x"])
    job_id = str(job.pk)
    assert get_engine().claim("default", 1, HOUR) == [job_id]
    later, soon = (timezone.now() + timedelta(minutes=m) for m in (60, 5))
    Job.objects.filter(pk=job.pk).update(status=Status.RETRYING, attempts=1, run_at=later)
    done: list[bool] = []

    class RescheduledBeforeAdd(Engine):
        def add(self, queue: str, items: Any, *args: Any, **kwargs: Any) -> Any:
            if not done:  # its push and read-back go through the app's engine
                done.append(reschedule(job, at=soon))
            return super().add(queue, items, *args, **kwargs)

    base = get_engine()
    engine = RescheduledBeforeAdd(base.client, prefix=base.prefix)
    engine._holder = base._holder  # the claimer's: a nack moves only its own engine's ids
    nacked = timezone.now() + timedelta(minutes=1)
    settle(engine, "default", job_id, Result(Outcome.RETRYING, job, retry_at=nacked))
    assert done == [True]
    assert engine.next_due("default") == [(job_id, int(to_ms(soon)))]


@pytest.mark.parametrize("move", ["ack", "purge"])
def test_an_ack_or_purge_keeps_the_priority_of_an_id_it_did_not_hold(engine, move):
    """``ack`` (in flight) and ``purge`` (in garbage) deleted the priority of every id
    given, held or not: one pending again for its next attempt (a dead job requeued while
    the admin's purge of it was on its way, for one) lost its priority."""
    engine.add(Q, {"done": 0})
    assert engine.claim(Q, 1, HOUR) == ["done"]
    if move == "purge":
        assert engine.bury(Q, ["done"]) == 1
    engine.add(Q, {"next": now_ms(engine.client) + HOUR}, {"next": 50})
    assert getattr(engine, move)(Q, ["done", "next"]) == 1
    assert engine.client.hget(engine.keys(Q).priority, "next") == b"50"


def test_overview_of_one_queue_name_is_refused_not_read_letter_by_letter(engine):
    with pytest.raises(TypeError, match="list of queue names"):
        engine.overview("orders")


@pytest.mark.parametrize("ttl", [1e19, 2**63 - 1, 2**63])
def test_a_turn_longer_than_redis_can_hold_is_a_value_error(engine, ttl):
    """An absurd ttl is the caller's error (``ValueError``), not Redis's refusal, which
    read as Redis unavailable (``EngineUnavailable``)."""
    with pytest.raises(ValueError, match="ttl"):
        engine.take_turn("prune", ttl)
