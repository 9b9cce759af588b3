"""run_delayworker as real processes: timing, crashes, leases, outages, signals.

Every test starts its own worker processes and stops them by pid; nothing here waits on a
sleep being long enough: each wait polls with a deadline. The tests that take
``worker_redis`` also run (``-m cluster``) on the session's Redis Cluster, with the
default queue in 1 shard and in 6.
"""

from __future__ import annotations

import itertools
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta

import pytest
import redis
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_delayjobs import schedule, schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import horizon, reconcile
from django_delayjobs.services import build_job
from tests.helpers import ROOT, TcpProxy, age_rows, start_worker, stop, wait_for, worker_env
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def live_workers(n: int = 1, queue: str = "default") -> bool:
    return get_engine().stats(queue).live_workers >= n


def statuses() -> dict[str, int]:
    from django.db.models import Count

    return dict(Job.objects.values_list("status").annotate(n=Count("pk")))


def test_job_starts_after_its_due_time_and_soon(worker_redis, tmp_path):
    worker = start_worker(worker_redis.url, env=worker_redis.env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        # 0.2 s apart: each one's lateness is the promoter's, not the time it waited for
        # the jobs before it in the one worker thread (on a loaded machine, 4 jobs' runs)
        jobs = [schedule(tasks.record, in_=0.5 + 0.2 * n, args=[f"r{n}"]) for n in range(5)]
        wait_for(lambda: Record.objects.count() == 5, timeout=10)
    finally:
        assert stop(worker) == 0
    for job in jobs:
        job.refresh_from_db()
        record = Record.objects.get(label=job.args[0])
        lateness = (record.created - job.run_at).total_seconds()
        assert 0 <= lateness < 0.5, lateness


def test_kill_9_mid_action_reruns_after_lease_and_writes_once(worker_redis, tmp_path):
    env = {**worker_redis.env, "DELAYJOBS_LEASE_SECONDS": "2"}
    first = start_worker(worker_redis.url, env=env, log=tmp_path / "a.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.write_then_sleep, in_=0, args=["once", 3.0])
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
        time.sleep(0.3)  # let the action write its (uncommitted) row
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert Job.objects.get(pk=job.pk).status == Status.RUNNING
        assert not Record.objects.exists()  # the killed attempt's write rolled back
        second = start_worker(worker_redis.url, env=env, log=tmp_path / "b.log")
        try:
            wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=30)
        finally:
            assert stop(second) == 0
    finally:
        if first.poll() is None:
            first.kill()
    job.refresh_from_db()
    # The killed delivery never recorded an outcome: the same attempt ran again, so the
    # kill did not cost the job an attempt.
    assert (job.attempts, job.deliveries) == (1, 2)
    started = job.events.filter(kind="started").values_list("message", flat=True)
    assert list(started) == [
        "attempt 1 of 5",
        "attempt 1 of 5, delivery 2 of 3 (an earlier delivery never recorded an outcome)",
    ]
    assert Record.objects.filter(label="once").count() == 1


def test_action_longer_than_the_lease_runs_once(redis_url, tmp_path):
    env = {"DELAYJOBS_LEASE_SECONDS": "1"}
    workers = [start_worker(redis_url, env=env, log=tmp_path / f"{n}.log") for n in range(2)]
    try:
        wait_for(lambda: live_workers(2))
        job = schedule(tasks.slow, in_=0, args=["slow", 3.5])
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=30)
        time.sleep(1.5)  # a lease-expiry redelivery would have happened by now
    finally:
        assert [stop(w) for w in workers] == [0, 0]
    job.refresh_from_db()
    assert job.attempts == 1
    assert Record.objects.filter(label="slow").count() == 1
    assert get_engine().stats("default").counters.get("recovered", 0) == 0


def test_two_workers_and_two_promoters_run_5000_jobs_exactly_once(worker_redis, tmp_path):
    workers = [
        start_worker(worker_redis.url, "--concurrency", "2", env=worker_redis.env,
                     log=tmp_path / f"{n}.log")
        for n in range(2)
    ]  # fmt: skip
    try:
        wait_for(lambda: live_workers(2))
        start = timezone.now() + timedelta(seconds=1)
        jobs = [
            build_job(tasks.record, at=start + timedelta(milliseconds=n % 2000), args=[str(n)])
            for n in range(5000)
        ]
        schedule_many(jobs)
        wait_for(lambda: Job.objects.filter(status=Status.SUCCEEDED).count() == 5000, timeout=180,
                 every=0.5)  # fmt: skip
    finally:
        assert [stop(w) for w in workers] == [0, 0]
    assert Record.objects.count() == 5000
    assert Record.objects.values("label").distinct().count() == 5000
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


def test_flushall_loses_nothing_thanks_to_reconcile(worker_redis, tmp_path):
    env = {**worker_redis.env, "DELAYJOBS_RECONCILE_SECONDS": "1"}
    worker = start_worker(worker_redis.url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        jobs = [build_job(tasks.record, in_=2, args=[str(n)]) for n in range(200)]
        schedule_many(jobs)
        worker_redis.flushall()  # on a Cluster: of every master
        wait_for(lambda: Record.objects.count() == 200, timeout=30)
    finally:
        assert stop(worker) == 0
    assert statuses() == {Status.SUCCEEDED: 200}
    assert Record.objects.values("label").distinct().count() == 200


def test_redis_down_for_10_seconds_loses_nothing(tmp_path, settings):
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    env = {"DELAYJOBS_RECONCILE_SECONDS": "1"}
    worker = start_worker(url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        before = [schedule(tasks.record, in_=n * 0.5, args=[f"before{n}"]) for n in range(20)]
        server.stop()
        during = [schedule(tasks.record, in_=1, args=[f"during{n}"]) for n in range(10)]
        time.sleep(10)  # the outage itself, not a wait for a result
        assert worker.poll() is None, "the worker must survive the outage"
        server.start()  # empty: no persistence, reconcile must bring the jobs back
        wait_for(lambda: Record.objects.count() == 30, timeout=30)
    finally:
        assert stop(worker) == 0
        server.close()
    assert len(before) + len(during) == Job.objects.filter(status=Status.SUCCEEDED).count()
    log = (tmp_path / "w.log").read_text()
    # One line per loop (promoter, reconcile, worker, housekeeping) when the outage starts,
    # one more if an outcome met it (its ack), and one when it ends: no line per call.
    assert 1 <= log.count("Redis is unavailable") <= 5
    assert "back after" in log
    assert "Traceback" not in log


class DatabaseOutage:
    """Make the database unreachable for the worker: PostgreSQL connections are refused
    (through a proxy the test closes); SQLite is locked exclusively."""

    def __init__(self) -> None:
        self.proxy: TcpProxy | None = None
        self.lock: sqlite3.Connection | None = None
        if connection.vendor == "sqlite":
            self.env = {"DELAYJOBS_SQLITE_TIMEOUT": "0.2"}
        else:
            s = connection.settings_dict
            self.proxy = TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432))
            self.proxy.up()
            url = f"postgres://{s['USER']}@127.0.0.1:{self.proxy.port}/{s['NAME']}"
            self.env = {"DATABASE_URL": url}

    def start(self) -> None:
        if self.proxy:
            self.proxy.down()
        else:
            self.lock = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
            self.lock.execute("BEGIN EXCLUSIVE")

    def end(self) -> None:
        if self.proxy:
            self.proxy.up()
        elif self.lock:
            self.lock.rollback()
            self.lock.close()
            self.lock = None


def test_database_unavailable_for_a_few_seconds_loses_nothing(redis_url, tmp_path):
    outage = DatabaseOutage()
    worker = start_worker(redis_url, env=outage.env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        # One transaction, due after the outage has begun (SQLite's outage is a lock that
        # this process could not schedule through).
        jobs = schedule_many(build_job(tasks.record, in_=1.0, args=[str(n)]) for n in range(10))
        outage.start()
        time.sleep(3)  # the outage itself: every query of the worker fails
        assert worker.poll() is None, "the worker must survive the outage"
        outage.end()
        wait_for(lambda: Record.objects.count() == 10, timeout=30)
    finally:
        outage.end()
        assert stop(worker) == 0
    assert Job.objects.filter(status=Status.SUCCEEDED).count() == len(jobs)
    assert "database is unavailable" in (tmp_path / "w.log").read_text()


def test_sigterm_lets_the_running_action_finish_and_exits_0(redis_url, tmp_path):
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    wait_for(live_workers)
    job = schedule(tasks.slow, in_=0, args=["finished", 2.0])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
    assert stop(worker) == 0
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert Record.objects.filter(label="finished").count() == 1
    assert get_engine().stats("default").live_workers == 0


def test_sigterm_hands_back_prefetched_jobs_that_had_not_started(redis_url, tmp_path):
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    wait_for(live_workers)
    past = timezone.now() - timedelta(seconds=1)
    first = build_job(tasks.slow, at=past, args=["first", 2.0])
    rest = [build_job(tasks.record, at=past, args=[f"rest{n}"]) for n in range(4)]
    schedule_many([first, *rest])  # one add: the worker takes all five ids at once
    wait_for(lambda: Job.objects.get(pk=first.pk).status == Status.RUNNING)
    assert stop(worker) == 0
    assert Job.objects.get(pk=first.pk).status == Status.SUCCEEDED
    assert {Job.objects.get(pk=job.pk).status for job in rest} == {Status.SCHEDULED}
    stats = get_engine().stats("default")
    assert (stats.in_flight, stats.pending + stats.ready) == (0, 4)
    call_command("run_delayworker", "--burst", "-v", "0")
    assert {Job.objects.get(pk=job.pk).status for job in rest} == {Status.SUCCEEDED}


def test_a_second_signal_exits_at_once(redis_url, tmp_path):
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    wait_for(live_workers)
    job = schedule(tasks.slow, in_=0, args=["interrupted", 30.0])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
    worker.send_signal(signal.SIGTERM)
    wait_for(lambda: "finishing running actions" in (tmp_path / "w.log").read_text())
    worker.send_signal(signal.SIGTERM)
    try:
        assert worker.wait(5) == 1  # long before the 30 s action could have finished
    finally:
        if worker.poll() is None:  # not left running into the next tests
            worker.kill()
            worker.wait()
    assert "second signal: exiting now" in (tmp_path / "w.log").read_text()
    # the action's transaction died with the process; the job is still there to retry
    assert Job.objects.get(pk=job.pk).status == Status.RUNNING
    assert not Record.objects.filter(label="interrupted").exists()


def test_a_burst_exits_1_when_redis_stays_unreachable(tmp_path, settings):
    """A burst always ends: when Redis goes away under it, its worker threads back off
    only for BURST_REDIS_SECONDS, then it exits 1 saying why (it used to retry forever,
    and bursts run from cron piled up behind it)."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": url}
    try:
        job = schedule(tasks.stop_redis_then_fail, in_=0, args=[url], max_attempts=1)
        cmd = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
               "-v", "1", "--burst"]  # fmt: skip
        with open(tmp_path / "w.log", "wb") as log:
            burst = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(url), stdout=log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        try:
            code = burst.wait(15)
        finally:
            if burst.poll() is None:
                burst.kill()
                burst.wait()
        assert Job.objects.get(pk=job.pk).status == Status.DEAD  # it did run the job
        text = (tmp_path / "w.log").read_text()
        assert code == 1 and "--burst: Redis has been unreachable for 5 s" in text, text
        assert "Traceback" not in text, text
    finally:
        server.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_start_up_exits_without_a_traceback(signum):
    """SIGTERM/SIGINT/SIGHUP while the start-up checks wait on a Redis slow to answer (a rolling
    update, Ctrl-C): the process ends by its own exit, 0 or 1 with the start-up check's
    one-line error, never by the signal (as PID 1 in a container: ignored until SIGKILL)
    nor with a KeyboardInterrupt traceback."""
    listener = socket.socket()  # a Redis that accepts and is slow to answer
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(30)
    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    cmd = [sys.executable, "-m", "django", "run_delayworker", "--settings", "tests.settings",
           "-v", "1"]  # fmt: skip
    worker = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(url), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        conn, _ = listener.accept()  # the worker is in its start-up check of Redis
        worker.send_signal(signum)
        out, _ = worker.communicate(timeout=20)
        conn.close()
    finally:
        listener.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    text = out.decode(errors="replace")
    assert "Traceback" not in text, text[-800:]
    assert worker.returncode in (0, 1), (worker.returncode, text[-800:])


def test_verbosity_2_logs_a_status_line(redis_url, tmp_path):
    log = tmp_path / "w.log"
    worker = start_worker(redis_url, "-v", "2", env={"DELAYJOBS_HEARTBEAT_SECONDS": "0.2"}, log=log)
    try:
        wait_for(live_workers)
        schedule(tasks.record, in_=0, args=["counted"])
        # processed=1, or 2 when the start-up sweep, which read the row before it ran,
        # added it again and a second delivery was dropped within the same status line
        # (shown step by step by the next test)
        wait_for(lambda: re.search(r"status: processed=[12] failed=0", log.read_text()))
    finally:
        assert stop(worker) == 0
    assert "queues default, roles promoter+worker, concurrency 1" in log.read_text()


def test_a_sweep_that_read_the_row_before_its_job_ran_adds_it_again_and_it_runs_once(
    redis_url, tmp_path
):
    """Why the status line above may say processed=2: a reconcile sweep (the worker's own,
    at start-up) reads a waiting row, the job runs and its id is acked, then the sweep adds
    the id again. It takes it out once it reads the row finished, but a worker may claim
    it first: a second delivery, dropped by the claim's conditional UPDATE, never a second
    run of the action."""
    engine = get_engine()
    worker = start_worker(redis_url, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.record, in_=0.5, args=["once"])  # pending: read by the sweep
        read: list[str] = []

        def progress() -> None:  # the sweep has read the row: the job runs and is acked
            if not read:
                read.append(Job.objects.get(pk=job.pk).status)
                wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED)
                wait_for(lambda: engine.stats("default").in_flight == 0)

        reconcile(engine, horizon=horizon(), progress=progress)
        assert read == [Status.SCHEDULED]
        # Its schedule added it once; the sweep added it again.
        assert engine.stats("default").counters["added"] >= 2
        wait_for(lambda: engine.stats("default").in_flight + engine.stats("default").ready == 0)
    finally:
        assert stop(worker) == 0
    assert Record.objects.filter(label="once").count() == 1
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1)


def test_failing_action_retries_then_dies_and_stats_show_it(redis_url, tmp_path, capsys):
    env = {"DELAYJOBS_RETRY_BACKOFF_SECONDS": "0.05"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(live_workers)
        job = schedule(tasks.fail, in_=0, max_attempts=3)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.DEAD, timeout=30)
    finally:
        assert stop(worker) == 0
    job.refresh_from_db()
    assert job.attempts == 3
    events = list(job.events.values_list("kind", flat=True))
    assert events.count("failed") == 3 and events[-1] == "dead"
    retries = list(job.events.filter(kind="started").values_list("at", flat=True))
    assert all(b > a for a, b in itertools.pairwise(retries))
    call_command("delayjobs_stats")
    out = capsys.readouterr().out.splitlines()
    header, line = out[0].split(), out[1].split()
    assert dict(zip(header, line, strict=False))["garbage"] == "1"


def test_worker_refuses_unreachable_redis_with_a_clear_error(settings):
    from django.core.management.base import CommandError

    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(CommandError, match=r"cannot use Redis at redis://127\.0\.0\.1:1/0"):
        call_command("run_delayworker", "--burst", "-v", "0")


@pytest.mark.parametrize("host", ["\u00e9" * 70, "caf\u00e9..example", "a\x00b"])
def test_worker_refuses_a_metrics_host_it_cannot_listen_on_with_a_command_error(host, settings):
    """A name IDNA cannot encode (a label over 63 characters once encoded, an empty
    label) or a NUL: socket.bind raises TypeError, not OSError."""
    from django.core.management.base import CommandError

    pytest.importorskip("prometheus_client")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}  # not loopback
    with pytest.raises(CommandError, match="--metrics-port: cannot listen on"):
        call_command("run_delayworker", "--burst", "-v", "0", "--metrics-port", "0",
                     "--metrics-host", host)  # fmt: skip


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "metrics.internal"])
def test_worker_refuses_metrics_beyond_loopback_without_a_token(host, settings):
    """The worker's metrics port has no sessions: on any address but loopback it needs
    METRICS_TOKEN, else anyone who reaches it reads the deployment's metrics. Refused
    before anything listens or runs."""
    from django.core.management.base import CommandError

    job = schedule(tasks.record, in_=0, args=["x"])
    with pytest.raises(CommandError, match="METRICS_TOKEN"):
        call_command("run_delayworker", "--burst", "-v", "0", "--metrics-port", "0",
                     "--metrics-host", host)  # fmt: skip
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED  # nothing ran
    from django_delayjobs.management.commands.run_delayworker import check_metrics_host

    for loopback in ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST."]:
        check_metrics_host({"metrics_host": loopback, "metrics_port": 9808})
    check_metrics_host({"metrics_host": host, "metrics_port": None})  # no metrics: no check
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": "t" * 32}
    check_metrics_host({"metrics_host": host, "metrics_port": 9808})


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_the_metrics_port_listens_on_the_ipv6_loopback(host, capsys):
    """::1 is one of the loopback addresses --metrics-host takes without a token; the
    server was IPv4 only, so the command refused it ("cannot listen")."""
    pytest.importorskip("prometheus_client")
    call_command("run_delayworker", "--burst", "-v", "1", "--metrics-port", "0",
                 "--metrics-host", host)  # fmt: skip
    assert re.search(r"delayjobs metrics: http://\[::1\]:\d+/metrics", capsys.readouterr().out)
    from django_delayjobs.metrics.server import MetricsServer

    server = MetricsServer(host, 0).start()
    try:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert server.url == f"http://[::1]:{server.port}/metrics"
            assert response.status == 200
            assert b"delayjobs_jobs_total" in response.read()
    finally:
        server.close()


def test_worker_warns_or_refuses_an_evicting_redis(tmp_path, settings, capsys):
    from django.core.management.base import CommandError

    with EmbeddedRedis(tmp_path / "r") as server:
        redis.Redis.from_url(server.url).config_set("maxmemory-policy", "allkeys-lru")
        settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": server.url}
        call_command("run_delayworker", "--burst", "-v", "0")
        assert "maxmemory-policy is 'allkeys-lru'" in capsys.readouterr().err
        settings.DELAYJOBS = {**settings.DELAYJOBS, "REFUSE_EVICTING_REDIS": True}
        with pytest.raises(CommandError, match="noeviction"):
            call_command("run_delayworker", "--burst", "-v", "0")


def test_reconcile_command_repairs_and_reports(redis_client, capsys):
    jobs = [schedule(tasks.record, in_=3600 * 24, args=[str(n)], queue="q1") for n in range(3)]
    age_rows()
    redis_client.flushdb()
    call_command("delayjobs_reconcile")
    assert "q1: re-added 3 job(s)" in capsys.readouterr().out
    assert get_engine().stats("q1").pending == len(jobs)
    call_command("delayjobs_reconcile")
    assert "repaired 0 job(s)" in capsys.readouterr().out
