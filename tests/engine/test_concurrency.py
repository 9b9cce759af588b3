"""Several OS processes claim from one queue while another promotes: each id once.

Four worker processes claim and ack; a fifth runs promote in a loop; the test process
adds 10,000 ids due over about 1.5 s. Every claim is recorded, as it happens, in a list
of the test's own (outside the queue's keys), so a duplicate or a loss shows in the
multiset of claimed ids. Leases are long: no id may be handed out twice.

A second test races cancellation against claiming: ids wait in ready while the test
process removes them one by one and the workers claim. An id whose remove won must never
be claimed (its entry in ready is a tombstone), and every id is claimed or removed.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager

import pytest
import redis

from django_delayjobs.engine import Engine

Q = "race"
N = 10_000
WORKERS = 4
CLAIMED = "test:claimed"  # the test's own record, not an engine key
STOP = "test:stop"
STARTED = "test:started"


def _worker(url: str, seed: int) -> None:
    r = redis.Redis.from_url(url)
    engine = Engine(r, prefix="c")
    rng = random.Random(seed)
    r.incr(STARTED)
    while True:
        ids = engine.claim(Q, rng.choice([1, 7, 50]), lease_ms=600_000)
        if ids:
            r.rpush(CLAIMED, *ids)
            assert engine.ack(Q, ids) == len(ids)
        elif r.exists(STOP):
            return
        else:
            engine.wait_for_work([Q], 0.05)


def _promoter(url: str) -> None:
    r = redis.Redis.from_url(url)
    engine = Engine(r, prefix="c")
    r.incr(STARTED)
    while not r.exists(STOP):
        result = engine.promote(Q, batch=500)
        if not result.moved:
            engine.wait_for_wake([Q], 0.005)


def _wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


@contextmanager
def _processes(redis_client: redis.Redis, *targets: tuple[Callable[..., None], tuple]):
    """Run the given processes; on leaving, tell them to stop, and check they exited 0."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=fn, args=args) for fn, args in targets]
    for proc in procs:
        proc.start()
    try:
        yield procs
        redis_client.set(STOP, 1)
        for proc in procs:
            proc.join(15)
        assert [proc.exitcode for proc in procs] == [0] * len(procs)
    finally:
        redis_client.set(STOP, 1)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def _claimed_once(redis_client: redis.Redis) -> set[str]:
    """The ids the workers claimed, after checking that none was claimed twice."""
    claimed = Counter(m.decode() for m in redis_client.lrange(CLAIMED, 0, -1))
    twice = {id_: n for id_, n in claimed.items() if n > 1}
    assert not twice, f"claimed more than once: {dict(list(twice.items())[:10])}"
    return set(claimed)


def _workers(redis_url: str) -> list[tuple[Callable[..., None], tuple]]:
    return [(_worker, (redis_url, seed)) for seed in range(WORKERS)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_each_id_is_claimed_exactly_once_by_competing_processes(redis_client, redis_url):
    engine = Engine(redis_client, prefix="c")
    targets = [*_workers(redis_url), (_promoter, (redis_url,))]
    with _processes(redis_client, *targets) as procs:
        _wait_until(lambda: int(redis_client.get(STARTED) or 0) == len(procs), 60)

        ids = [f"job-{i:05d}" for i in range(N)]
        start = engine.server_time_ms() + 200
        for lo in range(0, N, 1000):
            # Spread over ~1.5 s; the order of due times is shuffled against the ids.
            engine.add(Q, {id_: start + random.randrange(1500) for id_ in ids[lo : lo + 1000]})

        _wait_until(lambda: redis_client.llen(CLAIMED) >= N, 45)

    assert _claimed_once(redis_client) == set(ids)
    stats = engine.stats(Q)
    assert (stats.pending, stats.ready, stats.in_flight) == (0, 0, 0)
    assert stats.counters == {"added": N, "acked": N}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_removed_ready_id_is_never_claimed_by_competing_processes(redis_client, redis_url):
    engine = Engine(redis_client, prefix="c")
    ids = [f"job-{i:05d}" for i in range(N)]
    for lo in range(0, N, 5000):
        engine.add(Q, dict.fromkeys(ids[lo : lo + 5000], 0))  # all straight to ready
    removed: set[str] = set()
    with _processes(redis_client, *_workers(redis_url)) as procs:
        # Cancel every id, in an order shuffled against the list, starting while the
        # workers are still starting up: each remove wins (the id was still in ready,
        # its entry becomes a tombstone) or loses (a worker claimed it first).
        for id_ in random.sample(ids, N):
            if engine.remove(Q, [id_]):
                removed.add(id_)
        _wait_until(lambda: int(redis_client.get(STARTED) or 0) == len(procs), 60)
        _wait_until(lambda: redis_client.llen(CLAIMED) + len(removed) >= N, 45)

    claimed = _claimed_once(redis_client)
    assert not claimed & removed, "an id was claimed after its remove won"
    assert claimed | removed == set(ids)
    assert removed, "the first removes ran before any worker had started"
    stats = engine.stats(Q)
    assert (stats.pending, stats.ready, stats.in_flight) == (0, 0, 0)
    assert stats.counters == {"added": N, "removed": len(removed), "acked": len(claimed)}
