"""A worker whose clock is behind Redis's. Redis is the clock of what is due, and a worker
never starts a job before its ``run_at`` on its own clock; in between, the job must wait,
not go round and round between the two (a Redis of this test's own, its clock set ahead
by libfaketime: a real server whose clock disagrees with this host's)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import find_redis_server
from django_delayjobs.models import Job, Status
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import free_port, redis_answers, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: How far Redis's clock is ahead of this host's, in seconds.
AHEAD = 4.0


@pytest.fixture
def redis_ahead(tmp_path: Path) -> Iterator[str]:
    """The URL of a redis-server whose clock is ``AHEAD`` seconds ahead; stopped by pid
    (its process group's: ``faketime`` forks the server and waits for it, so killing
    ``faketime`` alone left the server running)."""
    faketime = shutil.which("faketime")
    if faketime is None:
        pytest.skip("needs libfaketime's faketime command (Debian: apt-get install faketime)")
    port = free_port()
    server = subprocess.Popen(
        [faketime, "-f", f"+{AHEAD}s", find_redis_server(), "--port", str(port),
         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    client = redis.Redis(port=port)
    try:
        wait_for(lambda: redis_answers(client), timeout=10)
        seconds, micros = client.time()
        assert abs(seconds + micros / 1e6 - time.time() - AHEAD) < 0.5, "faketime had no effect"
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def test_a_job_due_on_redis_clock_waits_for_this_hosts_clock_without_going_round(
    redis_ahead, caplog
):
    caplog.set_level(logging.DEBUG, logger="django_delayjobs.worker")
    with override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": redis_ahead}):
        engine = get_engine()
        process = WorkerProcess(engine, Options(queues=["default"], tick=0.1))
        thread = threading.Thread(target=process.run)
        thread.start()
        try:
            wait_for(lambda: engine.stats("default").live_workers == 1)
            job = schedule(tasks.record, in_=AHEAD - 1, args=["late"])  # due on Redis at once
            wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=15)
        finally:
            process.stop()
            thread.join(10)
    started = Job.objects.get(pk=job.pk).started_at
    assert started is not None and started >= job.run_at  # never before run_at on this clock
    # Deferred once, for the 3 s this host's clock still needs; not handed back at once
    # again and again (a claim and a deferral each tick) until its clock caught up.
    deferred = [r for r in caplog.records if r.getMessage() == f"job {job.pk}: deferred"]
    assert len(deferred) == 1, [r.getMessage() for r in caplog.records]
