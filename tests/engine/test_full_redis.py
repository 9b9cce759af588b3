"""Every script against a full Redis: ``maxmemory`` reached, with ``noeviction``.

Redis checks a script against ``maxmemory`` at its first write only; once a script has
written, its later writes pass unchecked. A script that can grow Redis must therefore write
something that grows it first, or a full Redis lets it through. Here every call is made on
a full Redis and must either change nothing (refused whole, or nothing to do) or be a
move that leaves no more ids than it found: the worker drains while Redis is full, and
new ids wait in the database until it has room.

The tests run on a Redis of this module's own: ``maxmemory`` is server-wide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine, EngineUnavailable

Q = "q"
LATER = 3_600_000  # an hour, in ms
NOW = 0  # a due time in the past: due now


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis()
    server.start()
    yield server
    server.close()


@pytest.fixture
def r(server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory", 0)
    client.flushall()
    yield client
    client.config_set("maxmemory", 0)
    client.close()


@pytest.fixture
def engine(r: redis.Redis) -> Iterator[Engine]:
    """A queue with an id in each place: pending later (P), pending and overdue (D, as
    before the promoter's next pass), ready (R), in flight with a lease already run out
    (F) and in garbage (G)."""
    engine = Engine(r, prefix="t")
    engine.add(Q, {"F": NOW, "G": NOW})
    assert sorted(engine.claim(Q, count=2, lease_ms=0)) == ["F", "G"]
    assert engine.bury(Q, ["G"]) == 1
    engine.add(Q, {"P": later(r), "R": NOW})
    r.zadd(engine.keys(Q).pending, {"D": 1})
    yield engine
    engine.close()


def now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def later(r: redis.Redis) -> int:
    """An hour from now, by the server's clock."""
    return now_ms(r) + LATER


@contextmanager
def full(r: redis.Redis) -> Iterator[None]:
    r.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            r.set("probe", "x")
        yield
    finally:
        r.config_set("maxmemory", 0)


def snapshot(r: redis.Redis) -> dict[Any, Any]:
    return {key: r.dump(key) for key in r.keys("*")}


def ids(r: redis.Redis, engine: Engine) -> int:
    """The ids the queue holds, in every place (ready counted once, by ready_set)."""
    k = engine.keys(Q)
    return r.zcard(k.pending) + r.scard(k.ready_set) + r.zcard(k.unack) + r.zcard(k.garbage)


ADDS = {  # ids -> due now (NOW) or in an hour and that many ms (LATER + ms); refused?
    "a new id due later": ({"new": LATER}, None, True),
    "a new id due now": ({"new": NOW}, None, True),
    "a new id with a priority": ({"new": LATER}, {"new": 5}, True),
    "a new id after an overdue pending one": ({"D": NOW, "new": LATER}, None, True),
    "a new id after one in garbage": ({"G": NOW, "new": NOW}, None, True),
    "an overdue pending id, due now": ({"D": NOW}, None, True),
    "a pending id, due at another time": ({"P": LATER + 60_000}, None, True),
    "ids it holds in ready, in flight and in garbage": (
        {"R": NOW, "F": NOW, "G": NOW},
        None,
        False,
    ),
}


@pytest.mark.parametrize(("items", "priorities", "refused"), ADDS.values(), ids=ADDS.keys())
def test_an_add_on_a_full_redis_changes_nothing(
    r: redis.Redis,
    engine: Engine,
    items: dict[str, int],
    priorities: dict[str, int] | None,
    refused: bool,
) -> None:
    due = {id_: now_ms(r) + ms if ms else NOW for id_, ms in items.items()}
    before = snapshot(r)
    with full(r):
        if refused:
            with pytest.raises(EngineUnavailable, match=r"Redis refused the command: .*maxmemory"):
                engine.add(Q, due, priorities)
        else:
            assert engine.add(Q, due, priorities) == []  # nothing to do
    assert snapshot(r) == before


MOVES: dict[str, Callable[[Engine], Any]] = {
    "promote": lambda e: e.promote(Q).moved == 1,  # D
    "claim": lambda e: e.claim(Q, count=5) == ["R"],
    "recover_expired": lambda e: e.recover_expired(Q) == ["F"],
    "ack": lambda e: e.ack(Q, ["F"]) == 1,
    "nack": lambda e: e.nack(Q, {"F": later(e.client)}) == 1,
    "bury": lambda e: e.bury(Q, ["F"]) == 1,
    "requeue due now": lambda e: e.requeue(Q, ["G"]) == ["G"],
    "requeue due later": lambda e: e.requeue(Q, ["G"], later(e.client)) == ["G"],
    "remove": lambda e: e.remove(Q, ["P", "R"]) == 2,
    "reschedule to now": lambda e: e.reschedule(Q, "P", NOW),
    "purge": lambda e: e.purge(Q, ["G"]) == 1,
}


@pytest.mark.parametrize("move", MOVES.values(), ids=MOVES.keys())
def test_the_moves_work_on_a_full_redis_and_grow_nothing(
    r: redis.Redis, engine: Engine, move: Callable[[Engine], Any]
) -> None:
    held = ids(r, engine)
    with full(r):
        assert move(engine)
    assert ids(r, engine) <= held


REFUSED: dict[str, Callable[[Engine], Any]] = {
    "heartbeat": lambda e: e.heartbeat(Q, "worker-1", 10_000),
    "extend_lease": lambda e: e.extend_lease(Q, ["F"], 10_000),
    "adopt": lambda e: e.adopt(Q, ["N"], 10_000),  # an id held nowhere: it grows Redis
    "reschedule to later": lambda e: e.reschedule(Q, "P", later(e.client) + 60_000),
}


@pytest.mark.parametrize("call", REFUSED.values(), ids=REFUSED.keys())
def test_what_writes_in_place_is_refused_whole(
    r: redis.Redis, engine: Engine, call: Callable[[Engine], Any]
) -> None:
    before = snapshot(r)
    with full(r), pytest.raises(EngineUnavailable, match="maxmemory"):
        call(engine)
    assert snapshot(r) == before
