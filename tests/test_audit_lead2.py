"""Reconcile and the engine after Redis came back from an older snapshot, or froze."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
import redis
from django.core.management import call_command

from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, EngineUnavailable
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import schedule
from tests.helpers import wait_for
from tests.test_audit_rec import running_long
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_running_job_redis_holds_only_in_garbage_is_put_back_in_flight(settings):
    """Redis restored from a snapshot taken while the job was dead; it was retried and
    claimed since. Reconcile left it alone (the id was "held", in garbage): the row said
    running forever, and no worker would ever deliver it again once its own was gone."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}
    engine = get_engine()
    job = running_long(engine)
    assert engine.bury("default", [str(job.pk)]) == 1  # the snapshot's copy: in garbage
    assert reconcile(engine, horizon=timedelta(minutes=5)) == {"default": 1}
    stats = engine.stats("default")
    assert (stats.in_flight, stats.garbage) == (1, 0)
    assert wait_for(lambda: engine.recover_expired("default")) == [str(job.pk)]


def test_a_running_job_that_dies_as_reconcile_adopts_it_stays_in_garbage():
    """The row was read running; its worker then settled it dead and buried its id. The
    id taken from garbage into flight goes back to garbage, not nowhere."""
    engine = get_engine()
    job = running_long(engine)

    class DiedFirst(Engine):
        def adopt(self, queue, ids, lease_ms):  # type: ignore[no-untyped-def]
            Job.objects.filter(pk=job.pk).update(status=Status.DEAD)
            assert self.bury(queue, [str(job.pk)]) == 1
            return super().adopt(queue, ids, lease_ms)

    assert sum(reconcile(DiedFirst(engine.client, prefix=engine.prefix)).values()) == 0
    stats = engine.stats("default")
    assert (stats.in_flight, stats.garbage) == (0, 1)


def test_a_full_pass_takes_out_of_garbage_the_ids_of_jobs_that_are_not_dead():
    """A Redis restored from an older snapshot holds the dead of then in garbage: jobs
    retried and finished since, or deleted since. The admin showed them dead forever."""
    engine = get_engine()
    jobs = {name: schedule(tasks.record, in_=0, args=[name]) for name in
            ("succeeded", "cancelled", "skipped", "gone", "dead", "retrying")}  # fmt: skip
    ids = {name: str(job.pk) for name, job in jobs.items()}
    assert sorted(engine.claim("default", 10, 60_000)) == sorted(ids.values())
    assert engine.bury("default", list(ids.values())) == 6
    for name in ("succeeded", "cancelled", "skipped", "dead", "retrying"):
        Job.objects.filter(pk=ids[name]).update(status=name)
    Job.objects.filter(pk=ids["gone"]).delete()

    assert reconcile(engine, horizon=timedelta(minutes=5)).cleared == {}
    assert engine.stats("default").garbage == 5  # the retrying one was requeued
    out = io.StringIO()
    call_command("delayjobs_reconcile", stdout=out)
    assert "default: took 4 id(s) out of garbage whose job is not dead" in out.getvalue()
    assert [id_ for id_, _ in engine.garbage("default")] == [ids["dead"]]
    assert reconcile(engine, horizon=None).cleared == {"default": 0}


def test_the_reads_of_a_sharded_queue_on_a_frozen_redis_wait_for_it_once(frozen_redis):
    """Each shard of a queue is read on its own so that a Cluster master that is down hides
    only its shards; on one Redis that does not answer, every shard waited for the read
    timeout in turn (and the live workers' count once more): the queue page and a scrape
    took five timeouts for a queue of four shards."""
    client = redis.Redis.from_url(frozen_redis, socket_timeout=0.5, socket_connect_timeout=0.5)
    engine = Engine(client, prefix="t", shards={"q": 4})
    for read in (engine.stats, engine.next_due, engine.garbage):
        started = time.monotonic()
        with pytest.raises(EngineUnavailable):
            read("q")
        # The first shard's timeout, and the directory's (which shards are listed) at most.
        assert time.monotonic() - started < 1.4, read
    client.close()
