"""The worker process's life, round 7: a clean stop on a Redis that does not answer."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import redis

from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine
from tests.helpers import start_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def exit_code(worker: subprocess.Popen[bytes], timeout: float) -> int:
    """The worker's exit code within ``timeout`` seconds (killed if it takes longer)."""
    try:
        return worker.wait(timeout)
    finally:
        if worker.poll() is None:  # not left running into the next tests
            worker.kill()
            worker.wait()


def test_a_clean_stop_on_a_frozen_redis_waits_for_it_once_not_once_per_queue(tmp_path):
    """A SIGTERM to a worker serving 8 queues of a Redis that does not answer took a
    socket timeout per queue to remove its heartbeat (9 s), and as long again at each
    heartbeat while it ran: every queue's call waited for the same dead server. It now
    gives up on the others once one call found Redis unreachable, as the promoter does
    (the heartbeats, the lease extensions and the metrics flush alike)."""
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    assert server.pid is not None
    queues = ",".join(f"q{n}" for n in range(8))
    worker = start_worker(url, "--queues", queues, log=tmp_path / "w.log")
    try:
        with redis.Redis.from_url(url) as client:  # each queue's heartbeat is written
            engine = Engine(client, prefix=delayjobs_settings.PREFIX)
            wait_for(lambda: all(engine.stats(f"q{n}").live_workers for n in range(8)))
        os.kill(server.pid, signal.SIGSTOP)
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert exit_code(worker, 30) == 0
        assert time.monotonic() - started < 6  # was 9.4 s: one socket timeout per queue
    finally:
        stop(worker)
        os.kill(server.pid, signal.SIGCONT)
        server.close()
