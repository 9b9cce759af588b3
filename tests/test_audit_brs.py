"""The worker's review, round brs: a burst whose leases Redis lost, a database that
answers reads but refuses writes, and an in-process worker that leaves an action running
past its shutdown grace."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.management.commands.run_delayworker import Command
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import SETTLED_SECONDS
from django_delayjobs.worker import Backoff, Options, WorkerProcess
from tests.helpers import WritesLocked, age_rows, set_read_only, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def in_a_thread(call: object) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``call`` in a thread; the list gets what it raised. The thread's connections
    are closed as it ends: one left to the garbage collector keeps the SQLite file open
    (and a later test's read-only file writable through it)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:
            raised.append(exc)
        finally:
            connections.close_all()

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


# -- 2. a database that answers reads but refuses writes --------------------------------------


class ReadOnly:
    """PostgreSQL's new sessions made read-only from ``hold()`` to ``release()``, as on a
    standby: they answer reads and refuse writes."""

    def hold(self) -> None:
        set_read_only(True)
        connections.close_all()  # this thread's next query: a new, read-only session

    def release(self) -> None:
        set_read_only(False)
        connections.close_all()


@pytest.fixture
def refusal() -> Iterator[WritesLocked | ReadOnly]:
    """A database that answers reads and refuses writes while held: SQLite's write lock
    (the busy timeout of this process's connections made short), PostgreSQL read-only."""
    if connection.vendor == "postgresql":
        read_only = ReadOnly()
        try:
            yield read_only
        finally:
            read_only.release()
        return
    options = connections.settings["default"].setdefault("OPTIONS", {})
    saved = options.get("timeout")
    options["timeout"] = 0.2
    connections.close_all()
    lock = WritesLocked()
    try:
        yield lock
    finally:
        lock.release()
        options["timeout"] = saved
        connections.close_all()


def hand_back_one(process: WorkerProcess, lock: WritesLocked | ReadOnly) -> None:
    """Deliver a due job to ``process`` while the database refuses writes: handed back."""
    job = schedule(tasks.record, in_=0, args=["refused"])
    age_rows()  # a job the reconcile sweep re-adds counts as lost
    claimed = wait_for(lambda: process.claim(["default"]))
    process.check_owner()  # as at start-up: this deployment's row, written once
    lock.hold()
    process.run_batch(*claimed, Backoff(process.stopping, "worker", process.database))
    assert status(job) == Status.SCHEDULED


def test_a_database_that_answers_reads_is_not_back_until_it_takes_a_write(refusal, caplog):
    """The owner check's read (every HEARTBEAT_SECONDS) said that the database was back
    while it still refused every claim: the log flapped between "unavailable" and "back"."""
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    hand_back_one(process, refusal)
    assert "worker: the jobs database 'default' is unavailable: " in caplog.text
    time.sleep(SETTLED_SECONDS)  # an outage ends once nothing failed for this long
    process.check_owner()  # reads: answered
    assert "the jobs database 'default' is back" not in caplog.text
    refusal.release()
    wait_for(lambda: process.check_owner() or "the jobs database 'default' is back" in caplog.text)
    assert caplog.text.count("worker: the jobs database 'default' is unavailable") == 1, caplog.text


def test_a_reconcile_sweep_is_no_end_of_an_outage_of_writes(refusal, caplog):
    """The reconcile sweep only reads the database: its success ended the outage too."""
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    hand_back_one(process, refusal)
    time.sleep(SETTLED_SECONDS)
    get_engine().client.flushdb()  # the sweep has something to say once it has run
    thread = threading.Thread(target=process.reconcile_loop)
    thread.start()
    try:
        wait_for(lambda: "reconcile re-added 1 job(s)" in caplog.text)
    finally:
        process.stop()
        thread.join(30)
    assert "the jobs database 'default' is back" not in caplog.text


# -- 3. an in-process worker that leaves an action running past its grace ---------------------


def test_an_in_process_worker_that_leaves_an_action_running_raises(settings, tmp_path: Path):
    """Called in-process (not from the command line, which exits), the command returned as
    if all was well while the action ran on in a process that no longer extended its
    lease: another worker could run the same job beside it."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "SHUTDOWN_GRACE_SECONDS": 0.2}
    go = tmp_path / "go"
    job = schedule(tasks.wait_for_file, in_=0, args=[str(go), 60])
    command = Command()
    thread, raised = in_a_thread(lambda: call_command(command, "-v", "0"))
    try:
        wait_for(lambda: status(job) == Status.RUNNING)
        assert command.process is not None
        command.process.stop()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        go.touch()
        wait_for(lambda: status(job) == Status.SUCCEEDED)
    assert len(raised) == 1 and isinstance(raised[0], CommandError), raised
    assert str(job.pk) in str(raised[0])


def test_an_in_process_worker_whose_claim_waits_past_its_grace_says_so(settings):
    """Stopped while its only worker thread's claim waits on the database, the command
    raises without calling that claim a running action: the job never started, and was
    handed back."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "SHUTDOWN_GRACE_SECONDS": 0.5}
    engine = get_engine()
    job = schedule(tasks.record, in_=3600, args=["held"])
    lock = WritesLocked()
    command = Command()
    thread, raised = in_a_thread(lambda: call_command(command, "--concurrency", "1", "-v", "0"))
    try:
        wait_for(lambda: engine.stats("default").live_workers == 1)
        lock.hold()
        assert engine.reschedule("default", str(job.pk), 0)  # due now, in Redis alone
        wait_for(lambda: engine.stats("default").in_flight == 1)
        time.sleep(0.5)  # the claim is sent, and waits on the lock
        assert command.process is not None
        command.process.stop()
        thread.join(30)
        assert not thread.is_alive()
        stats = engine.stats("default")
        assert (stats.in_flight, stats.pending + stats.ready) == (0, 1), stats
    finally:
        lock.release()
        for left in command.process.workers if command.process else []:
            left.join(30)  # its claim ends (the job is not due): done before the next test
    assert len(raised) == 1 and isinstance(raised[0], CommandError), raised
    message = str(raised[0])
    assert "busy outside any action" in message and "actions still ran" not in message
