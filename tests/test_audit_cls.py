"""Audit of the Redis Cluster paths (round 2): folding counters, waits, promote and claim.

Every test marked ``cluster`` needs the session's Redis Cluster (``pytest -m cluster``);
the others run on one Redis too, for comparison.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from tests.engine.conftest import Backend, on_cluster, open_backend

Q = "q"
OLD = [f"q#{k}/2" for k in range(2)]  # the shards of an older count of q
INTO = "q#0/3"  # the shard of the current count that counters are folded into
COUNTS = {"added": 7, "acked": 4, "removed": 3}


@pytest.fixture(params=["single", on_cluster("cluster")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


@pytest.fixture
def client(backend: Backend) -> Iterator[Any]:
    made = backend.client()
    made.flushall()
    yield made
    close_client(made)


def counters(engine: Engine, shard: str) -> dict[str, int]:
    raw = engine.client.hgetall(engine.keys(shard).counters)
    return {k.decode(): int(v) for k, v in raw.items() if v.lstrip(b"-").isdigit() and int(v)}


def test_a_field_of_the_new_shard_that_holds_no_integer_counts_nothing_twice(client):
    """The new shard's ``acked`` holds another program's text. On one Redis the fold moves
    the other counts and leaves ``acked`` in the old shard. On a Cluster the counts were
    taken, then added in a MULTI, where the ``acked`` HINCRBY failed but the others were
    applied (Redis does not roll a transaction back): the put-back gave them to the old
    shard again, so they were counted twice, and again at every promoter pass."""
    engine = Engine(client, prefix="t", shards={Q: 3})
    for shard in OLD:
        client.hset(engine.keys(shard).counters, mapping=COUNTS)
        client.sadd(engine.queues_key, shard)
    client.hset(engine.keys(INTO).counters, "acked", "x")
    for _ in range(3):  # every promoter pass forgets the empty shards
        with contextlib.suppress(EngineUnavailable):  # it was raised on a Cluster
            engine.forget_empty_shards(Q)
    moved = {"added": 14, "removed": 6}
    assert counters(engine, INTO) == moved
    assert client.hget(engine.keys(INTO).counters, "acked") == b"x"
    left = [counters(engine, shard) for shard in OLD]
    assert left == [{"acked": 4}, {"acked": 4}]
