"""Reconcile's sweep of Redis garbage when Redis stops answering half-way through it."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from django.db import connection

from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import EngineUnavailable
from django_delayjobs.reconcile import CHUNK, reconcile

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_redis_that_stops_answering_during_the_garbage_sweep_costs_one_timeout(
    own_jobs_redis: EmbeddedRedis,
) -> None:
    """The full pass reads each queue's garbage in chunks (ZSCAN) and looks their jobs up
    in the database. Redis frozen after the first chunk was read: the pass fails after
    one read timeout (not one per queue left, nor one per chunk), purges nothing it did
    not check, and the next pass, Redis back, clears every id whose row is gone."""
    engine = get_engine()
    queues = [f"q{n}" for n in range(5)]
    ids = {queue: [str(uuid.uuid4()) for _ in range(CHUNK + 500)] for queue in queues}
    for queue in queues:  # rows deleted long ago
        engine.add(queue, dict.fromkeys(ids[queue], 0))
        engine.promote(queue, batch=len(ids[queue]))
        assert len(engine.claim(queue, len(ids[queue]))) == len(ids[queue])
        assert engine.bury(queue, ids[queue]) == len(ids[queue])
    assert own_jobs_redis.pid is not None
    pid = own_jobs_redis.pid
    frozen: list[float] = []

    def freeze_at_the_first_lookup(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if not frozen and "IN (" in sql.upper():  # the first chunk's statuses
            os.kill(pid, signal.SIGSTOP)
            frozen.append(time.monotonic())
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(freeze_at_the_first_lookup):
            with pytest.raises(EngineUnavailable):
                reconcile(engine, horizon=None)
            assert frozen
            assert time.monotonic() - frozen[0] < 3 * SOCKET_TIMEOUT  # 5 queues: not 5 s
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [engine.stats(queue).garbage for queue in queues] == [CHUNK + 500] * 5  # unchecked
    assert dict(reconcile(engine, horizon=None).cleared) == dict.fromkeys(queues, CHUNK + 500)
    assert [engine.stats(queue).garbage for queue in queues] == [0] * 5
