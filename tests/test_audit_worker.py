"""Audit of the worker process and its commands: each test reproduces one bug."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst(*args: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", *args)


def test_burst_runs_a_job_whose_lease_ran_out():
    """A worker killed (kill -9, OOM) after claiming an id leaves it in flight until its
    lease ends; then it is due again. ``--burst`` ("process what is due now") calls only
    ``promote_due`` and never recovers expired leases, so a deployment that drains with
    bursts (cron) never runs that job again: it stays ``scheduled`` forever, its id stuck
    in ``unack``. A burst should recover expired leases as the promoter does."""
    job = schedule(tasks.record, in_=0, args=["orphan"])
    engine = get_engine()
    engine.promote("default", 10)
    assert engine.claim("default", 1, 1) == [str(job.pk)]  # a worker that died at once
    time.sleep(0.05)  # its 1 ms lease is over
    burst()
    assert Record.objects.filter(label="orphan").count() == 1
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_a_process_that_has_stopped_never_heartbeats_again(monkeypatch):
    """``beat_lock`` is meant to ensure "a last heartbeat never follows unregister()", but
    it only orders the two calls: when the housekeeping thread is between its owner check
    (a database query) and its heartbeat as the process stops, the main thread unregisters
    first and the housekeeping thread then records the stopped process as live for three
    HEARTBEAT_SECONDS (worker.py ``heartbeat``: only ``fatal`` is checked, not
    ``stopped``). The admin and ``delayjobs_health`` then count a worker that is gone.
    Right: once ``stopped`` is set (or unregister ran), no heartbeat is written."""
    from django_delayjobs import worker

    real = worker.check_owner

    def slow_database(engine):  # the owner check waits on a busy database
        time.sleep(0.6)
        real(engine)

    monkeypatch.setattr(worker, "check_owner", slow_database)
    burst()  # nothing due: ends at once, while housekeeping is still in its owner check
    time.sleep(1.0)  # housekeeping finishes its step
    assert get_engine().stats("default").live_workers == 0
