"""Audit of reconcile, the outbox and recovery after Redis loses data."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from django_delayjobs import timing
from django_delayjobs.connection import get_engine
from django_delayjobs.embedded import EmbeddedRedis, find_redis_server, start_server
from django_delayjobs.engine import Engine
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
