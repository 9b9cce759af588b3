"""Execution, second audit: what actions and signal receivers do to the worker (raise
from inside exception groups, change their own job's row, leave transactions open on any
database, activate a time zone, return what cannot be stored, leave threads running), and
what the worker says about it. A real worker runs each job (--burst in this process, or a
worker process)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import close_old_connections, connection, connections, transaction
from django.utils import timezone, translation

from django_delayjobs import GiveUp, Retry, delayable, schedule
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from tests.helpers import burst_worker
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def history(job: Job) -> list[tuple[str, int]]:
    return list(job.events.order_by("id").values_list("kind", "attempt"))


# -- Retry and GiveUp inside an exception group --------------------------------------------


@delayable
async def in_a_task_group(raised: list[str]) -> None:
    """Runs one task per entry of ``raised`` in an asyncio TaskGroup (the group wraps
    what they raise in an ExceptionGroup); "nested" runs a TaskGroup of its own."""

    async def task(what: str) -> None:
        await asyncio.sleep(0)
        if what == "giveup":
            raise GiveUp("the order is gone")
        if what.startswith("retry"):
            raise Retry("the shop is busy", after=float(what.partition(":")[2] or "nan"))
        if what == "nested":
            async with asyncio.TaskGroup() as group:
                group.create_task(task("giveup"))
        raise ValueError(what)

    await sync_to_async(Record.objects.create)(label="wrote")  # rolled back
    async with asyncio.TaskGroup() as group:
        for what in raised:
            group.create_task(task(what))


@pytest.mark.parametrize(
    "raised", [["giveup"], ["giveup", "error"], ["nested", "error"]],
    ids=["alone", "mixed", "nested"],
)  # fmt: skip
def test_a_give_up_in_an_exception_group_gives_up(raised):
    """A ``GiveUp`` raised in a task of an asyncio TaskGroup reaches the worker inside an
    ``ExceptionGroup``: it was a plain failure, retried with the usual backoff until the
    attempts ran out, though the action had said the job can never succeed."""
    job = schedule(in_a_task_group, in_=0, args=[raised], max_attempts=5)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.DEAD, 1), job.last_error
    assert history(job) == [("scheduled", 0), ("started", 1), ("failed", 1), ("dead", 1)]
    assert "GiveUp: the order is gone" in job.last_error
    assert not Record.objects.exists()


def test_a_retry_in_an_exception_group_waits_as_long_as_the_longest_asks():
    """Each ``Retry`` in the group asked not to be tried again before its ``after``: the
    next attempt waits for the longest (an hour), not the usual backoff (about 10 s)."""
    job = schedule(in_a_task_group, in_=0, args=[["retry:60", "retry:3600", "error"]])
    before = timezone.now()
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1), job.last_error
    hour = timedelta(hours=1)
    assert before + hour <= job.run_at <= timezone.now() + hour


@delayable
async def lose_the_connection_in_a_task_group(label: str) -> None:
    """Writes, then loses its database connection in a task of a TaskGroup (the server
    ends the session, as a failover or a restart does)."""

    def write_then_lose() -> None:
        Record.objects.create(label=label)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async with asyncio.TaskGroup() as group:
        group.create_task(sync_to_async(write_then_lose)())


def test_a_connection_lost_inside_an_exception_group_costs_no_attempt():
    """A lost connection is no failure of the action: its delivery is handed back and the
    same attempt runs again. Raised in a TaskGroup's task, the error reached the worker
    inside an ``ExceptionGroup`` and an attempt was used (with max_attempts=1, dead)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no connection to terminate")
    job = schedule(lose_the_connection_in_a_task_group, in_=0, args=["lost"], max_attempts=1)
    with pytest.raises(CommandError, match=r"handed back 1 job\(s\)"):
        burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.RUNNING, 1, 1), job.last_error
    assert history(job) == [("scheduled", 0), ("started", 1)]
    assert not Record.objects.exists()


# -- --burst: a bug is not the database ---------------------------------------------------


def test_a_burst_that_met_a_bug_says_so_not_that_the_database_was_unavailable(monkeypatch, caplog):
    """A delivery that met a bug in this package is handed back like one the database
    refused, and a burst exits 1 for it: its message blamed the database ("the database
    was unavailable"), sending whoever read it to look at a database that was fine."""

    def bug(self: Execution) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(Execution, "run", bug)
    schedule(tasks.record, in_=0, args=["never"])
    with pytest.raises(CommandError) as raised:
        burst()
    message = str(raised.value)
    assert "1 job(s)" in message and "unexpected error" in message, message
    assert "database" not in message, message
    assert "unexpected error" in caplog.text


# -- an action that changes its own job's row ----------------------------------------------


@delayable
def change_own_row(label: str) -> str:
    """Settles every job of its kind through the ORM, its own (running) one included:
    cleanup code that ends an order's jobs in one UPDATE, say."""
    Record.objects.create(label=label)
    Job.objects.filter(action=change_own_row.delayable_name).update(status=Status.CANCELLED)
    return label


def test_an_action_that_changes_its_own_jobs_row_fails_its_attempt_saying_so(caplog):
    """Its outcome's fenced UPDATE found the row changed and took that for another worker
    having taken the job over: the job stayed running, its writes rolled back, until its
    lease ended and it ran again; after MAX_DELIVERIES such runs it was dead as a job
    whose worker was lost each time. The change was the action's own, rolled back with
    its other writes: its attempt failed, with an error that says what it did."""
    job = schedule(change_own_row, in_=0, args=["ran"], max_attempts=2)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1), job.last_error
    assert history(job) == [("scheduled", 0), ("started", 1), ("failed", 1)]
    first = job.last_error.splitlines()[0]
    assert first.startswith("django_delayjobs.execution.JobRowChanged: the action changed"), first
    assert "taken over" not in caplog.text
    assert not Record.objects.exists()


# -- what an action leaves open on another database ----------------------------------------

OTHER = "exe2_other"


@pytest.fixture(scope="class")
def other_database(django_db_setup, tmp_path_factory):
    """A second database alias (a SQLite file with a table ``t``), as a project with an
    analytics or legacy database has; its path. For a class: so that it exists before a
    test's ``databases`` are checked, and is gone before the next tests' worker threads
    meet it; after the test databases are made (none for it)."""
    path = tmp_path_factory.mktemp("other") / "other.sqlite3"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE t (label TEXT)")
    configured = {"default": connections.settings["default"],
                  OTHER: {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}}  # fmt: skip
    connections.settings[OTHER] = connections.configure_settings(configured)[OTHER]
    try:
        yield path
    finally:
        connections[OTHER].close()
        del connections.settings[OTHER]


def write_other(label: str) -> None:
    with connections[OTHER].cursor() as cursor:
        cursor.execute("INSERT INTO t (label) VALUES (%s)", [label])


@delayable
def leave_other_open(how: str) -> str:
    """Writes to the other database in a block it never exits, or with autocommit off."""
    if how == "atomic":
        transaction.atomic(using=OTHER).__enter__()
    else:
        transaction.set_autocommit(False, using=OTHER)
    write_other("left open")
    return how


@delayable
def write_other_database(label: str) -> str:
    write_other(label)
    return label


@pytest.mark.django_db(transaction=True, databases=["default", OTHER])
class TestAnotherDatabase:
    @pytest.mark.parametrize("how", ["atomic", "autocommit"])
    def test_what_an_action_leaves_open_on_it_is_repaired(self, other_database, how):
        """An action that left an atomic block open (or autocommit off) on another database
        than the jobs' left it so for the worker thread's later jobs: their writes there went
        into a transaction that never committed, and were lost when the connection was
        closed, their jobs succeeded all the same. As on the jobs' database: rolled back and
        repaired, and the action's attempt failed."""
        with closing(sqlite3.connect(other_database)) as db, db:
            db.execute("DELETE FROM t")
        now = timezone.now()
        bad = schedule(leave_other_open, at=now, args=[how], max_attempts=2)
        good = schedule(write_other_database, at=now + timedelta(milliseconds=1), args=["after"])
        burst()
        bad.refresh_from_db()
        good.refresh_from_db()
        assert good.status == Status.SUCCEEDED, good.last_error
        with closing(sqlite3.connect(other_database)) as db, db:
            assert db.execute("SELECT label FROM t").fetchall() == [("after",)]
        assert (bad.status, bad.attempts) == (Status.RETRYING, 1), bad.last_error
        first = bad.last_error.splitlines()[0]
        assert f"on the database '{OTHER}'" in first, first


@delayable
def tidy_connections(label: str) -> str:
    """Writes, then calls ``close_old_connections()``, as code shared with Celery tasks or
    threads does at its start or end."""
    Record.objects.create(label=label)
    close_old_connections()
    return label


def test_close_old_connections_in_an_atomic_action_is_named_as_what_closed_it():
    """Inside a transaction Django's ``close_old_connections()`` closes the connection
    (autocommit is off there, as it is not in the settings): the attempt fails, and its
    error said only ``connection.close()``, which the action never called."""
    job = schedule(tidy_connections, in_=0, args=["tidy"], max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    first = job.last_error.splitlines()[0]
    assert "the action closed the database connection" in first, first
    assert "close_old_connections()" in first, first
    assert not Record.objects.exists()


@delayable(atomic=False)
def call_out_and_return_the_response(label: str) -> object:
    """Makes its outside call (here a committed write), then returns the response object
    itself instead of its JSON: a slip."""
    Record.objects.create(label=label)
    return object()


def test_a_non_atomic_action_whose_return_value_cannot_be_stored_is_not_run_again():
    """Its attempt failed and was retried like any failure, so its outside effect (an HTTP
    call, an e-mail) happened again at every attempt, each time to the same end. Its
    effect is done and cannot roll back: the job is dead at once, saying why."""
    job = schedule(call_out_and_return_the_response, in_=0, args=["sent"], max_attempts=3)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.DEAD, 1), job.last_error
    first = job.last_error.splitlines()[0]
    assert first.startswith("django_delayjobs.execution.ResultNotStored: "), first
    assert "Not run again" in job.last_error, job.last_error
    assert Record.objects.filter(label="sent").count() == 1


# -- what a signal receiver leaves open ----------------------------------------------------


@pytest.mark.parametrize("signal_name", ["job_started", "job_succeeded"])
def test_an_atomic_block_a_receiver_leaves_open_costs_no_job_its_outcome(signal_name, caplog):
    """A receiver that entered ``transaction.atomic()`` and never exited it left every
    later claim, action and outcome of the worker thread in a transaction that never
    committed (on SQLite holding the database's write lock meanwhile): the jobs were
    reported succeeded and acked in Redis while their rows stayed running, their writes
    lost. The block is rolled back and the receiver named in the log, as for autocommit."""
    from django_delayjobs import signals

    def left_open(sender, job, **kwargs):
        if job.args == ["first"]:
            transaction.atomic().__enter__()

    getattr(signals, signal_name).connect(left_open)
    try:
        now = timezone.now()
        jobs = [
            schedule(tasks.record, at=now + timedelta(milliseconds=n), args=[label])
            for n, label in enumerate(["first", "next"])
        ]
        burst()
    finally:
        getattr(signals, signal_name).disconnect(left_open)
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.deliveries) == (Status.SUCCEEDED, 1), job.last_error
    assert sorted(Record.objects.values_list("label", flat=True)) == ["first", "next"]
    assert "left 1 transaction.atomic() block open" in caplog.text


# -- what an action leaves activated -------------------------------------------------------

#: (label, the time zone and the language each ``localized`` call found active)
found: list[tuple[str, str, str | None]] = []


@delayable
def localized(label: str, activate: bool) -> str:
    """Sends a customer's e-mail in the customer's time zone and language, activated for
    the rest of the thread (``activate()``, not the ``override()`` blocks)."""
    found.append((label, timezone.get_current_timezone_name(), translation.get_language()))
    if activate:
        timezone.activate("Asia/Tokyo")
        translation.activate("fr")
    return label


def test_the_time_zone_and_language_an_action_activates_end_with_its_job(settings):
    """They stayed active in the worker thread: the next job, for another customer, ran
    in the first one's time zone and language (its e-mail sent in French)."""
    found.clear()
    now = timezone.now()
    schedule(localized, at=now, args=["tokyo", True])
    schedule(localized, at=now + timedelta(milliseconds=1), args=["next", False])
    burst()
    default = (settings.TIME_ZONE, settings.LANGUAGE_CODE)
    assert found == [("tokyo", *default), ("next", *default)]


# -- what an action leaves running -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["pool", "thread"])
def test_a_thread_an_action_leaves_running_holds_the_exit_up_for_the_grace_at_most(
    redis_url, tmp_path, how
):
    """At exit Python waits for the tasks of every ThreadPoolExecutor and for threads that
    are not daemons: a task an action left running held a worker that had stopped (its
    heartbeat removed), or a --burst run by cron, up for as long as it ran, for good if
    it never ends. The process now waits SHUTDOWN_GRACE_SECONDS for them, then exits."""
    job = schedule(tasks.leave_a_thread, in_=0, args=[how, 60.0])
    log = tmp_path / "worker.log"
    started = time.monotonic()
    grace = {"DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}
    assert burst_worker(redis_url, log, env=grace, timeout=15) == 0, log.read_text()
    assert time.monotonic() - started < 15, log.read_text()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED
    assert "still exiting 1 s after the worker stopped" in log.read_text(), log.read_text()


# -- PostgreSQL's idle-in-transaction timeout -----------------------------------------------


@delayable
def idle_in_transaction(label: str) -> str:
    """Writes, then holds its transaction idle past the session's timeout (an HTTP call
    between its queries, say)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
    Record.objects.create(label=label)
    time.sleep(0.4)
    return label


def test_an_idle_in_transaction_timeout_is_the_actions_failure():
    """Decided, not a bug: the server ends a session that an action holds idle in its
    transaction, and its writes with it. That is the action's doing (the same attempt
    would meet the same timeout), so the attempt fails saying so, as one past
    MAX_RUN_SECONDS does; it is not delivered again as after a lost connection, which
    after MAX_DELIVERIES would be dead as a job whose worker was lost each time."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's idle_in_transaction_session_timeout")
    job = schedule(idle_in_transaction, in_=0, args=["idle"], max_attempts=2)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1)
    assert "idle-in-transaction timeout" in job.last_error.splitlines()[0], job.last_error
    assert not Record.objects.exists()
