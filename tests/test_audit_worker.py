"""Audit of the worker process and its commands: each test reproduces one bug."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status
from tests.helpers import ROOT, worker_env
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst(*args: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", *args)


def test_burst_runs_a_job_whose_lease_ran_out():
    """A worker killed (kill -9, OOM) after claiming an id leaves it in flight until its
    lease ends; then it is due again. ``--burst`` ("process what is due now") calls only
    ``promote_due`` and never recovers expired leases, so a deployment that drains with
    bursts (cron) never runs that job again: it stays ``scheduled`` forever, its id stuck
    in ``unack``. A burst should recover expired leases as the promoter does."""
    job = schedule(tasks.record, in_=0, args=["orphan"])
    engine = get_engine()
    engine.promote("default", 10)
    assert engine.claim("default", 1, 1) == [str(job.pk)]  # a worker that died at once
    time.sleep(0.05)  # its 1 ms lease is over
    burst()
    assert Record.objects.filter(label="orphan").count() == 1
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_a_process_that_has_stopped_never_heartbeats_again(monkeypatch):
    """``beat_lock`` is meant to ensure "a last heartbeat never follows unregister()", but
    it only orders the two calls: when the housekeeping thread is between its owner check
    (a database query) and its heartbeat as the process stops, the main thread unregisters
    first and the housekeeping thread then records the stopped process as live for three
    HEARTBEAT_SECONDS (worker.py ``heartbeat``: only ``fatal`` is checked, not
    ``stopped``). The admin and ``delayjobs_health`` then count a worker that is gone.
    Right: once ``stopped`` is set (or unregister ran), no heartbeat is written."""
    from django_delayjobs import worker

    real = worker.check_owner

    def slow_database(engine):  # the owner check waits on a busy database
        time.sleep(1.5)
        real(engine)

    monkeypatch.setattr(worker, "check_owner", slow_database)
    burst()  # nothing due: ends at once, while housekeeping is still in its owner check
    time.sleep(2.0)  # housekeeping finishes its step
    assert get_engine().stats("default").live_workers == 0


def test_a_burst_ends_when_redis_goes_away_under_it(tmp_path, settings):
    """docs/worker.md: ``--burst`` "process[es] what is due now, then exit[s] 0 (it always
    ends ...)". If Redis goes away during a burst, every worker thread's ``claim`` raises
    ``EngineUnavailable`` and ``work_loop`` backs off and tries again forever
    (worker.py ``work_loop``: ``burst_done`` is only reached when a claim succeeds), so
    a burst run from cron or a CI step never ends and the next ones pile up behind it.
    Right: a burst that cannot reach Redis for a bounded time gives up and exits
    (non-zero, saying why), as it refuses an unreachable Redis at start-up."""
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
            burst.wait(8)
        except subprocess.TimeoutExpired:
            pass
        finally:
            still_running = burst.poll() is None
            if still_running:
                burst.kill()
                burst.wait()
        assert Job.objects.get(pk=job.pk).status == Status.DEAD  # it did run the job
        assert not still_running, "the burst was still running 8 s after Redis went away"
    finally:
        server.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_exits_0_without_a_traceback(signum, tmp_path):
    """DESIGN.md and docs/worker.md: on SIGTERM/SIGINT the worker stops and exits 0. The
    handlers are only installed in ``WorkerProcess.run()`` (worker.py ``run`` ->
    ``install_signal_handlers``), after the start-up checks of Redis and the database
    (run_delayworker.py ``run``: ``check_redis``, ``check_owner``, the metrics port). A
    stop that arrives meanwhile (a rolling update, Ctrl-C while Redis is slow to answer)
    kills the process by SIGTERM (-15, nothing logged; as PID 1 in a container it is
    ignored until the SIGKILL) or ends it with a KeyboardInterrupt traceback from
    redis-py. Right: handlers installed first thing in ``handle()``; a stop during
    start-up ends the process by its own exit (0, or 1 with the one-line error of a
    start-up check cut short), never by the signal and never with a traceback."""
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
    # 0, or 1 with the start-up check's one-line error: not killed by the signal
    assert worker.returncode in (0, 1), (worker.returncode, text[-800:])
