"""The worker process's life, round 2: signals, a database that hangs under the
housekeeping, the metrics thread, and the end of the shutdown grace."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from django.db import connection, transaction

from django_delayjobs import schedule
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine, redis_client
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import ROOT, exit_code, start_worker, stop, wait_for, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def live_workers() -> int:
    return get_engine().stats("default").live_workers


def running(job: Job) -> bool:
    return Job.objects.get(pk=job.pk).status == Status.RUNNING


def hold_the_database(held: threading.Event, release: threading.Event) -> None:
    """On PostgreSQL, hold the events' table as a long migration would (on SQLite the
    running atomic action holds the database's write lock itself, for as long as it
    runs, which is what the pruning's transaction waits for)."""
    try:
        if connection.vendor == "postgresql":
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("LOCK TABLE django_delayjobs_jobevent IN ACCESS EXCLUSIVE MODE")
                held.set()
                release.wait(30)
        held.set()
    finally:
        connection.close()


def test_a_database_that_hangs_under_the_pruning_stops_no_lease_nor_heartbeat(settings):
    """The automatic pruning (and the owner check, the WAL checkpoint) ran in the thread
    that extends the leases and sends the heartbeats: a database that hung under them (a
    lock, a network cut) stopped both, so the worker looked dead and other workers ran the
    jobs it was still running once their leases ended."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.3}
    engine = Engine(redis_client(), prefix=delayjobs_settings.PREFIX)  # not reset below
    job = schedule(tasks.slow, in_=0, args=["slow", 3.0])
    process = WorkerProcess(engine, Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_the_database, args=(held, release))
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
        holder.start()
        held.wait(10)
        # the pruning's next pass now waits for the database
        settings.DELAYJOBS = {**settings.DELAYJOBS, "PRUNE_AFTER_SECONDS": 60}
        unack = engine.keys("default").unack
        for n in range(9):  # 1.8 s: past the lease and the heartbeat's expiry
            release.wait(0.2)
            now_ms = engine.server_time_ms()
            assert (engine.client.zscore(unack, str(job.pk)) or 0) > now_ms, n
            assert engine.stats("default").live_workers == 1
    finally:
        release.set()
        holder.join(30)
        process.stop()
        thread.join(30)
        engine.close()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_sighup_stops_a_worker_as_sigterm_does(redis_client, redis_url, tmp_path):
    """A terminal that closes (or ``kill -HUP``) killed the worker on the spot (Python's
    default): its running action cut short, its heartbeat left alive for three beats and
    its ids left to their lease. It now stops as on SIGTERM: finish, hand back, exit 0."""
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    try:
        wait_for(lambda: live_workers() == 1)
        job = schedule(tasks.slow, in_=0, args=["finished", 0.5])
        wait_for(lambda: running(job))
        worker.send_signal(signal.SIGHUP)
        assert exit_code(worker, 20) == 0
    finally:
        stop(worker)
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert live_workers() == 0


@pytest.mark.parametrize("signals", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGQUIT,)])
def test_a_worker_exiting_at_once_removes_its_heartbeat(redis_client, redis_url, tmp_path,
                                                        signals):  # fmt: skip
    """A second SIGTERM (or a SIGQUIT, whose default dumped core) exits at once, and left
    the heartbeat behind: the admin, the API and the health check showed a dead worker as
    live for up to three HEARTBEAT_SECONDS. SIGQUIT also writes every thread's traceback,
    to see where a worker was stuck."""
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    try:
        wait_for(lambda: live_workers() == 1)
        marker = tmp_path / "started"
        job = schedule(tasks.mark_then_sleep, in_=0, args=[str(marker), 30.0])
        wait_for(marker.exists)  # in the action: its frame is in the traceback
        for n, signum in enumerate(signals):
            worker.send_signal(signum)
            if n < len(signals) - 1:  # two at once would be one (pending signals merge)
                wait_for(lambda: "finishing running actions" in (tmp_path / "w.log").read_text())
        assert exit_code(worker, 5) == 1
    finally:
        stop(worker)
    assert live_workers() == 0
    assert running(job)  # its transaction died with the process; delivered again later
    if signals == (signal.SIGQUIT,):
        assert "in mark_then_sleep" in (tmp_path / "w.log").read_text()  # the action's frame


@contextlib.contextmanager
def eight_queues_frozen(tmp_path) -> Iterator[subprocess.Popen[bytes]]:
    """A worker serving 8 queues of a private Redis, which is frozen (SIGSTOP) once every
    queue's heartbeat is written; woken and stopped after."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    assert server.pid is not None
    queues = ",".join(f"q{n}" for n in range(8))
    worker = start_worker(url, "--queues", queues, log=tmp_path / "w.log")
    try:
        with redis.Redis.from_url(url) as client:
            engine = Engine(client, prefix=delayjobs_settings.PREFIX)
            wait_for(lambda: all(engine.stats(f"q{n}").live_workers for n in range(8)))
        os.kill(server.pid, signal.SIGSTOP)
        yield worker
    finally:
        stop(worker)
        os.kill(server.pid, signal.SIGCONT)
        server.close()


def test_exiting_at_once_does_not_wait_for_a_frozen_redis(tmp_path):
    """Removing the heartbeat on the way out is bounded: a Redis that does not answer
    holds the exit up for about a second, not a socket timeout per queue served."""
    with eight_queues_frozen(tmp_path) as worker:
        started = time.monotonic()
        worker.send_signal(signal.SIGQUIT)
        assert exit_code(worker, 10) == 1
        assert time.monotonic() - started < 4


def test_a_clean_stop_on_a_frozen_redis_waits_for_it_once_not_once_per_queue(tmp_path):
    """A SIGTERM to a worker serving 8 queues of a Redis that does not answer took a
    socket timeout per queue to remove its heartbeat (9 s), and as long again at each
    heartbeat while it ran: every queue's call waited for the same dead server. It now
    gives up on the others once one call found Redis unreachable, as the promoter does
    (the heartbeats, the lease extensions and the metrics flush alike)."""
    with eight_queues_frozen(tmp_path) as worker:
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert exit_code(worker, 30) == 0
        assert time.monotonic() - started < 6  # was 9.4 s: one socket timeout per queue


def test_a_worker_whose_metrics_thread_ends_stops_as_for_any_thread(redis_client):
    """The metrics port's thread was not watched: when it ended the worker ran on with no
    metrics, which nothing but a scrape failing told. Like any thread of the worker that
    ends, it now stops the process (exit 1), for its supervisor to restart it."""
    from django_delayjobs.metrics.server import MetricsServer
    from django_delayjobs.worker import WorkerDied

    server = MetricsServer("127.0.0.1", 0).start()
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    died: list[BaseException] = []

    def run() -> None:
        try:
            process.run(also=[server.thread])
        except WorkerDied as exc:
            died.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: live_workers() == 1)
        server.httpd.shutdown()  # its thread ends
        thread.join(10)
    finally:
        process.stop()
        thread.join(30)
        server.close()
    assert died and "delayjobs-metrics" in str(died[0])
    assert live_workers() == 0


def test_a_worker_leaving_an_action_past_the_grace_exits_then(redis_client, redis_url,
                                                              tmp_path):  # fmt: skip
    """Past SHUTDOWN_GRACE_SECONDS a worker leaves its running action to its lease and
    exits, no longer extending it and its heartbeat removed. An action waiting for a
    thread of its own (a ThreadPoolExecutor's) kept the process from exiting: it ran on,
    looking dead, and once its lease ended another worker ran the job a second time
    while it still ran. The process now exits at the end of the grace, whatever runs."""
    env = {"DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "0.5"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: live_workers() == 1)
        job = schedule(tasks.slow_in_a_thread, in_=0, args=["left", 30.0])
        wait_for(lambda: running(job))
        worker.send_signal(signal.SIGTERM)
        assert exit_code(worker, 6) == 0
    finally:
        stop(worker)
    log = (tmp_path / "w.log").read_text()
    assert "leaving them to their lease" in log and "stopped (" in log, log
    assert live_workers() == 0
    assert running(job) and get_engine().stats("default").in_flight == 1  # for its lease


def test_an_overrun_whose_failure_waits_for_a_lock_keeps_its_lease_till_the_exit(
    redis_client, redis_url, tmp_path
):
    """An action past MAX_RUN_SECONDS that holds its row's lock (on SQLite, the write
    lock) holds up the writing of its failure for as long as it runs. That write ran in the
    thread that extends the leases: through the whole shutdown grace none was extended,
    so the leases of the jobs still running in this process (the stuck one included)
    ended, and another worker could run them beside it. The failure is now written apart."""
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "2.5",
           "DELAYJOBS_LEASE_SECONDS": "1"}  # fmt: skip
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: live_workers() == 1)
        job = schedule(tasks.lock_own_row_then_sleep, in_=0, args=[600.0])
        wait_for(lambda: "ran past MAX_RUN_SECONDS" in (tmp_path / "w.log").read_text())
        engine, samples = get_engine(), 0
        unack = engine.keys("default").unack
        while worker.poll() is None:  # till the exit, at the grace's end
            # The time first: a pause of this process between the two reads must not
            # count against the lease.
            now_ms, deadline = engine.server_time_ms(), engine.client.zscore(unack, str(job.pk))
            assert worker.poll() is not None or (deadline or 0) > now_ms, samples
            samples += 1
            time.sleep(0.05)
        assert worker.returncode == 1 and samples > 20
    finally:
        stop(worker)


# -- round 3: start-up and operational logging -------------------------------------------


def test_an_idle_worker_says_when_the_database_is_back(redis_url, tmp_path):
    """The outage is met by a delivery, which is then gone: no later delivery would say
    that the database is back, so the worker's own periodic contact with it must."""
    from tests.test_worker_processes import DatabaseOutage

    outage = DatabaseOutage()
    env = {**outage.env, "DELAYJOBS_HEARTBEAT_SECONDS": "0.5"}
    log = tmp_path / "w.log"
    worker = start_worker(redis_url, env=env, log=log)
    try:
        wait_for(live_workers)
        job = schedule(tasks.record, in_=0.5, args=["met the outage"])
        outage.start()
        wait_for(lambda: "worker: the jobs database 'default' is unavailable" in log.read_text())
        # Handed back, due again in 1 s: taken out of Redis, the worker is idle from now on.
        wait_for(lambda: get_engine().remove("default", [str(job.pk)]) == 1)
        outage.end()
        wait_for(lambda: "the jobs database 'default' is back" in log.read_text(), timeout=15)
    finally:
        outage.end()
        assert stop(worker) == 0
    text = log.read_text()
    once = "worker: the jobs database 'default' is unavailable"
    assert text.count(once) == 1, text  # one per process
    assert "Traceback" not in text, text


def test_a_database_the_jobs_do_not_use_does_not_stop_the_worker(redis_url, tmp_path):
    """Django 6.1's system checks open every alias they are given, every one by default: an
    alias the jobs do not live on that cannot be opened (its server down, its directory
    gone) refused the worker, in a line that did not name it. The worker checks the
    database its jobs live on; actions that use the other one fail and are retried."""
    env = {"DELAYJOBS_TEST_THINGS_DB": str(tmp_path / "no-such-directory" / "things.sqlite3")}
    job = schedule(tasks.record, in_=0, args=["ran"])
    done = subprocess.run(
        [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
         "--burst"],
        cwd=ROOT, env={**worker_env(redis_url), **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_the_wal_checkpoints_touch_only_the_database_the_jobs_live_on(redis_url, tmp_path):
    """They opened every SQLite alias of the project after each burst of jobs: one the
    jobs never use was created as an empty file (or failed there, unseen), and its
    connections, opened by actions, were left without SQLite's own checkpoints."""
    things = tmp_path / "things.sqlite3"
    env = {"DELAYJOBS_TEST_THINGS_DB": str(things), "DELAYJOBS_HEARTBEAT_SECONDS": "0.2"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        for n in range(3):  # one checkpoint after each (at most one a second)
            job = schedule(tasks.record, in_=0, args=[f"job {n}"])
            wait_for(lambda job=job: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED)
            time.sleep(1.2)  # the next checkpoint is due: an observation window, no wait
    finally:
        assert stop(worker) == 0
    assert not things.exists()
