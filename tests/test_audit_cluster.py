"""Audit of the Redis Cluster area: failing tests first (moved to their module once fixed)."""

from __future__ import annotations

from tests.engine.test_sharded import HOUR, N, Q, backend, engine, ids, redis_client  # noqa: F401


def test_claims_by_queue_name_step_each_queue_s_own_turn(engine):  # noqa: F811
    """A caller that claims from another queue between claims from ``q`` still gets one
    id from each shard of ``q`` in 6 claims (one turn for every queue gave ``q`` every
    other start: 3 of its 6 shards)."""
    given = ids(60)
    engine.add(Q, dict.fromkeys(given, 0))
    first = []
    for _ in range(N):
        assert engine.claim("other", 1, HOUR) == []
        first += engine.claim(Q, 1, HOUR)
    assert sorted(engine.home(Q, i) for i in first) == engine.shards(Q)
