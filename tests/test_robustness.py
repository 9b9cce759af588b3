"""Faults that once stopped a worker silently, each with a real worker process.

A worker that heartbeats must be a worker that works: an action cannot kill its thread,
a dying thread takes the process down (non-zero), bad settings stop it before it starts,
infrastructure failures cost no attempt, and a job that kills its worker every time ends
dead instead of looping.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from django_delayjobs import outcomes, schedule, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import EngineUnavailable
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from tests.helpers import (
    ROOT,
    age_rows,
    set_read_only,
    start_worker,
    stop,
    wait_for,
    worker_env,
)
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def live_workers(n: int = 1) -> bool:
    return get_engine().stats("default").live_workers >= n


def status(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


def test_system_exit_in_an_action_neither_kills_the_thread_nor_the_job(redis_url, tmp_path):
    worker = start_worker(redis_url, "--concurrency", "1", log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        bad = [schedule(tasks.raise_base, in_=0, args=[k], max_attempts=1)
               for k in ("SystemExit", "KeyboardInterrupt")]  # fmt: skip
        good = schedule(tasks.record, in_=0, args=["after them"])
        wait_for(lambda: status(good) == Status.SUCCEEDED, timeout=20)
        assert worker.poll() is None
    finally:
        assert stop(worker) == 0
    assert [status(job) for job in bad] == [Status.DEAD, Status.DEAD]
    assert not Record.objects.filter(label__startswith="before:").exists()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DELAYJOBS_LEASE_SECONDS", "inf"), ("DELAYJOBS_RECONCILE_SECONDS", "nan"),
     ("DELAYJOBS_HEARTBEAT_SECONDS", "0")],
)  # fmt: skip
def test_settings_that_would_make_a_zombie_are_refused_with_one_line(redis_url, variable, value):
    env = {**worker_env(redis_url), variable: value}
    check = subprocess.run(
        [sys.executable, "-m", "django", "check", "--settings", "tests.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode != 0 and "django_delayjobs.E003" in check.stderr
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
         "--skip-checks"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1 and time.monotonic() - started < 30
    (line,) = run.stderr.strip().splitlines()
    name = variable.removeprefix("DELAYJOBS_")
    assert line.startswith("CommandError: ") and f"DELAYJOBS['{name}']" in line


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="SQLite has no connection to terminate: the database outage "
                    "test of test_worker_processes covers it")  # fmt: skip
def test_a_lost_database_connection_is_not_the_actions_failure(redis_url, tmp_path):
    # The claim committed: the row is left running, delivered again once it started half
    # a lease ago (2 s here; the action's own 2 s pass before it is handed back anyway).
    env = {"DELAYJOBS_LEASE_SECONDS": "4"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.write_then_sleep, in_=0, args=["survived", 2.0], max_attempts=1)
        wait_for(lambda: status(job) == Status.RUNNING)
        time.sleep(0.3)  # inside the action's transaction now
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in%%'"
            )
            assert cursor.fetchall(), "the worker's connection was not found"
        wait_for(lambda: status(job) == Status.SUCCEEDED, timeout=30)
    finally:
        assert stop(worker) == 0
    job.refresh_from_db()
    assert (job.attempts, job.deliveries) == (1, 2)  # one attempt, delivered twice
    assert not job.events.filter(kind="failed").exists()
    assert Record.objects.filter(label="survived").count() == 1
    log = (tmp_path / "w.log").read_text()
    assert "the database is unavailable" in log and "Traceback" not in log


def test_burst_always_ends_and_timing_options_are_bounded(redis_url):
    schedule(tasks.record, in_=0, args=["burst"])
    env = worker_env(redis_url)
    base = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
            "-v", "0"]  # fmt: skip
    done = subprocess.run([*base, "--burst", "--tick", "0.05"], cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 0
    assert Record.objects.filter(label="burst").count() == 1
    for args, message in [
        (["--tick", "0.0001"], "--tick must be from 0.05 to 60"),
        (["--tick", "nan"], "--tick must be from"),
        (["--burst", "--promoter-only"], "needs the worker role"),
        (["--concurrency", "0"], "--concurrency must be from 1"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("run_delayworker", *args)


def test_two_deployments_on_one_redis_and_prefix_are_kept_apart(redis_url, tmp_path,
                                                                  redis_client):  # fmt: skip
    other_db = tmp_path / "other.sqlite3"
    other = {**worker_env(redis_url), "DATABASE_URL": "", "DELAYJOBS_TEST_SQLITE": str(other_db),
             "DELAYJOBS_HEARTBEAT_SECONDS": "0.2"}  # fmt: skip
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0", "--settings",
                    "tests.settings"], cwd=ROOT, env=other, check=True, timeout=120)  # fmt: skip
    ours = start_worker(redis_url, env={"DELAYJOBS_HEARTBEAT_SECONDS": "0.2"},
                        log=tmp_path / "ours.log")  # fmt: skip
    try:
        wait_for(live_workers)
        theirs = start_worker(redis_url, env=other, log=tmp_path / "theirs.log")
        assert theirs.wait(30) == 1
        text = (tmp_path / "theirs.log").read_text()
        assert "holds the jobs of another deployment" in text and "PREFIX" in text
        # Redis loses its data and the other deployment's worker records itself first: ours
        # notices at its next heartbeat and stops rather than drop the other's ids.
        with contextlib.closing(sqlite3.connect(other_db)) as db:
            (their_uid,) = db.execute("SELECT uid FROM django_delayjobs_deployment").fetchone()
        redis_client.flushdb()
        redis_client.set("{delayjobs}:deployment", str(uuid.UUID(their_uid)))
        assert ours.wait(30) == 1
        assert "holds the jobs of another deployment" in (tmp_path / "ours.log").read_text()
    finally:
        for process in (ours, theirs):
            if process.poll() is None:
                process.kill()


def test_outcome_signals_are_sent_when_redis_is_gone_at_that_moment(tmp_path, settings):
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    env = {"DELAYJOBS_TEST_RECORD_SIGNALS": "1"}
    worker = start_worker(url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.stop_redis_then_fail, in_=0, args=[url], max_attempts=1)
        wait_for(lambda: status(job) == Status.DEAD, timeout=20)
        wait_for(lambda: Record.objects.filter(label=f"signal:job_dead:{job.pk}").exists())
        assert Record.objects.filter(label=f"signal:job_failed:{job.pk}").exists()
        server.start()
    finally:
        assert stop(worker) == 0
        server.close()


def test_a_full_redis_delays_jobs_but_loses_none_and_kills_no_worker(tmp_path, settings):
    """Redis at maxmemory with noeviction refuses every command that would grow it: adds,
    heartbeats, leases. Nothing may be lost or crash meanwhile, and the jobs Redis holds
    still run; once it has room again, reconcile puts back what Redis refused, and every
    job runs once."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    client = redis.Redis.from_url(url)
    env = {"DELAYJOBS_RECONCILE_SECONDS": "1"}
    worker = start_worker(url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        early = schedule(tasks.record, in_=1, args=["early"])  # pending as Redis fills up
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            client.set("probe", "x")
        jobs = [schedule(tasks.record, in_=0, args=[f"full{n}"]) for n in range(10)]
        time.sleep(3)  # three reconcile sweeps, three heartbeats refused
        assert worker.poll() is None
        wait_for(lambda: status(early) == Status.SUCCEEDED)  # the moves grow nothing
        assert (
            Job.objects.filter(pk__in=[j.pk for j in jobs], status=Status.SCHEDULED).count() == 10
        )
        client.config_set("maxmemory", 0)
        wait_for(lambda: Record.objects.filter(label__startswith="full").count() == 10, 30)
        wait_for(live_workers)
    finally:
        code = stop(worker)
        server.close()
    assert code == 0
    assert Record.objects.count() == 11  # each once
    log = (tmp_path / "w.log").read_text()
    assert "Redis refused the command" in log and "maxmemory" in log, log
    assert "unreachable" not in log and "Traceback" not in log, log  # full, not gone


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="a read-only database (PostgreSQL)")  # fmt: skip
def test_a_read_only_database_costs_no_attempt_and_kills_no_worker(redis_url, tmp_path):
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.record, in_=1.5, args=["written"], max_attempts=1)
        set_read_only(True)
        try:
            time.sleep(4)  # due, delivered, and refused a few times
            assert worker.poll() is None
            assert status(job) == Status.SCHEDULED
        finally:
            set_read_only(False)
        wait_for(lambda: status(job) == Status.SUCCEEDED, timeout=30)
        wait_for(live_workers)
    finally:
        code = stop(worker)
    assert code == 0
    job.refresh_from_db()
    assert job.attempts == 1 and not job.events.filter(kind="failed").exists()
    assert Record.objects.filter(label="written").count() == 1
    log = (tmp_path / "w.log").read_text()
    assert "read-only" in log and "Traceback" not in log, log


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="a read-only session (PostgreSQL)")  # fmt: skip
def test_an_outcome_the_database_refuses_is_handed_back_on_a_new_connection(redis_url,
                                                                            tmp_path):  # fmt: skip
    """An action leaves its session read-only and fails: its failure cannot be written.
    The worker hands the job back and drops that connection, even one it would keep, so
    its next claims are not refused too; after MAX_DELIVERIES the job is dead."""
    # Each delivery handed back leaves its row running: the next is taken over once that
    # one started half a lease ago (1 s here).
    env = {"DELAYJOBS_TEST_PERSISTENT_CONNECTIONS": "1", "DELAYJOBS_MAX_DELIVERIES": "3",
           "DELAYJOBS_LEASE_SECONDS": "2"}  # fmt: skip
    worker = start_worker(redis_url, "--concurrency", "1", env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.read_only_session_then_fail, in_=0)
        wait_for(lambda: status(job) == Status.DEAD, timeout=30)
        after = schedule(tasks.record, in_=0, args=["after"])
        wait_for(lambda: status(after) == Status.SUCCEEDED)
    finally:
        assert stop(worker) == 0
    job.refresh_from_db()
    assert (job.attempts, job.deliveries) == (1, 3)
    assert "never recorded an outcome" in job.last_error
    log = (tmp_path / "w.log").read_text()
    assert "read-only transaction); handed back" in log and "Traceback" not in log, log


def test_a_dying_thread_takes_the_process_down_and_its_heartbeat_with_it(redis_url, tmp_path):
    env = {"DELAYJOBS_TEST_BREAK_THREAD": "promoter"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        assert worker.wait(30) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "w.log").read_text()
    assert "thread delayjobs-promoter died" in log and "a bug in the promoter" in log
    assert get_engine().stats("default").live_workers == 0


def test_an_action_that_never_ends_stops_its_worker_past_max_run_seconds(redis_url, tmp_path):
    """A worker whose only thread is stuck in an action would heartbeat and do nothing.
    Past MAX_RUN_SECONDS it exits 1 instead, for its supervisor to start another, and the
    job is not lost: its failure is recorded, or (SQLite, whose write lock the action's
    transaction holds) the same attempt is delivered again."""
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1",
           "DELAYJOBS_SQLITE_TIMEOUT": "2"}  # fmt: skip
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.slow, in_=0, args=["never", 600.0])
        assert worker.wait(30) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "w.log").read_text()
    assert f"job {job.pk} (" in log and "ran past MAX_RUN_SECONDS (1 s)" in log, log
    stats = get_engine().stats("default")
    assert stats.live_workers == 0
    job.refresh_from_db()
    if connection.vendor == "sqlite":
        assert job.status == Status.RUNNING and stats.pending + stats.in_flight == 1
    else:
        assert job.status == Status.RETRYING and "MAX_RUN_SECONDS" in job.last_error
        assert (stats.in_flight, stats.pending) == (0, 1)


def test_the_rest_of_a_stuck_threads_batch_is_handed_back_when_its_worker_exits(
    redis_url, tmp_path
):
    """The ids a thread claimed with the one it is stuck in would wait in Redis for their
    lease to end (LEASE_SECONDS, 5 minutes by default); the exiting worker hands them back."""
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}
    worker = start_worker(redis_url, "--concurrency", "1", env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        due = timezone.now() + timedelta(seconds=1)  # promoted together, highest first
        stuck, *rest = schedule_many(
            [build_job(tasks.slow_outside, at=due, args=["never", 600.0], priority=10,
                       max_attempts=1)]
            + [build_job(tasks.record, at=due, args=[f"rest{n}"]) for n in range(3)]
        )  # fmt: skip
        assert worker.wait(30) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
    assert status(stuck) == Status.DEAD and all(status(job) == Status.SCHEDULED for job in rest)
    stats = get_engine().stats("default")
    assert (stats.in_flight, stats.pending + stats.ready, stats.garbage) == (0, 3, 1)
    assert "handed back 3 job(s) that had not started" in (tmp_path / "w.log").read_text()
    second = start_worker(redis_url, log=tmp_path / "w2.log")
    try:
        wait_for(lambda: Record.objects.filter(label__startswith="rest").count() == 3)
    finally:
        assert stop(second) == 0


def test_ids_a_worker_cannot_hand_back_as_it_exits_come_back_with_their_lease(tmp_path, settings):
    """Redis is down as the stuck worker exits: it says it could not hand them back, and
    once Redis is back (with its data) their leases return them and they run once."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1",
           "DELAYJOBS_LEASE_SECONDS": "3"}  # fmt: skip
    worker = start_worker(url, "--concurrency", "1", env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        due = timezone.now() + timedelta(seconds=1)  # promoted together, highest first
        stuck, *rest = schedule_many(
            [build_job(tasks.stop_redis_then_hang, at=due, args=[url, 600.0], priority=10,
                       max_attempts=1)]
            + [build_job(tasks.record, at=due, args=[f"rest{n}"]) for n in range(3)]
        )  # fmt: skip
        assert worker.wait(30) == 1
        log = (tmp_path / "w.log").read_text()
        assert "could not hand back 3 job(s) that had not started" in log, log
        assert "handed back 3" not in log
        server.start()
        assert get_engine().stats("default").in_flight == 4  # saved with their leases
        second = start_worker(url, log=tmp_path / "w2.log")
        try:
            wait_for(lambda: Record.objects.filter(label__startswith="rest").count() == 3)
        finally:
            assert stop(second) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
        server.close()
    assert status(stuck) == Status.DEAD and all(status(j) == Status.SUCCEEDED for j in rest)
    assert Record.objects.filter(label__startswith="rest").count() == 3  # each once


def test_a_stuck_action_that_locks_its_own_row_still_stops_its_worker(redis_url, tmp_path):
    """The failure cannot be written while the action holds its row's lock (on SQLite,
    the write lock) and never ends: the worker stops first, so it exits all the same, and
    the same attempt is delivered again later."""
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.lock_own_row_then_sleep, in_=0, args=[600.0])
        assert worker.wait(30) == 1
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "ran past MAX_RUN_SECONDS (1 s)" in (tmp_path / "w.log").read_text()
    stats = get_engine().stats("default")
    assert stats.live_workers == 0
    job.refresh_from_db()
    assert job.status == Status.RUNNING and stats.pending + stats.in_flight == 1


def test_a_job_that_kills_its_worker_every_time_ends_dead(redis_url, tmp_path):
    env = {"DELAYJOBS_LEASE_SECONDS": "1"}
    job = schedule(tasks.end_process, in_=0, args=[9])
    codes = []
    for n in range(6):  # a supervisor: restart the worker whenever it ends
        worker = start_worker(redis_url, env=env, log=tmp_path / f"{n}.log")
        try:
            wait_for(lambda w=worker: w.poll() is not None or status(job) == Status.DEAD, 30)
        finally:
            codes.append(stop(worker))
        if status(job) == Status.DEAD:
            break
    job.refresh_from_db()
    assert job.status == Status.DEAD, codes
    assert codes[:3] == [9, 9, 9]  # three deliveries, each ended its worker
    assert (job.attempts, job.deliveries) == (1, 3)
    assert "delivered 3 time(s) and never recorded an outcome" in job.last_error


def test_schedule_does_not_block_on_a_frozen_redis_and_logs_one_line(tmp_path, settings,
                                                                       caplog):  # fmt: skip
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    get_engine().known_queues()  # connect while it answers
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        for n in range(3):
            with transaction.atomic():
                schedule(tasks.record, in_=60, args=[str(n)])
        elapsed = time.monotonic() - started
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.close()
    assert elapsed < 3 * 1.5, elapsed  # the 1 s socket timeout, no retries inside redis-py
    assert Job.objects.filter(status=Status.SCHEDULED).count() == 3  # reconcile's to add
    warnings = [r for r in caplog.records if "Redis is unavailable" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None


def test_an_outage_is_logged_once_and_a_later_one_again(caplog, monkeypatch):
    """Failures with successes in between (the shards of a dead Cluster master, and the
    others') are one outage; once calls succeeded and none failed for SETTLED_SECONDS it
    is over, and the next failure, however long after, starts a new one, logged again."""
    monkeypatch.setattr(outcomes, "SETTLED_SECONDS", 0.2)
    outage = outcomes.Outage("test", "reconcile will")
    down = EngineUnavailable("Redis is unreachable")
    with caplog.at_level(logging.WARNING, logger="django_delayjobs.worker"):
        for _ in range(5):
            outage.failed(down)
            outage.ok()
        started = time.monotonic()
        outage.ok()
        wait_for(lambda: time.monotonic() - started > 0.2)  # quiet for longer than 0.2 s
        outage.failed(down)  # no call came in between to say the first one ended
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "Redis is unavailable (Redis is unreachable); reconcile will",
        "Redis is back after 5 failed call(s) since " + lines[1].split(" since ")[1],
        "Redis is unavailable (Redis is unreachable); reconcile will",
    ], lines


def test_a_full_reconcile_does_not_wait_for_a_frozen_redis_chunk_after_chunk(tmp_path, settings):
    """A full pass against a Redis that accepts connections and never answers waited for
    the socket timeouts of every 1000-job chunk in turn (about 2 s each: 100,000 waiting
    jobs, over 3 minutes) before its one-line error: ``delayjobs_reconcile`` hung. It
    gives up on a queue whose first chunk got no answer, and on one Redis on every queue."""
    now = timezone.now()
    Job.objects.bulk_create(
        Job(queue=queue, action="tests.nothing", run_at=now + timedelta(hours=1),
            status=Status.SCHEDULED)
        for queue in ("default", "b", "c") for _ in range(2000)
    )  # fmt: skip
    server = EmbeddedRedis(tmp_path / "redis")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": server.start()}
    get_engine().known_queues()  # connected while it answers
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(CommandError, match="unreachable"):
            call_command("delayjobs_reconcile", stdout=StringIO())
        elapsed = time.monotonic() - started
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.close()
    assert elapsed < 5, elapsed


def test_a_job_whose_add_may_still_be_on_its_way_is_re_added_but_not_reported(caplog):
    from django_delayjobs.reconcile import reconcile

    with transaction.atomic():  # as if the sweep read the row between commit and push
        job = schedule(tasks.record, in_=60, args=["young"])
        transaction.on_commit(lambda: get_engine().remove("default", [str(job.pk)]))
    assert get_engine().stats("default").pending == 0
    assert sum(reconcile(get_engine()).values()) == 0
    assert get_engine().stats("default").pending == 1  # re-added all the same
    assert not [r for r in caplog.records if r.name == "django_delayjobs.reconcile"]
    age_rows()  # ten seconds later, the same loss is a loss
    get_engine().remove("default", [str(job.pk)])
    assert reconcile(get_engine()) == {"default": 1}


def test_a_sweep_that_repairs_nothing_warns_nothing(caplog):
    from django_delayjobs.reconcile import reconcile

    schedule(tasks.record, in_=60, args=["held"])
    assert sum(reconcile(get_engine()).values()) == 0
    assert not [r for r in caplog.records if r.name == "django_delayjobs.reconcile"]


@pytest.mark.skipif("os.environ.get('DATABASE_URL') is None",
                    reason="pg_terminate_backend: PostgreSQL only")  # fmt: skip
def test_a_connection_lost_in_the_middle_of_a_sweep_is_a_database_error(monkeypatch):
    """What killed a worker in the chaos test: the sweep read through a server-side cursor,
    and the connection was lost just before Django closed it, with the driver's close(),
    outside Django's error wrapping: psycopg's OperationalError, which the worker's
    reconcile loop does not catch (it catches django.db.Error), killed the thread. The
    sweep now reads page by page, through no server-side cursor; a connection lost
    between two pages (terminated for real, from another session) is a django.db.Error,
    and the next sweep, on a new connection, repairs."""
    import threading

    import psycopg
    from django.db import DatabaseError, close_old_connections, connections

    from django_delayjobs import reconcile as sweeps

    monkeypatch.setattr(sweeps, "CHUNK", 1)
    for n in range(3):
        schedule(tasks.record, in_=0, args=[f"swept{n}"])
    age_rows()  # lost, not on their way: the sweep counts them
    get_engine().remove("default", [str(pk) for pk in Job.objects.values_list("pk", flat=True)])
    opened: list[object] = []
    monkeypatch.setattr(psycopg.ServerCursor, "__init__", lambda *a, **k: opened.append(a))
    terminated: list[int] = []

    def terminate() -> None:  # at the first row read, before the next page
        if terminated:
            return
        own = connections["default"].connection
        terminated.append(own.info.backend_pid)
        other = connections.create_connection("default")
        try:
            with other.cursor() as sql:  # waits until the session is gone
                sql.execute("SELECT pg_terminate_backend(%s, 5000)", [terminated[0]])
        finally:
            other.close()

    raised: list[BaseException] = []
    repaired: list[object] = []

    def sweep() -> None:  # in a thread of its own, as in the worker: its own connection
        try:
            try:
                sweeps.reconcile(get_engine(), progress=terminate)
            except BaseException as exc:
                raised.append(exc)
            close_old_connections()  # what the reconcile loop does after a failed sweep
            repaired.append(sweeps.reconcile(get_engine()))
        finally:
            connections.close_all()

    thread = threading.Thread(target=sweep)
    thread.start()
    thread.join(30)
    assert terminated and not opened
    assert len(raised) == 1 and isinstance(raised[0], DatabaseError), raised
    # The first page's job was added before its check failed; the next sweep, on a new
    # connection, repairs the other two.
    assert repaired == [{"default": 2}]
    assert get_engine().stats("default").overdue + get_engine().stats("default").ready == 3
