"""Audit of reconcile, the outbox and recovery after Redis loses data."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from django_delayjobs import sql, timing
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis, find_redis_server, start_server
from django_delayjobs.engine import Engine
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import reschedule, schedule
from tests.helpers import age_rows, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class RescheduledFirst(Engine):
    """An engine whose add lets "a user" reschedule a job just before it runs: the row
    changed after reconcile read it, and its own on-commit add reached Redis first."""

    moves: dict[str, timedelta]

    def add(self, queue, items, priorities=None, **options):  # type: ignore[no-untyped-def]
        for pk, in_ in self.moves.items():
            assert reschedule(pk, in_=in_)
        self.moves = {}
        return super().add(queue, items, priorities, **options)


def pending_due(queue: str) -> dict[str, int]:
    return dict(get_engine().next_due(queue, 100))


def test_reconcile_does_not_undo_a_reschedule_committed_after_it_read_the_row():
    earlier = schedule(tasks.record, in_=200, args=["earlier"])
    later = schedule(tasks.record, in_=100, args=["later"])
    age_rows()
    engine = RescheduledFirst(get_engine().client, prefix=get_engine().prefix)
    engine.moves = {str(earlier.pk): timedelta(seconds=30), str(later.pk): timedelta(hours=1)}
    assert sum(reconcile(engine, horizon=timedelta(minutes=5)).values()) == 0
    earlier.refresh_from_db()
    later.refresh_from_db()
    held = pending_due("default")
    # Moved earlier: due at its new time, not 170 s late at the one reconcile read.
    assert held[str(earlier.pk)] == pytest.approx(timing.to_ms(earlier.run_at), abs=1)
    # Moved later: an early delivery is harmless (the worker sees run_at and defers it).
    assert held[str(later.pk)] <= timing.to_ms(later.run_at)
    assert later.run_at > timezone.now() + timedelta(minutes=50)


def served_by(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


@pytest.mark.django_db(transaction=False)
def test_a_second_embedded_redis_on_a_directory_in_use_is_refused(tmp_path):
    """Two processes (the shop's ``embedded_redis`` started twice, say) on one directory:
    the second server took the socket over, and the first went on running, unreachable."""
    first = EmbeddedRedis(tmp_path / "redis")
    first.start()
    try:
        second = EmbeddedRedis(tmp_path / "redis")
        with pytest.raises(RuntimeError, match="already"):
            second.start()
        assert second.process is None
        assert served_by(first.url) == first.pid
    finally:
        first.close()


@pytest.mark.django_db(transaction=False)
def test_an_embedded_redis_killed_with_sigkill_starts_again_on_its_directory(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        assert server.process is not None
        server.process.kill()  # its socket file stays behind
        server.process.wait()
        server.start()
        assert served_by(server.url) == server.pid
    finally:
        server.close()


@pytest.mark.django_db(transaction=False)
def test_an_embedded_redis_does_not_take_the_socket_of_a_server_that_outlived_its_owner(
    tmp_path,
):
    directory = tmp_path / "redis"
    directory.mkdir()
    orphan = start_server([find_redis_server(), "--port", "0", "--save", "", "--unixsocket",
                           str(directory / "redis.sock"), "--dir", str(directory)])  # fmt: skip
    server = EmbeddedRedis(directory)
    try:
        wait_for(server._answers)  # the orphan binds its socket after a moment
        with pytest.raises(RuntimeError, match="already answers"):
            server.start()
        assert served_by(server.url) == orphan.pid
        server.close()  # no lock left behind: free again once the orphan is gone
        orphan.terminate()
        orphan.wait(10)
        server.start()
        assert served_by(server.url) == server.pid
    finally:
        server.close()
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def running_long(engine: Engine) -> Job:
    """A job a live worker has been running for ten minutes (past its first lease, which
    it extends), claimed in Redis and in the database."""
    job = schedule(tasks.record, in_=0, args=["long"])

    def promoted_and_claimed() -> list[str]:
        engine.promote("default")  # due now: pending until the next ms
        return engine.claim("default", 1)

    assert wait_for(promoted_and_claimed) == [str(job.pk)]
    assert sql.claim(str(job.pk), "w", timezone.now(), 5) is not None
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    age_rows(20)
    return job


def test_a_job_still_running_when_redis_lost_its_data_is_not_delivered_again(redis_client):
    engine = get_engine()
    job = running_long(engine)
    redis_client.flushdb()  # a restart without persistence: its lease is gone
    assert reconcile(engine, horizon=timedelta(minutes=5)) == {"default": 1}
    # Not handed to a second worker while the first one runs it: back in flight, with a
    # lease its worker keeps extending.
    assert engine.claim("default", 1) == []
    assert engine.extend_lease("default", [str(job.pk)], 60_000) == [str(job.pk)]
    assert engine.claim("default", 1) == []
    assert sum(reconcile(engine, horizon=timedelta(minutes=5)).values()) == 0


def test_a_running_job_redis_lost_with_its_worker_comes_back_when_its_lease_ends(
    redis_client, settings
):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}
    engine = get_engine()
    job = running_long(engine)
    redis_client.flushdb()  # and its worker died: nobody extends the lease
    assert reconcile(engine, horizon=timedelta(minutes=5)) == {"default": 1}
    assert wait_for(lambda: engine.recover_expired("default")) == [str(job.pk)]
    assert engine.claim("default", 1) == [str(job.pk)]
    claimed = sql.claim(str(job.pk), "w2", timezone.now(), 5)
    assert claimed is not None and claimed.deliveries == 2 and claimed.status == Status.RUNNING


def test_a_running_job_that_finishes_as_reconcile_adopts_it_leaves_nothing_in_flight(
    redis_client,
):
    engine = get_engine()
    job = running_long(engine)
    redis_client.flushdb()

    class FinishedFirst(Engine):
        def adopt(self, queue, ids, lease_ms):  # type: ignore[no-untyped-def]
            Job.objects.filter(pk=job.pk).update(status=Status.SUCCEEDED)
            return super().adopt(queue, ids, lease_ms)

    assert sum(reconcile(FinishedFirst(engine.client, prefix=engine.prefix)).values()) == 0
    assert engine.stats("default").in_flight == 0
