"""Audit of races and real failures: workers killed or cut off from Redis at each point of
a job's life, Redis restarted with and without its data, and what the row and Redis say
of every job once it is over."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def status(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


def test_a_dead_job_whose_bury_was_lost_goes_to_garbage_when_it_comes_back(tmp_path, settings):
    """The action failed for good and Redis went down before the worker could move the id
    to garbage: it came back in flight with Redis's data, was delivered again once its
    lease ended, found its row dead, and was acked. The dead job was missing from the
    garbage (the queue page, its requeue and purge buttons, the garbage count) for good."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    worker = start_worker(url, env={"DELAYJOBS_LEASE_SECONDS": "1"}, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers)
        job = schedule(tasks.stop_redis_saving_then_fail, in_=0, args=[url], max_attempts=1)
        wait_for(lambda: status(job) == Status.DEAD)
        server.start()  # with its data: the id in flight, its lease running out
        engine = get_engine()
        wait_for(lambda: engine.stats("default").in_flight == 0)
        assert [pk for pk, _ in engine.garbage("default")] == [str(job.pk)]
    finally:
        assert stop(worker) == 0
        server.close()
    assert list(Job.objects.get(pk=job.pk).events.values_list("kind", flat=True)) == [
        "scheduled", "started", "failed", "dead",
    ]  # fmt: skip
