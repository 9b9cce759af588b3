"""Audit of sharded queues (QUEUE_SHARDS) and a change of a queue's shard count."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, PartlyUnavailable, WrongType
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import reschedule
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def shards(settings, count: int) -> None:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": count}}


def holders(job_id: str) -> list[str]:
    """Every shard of "orders" (served or not) that holds ``job_id`` pending or ready."""
    engine = get_engine()
    found = []
    for name in engine.shards("orders"):
        keys = engine.keys(name)
        if engine.client.zscore(keys.pending, job_id) is not None or engine.client.sismember(
            keys.ready_set, job_id
        ):
            found.append(name)
    return found


@pytest.mark.parametrize("in_", [7200, 0])
def test_a_reschedule_of_a_job_in_a_shard_of_the_old_count_leaves_one_copy(settings, in_):
    """Reschedule (and the admin's "run now", a reschedule to now) added the id to its
    shard under the new count and left it waiting in its old shard: two copies, the queue's
    pending count one too high, and the old copy, deferred to the row's due time, came
    back with the new one: two deliveries of one job at once (a running job is delivered
    again to the worker that claims its other copy)."""
    job = schedule(tasks.record, in_=3600, args=["x"], queue="orders")
    shards(settings, 4)
    assert get_engine().old_shards("orders") == ["orders#0/1"]
    assert reschedule(job, in_=in_) is True
    assert len(holders(str(job.pk))) == 1
    stats = get_engine().stats("orders")
    assert stats.pending + stats.ready == 1
    if in_ == 0:
        call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
        assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
        assert Record.objects.filter(label="x").count() == 1
        assert len(holders(str(job.pk))) == 0


def test_reconcile_adopts_no_running_job_whose_id_is_in_flight_in_an_old_shard(settings):
    """Reconcile puts a running job that Redis holds nowhere back in flight (``adopt``). It
    looked in the job's shard under the new count only: every job running in a shard of
    the old count got a second copy in flight, which recover_expired handed to another
    worker once that copy's lease ran out (its worker extends the lease of the first):
    a long job delivered twice at once, and the queue's in-flight count one too high."""
    job = schedule(tasks.record, in_=0, args=["r"], queue="orders")
    engine = get_engine()
    assert engine.claim("orders", 1, 60_000) == [str(job.pk)]
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, attempts=1, deliveries=1)
    shards(settings, 4)
    engine = get_engine()
    reconcile(engine, horizon=None)
    assert engine.stats("orders").in_flight == 1
    assert engine.stats("orders#0/1").in_flight == 1


def test_an_add_under_a_new_count_moves_waiting_ids_and_leaves_busy_ones(redis_client):
    """The engine's side of the two tests above: an add by queue name takes an id waiting
    in a shard of an older count out of it (``moved``), and adds none that such a shard
    holds in flight or in garbage."""
    old = Engine(redis_client, prefix="t")
    now = old.server_time_ms()
    old.add("q", {"flying": now, "dead": now, "ready": now, "later": now + 3_600_000})
    assert old.claim("q", 2, 60_000) == ["flying", "dead"]
    assert old.bury("q", ["dead"]) == 1
    new = Engine(redis_client, prefix="t", shards={"q": 4})
    result = new.add("q", dict.fromkeys(["flying", "dead", "ready", "later", "new"], now))
    assert result == ["new"] and sorted(result.moved) == ["later", "ready"]
    was = new.stats("q#0/1")
    assert (was.pending, was.ready, was.in_flight, was.garbage) == (0, 0, 1, 1)
    total = new.stats("q")
    assert (total.pending, total.ready, total.in_flight, total.garbage) == (0, 3, 1, 1)
    assert sorted(new.claim("q", 10, 60_000)) == ["later", "new", "ready"]
    # No second copy: "flying" stays in flight there; "dead" (a running job's, by the
    # caller: adopt is for running jobs) goes from garbage into flight there, as adopt does
    # in an id's own shard.
    assert sorted(new.adopt("q", ["flying", "dead", "gone"], 60_000)) == ["dead", "gone"]
    was = new.stats("q#0/1")
    assert (was.pending, was.ready, was.in_flight, was.garbage) == (0, 0, 2, 0)


def test_an_id_claimed_from_its_old_shard_during_the_move_is_not_left_in_the_new(redis_client):
    """The add runs first, the take-out second (an add that fails leaves the id where it
    was): a worker of the old count that claims the id in between keeps it, and the copy
    just added to the new shard is taken out again."""
    old = Engine(redis_client, prefix="t")
    now = old.server_time_ms()
    old.add("q", {"a": now})

    class ClaimedBetween(Engine):
        def _run(self, name, keys, args):  # type: ignore[no-untyped-def]
            if name == "withdraw" and args[0] == 1:  # the take-out, after the add
                assert old.claim("q", 1, 60_000) == ["a"]
            return super()._run(name, keys, args)

    new = ClaimedBetween(redis_client, prefix="t", shards={"q": 4})
    assert new.add("q", {"a": now}) == []
    total = new.stats("q")
    assert (total.pending, total.ready, total.in_flight) == (0, 0, 1)


def test_a_directory_of_the_wrong_type_stops_no_queue(settings, caplog):
    """The directory of queues (``{<prefix>}:queues``) overwritten by another program with
    a key of another type: every queue is still served, and nothing is lost."""
    shards(settings, 3)
    engine = get_engine()
    engine.client.set(engine.queues_key, "not a set")
    jobs = [schedule(tasks.record, in_=0, args=[f"d{n}"], queue=queue)
            for n, queue in enumerate(["default", "orders", "orders", "orders"])]  # fmt: skip
    call_command("run_delayworker", "--burst", "--queues", "default,orders", "-v", "0")
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {Status.SUCCEEDED}


def test_a_directory_of_the_wrong_type_is_named_and_adds_still_add(redis_client):
    engine = Engine(redis_client, prefix="t", shards={"q": 3})
    redis_client.set(engine.queues_key, "x")
    with pytest.raises(PartlyUnavailable, match=r"directory of queues \{t\}:queues") as caught:
        engine.add("q", {"a": 4e12, "b": 4e12, "c": 4e12})
    assert sorted(caught.value.done) == ["a", "b", "c"]
    assert engine.stats("q").pending == 3  # served: the current shards, listed or not
    with pytest.raises(WrongType, match=r"\{t\}:queues"):
        engine.known_queues()  # where queues are listed, the key is named
