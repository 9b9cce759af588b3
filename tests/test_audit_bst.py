"""A ``--burst`` always ends: no call of its worker threads waits on the database unwatched."""

from __future__ import annotations

import pytest

from django_delayjobs import schedule
from django_delayjobs.models import Job, Status
from tests.helpers import exit_code, start_worker, wait_for
from tests.test_audit_wkr import proxied_database
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_whose_put_back_waits_on_a_silent_connection_exits_1(
    redis_url, redis_client, tmp_path
):
    """A burst puts back in Redis the jobs whose lease it lost (``put_back``) with a read of
    their rows that nothing watched: over a connection left half-open it waited for the
    kernel's TCP timeout, and the burst run by cron never ended. It now stops once stuck 30
    ``HEARTBEAT_SECONDS`` (6 s here), as the threads that wait on the database do."""
    outage = proxied_database()
    assert outage.proxy is not None
    env = {**outage.env, "DELAYJOBS_HEARTBEAT_SECONDS": "0.2", "DELAYJOBS_LEASE_SECONDS": "1.5",
           "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}  # fmt: skip
    go, log = tmp_path / "go", tmp_path / "w.log"
    jobs = [schedule(tasks.wait_for_file, in_=0, args=[str(go), 60]) for _ in range(2)]
    burst = start_worker(redis_url, "--burst", env=env, log=log)
    try:
        first = wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in jobs],
                                                    status=Status.RUNNING).first())  # fmt: skip
        other = next(job for job in jobs if job.pk != first.pk)
        redis_client.flushall()  # Redis loses its data: the batch's other lease is lost
        wait_for(lambda: f"lost the lease of job {other.pk}" in log.read_text())
        outage.proxy.silence(b'("django_delayjobs_job"."run_at")::text')  # put_back's read
        go.touch()
        assert exit_code(burst, 60) == 1, log.read_text()
    finally:
        outage.proxy.down()
        if burst.poll() is None:
            burst.kill()
            burst.wait()
    text = log.read_text()
    assert "thread delayjobs-worker-0 has made no progress" in text, text
    assert "(more than 6 s)" in text, text
    # Its thread ran no action: the log named none as running ("job(s) " with no id).
    assert "actions still running" not in text, text
    assert "worker thread(s) still busy after 1.0 s, running no action" in text, text
    assert Job.objects.get(pk=first.pk).status == Status.SUCCEEDED
