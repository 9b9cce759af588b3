"""A queue of several shards, addressed by its queue name: routing, fan-out, count changes.

Every test runs on one Redis and (``-m cluster``) on the session's Redis Cluster, where the
6 shards of ``q`` live on 3 masters. Where ids are is read from each shard's keys.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.engine import Engine
from django_delayjobs.engine.sharding import parse, slot, tag
from tests.helpers import add_pending

from .conftest import Backend, on_cluster, open_backend

Q = "q"
N = 6
HOUR = 3_600_000


@pytest.fixture(params=["single", on_cluster("cluster")])
def backend(request: pytest.FixtureRequest) -> Backend:
    return open_backend(request, request.param)


@pytest.fixture
def redis_client(backend_client: Any) -> Any:
    return backend_client


def make(client: Any, count: int = N) -> Engine:
    return Engine(client, prefix="t", shards={Q: count})


@pytest.fixture
def engine(redis_client) -> Iterator[Engine]:
    """Closed at the end, so that no wait of this test outlives it (see waiting.py)."""
    engine = make(redis_client)
    yield engine
    engine.close()


def ids(n: int, stem: str = "id") -> list[str]:
    return [f"{stem}{i:04d}" for i in range(n)]


def where(r: Any, engine: Engine, shard: str) -> dict[str, Any]:
    k = engine.keys(shard)
    live = {m.decode() for m in r.smembers(k.ready_set)}
    listed = [m.decode() for m in r.lrange(k.ready, 0, -1)]
    return {
        "pending": {m.decode(): int(s) for m, s in r.zrange(k.pending, 0, -1, withscores=True)},
        "ready": list(dict.fromkeys(i for i in listed if i in live)),
        "unack": {m.decode() for m in r.zrange(k.unack, 0, -1)},
        "garbage": {m.decode() for m in r.zrange(k.garbage, 0, -1)},
    }


def by_shard(engine: Engine, given: list[str], queue: str = Q) -> dict[str, list[str]]:
    """The ids each shard should hold, in the order given."""
    found: dict[str, list[str]] = {}
    for id_ in given:
        found.setdefault(engine.home(queue, id_), []).append(id_)
    return found


# -- names and routing ------------------------------------------------------------------


def test_a_queue_of_6_has_6_shard_names_each_with_a_tag_of_its_own(engine):
    names = engine.shards(Q)
    assert names == [f"q#{k}/6" for k in range(N)]
    tags = {engine.keys(name).pending.split("}")[0] for name in names}
    assert len(tags) == N
    assert engine.shard_count(Q) == N
    assert engine.shard_count("other") == 1
    assert engine.shards("other") == ["other"]


def test_each_id_goes_to_its_home_shard_and_nowhere_else(engine, redis_client):
    given = ids(300)
    now = engine.server_time_ms()
    assert engine.add(Q, {i: now + HOUR for i in given}) == given
    expected = by_shard(engine, given)
    assert len(expected) == N  # 300 ids reach every shard
    for name in engine.shards(Q):
        assert set(where(redis_client, engine, name)["pending"]) == set(expected[name])
    assert engine.stats(Q).pending == 300
    assert engine.add(Q, {i: now + HOUR for i in given}) == []  # each is held: no copy


def test_ready_is_fifo_within_each_shard(engine, redis_client):
    given = ids(120)
    for id_ in given:  # one add per id: the order of arrival is the order given
        engine.add(Q, {id_: 0})
    for name, expected in by_shard(engine, given).items():
        assert where(redis_client, engine, name)["ready"] == expected
    claimed: list[str] = []
    while batch := engine.claim(Q, 7, HOUR):
        claimed += batch
    assert sorted(claimed) == given
    for expected in by_shard(engine, given).values():
        assert [i for i in claimed if i in set(expected)] == expected


def test_claim_by_queue_name_starts_one_shard_further_each_time(engine):
    given = ids(60)
    engine.add(Q, dict.fromkeys(given, 0))
    first = [engine.claim(Q, 1, HOUR)[0] for _ in range(N)]
    assert sorted(engine.home(Q, i) for i in first) == engine.shards(Q)  # 6 claims, 6 shards
    assert sorted(first + engine.claim(Q, 1000, HOUR)) == given


def test_claims_by_queue_name_step_each_queue_s_own_turn(engine):
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


def test_claim_gathers_its_count_from_several_shards(engine):
    given = ids(12)
    engine.add(Q, dict.fromkeys(given, 0))
    claimed = engine.claim(Q, 12, HOUR)
    assert sorted(claimed) == given
    assert engine.claim(Q, 12, HOUR) == []


def test_promote_by_queue_name_covers_every_shard(engine, redis_client):
    given = ids(60)
    due = add_pending(engine, Q, given, 150)
    engine.add(Q, {"later": due + HOUR})
    deadline = time.monotonic() + 5
    while engine.stats(Q).overdue < 60:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    result = engine.promote(Q, batch=5)  # up to 5 per shard
    per_shard = Counter(engine.home(Q, i) for i in given)
    assert result.moved == sum(min(5, n) for n in per_shard.values())
    assert result.next_due_ms is not None and result.next_due_ms <= due
    while engine.promote(Q, batch=5).moved:
        pass
    after = engine.promote(Q)
    assert (after.moved, after.next_due_ms) == (0, due + HOUR)
    assert 0 < after.next_due_in_us <= HOUR * 1000
    assert engine.stats(Q).ready == 60


def test_in_flight_ids_are_acked_nacked_buried_and_extended_in_their_shard(engine):
    given = ids(30)
    engine.add(Q, dict.fromkeys(given, 0))
    claimed = engine.claim(Q, 30, HOUR)
    assert sorted(claimed) == given
    assert sorted(engine.extend_lease(Q, given, HOUR)) == given
    assert engine.ack(Q, given[:10]) == 10
    assert engine.bury(Q, given[10:20]) == 10
    assert engine.nack(Q, dict.fromkeys(given[20:], engine.server_time_ms() + HOUR)) == 10
    stats = engine.stats(Q)
    assert (stats.in_flight, stats.garbage, stats.pending) == (0, 10, 10)
    assert stats.counters == {"added": 30, "acked": 10, "buried": 10, "nacked": 10}
    assert sorted(i for i, _ in engine.garbage(Q, 100)) == sorted(given[10:20])
    assert sorted(engine.requeue(Q, given[10:15])) == sorted(given[10:15])
    assert engine.purge(Q, given[15:20]) == 5
    assert engine.remove(Q, given[10:15] + given[20:]) == 15
    assert engine.stats(Q).pending + engine.stats(Q).ready + engine.stats(Q).garbage == 0


def test_stats_sum_the_shards_and_list_each(engine):
    now = engine.server_time_ms()
    engine.add(Q, {i: now + HOUR + n for n, i in enumerate(ids(40))})
    engine.add(Q, dict.fromkeys(ids(20, "r"), 0))
    engine.heartbeat(Q, "w1", HOUR)
    stats = engine.stats(Q)
    assert (stats.queue, stats.pending, stats.ready, stats.live_workers) == (Q, 40, 20, 1)
    assert [s.queue for s in stats.shards] == engine.shards(Q)
    assert sum(s.pending for s in stats.shards) == 40
    assert sum(s.ready for s in stats.shards) == 20
    assert stats.next_due_ms == now + HOUR
    one = engine.stats("q#2/6")
    assert one.queue == "q#2/6" and one.shards == ()
    assert one.live_workers == 1  # workers are per queue, whatever shard is asked


def test_next_due_and_garbage_merge_the_shards_in_order(engine):
    now = engine.server_time_ms()
    given = ids(30)
    engine.add(Q, {i: now + HOUR + 1000 * n for n, i in enumerate(given)})
    assert engine.next_due(Q, 7) == [(i, now + HOUR + 1000 * n) for n, i in enumerate(given[:7])]
    engine.add(Q, dict.fromkeys(ids(12, "d"), 0))
    engine.bury(Q, engine.claim(Q, 12, HOUR))
    dead = engine.garbage(Q, 5)
    assert len(dead) == 5
    assert [t for _, t in dead] == sorted((t for _, t in dead), reverse=True)


def test_a_token_in_any_shard_wakes_a_worker_waiting_on_the_queue(engine, redis_client):
    last = engine.shards(Q)[-1]
    id_ = next(i for i in ids(100) if engine.home(Q, i) == last)
    add_pending(engine, Q, [id_], 200)
    out: list[tuple[bool, float]] = []
    thread = threading.Thread(
        target=lambda: out.append((engine.wait_for_work([Q], 10), time.monotonic()))
    )
    thread.start()
    deadline = time.monotonic() + 20
    while not engine.promote(Q).moved:
        assert time.monotonic() < deadline, "never promoted"
        time.sleep(0.005)
    moved_at = time.monotonic()
    thread.join(10)
    assert out and out[0][0] is True
    assert out[0][1] - moved_at < 0.5
    assert engine.claim(Q, 1, HOUR) == [id_]


BAD_NAMES = ["q#6/6", "q#1/1", "q#0/0", "q#1/65", "q#a/6", "#1/6", "q#01/6", "q#1/6#2/6", "q:x#1/6"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_shard_names_are_refused_before_any_command(tmp_path, name):
    # No Redis listens there: had a command been sent first, this would be EngineUnavailable.
    client = redis.Redis(unix_socket_path=str(tmp_path / "none.sock"), retry=Retry(NoBackoff(), 0))
    engine = make(client)
    for call in (
        lambda: engine.stats(name),
        lambda: engine.add(name, {"a": 0}),
        lambda: engine.claim(name),
        lambda: engine.wait_for_work([name], 0.01),
    ):
        with pytest.raises(ValueError, match="is not valid"):
            call()


@pytest.mark.parametrize("bad", [0, 65, {"q": 0}, {"q": 65}, {"a:b": 2}, True, {"q": 0.5}])
def test_bad_shard_counts_are_refused(tmp_path, bad):
    client = redis.Redis(unix_socket_path=str(tmp_path / "none.sock"))
    with pytest.raises((TypeError, ValueError)):
        Engine(client, prefix="t", shards=bad)


def test_the_shard_of_1_of_a_queue_that_now_has_more_is_named_explicitly(redis_client):
    one, six = make(redis_client, 1), make(redis_client, 6)
    one.add(Q, {"a": 0})
    assert six.old_shards(Q) == ["q#0/1"]  # "q" would route each id to one of the 6
    assert six.claim("q#0/1", 1, HOUR) == ["a"]
    assert six.ack("q#0/1", ["a"]) == 1
    assert six.stats("q#0/1").in_flight == 0
    assert one.shards(Q) == ["q"]  # where the count is 1, the queue's name is the shard's


def test_a_name_in_the_directory_that_this_version_does_not_write_is_ignored(engine, redis_client):
    redis_client.sadd(engine.queues_key, "q#9/6", "x{y", "q#1/6")
    assert engine.known_queues() == ["q"]
    assert engine.shards(Q) == [f"q#{k}/6" for k in range(N)]


# -- changing a queue's shard count -----------------------------------------------------


def test_after_a_count_change_the_old_shards_are_served_until_empty(redis_client):
    before, after = make(redis_client, 6), make(redis_client, 4)
    now = before.server_time_ms()
    old = ids(60, "old")
    before.add(Q, {i: now + HOUR for i in old[:30]})
    before.add(Q, dict.fromkeys(old[30:], 0))
    new = ids(20, "new")
    after.add(Q, dict.fromkeys(new, 0))
    # The directory lists both counts' shards: the new engine serves all ten.
    served = after.shards(Q)
    assert served[:4] == [f"q#{k}/4" for k in range(4)]
    assert sorted(served[4:]) == sorted(f"q#{k}/6" for k in range(6))
    assert after.stats(Q).pending == 30
    claimed: list[str] = []
    while batch := after.claim(Q, 9, HOUR):
        claimed += batch
    assert sorted(claimed) == sorted(old[30:] + new)
    assert after.ack(Q, new) == 20  # ids of the new count: routed to their shard
    for shard in served[4:]:  # ids of the old count: acked where they were claimed
        mine = [i for i in old[30:] if before.home(Q, i) == shard]
        assert after.ack(shard, mine) == len(mine)
    # Remove (a cancel) and reschedule find ids left in the old shards.
    assert after.remove(Q, old[:5]) == 5
    assert after.reschedule(Q, old[5], now + 2 * HOUR) is True
    assert after.forget_empty_shards(Q) == []  # 25 pending ids are still there
    assert after.remove(Q, old[5:30]) == 25
    assert sorted(after.forget_empty_shards(Q)) == sorted(f"q#{k}/6" for k in range(6))
    assert after.shards(Q) == [f"q#{k}/4" for k in range(4)]


def test_dead_ids_of_an_old_count_are_requeued_and_purged_where_they_died(redis_client):
    before, after = make(redis_client, 6), make(redis_client, 1)
    dead = ids(12, "dead")
    before.add(Q, dict.fromkeys(dead, 0))
    assert before.bury(Q, before.claim(Q, 12, HOUR)) == 12
    assert after.shards(Q)[0] == Q
    assert after.stats(Q).garbage == 12
    assert sorted(after.requeue(Q, dead[:6])) == sorted(dead[:6])
    assert after.purge(Q, dead[6:]) == 6
    assert sorted(after.claim(Q, 12, HOUR)) == sorted(dead[:6])
    assert after.ack(Q, dead[:6]) == 6  # in flight in their old shards: acked there
    assert sorted(after.forget_empty_shards(Q)) == sorted({before.home(Q, i) for i in dead})


def test_a_shard_refilled_while_it_is_forgotten_is_listed_again(redis_client):
    old, new = make(redis_client, 2), make(redis_client, 3)
    old.add(Q, {"a": 0})
    old.ack(Q, old.claim(Q, 1, HOUR))
    shard = old.home(Q, "b")
    # The old shard is empty: forgetting it and an add from an old process may interleave.
    assert shard in new.forget_empty_shards(Q)
    assert old.add(Q, {"b": 0}) == ["b"]  # finds the shard empty: lists it again
    assert shard.encode() in redis_client.smembers(new.queues_key)
    new.known_queues()  # reads the directory afresh (otherwise within DIRECTORY_TTL)
    assert shard in new.shards(Q)  # served again: its id is not stranded
    assert new.claim(shard, 1, HOUR) == ["b"]


def test_a_shard_holding_only_tombstones_is_listed_again_by_its_next_add(redis_client):
    """An id removed while ready leaves a tombstone in the ready list, but the shard holds
    no id: ``forget_empty_shards`` forgets it, and an old process's add to it must find it
    empty (``ready_set``, not the list) and list it again."""
    old, new = make(redis_client, 2), make(redis_client, 3)
    shard = old.home(Q, "a")
    old.add(Q, {"a": 0})
    assert old.remove(Q, ["a"]) == 1  # removed while ready: a tombstone stays in ready
    assert redis_client.llen(old.keys(shard).ready) == 1
    assert shard in new.forget_empty_shards(Q)
    b = next(f"b{i}" for i in range(100) if old.home(Q, f"b{i}") == shard)
    assert old.add(Q, {b: 0}) == [b]  # an old process adds to the shard it knows
    assert shard.encode() in redis_client.smembers(new.queues_key)
    new.known_queues()
    assert shard in new.shards(Q)


# -- placement --------------------------------------------------------------------------


def test_shard_k_of_n_lies_in_the_middle_of_the_k_th_nth_of_the_slots(engine):
    for n in (2, 3, 6, 12, 64):
        for k in range(n):
            s = slot(tag("t", parse(f"q#{k}/{n}")))
            width = 16384 / n
            assert width * k + width * 3 / 8 - 1 <= s < width * k + width * 5 / 8, (k, n, s)


def test_the_counters_of_a_forgotten_shard_stay_in_the_queues_totals(redis_client):
    """Prometheus exports the summed counters (``delayjobs_jobs_total``): a forgotten
    shard took its counts with it, and the totals dropped, which Prometheus reads as a
    counter reset (a spike in every rate())."""
    before, after = make(redis_client, 2), make(redis_client, 3)
    before.add(Q, dict.fromkeys(ids(6), 0))
    claimed = before.claim(Q, 4, HOUR)
    before.ack(Q, claimed)
    before.remove(Q, [i for i in ids(6) if i not in claimed])
    after.add(Q, {"new": 0})
    totals = after.stats(Q).counters
    assert totals == {"added": 7, "acked": 4, "removed": 2}
    assert len(after.forget_empty_shards(Q)) == 2
    assert after.stats(Q).counters == totals
    after.ack(Q, after.claim(Q, 1, HOUR))
    assert after.stats(Q).counters == {**totals, "acked": 5}
