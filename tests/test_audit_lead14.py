"""Audit of a worker's way out: an action past ``MAX_RUN_SECONDS`` keeps running until its
process exits, so its retry must not be due before then."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.models import EventKind, Job, Status
from tests.helpers import start_worker, wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_retry_of_an_action_past_max_run_seconds_is_due_only_once_its_process_is_gone(
    redis_url, tmp_path
):
    """The attempt is failed while its action still runs, in a process that lives on for
    up to its shutdown grace, then as long again for the interpreter's exit. A retry due
    in its usual backoff (here 0.25-0.5 s) would have another worker run the next attempt
    beside the one still running: the outside effects twice at once."""
    grace = 3.0
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": str(grace),
           "DELAYJOBS_RETRY_BACKOFF_SECONDS": "0.5"}  # fmt: skip
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 1)
        # Not atomic: no transaction of the action's holds the failure's write back.
        job = schedule(tasks.slow_outside, in_=0, args=["stuck", 600.0])
        assert worker.wait(60) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and "MAX_RUN_SECONDS" in job.last_error
    failed_at = job.events.get(kind=EventKind.FAILED).at
    assert job.run_at >= failed_at + timedelta(seconds=2 * grace), (job.run_at, failed_at)
    engine = get_engine()  # Redis holds the same due time: the nack's
    score = engine.client.zscore(
        engine.keys(engine.home("default", str(job.pk))).pending, str(job.pk)
    )
    assert score is not None and score >= job.run_at.timestamp() * 1000 - 1, (score, job.run_at)


class WritesLocked:
    """The jobs' table locked against writes by another connection from ``hold()`` to
    ``release()``: a claim's ``UPDATE`` waits for it (on SQLite for the whole database's
    write lock, within the 30 s busy timeout of the test settings)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.holder: threading.Thread | None = None

    def hold(self) -> None:
        locked = threading.Event()

        def hold() -> None:
            if connection.vendor == "sqlite":
                other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
                other.execute("BEGIN IMMEDIATE")
            else:
                import psycopg

                other = psycopg.connect(**connection.get_connection_params())
                # Not the row alone: the claim skips a locked row (SKIP LOCKED) at once.
                other.execute(f'LOCK TABLE "{Job._meta.db_table}" IN EXCLUSIVE MODE')
            locked.set()
            self.released.wait(60)
            other.rollback()
            other.close()

        self.holder = threading.Thread(target=hold)
        self.holder.start()
        assert locked.wait(10)

    def release(self) -> None:
        self.released.set()
        if self.holder is not None:
            self.holder.join(10)


def test_a_job_whose_claim_waits_past_the_grace_is_handed_back_not_left_to_its_lease(
    redis_url, tmp_path
):
    """Stopped (SIGTERM) while a worker thread's claim waits on the database, the process
    exits after its grace without that thread. The job never started: it is handed back,
    due at once, as the rest of a batch is; left in flight it waited for its lease
    (LEASE_SECONDS, 5 minutes by default). And the log does not call it a running action."""
    env = {"DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}
    worker = start_worker(redis_url, "--concurrency", "1", env=env, log=tmp_path / "w.log")
    engine = get_engine()
    job = schedule(tasks.record, in_=3600, args=["held"])
    lock = WritesLocked()
    try:
        wait_for(lambda: engine.stats("default").live_workers == 1)
        lock.hold()
        assert engine.reschedule("default", str(job.pk), 0)  # due now, in Redis alone
        wait_for(lambda: engine.stats("default").in_flight == 1)
        time.sleep(0.5)  # the claim is sent, and waits on the lock
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        stats = engine.stats("default")
        assert (stats.in_flight, stats.pending + stats.ready) == (0, 1), stats
    finally:
        lock.release()
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "w.log").read_text()
    assert "running no action" in log and "actions still running" not in log, log
