"""A claim that Redis ran after the worker gave up waiting for it.

Redis stalled longer than the client's socket timeout (1 s) with a worker's claim on its
way: a fork for a snapshot of a large dataset, a slow command, or, here, SIGSTOP. The
claim failed with a timeout in the worker, but Redis ran it once woken: its ids went in
flight under a lease nobody held, and waited for that lease to end (``LEASE_SECONDS``,
300 s by default) before they were handed out again.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs import schedule
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import SOCKET_TIMEOUT
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine, EngineUnavailable
from django_delayjobs.models import Job, Status
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


class StopsRedisFirst(redis.UnixDomainSocketConnection):
    """A connection that, when its thread asks (``asked.stop``), stops Redis (SIGSTOP) just
    before it sends the command: Redis holds it unread and runs it once woken. Not before
    Redis has accepted the connection: what came in on one it had not yet accepted when its
    client gave up is dropped with it, and the command never runs."""

    redis_pid = 0
    asked = threading.local()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if getattr(self.asked, "stop", False):
            self.asked.stop = False
            # a round trip first: Redis has accepted the connection (it may be new)
            super().send_packed_command(self.pack_command("PING"), check_health)
            assert self.read_response() == b"PONG"
            os.kill(self.redis_pid, signal.SIGSTOP)
        super().send_packed_command(command, check_health)


def stopping_client(server: EmbeddedRedis) -> redis.Redis:
    """A client with the worker's timeout (1 s, no retries) over ``StopsRedisFirst``."""
    assert server.pid is not None
    StopsRedisFirst.redis_pid = server.pid
    pool = redis.ConnectionPool(connection_class=StopsRedisFirst, path=str(server.socket_path),
                                socket_timeout=SOCKET_TIMEOUT,
                                retry=Retry(NoBackoff(), 0))  # fmt: skip
    return redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))


def freeze_around_first_claim(engine: Engine, server: EmbeddedRedis) -> list[Exception]:
    """Send the engine's first claim to a Redis stopped just before, and wake Redis once
    the call has failed (Redis then runs it); return that call's errors."""
    real, lost = engine.claim, []
    assert server.pid is not None
    pid = server.pid

    def claim(*args: Any, **kwargs: Any) -> list[str]:
        if lost:
            return real(*args, **kwargs)
        StopsRedisFirst.asked.stop = True
        try:
            return real(*args, **kwargs)
        except EngineUnavailable as exc:
            lost.append(exc)
            raise
        finally:
            os.kill(pid, signal.SIGCONT)

    engine.claim = claim  # type: ignore[method-assign]
    return lost


def test_jobs_a_claim_took_after_its_worker_gave_up_run_at_once_not_after_the_lease(
    own_jobs_redis, settings
):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 300}
    engine = Engine(stopping_client(own_jobs_redis), prefix=delayjobs_settings.PREFIX)
    jobs = [schedule(tasks.record, in_=0, args=[f"job-{n}"]) for n in range(3)]
    wait_for(lambda: engine.stats("default").ready == 3)
    assert engine.claim("other", 1) == []  # the script loaded: EVALSHA runs on waking
    lost = freeze_around_first_claim(engine, own_jobs_redis)
    process = WorkerProcess(engine, Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        # seconds, not the 300 s of the lease the lost call gave them
        wait_for(lambda: Job.objects.filter(status=Status.SUCCEEDED).count() == 3, timeout=20)
    finally:
        process.stop()
        thread.join(30)
        engine.close()
    assert len(lost) == 1 and "unreachable" in str(lost[0])  # the worker never heard back
    assert sorted(Record.objects.values_list("label", flat=True)) == [
        f"job-{n}" for n in range(3)
    ]  # each once
    assert {job.pk for job in jobs} == set(Job.objects.values_list("pk", flat=True))
