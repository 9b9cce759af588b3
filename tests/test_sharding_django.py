"""A queue's shard count changes under the Django layer (one Redis; the engine is the same
on a Cluster): nothing is stranded, cancel still wins, reconcile moves the waiting jobs."""

from __future__ import annotations

import logging

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.metrics import snapshot
from django_delayjobs.models import Job, Status
from django_delayjobs.promoter import Promoter
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def shards(settings, count: int) -> None:
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": count}}


def pending_in(shard: str) -> int:
    return get_engine().stats(shard).pending


def test_jobs_of_the_old_count_run_cancel_and_move_after_a_change(settings, caplog):
    shards(settings, 6)
    later = schedule_many([build_job(tasks.record, in_=3600, args=[f"l{n}"], queue="orders")
                           for n in range(40)])  # fmt: skip
    now = schedule_many([build_job(tasks.record, in_=0, args=[f"n{n}"], queue="orders")
                         for n in range(10)])  # fmt: skip
    assert len(get_engine().shards("orders")) == 6
    # The shards that hold these ids (random ids: one of the 6 may hold none of the 50).
    old = sorted({get_engine().home("orders", str(j.pk)) for j in later + now})
    waiting = {get_engine().home("orders", str(j.pk)) for j in later[1:]}  # after the cancel

    shards(settings, 4)  # a new deployment: the same Redis, another count
    engine = get_engine()
    assert engine.shard_count("orders") == 4
    assert sorted(engine.old_shards("orders")) == sorted(old)
    assert later[0].cancel() is True  # found in its old shard
    assert sum(pending_in(s) for s in old) == 39

    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    assert Record.objects.filter(label__startswith="n").count() == 10  # old shards served
    # A burst that lasted over a second has forgotten the old shards it emptied (those
    # that held none of the waiting jobs); every shard that holds one is still listed.
    listed = sorted(engine.old_shards("orders"))
    assert waiting <= set(listed) <= set(old)

    with caplog.at_level(logging.INFO, logger="django_delayjobs.reconcile"):
        assert sum(reconcile(engine, horizon=None).values()) == 0  # none missing: 39 moved
    assert "moved 39 waiting job(s)" in caplog.text
    assert sum(pending_in(s) for s in old) == 0
    assert sum(pending_in(s) for s in engine.shards("orders")[:4]) == 39
    assert sorted(engine.forget_empty_shards("orders")) == listed
    assert engine.shards("orders") == [f"orders#{k}/4" for k in range(4)]
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in now])} == {Status.SUCCEEDED}


def test_growing_from_one_shard_keeps_serving_the_queue_of_one(settings):
    job = schedule(tasks.record, in_=0, args=["one"], queue="orders")
    shards(settings, 3)
    engine = get_engine()
    assert engine.old_shards("orders") == ["orders#0/1"]  # "orders" alone: the whole queue
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    # The burst's housekeeping (as a promoter's) dropped the emptied shard from the directory.
    assert engine.old_shards("orders") == [] and engine.forget_empty_shards("orders") == []


def test_a_queue_the_directory_lost_is_listed_again_by_a_promoter(settings):
    """On a Cluster the directory of queues lives on one master: if that one loses its data
    and the masters of a queue's shards do not, an add lists a shard again only once it
    finds it empty, so the queue, ids and all, was missing from the metrics and from
    ``delayjobs_stats`` until it had emptied. A promoter lists its queues' shards again."""
    shards(settings, 3)
    schedule_many([build_job(tasks.record, in_=3600, args=[str(n)], queue="orders")
                   for n in range(30)])  # fmt: skip
    engine = get_engine()
    engine.client.delete(engine.queues_key)  # lost with its master's data
    assert "orders" not in engine.known_queues()  # (the metrics list QUEUE_SHARDS's too)

    Promoter(engine, ["orders"]).step()
    assert "orders" in engine.known_queues()
    assert sum(r.stats.pending for r in snapshot.read(engine) if r.name == "orders") == 30


def test_metrics_count_per_queue_and_show_each_shard(settings):
    pytest.importorskip("prometheus_client")
    from prometheus_client import parser

    from django_delayjobs.metrics import exposition, recorder, snapshot
    from django_delayjobs.outcomes import Outcome, Result, settle

    shards(settings, 3)
    jobs = schedule_many([build_job(tasks.record, in_=3600, args=[f"m{n}"], queue="orders")
                          for n in range(30)])  # fmt: skip
    engine = get_engine()
    text = exposition.render(snapshot.read(engine)).decode()
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    per_shard = {(s.labels["shard"], s.labels["state"]): s.value
                 for s in families["delayjobs_shard_jobs"].samples}  # fmt: skip
    assert {shard for shard, _ in per_shard} == set(engine.shards("orders"))
    assert sum(v for (_, state), v in per_shard.items() if state == "pending") == 30
    totals = {(s.labels["queue"], s.labels["state"]): s.value
              for s in families["delayjobs_queue_jobs"].samples}  # fmt: skip
    assert totals[("orders", "pending")] == 30

    recorder.RECORDER.take()  # what other tests left
    job = jobs[0]
    shard = engine.home("orders", str(job.pk))
    settle(engine, shard, str(job.pk), Result(Outcome.SUCCEEDED, job, duration=0.01))
    assert {queue for queue, _ in recorder.RECORDER.take()} == {"orders"}  # not the shard
