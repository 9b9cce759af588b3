"""Failure modes of a running worker process (audit-fail). Real processes, real servers:
each test starts its own worker processes and stops them by pid."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.helpers import start_worker, stop, wait_for
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
