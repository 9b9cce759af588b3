"""Failure modes of a running worker process (audit-fail). Real processes, real servers:
each test starts its own worker processes and stops them by pid."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.helpers import start_worker, stop, wait_for
from tests.test_worker_processes import DatabaseOutage
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_worker_whose_housekeeping_thread_died_keeps_its_running_jobs_leases(redis_url, tmp_path):
    """The housekeeping thread extends the leases of the running jobs. When it died (a bug:
    here its metrics flush raises RecursionError), the process stopped, as it must, but
    let its running actions finish through SHUTDOWN_GRACE_SECONDS with their leases no
    longer extended: past LEASE_SECONDS another worker ran the same job beside them, and
    an outside call went out twice. The process extends them itself while it waits."""
    env = {"DELAYJOBS_LEASE_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "30"}
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    workers = [start_worker(redis_url, env=env, log=log) for log in logs]
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 2)
        job = schedule(tasks.break_housekeeping_then_call_out, in_=0, args=[8.0])
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=60)
        died = wait_for(lambda: [w for w in workers if w.poll() is not None], timeout=60)
    finally:
        codes = [stop(worker) for worker in workers]
    assert len(died) == 1 and sorted(codes) == [0, 1], codes
    assert "thread delayjobs-housekeeping died" in "".join(log.read_text() for log in logs)
    assert list(Record.objects.values_list("label", flat=True)) == ["called out: delivery 1"]
    job.refresh_from_db()
    assert (job.attempts, job.deliveries) == (1, 1)


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="a connection to end: SQLite's refusal (a lock) is test_worker_inprocess's",
)
def test_a_non_atomic_actions_outcome_waits_for_a_database_that_is_restarting(redis_url, tmp_path):
    """After a non-atomic action (an HTTP callback) the worker writes its outcome; if its
    connection was lost meanwhile it tried a new one once, then handed the job back: the
    database restarting, or failing over, for a few seconds at that moment (its new
    connections refused) ran the action again, its outside effect twice. It waits for the
    database as it waits for SQLite's lock: every 0.5 s for up to 60 s."""
    outage = DatabaseOutage()
    worker = start_worker(redis_url, env=outage.env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 1)
        # Attempt 2 writes its record (its call out), then runs 2 s more.
        job = schedule(tasks.retry_then_call_out, in_=0, args=[2.0])
        wait_for(lambda: Record.objects.exists())
        outage.start()  # the outcome is written within it
        time.sleep(4)
        outage.end()
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=60)
    finally:
        outage.end()
        code = stop(worker)
    assert code == 0
    assert list(Record.objects.values_list("label", flat=True)) == [
        "called out: attempt 2 delivery 1"
    ]
