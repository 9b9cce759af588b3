"""Audit of the hand-back of waiting ids: what changes between a decision and its release.

``give_back`` read which ids were lost, asked Redis about the stale ones (a round trip)
and released the rest in a second lock section: an id an extension found lost in between
was nacked from under the worker that holds it now. A burst that could not hand back its
ids (Redis did not answer) recorded only some of them, and exited 0 with the rest in
flight. And an id let go (or left) as lost while another thread of the process claimed it
again was released all the same: in flight under the fresh lease, held by nobody."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine, close_client
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.test_audit_lease4 import stale_batch
from tests.test_audit_lse import another

Q = "default"
HOUR = 3_600_000


@pytest.fixture
def stoppable(own_redis: EmbeddedRedis) -> Iterator[Engine]:
    """An engine on ``own_redis`` whose calls give up after 0.5 s, once, when it is stopped."""
    client = redis.Redis.from_url(own_redis.url, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        yield Engine(client, prefix="t")
    finally:
        close_client(client)


def hold_fresh(engine: Engine, worker: WorkerProcess, job_id: str, lease_ms: int) -> None:
    """Claim ``job_id`` for ``worker`` now (confirmed now, whatever its lease in Redis)."""
    engine.add(Q, {job_id: 0})
    worker.hold(Q, engine.claim(Q, 1, lease_ms=lease_ms))


def test_an_id_found_lost_while_its_batch_is_handed_back_is_not_nacked(engine, monkeypatch):
    """While the call asking about a stale id of the batch is under way, an extension finds
    another waiting id lost (another worker claimed it once its lease had ended): the hand
    back must leave it to that worker, not nack it (nack moves it whoever holds it)."""
    worker = WorkerProcess(engine, Options(queues=[Q]))
    stale_batch(engine, worker, ["s"])
    hold_fresh(engine, worker, "x", lease_ms=0)  # its lease ends at once
    time.sleep(0.01)
    real = engine.extend_lease

    def asked_then_found_lost(*args, **kwargs):  # type: ignore[no-untyped-def]
        extended = real(*args, **kwargs)  # the call asking about s
        monkeypatch.setattr(engine, "extend_lease", real)
        assert engine.recover_expired(Q) == ["x"]
        assert another(engine).claim(Q, 1, lease_ms=HOUR) == ["x"]
        worker.extend(Q, {"x": worker.leases["x"]})  # the housekeeping thread's
        assert "x" in worker.lost
        return extended

    monkeypatch.setattr(engine, "extend_lease", asked_then_found_lost)
    assert worker.give_back(Q, ["s", "x"], threading.get_ident()) == 1  # s alone
    stats = engine.stats(Q)
    assert (stats.in_flight, stats.pending + stats.ready) == (1, 1)  # x: the other's
    assert worker.held == {}


@pytest.mark.django_db(transaction=True)
def test_a_burst_that_could_not_ask_about_its_batch_counts_every_id_it_left(own_redis, stoppable):
    """Redis does not answer the call asking about a stale id of the batch being handed
    back: the ids of the batch that were not stale are left in flight too, under this
    burst's lease, and the burst must exit 1 for them as for the stale one."""
    assert own_redis.pid is not None
    worker = WorkerProcess(stoppable, Options(queues=[Q], burst=True))
    stale_batch(stoppable, worker, ["s"])
    hold_fresh(stoppable, worker, "x", lease_ms=HOUR)
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        assert worker.give_back(Q, ["s", "x"], threading.get_ident()) is None
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    assert (worker.unconfirmed, worker.held) == ({"s", "x"}, {})
    assert stoppable.stats(Q).in_flight == 2
    with pytest.raises(WorkerDied, match="did not answer to confirm their lease"):
        worker.run()


def test_a_burst_whose_hand_back_is_not_answered_counts_the_ids_it_left(own_redis, stoppable):
    """The nack of a burst's hand-back gets no answer: its ids stay in flight under the
    burst's lease, recorded nowhere, and the burst exited 0."""
    assert own_redis.pid is not None
    worker = WorkerProcess(stoppable, Options(queues=[Q], burst=True))
    hold_fresh(stoppable, worker, "x", lease_ms=HOUR)
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        assert worker.give_back(Q, ["x"], threading.get_ident()) is None
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    assert (worker.unconfirmed, worker.held) == ({"x"}, {})


def test_a_lost_id_claimed_again_while_its_batch_is_handed_back_is_handed_back(engine, monkeypatch):
    """A waiting id is lost (Redis no longer had it in flight); while the call asking about
    a stale id of its batch is under way, another thread's claim takes it again (Redis was
    given it back): in flight under this process's fresh lease, it is handed back, not let
    go there, extended by nobody, with a burst putting nothing back (it is in flight)."""
    worker = WorkerProcess(engine, Options(queues=[Q], burst=True))
    stale_batch(engine, worker, ["s"])
    hold_fresh(engine, worker, "x", lease_ms=0)
    time.sleep(0.01)
    assert engine.recover_expired(Q) == ["x"]
    worker.extend(Q, {"x": worker.leases["x"]})
    assert "x" in worker.lost
    real = engine.extend_lease

    def asked_then_claimed_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        extended = real(*args, **kwargs)  # the call asking about s
        monkeypatch.setattr(engine, "extend_lease", real)
        assert worker.hold(Q, engine.claim(Q, 1, lease_ms=HOUR)) == []  # another thread's
        return extended

    monkeypatch.setattr(engine, "extend_lease", asked_then_claimed_again)
    assert worker.give_back(Q, ["s", "x"], threading.get_ident()) == 2
    stats = engine.stats(Q)
    assert (stats.in_flight, stats.pending + stats.ready) == (0, 2)
    assert (worker.let_gone, worker.held) == (set(), {})


def test_an_id_claimed_again_once_found_lost_is_started(engine, monkeypatch):
    """The call asking about a stale id finds it out of flight and marks it lost; before
    the worker thread lets it go, another thread's claim takes it again: it is this
    thread's, under a fresh lease, and must be started, not released to wait there."""
    worker = WorkerProcess(engine, Options(queues=[Q], burst=True))
    thread = threading.get_ident()
    stale_batch(engine, worker, ["a"], lease_ms=0)
    time.sleep(0.01)
    assert engine.recover_expired(Q) == ["a"]
    real = worker.reconfirm

    def found_lost_then_claimed_again(ids):  # type: ignore[no-untyped-def]
        kept = real(ids)
        assert "a" in worker.lost
        assert worker.hold(Q, engine.claim(Q, 1, lease_ms=HOUR)) == []  # another thread's
        return kept

    monkeypatch.setattr(worker, "reconfirm", found_lost_then_claimed_again)
    assert worker.takes_up(Q, "a", thread, deque())
    assert (worker.let_gone, list(worker.held)) == (set(), ["a"])


def test_an_id_claimed_again_while_redis_does_not_answer_about_it_is_started(
    own_redis, stoppable, monkeypatch
):
    """Another thread's claim takes a stale id again just before Redis stops answering the
    call asking about it: under the claim's fresh lease, it is started, not left (released
    in flight under that lease, and counted by a burst as not run)."""
    assert own_redis.pid is not None
    worker = WorkerProcess(stoppable, Options(queues=[Q], burst=True))
    stale_batch(stoppable, worker, ["a"], lease_ms=0)
    time.sleep(0.01)
    assert stoppable.recover_expired(Q) == ["a"]
    stoppable.extend_lease(Q, ["b"], HOUR)  # its script loaded
    real = stoppable.extend_lease

    def claimed_again_then_no_answer(*args, **kwargs):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(stoppable, "extend_lease", real)
        assert worker.hold(Q, stoppable.claim(Q, 1, lease_ms=HOUR)) == []  # another thread's
        assert own_redis.pid is not None
        os.kill(own_redis.pid, signal.SIGSTOP)
        return real(*args, **kwargs)

    monkeypatch.setattr(stoppable, "extend_lease", claimed_again_then_no_answer)
    try:
        assert worker.takes_up(Q, "a", threading.get_ident(), deque())
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    assert (worker.unconfirmed, list(worker.held)) == (set(), ["a"])
