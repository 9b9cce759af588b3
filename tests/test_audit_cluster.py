"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

import uuid
from collections import Counter

from django_delayjobs.connection import get_engine
from django_delayjobs.worker import Options, WorkerProcess


def test_a_sharded_queue_after_another_has_every_shard_claimed_from_in_turn(settings):
    """Every shard of a queue is tried first in turn, whatever queues come before it: a
    worker on ``default,orders`` with ``default`` empty claimed from shards 1, 3 and 5 of
    ``orders`` only (each claim took two turns, one per queue), so while those had ids
    the other three starved."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 6}}
    engine = get_engine()
    now = engine.server_time_ms()
    for shard in engine.shards("orders"):
        engine.add(shard, {str(uuid.uuid4()): now for _ in range(2)})
    queues = ["default", "orders"]
    process = WorkerProcess(engine, Options(queues=queues))
    claimed = [process.claim(queues) for _ in range(6)]  # ids left in every shard
    assert Counter(shard for shard, _ in claimed) == dict.fromkeys(engine.shards("orders"), 1)
