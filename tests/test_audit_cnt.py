"""Audit of folding the counters of a forgotten shard (``Engine.forget_empty_shards``).

Every test runs on one Redis and (``-m cluster``) on the session's Redis Cluster, where the
old and the new shards of ``q`` live on different masters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from tests.engine.conftest import Backend, on_cluster, open_backend

Q = "q"
OLD = [f"q#{k}/2" for k in range(2)]  # the shards of the old count
INTO = "q#0/3"  # the shard of the current count that counters are folded into
COUNTS = {"added": 7, "acked": 4, "removed": 3}


@pytest.fixture(params=["single", on_cluster("cluster")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


@pytest.fixture
def clients(backend: Backend) -> Iterator[list[Any]]:
    """Two clients of the backend (two promoters' processes), the backend flushed first."""
    made = [backend.client(), backend.client()]
    made[0].flushall()
    yield made
    for client in made:
        close_client(client)


def engines(clients: list[Any]) -> list[Engine]:
    return [Engine(client, prefix="t", shards={Q: 3}) for client in clients]


def total(engine: Engine, shard: str) -> dict[str, int]:
    raw = engine.client.hgetall(engine.keys(shard).counters)
    return {k.decode(): int(v) for k, v in raw.items() if int(v)}


def old_shards_with_counts(engine: Engine) -> None:
    """List the old shards, empty but for their counters (each holds COUNTS)."""
    for shard in OLD:
        engine.client.hset(engine.keys(shard).counters, mapping=COUNTS)
        engine.client.sadd(engine.queues_key, shard)


def race(racers: list[Engine]) -> None:
    """Each engine forgets the empty shards of ``q`` at the same moment, in its thread."""
    barrier = threading.Barrier(len(racers))
    errors: list[BaseException] = []

    def forget(engine: Engine) -> None:
        try:
            barrier.wait()
            engine.forget_empty_shards(Q)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=forget, args=(engine,)) for engine in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_two_promoters_forgetting_the_same_shard_fold_its_counts_once(clients):
    """Each promoter read the old shard's counts (HGETALL), then added them to the new
    shard and subtracted them from the old one: two at once both added them, the queue's
    totals jumped by those counts (and the old shard went negative)."""
    racers = engines(clients)
    expected = dict.fromkeys(COUNTS, 0)
    for _ in range(40):
        old_shards_with_counts(racers[0])
        for engine in racers:
            engine.known_queues()  # read the directory afresh: the old shards are listed
        race(racers)
        expected = {name: count + len(OLD) * COUNTS[name] for name, count in expected.items()}
        assert total(racers[0], INTO) == expected
        assert [total(racers[0], shard) for shard in OLD] == [{}, {}]
        assert racers[0].stats(Q).counters == expected


def test_counts_stay_in_the_old_shard_when_the_new_one_cannot_take_them(clients):
    """A fold that cannot write the new shard's counters leaves the counts in the old shard
    (still listed, so the next fold moves them), not nowhere: here the new shard's counters
    key is another program's STRING."""
    engine = engines(clients)[0]
    old_shards_with_counts(engine)
    engine.client.set(engine.keys(INTO).counters, "not a hash")
    with pytest.raises(EngineUnavailable):
        engine.forget_empty_shards(Q)
    assert [total(engine, shard) for shard in OLD] == [COUNTS, COUNTS]
    assert sorted(engine.old_shards(Q)) == OLD
    engine.client.delete(engine.keys(INTO).counters)
    assert sorted(engine.forget_empty_shards(Q)) == OLD
    assert total(engine, INTO) == {name: 2 * count for name, count in COUNTS.items()}


def test_a_field_that_holds_no_integer_is_left_in_the_old_shard(clients):
    """Another program's field (not an integer) stays where it is; the counts move."""
    engine = engines(clients)[0]
    old_shards_with_counts(engine)
    engine.client.hset(engine.keys(OLD[0]).counters, mapping={"note": "x", "zero": 0})
    assert sorted(engine.forget_empty_shards(Q)) == OLD
    assert total(engine, INTO) == {name: 2 * count for name, count in COUNTS.items()}
    assert engine.client.hgetall(engine.keys(OLD[0]).counters) == {b"note": b"x", b"zero": b"0"}
