"""The worker's review, round brs: a burst whose leases Redis lost, a database that
answers reads but refuses writes, and an in-process worker that leaves an action running
past its shutdown grace."""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.models import Job, Status
from tests.helpers import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def in_a_thread(call: object) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``call`` in a thread; the list gets what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised


# -- 1. a burst that lost the leases of the jobs it held --------------------------------------


def test_a_burst_puts_back_the_jobs_whose_lease_redis_lost(own_jobs_redis, settings, tmp_path,
                                                           caplog):  # fmt: skip
    """Redis restarts empty while a burst runs the first job of a batch of two: the
    second one's lease is lost, so the burst lets it go. No promoter runs a reconcile sweep
    beside a burst run by cron: the job stayed scheduled with nothing in Redis, and the
    burst exited 0."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1.5}  # extended every 0.5 s
    go = tmp_path / "go"
    jobs = [schedule(tasks.wait_for_file, in_=0, args=[str(go), 60]) for _ in range(2)]
    thread, raised = in_a_thread(lambda: call_command("run_delayworker", "--burst", "-v", "0"))
    try:
        first = wait_for(lambda: next((j for j in jobs if status(j) == Status.RUNNING), None))
        other = next(job for job in jobs if job.pk != first.pk)
        own_jobs_redis.stop()
        own_jobs_redis.start()  # empty: it keeps nothing on disk
        wait_for(lambda: f"lost the lease of job {other.pk}" in caplog.text)
    finally:
        go.touch()
        thread.join(60)
    assert not thread.is_alive() and not raised, raised
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Status.SUCCEEDED, 1), job.last_error
