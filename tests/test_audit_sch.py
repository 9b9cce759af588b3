"""Audit of the entry points during outages: ``schedule()`` and ``schedule_many()`` while
Redis does not answer (one read timeout, the outbox keeps the job), the refusal when the
jobs' own database is unavailable (it names the database), and the health check's
database probe (bounded as ``bounded.read`` bounds a read)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from django_delayjobs import schedule
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine, reset_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, schedule_many
from tests.testapp import tasks

from .test_rest_helpers import redis_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


# -- schedule() while Redis does not answer --------------------------------------------------


@pytest.fixture
def own_redis(tmp_path, settings) -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own (the jobs' Redis), which it may stop with SIGSTOP."""
    server = EmbeddedRedis(tmp_path / "redis")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": server.start()}
    assert server.pid is not None
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.close()


def frozen(server: EmbeddedRedis) -> None:
    """Stop ``server`` with a fresh engine whose connection is open: as in a web process
    that has not read the queue directory within ``DIRECTORY_TTL``."""
    assert server.pid is not None
    reset_engine()
    get_engine().client.ping()
    os.kill(server.pid, signal.SIGSTOP)


@pytest.mark.slow
def test_a_schedule_while_redis_does_not_answer_waits_for_one_timeout(own_redis):
    """Redis frozen: the add read the queue directory first (for shards of an older
    count) and timed out, then ran its script and timed out again: two timeouts for a
    ``schedule()`` once per ``DIRECTORY_TTL``. The job is committed all the same, and
    reconcile hands it to Redis once Redis answers again."""
    frozen(own_redis)
    started = time.monotonic()
    job = schedule(tasks.record, in_=600, args=["x"])
    took = time.monotonic() - started
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGCONT)
    assert took < 2 * SOCKET_TIMEOUT, took  # a second wait makes it 2 s at least
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    assert redis_state(job) is None  # the add did not happen...
    reconcile(get_engine(), horizon=None)
    assert redis_state(job) == "pending"  # ...reconcile made it


@pytest.mark.slow
def test_a_schedule_many_over_queues_while_redis_does_not_answer_waits_for_one_timeout(
    own_redis,
):
    """Redis frozen: ``schedule_many`` made one add per queue (and per batch), each
    waiting for the read timeout, on a Redis that had already not answered the first:
    three queues took 3 s and more. Every job is committed all the same."""
    jobs = [build_job(tasks.record, in_=600, args=["x"], queue=q) for q in ("a", "b", "c")]
    frozen(own_redis)
    started = time.monotonic()
    schedule_many(jobs)
    took = time.monotonic() - started
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGCONT)
    assert took < 2 * SOCKET_TIMEOUT, took  # a second wait makes it 2 s at least
    assert Job.objects.filter(status=Status.SCHEDULED).count() == 3
    reconcile(get_engine(), horizon=None)
    assert [redis_state(job) for job in jobs] == ["pending"] * 3
