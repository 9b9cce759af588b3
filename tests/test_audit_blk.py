"""Short blocking waits: a wait of a few milliseconds or less is never sent as a ``BLPOP``
that Redis reads as "block forever".

Redis before 7.0.8 (6.2 included, the embedded server's) turns a ``BLPOP`` timeout of
0.001 s into 0 ms, and 0 means no timeout (redis/redis#11687). A wait of that length held
its connection until the socket timeout (a promoter 0.9 s late), or until a token came on
a client with none. These tests run on the embedded server, whatever ``REDIS_URL`` says.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.engine import Engine
from django_delayjobs.engine.waiting import BlockingWait
from django_delayjobs.promoter import PRECISE_STRETCH, Promoter

#: Waits an old Redis was sent as "block forever", and two just above (controls).
SLIVERS = [0, 1e-9, 0.0001, 0.0005, 0.0009, 0.001, 0.00101, 0.0015]


@pytest.fixture
def old_redis(own_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url, socket_timeout=1)
    yield client
    client.close()


def test_the_embedded_server_reads_a_blpop_of_1_ms_as_no_timeout(
    old_redis: redis.Redis,
) -> None:
    """The premise of this file: without it the tests below could not fail. (A newer
    embedded server, 7.0.8 on, reads 1 ms right: the tests below still hold there.)"""
    name = old_redis.info("server")["redis_version"]  # "6.2.14", or "7.2.4-rc1" and such
    version = tuple(int(part) for part in re.findall(r"\d+", name)[:3])
    if version >= (7, 0, 8):
        pytest.skip(f"Redis {version} reads a 1 ms timeout as 1 ms")
    started = time.monotonic()
    with pytest.raises(redis.exceptions.TimeoutError):
        old_redis.execute_command("BLPOP", "nothing", "0.001")
    assert time.monotonic() - started >= 0.95


@pytest.mark.parametrize("seconds", SLIVERS)
@pytest.mark.parametrize("kind", ["wake", "work"])
def test_a_very_short_wait_ends_on_time(old_redis: redis.Redis, seconds: float, kind: str) -> None:
    engine = Engine(old_redis, prefix="t")
    wait = engine.wait_for_wake if kind == "wake" else engine.wait_for_work
    started = time.monotonic()
    assert wait(["q"], seconds) is False
    assert time.monotonic() - started < 0.3


def test_a_very_short_wait_still_takes_a_token_that_is_there(old_redis: redis.Redis) -> None:
    engine = Engine(old_redis, prefix="t")
    old_redis.rpush(engine.keys("q").notify, "1")
    assert engine.wait_for_work(["q"], 0.0005) is True
    assert old_redis.llen(engine.keys("q").notify) == 0


def test_a_short_wait_with_no_socket_timeout_never_blocks_for_good(
    own_redis: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(own_redis.url, socket_timeout=None)
    waiter = BlockingWait(client)
    assert waiter.longest is None
    results: list[bool] = []
    thread = threading.Thread(
        target=lambda: results.append(waiter.wait(["nothing"], 0.0005)), daemon=True
    )
    thread.start()
    thread.join(2)
    try:
        assert not thread.is_alive(), "a 0.5 ms wait blocked for good"
        assert results == [False]
    finally:
        client.rpush("nothing", "x")  # frees a pop blocked for good, if one is
        thread.join(5)
        client.close()


def test_an_absurd_wait_with_no_socket_timeout_blocks_until_a_token(
    own_redis: EmbeddedRedis,
) -> None:
    """Sent whole, 1e20 s was Redis's "timeout is out of range" error: the wait is capped
    (``MAX_BLOCK``), so it blocks, and a token ends it."""
    client = redis.Redis.from_url(own_redis.url, socket_timeout=None)
    waiter = BlockingWait(client)
    results: list[object] = []

    def wait() -> None:
        try:
            results.append(waiter.wait(["bell"], 1e20))
        except Exception as error:  # the assertion below names it
            results.append(error)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(0.3)
    try:
        assert thread.is_alive(), results
        client.rpush("bell", "1")
        thread.join(5)
        assert results == [True]
    finally:
        client.rpush("bell", "x")
        thread.join(5)
        client.close()


@pytest.mark.parametrize("sliver", [0.0, 0.0002, 0.0005, 0.0009, 0.002])
def test_a_promoter_sleep_that_leaves_a_sliver_to_block_ends_on_time(
    old_redis: redis.Redis, sliver: float
) -> None:
    """The sleep blocks until ``PRECISE_STRETCH`` before its end, then sleeps the rest:
    a sliver left to block must not hold it for the socket timeout."""
    promoter = Promoter(Engine(old_redis, prefix="t"), ["q"], tick=1.0)
    for _ in range(3):
        started = time.monotonic()
        promoter.sleep(PRECISE_STRETCH + sliver)
        took = time.monotonic() - started
        assert PRECISE_STRETCH + sliver <= took < PRECISE_STRETCH + sliver + 0.15
