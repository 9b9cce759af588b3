"""Audit of the engine facing a Redis in hostile or unusual states (moved once fixed)."""

from __future__ import annotations

import threading

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.worker import Options, WorkerProcess
from tests.testapp import tasks


def test_ids_whose_ready_list_vanished_are_still_claimed(redis_client):
    """ready_set says which ids are in ready, and add trusts it. When the ready LIST alone
    is gone (evicted under an LRU maxmemory-policy, deleted by hand) its ids could never be
    claimed, and add, reconcile's, left them there as held: stuck for good."""
    engine = Engine(redis_client, prefix="t")
    engine.add("q", {"a": 0, "b": 0})
    redis_client.delete(engine.keys("q").ready)
    assert engine.add("q", {"a": 0, "b": 0}) == []  # held, as far as add can tell
    assert sorted(engine.claim("q", 5)) == ["a", "b"]
    assert engine.stats("q").ready == 0


@pytest.mark.django_db(transaction=True)
def test_a_burst_ends_and_runs_a_job_whose_ready_entry_was_evicted(redis_client):
    """The burst saw ready_set non-empty, claimed nothing and looped at full CPU forever."""
    job = schedule(tasks.record, in_=0, args=["evicted"])
    engine = get_engine()
    redis_client.delete(engine.keys("default").ready)
    reconcile(engine)
    process = WorkerProcess(engine, Options(queues=["default"], burst=True))
    thread = threading.Thread(target=process.run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        process.stop()
        thread.join(20)
        pytest.fail("the burst did not end")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
