"""Mends from a code review (audit-mnd). Real servers: SQLite or PostgreSQL, a private
Redis; the worker runs in this process (``--burst``) or as a subprocess."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connection, connections

from django_delayjobs import schedule
from django_delayjobs.execution import OUTCOME_PATIENCE
from django_delayjobs.models import Status
from tests.helpers import ROOT, set_read_only, wait_for, worker_env
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLSTATEs")


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


@contextlib.contextmanager
def success_refused(sqlstate: str = "55000", times: int = 1_000_000) -> Iterator[None]:
    """Make the database fail the write of the first ``times`` ``succeeded`` events: a
    trigger that raises ``sqlstate`` (PostgreSQL), or SQLITE_ERROR (SQLite, every time;
    an ``OperationalError`` as a missing table or column is)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "CREATE TRIGGER mnd_refuse BEFORE INSERT ON django_delayjobs_jobevent "
                "WHEN NEW.kind = 'succeeded' BEGIN SELECT json('refused for good'); END"
            )
        else:
            cursor.execute("CREATE SEQUENCE mnd_refusals")
            cursor.execute(
                "CREATE FUNCTION mnd_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF NEW.kind = 'succeeded' AND nextval('mnd_refusals') <= {times} THEN "
                f"RAISE EXCEPTION 'refused ({sqlstate})' USING ERRCODE = '{sqlstate}'; "
                "END IF; RETURN NEW; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER mnd_refuse BEFORE INSERT ON django_delayjobs_jobevent "
                "FOR EACH ROW EXECUTE FUNCTION mnd_refuse()"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("DROP TRIGGER mnd_refuse")
            else:
                cursor.execute("DROP TRIGGER mnd_refuse ON django_delayjobs_jobevent")
                cursor.execute("DROP FUNCTION mnd_refuse()")
                cursor.execute("DROP SEQUENCE mnd_refusals")


def refusals() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_value FROM mnd_refusals")
        return cursor.fetchone()[0]


def test_a_non_atomic_actions_outcome_refused_for_good_is_not_tried_again_for_a_minute():
    """The outcome of a non-atomic action is written again for up to OUTCOME_PATIENCE
    while the database fails it for a moment (a restart, a lock). A refusal that no wait
    mends (an OperationalError for a missing table, say) held the worker thread for that
    minute too; it is the action's failure at once, as before the wait existed."""
    job = schedule(tasks.outside_call, in_=0, args=["called", False])
    with success_refused():
        began = time.monotonic()
        burst()
        took = time.monotonic() - began
    job.refresh_from_db()
    assert took < OUTCOME_PATIENCE.total_seconds() / 4, took
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1)
    assert "refused" in job.last_error or "malformed JSON" in job.last_error, job.last_error


@postgresql_only
@pytest.mark.parametrize(
    "sqlstate",
    [
        "57P03",  # cannot connect now: a server starting up
        "40001",  # serialization failure
        "08006",  # connection failure
    ],
)
def test_a_non_atomic_actions_outcome_waits_for_a_refusal_that_passes(sqlstate):
    job = schedule(tasks.outside_call, in_=0, args=["called", False])
    with success_refused(sqlstate, times=3):
        burst()
        assert refusals() > 3  # refused three times, then written
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), job.last_error
    assert Record.objects.filter(label="called").count() == 1


@postgresql_only
def test_a_non_atomic_actions_outcome_waits_through_a_failover_onto_a_standby():
    """A failover ends the worker's session as its action calls out, and the new sessions
    reach a standby for a while: read-only. The outcome was handed back at the first
    read-only refusal, the call out made again."""
    tasks.failed_over.clear()
    job = schedule(tasks.call_out_during_failover, in_=0)

    def fail_over() -> None:
        try:
            wait_for(lambda: Record.objects.exists())
            set_read_only(True)  # ends the worker's session: this process's main thread's
            tasks.failed_over.set()
            time.sleep(2)  # the standby's turn
            set_read_only(False)
        finally:
            connections.close_all()

    failover = threading.Thread(target=fail_over)
    failover.start()
    try:
        burst()
    finally:
        failover.join(30)
        connection.close()  # ended by the failover's end
        set_read_only(False)  # (if the test failed before that)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), job.last_error
    assert Record.objects.filter(label="called out").count() == 1


@pytest.mark.parametrize(
    ("jobs_apart", "said"),
    [
        (False, "the jobs database 'default' is unavailable"),
        # The jobs on a database of their own, which answers: not named for the project's.
        (True, "the database is unavailable"),
    ],
)
def test_run_delayworker_names_the_jobs_database_wherever_it_fails(
    jobs_apart, said, redis_url, tmp_path
):
    """The worker's outage lines, and the start-up checks, say "the jobs database
    'default' is unavailable"; a database error met elsewhere in the command (here: a
    tasks module that reads at import, its system checks skipped) said "the database is
    unavailable", leaving the operator to guess which."""
    env = {**worker_env(redis_url), "DELAYJOBS_TEST_QUERY_ON_IMPORT": "1",
           "DELAYJOBS_TEST_SQLITE": str(tmp_path / "missing" / "db.sqlite3")}  # fmt: skip
    if jobs_apart:
        env["DELAYJOBS_TEST_JOBS_DB"] = str(tmp_path / "jobs.sqlite3")
    env.pop("DATABASE_URL", None)
    command = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
               "--skip-checks", "--burst"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"CommandError: {said}: unable to open database file", done.stderr
