"""The contract of every engine operation, against a real Redis.

State is read straight from the keys (ZRANGE/LRANGE/SMEMBERS), not through the engine, so
a test shows where an id really is. An id is in ready when it is in the ``ready_set`` SET;
the ready LIST gives the order and may also hold tombstones, entries of ids removed while
ready, which claim pops and skips. Times are either far from now (an hour) or created by the
server itself (lease 0 expires at once), so nothing depends on a sleep being long enough;
the two tests that must see real time pass use a polling helper with a deadline.

Each test runs on one Redis, and with ``-m cluster`` on the session's Redis Cluster twice:
with ``Q`` a queue of 1 shard, and with ``Q`` the name of one shard of a queue of 6
(``q#3/6``: its own hash tag, in the slot range of the second master). What a queue of
several shards does when addressed by its queue name is tested in ``test_sharded.py``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs.engine import MAX_BATCH, Engine, close_client
from django_delayjobs.engine.sharding import parse
from django_delayjobs.engine.validation import MAX_DUE_MS
from tests.helpers import add_pending

from .conftest import on_cluster

Q = "q"
HOUR = 3_600_000


#: For a test without the ``engine`` fixture, which alone makes ``Q`` the shard's name:
#: its cluster-shard run would repeat its cluster one.
WITHOUT_SHARD = pytest.mark.parametrize("backend", ["single", on_cluster("cluster")], indirect=True)


@pytest.fixture
def redis_client(backend_client: Any) -> Any:
    return backend_client


def base(name: str) -> str:
    """The queue a queue or shard name belongs to (what known_queues lists)."""
    return parse(name).queue


# -- helpers ----------------------------------------------------------------------------


def _zset(r: redis.Redis, key: str) -> dict[str, int]:
    return {m.decode(): int(s) for m, s in r.zrange(key, 0, -1, withscores=True)}


def entries(r: redis.Redis, engine: Engine, queue: str | None = None) -> list[str]:
    """The ready LIST as stored: live ids and tombstones."""
    queue = queue or Q
    return [m.decode() for m in r.lrange(engine.keys(queue).ready, 0, -1)]


def ready_ids(r: redis.Redis, engine: Engine, queue: str | None = None) -> list[str]:
    """The ids in ready, in the order claim takes them.

    ``ready_set`` says which ids are in ready; each is claimed at its first entry in the
    LIST, and every other entry (a tombstone, or a later entry of the same id) is skipped.
    """
    queue = queue or Q
    k = engine.keys(queue)
    pipe = r.pipeline(transaction=True)
    pipe.lrange(k.ready, 0, -1)
    pipe.smembers(k.ready_set)
    raw, members = pipe.execute()
    listed = [m.decode() for m in raw]
    live = {m.decode() for m in members}
    assert live <= set(listed), f"in ready_set without an entry in ready: {live - set(listed)}"
    return list(dict.fromkeys(id_ for id_ in listed if id_ in live))


def state(r: redis.Redis, engine: Engine, queue: str | None = None) -> dict[str, Any]:
    """Where every id of ``queue`` is, read from the keys themselves."""
    queue = queue or Q
    k = engine.keys(queue)
    return {
        "pending": _zset(r, k.pending),
        "ready": ready_ids(r, engine, queue),
        "unack": _zset(r, k.unack),
        "garbage": _zset(r, k.garbage),
    }


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Return the first truthy value of ``predicate()``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.005)


def drain(r: redis.Redis, key: str) -> None:
    r.delete(key)


def in_flight(engine: Engine, ids: list[str], lease_ms: int = HOUR) -> None:
    """Put ``ids`` in flight. The ready list must be empty."""
    assert engine.add(Q, dict.fromkeys(ids, 0)) == ids
    assert engine.claim(Q, len(ids), lease_ms) == ids


def overdue(engine: Engine, scores: dict[str, int]) -> None:
    """Put ids in pending with due times already past (a nack with an old retry time)."""
    in_flight(engine, list(scores))
    assert engine.nack(Q, scores) == len(scores)


@pytest.fixture
def now(engine: Engine) -> int:
    return engine.server_time_ms()


@pytest.fixture
def populated(engine: Engine, now: int) -> Engine:
    """One id in each place: p pending, r ready, u in flight, g in garbage."""
    in_flight(engine, ["g", "u"])
    assert engine.bury(Q, ["g"]) == 1
    assert engine.add(Q, {"r": 0, "p": now + HOUR}) == ["r", "p"]
    return engine


# -- nothing to do ----------------------------------------------------------------------


def test_operations_on_an_empty_queue_do_nothing_and_write_nothing(engine, redis_client):
    before = engine.server_time_ms()
    result = engine.promote(Q)
    assert result.moved == 0
    assert result.next_due_ms is None and result.next_due_in_us is None
    assert before <= result.now_ms <= engine.server_time_ms()
    assert engine.claim(Q, 10) == []
    assert engine.recover_expired(Q) == []
    assert engine.extend_lease(Q, ["a"], 1000) == []
    assert engine.remove(Q, ["a"]) == 0
    assert engine.reschedule(Q, "a", before + HOUR) is False
    assert engine.ack(Q, ["a"]) == 0
    assert engine.nack(Q, {"a": before}) == 0
    assert engine.bury(Q, ["a"]) == 0
    assert engine.requeue(Q, ["a"]) == []
    assert engine.purge(Q, ["a"]) == 0
    assert engine.garbage(Q) == []
    assert engine.next_due(Q) == []
    assert engine.workers(Q) == []
    assert engine.known_queues() == []
    stats = engine.stats(Q)
    assert (stats.pending, stats.overdue, stats.ready, stats.in_flight) == (0, 0, 0, 0)
    assert (stats.expired_leases, stats.garbage, stats.live_workers) == (0, 0, 0)
    assert stats.next_due_ms is None
    assert stats.oldest_lease_ms is None
    assert stats.counters == {}
    assert stats.queue == Q
    assert redis_client.dbsize() == 0


# -- add --------------------------------------------------------------------------------


def test_add_puts_later_ids_in_pending_and_due_ones_at_the_tail_of_ready(engine, redis_client, now):
    assert engine.add(Q, {"r1": 0, "f": now + HOUR, "r2": now - HOUR}) == ["r1", "f", "r2"]
    assert engine.add(Q, {"r3": now}) == ["r3"]
    s = state(redis_client, engine)
    assert s["pending"] == {"f": now + HOUR}
    assert s["ready"] == ["r1", "r2", "r3"]
    assert engine.known_queues() == [base(Q)]


def test_add_of_a_pending_id_sets_its_new_due_time_without_a_duplicate(engine, redis_client, now):
    assert engine.add(Q, {"a": now + HOUR}) == ["a"]
    assert engine.add(Q, {"a": now + 2 * HOUR, "b": now + HOUR}) == ["b"]
    assert state(redis_client, engine)["pending"] == {"a": now + 2 * HOUR, "b": now + HOUR}
    assert engine.add(Q, {"a": now + HOUR // 2}) == []
    assert state(redis_client, engine)["pending"]["a"] == now + HOUR // 2


def test_add_of_a_pending_id_with_a_past_time_moves_it_to_ready_once(engine, redis_client, now):
    engine.add(Q, {"a": now + HOUR})
    assert engine.add(Q, {"a": 0}) == []
    assert engine.add(Q, {"a": 0}) == []
    s = state(redis_client, engine)
    assert s["pending"] == {}
    assert s["ready"] == ["a"]


def test_add_leaves_ready_in_flight_and_buried_ids_alone(populated, redis_client, now):
    before = state(redis_client, populated)
    for due in (0, now + HOUR):
        assert populated.add(Q, {"r": due, "u": due, "g": due}) == []
        assert state(redis_client, populated) == before
    assert populated.add(Q, {"r": 0, "new": 0, "u": now + HOUR}) == ["new"]
    after = state(redis_client, populated)
    assert after["ready"] == ["r", "new"]
    assert after["unack"] == before["unack"]
    assert after["garbage"] == before["garbage"]


def test_add_registers_each_queue_once(engine, now):
    engine.add("b", {"x": now + HOUR})
    engine.add("a", {"x": 0})
    engine.add("b", {"y": 0})
    assert engine.known_queues() == ["a", "b"]
    assert Engine(engine.client, prefix="other").known_queues() == []


def test_a_queue_emptied_by_a_flush_is_listed_again_by_its_next_add(engine, redis_client, now):
    engine.add("a", {"x": now + HOUR})
    redis_client.flushdb()
    assert engine.known_queues() == []
    engine.add("a", {"y": now + HOUR})
    assert engine.known_queues() == ["a"]


# -- remove -----------------------------------------------------------------------------


def test_remove_takes_pending_and_ready_ids_and_counts_them(populated, redis_client):
    assert populated.remove(Q, ["p", "r", "u", "g", "unknown"]) == 2
    s = state(redis_client, populated)
    assert s["pending"] == {}
    assert s["ready"] == []
    assert list(s["unack"]) == ["u"]
    assert list(s["garbage"]) == ["g"]
    assert populated.stats(Q).ready == 0
    assert populated.remove(Q, ["p", "r"]) == 0


def test_remove_of_a_ready_id_leaves_a_tombstone_that_claim_skips(engine, redis_client):
    engine.add(Q, dict.fromkeys(["a", "b", "c", "d", "e", "f"], 0))
    assert engine.remove(Q, ["b", "d"]) == 2
    # O(1): the id leaves ready_set; the LIST is not scanned, its entry stays behind.
    assert entries(redis_client, engine) == ["a", "b", "c", "d", "e", "f"]
    assert state(redis_client, engine)["ready"] == ["a", "c", "e", "f"]
    assert engine.stats(Q).ready == 4
    assert engine.claim(Q, 3) == ["a", "c", "e"]
    assert entries(redis_client, engine) == ["f"]  # popped no further than needed
    assert engine.remove(Q, ["f"]) == 1
    assert engine.claim(Q, 3) == []
    k = engine.keys(Q)
    assert redis_client.exists(k.ready, k.ready_set) == 0
    assert list(state(redis_client, engine)["unack"]) == ["a", "c", "e"]


def test_claim_skips_a_run_of_tombstones_and_still_returns_live_ids(engine, redis_client):
    engine.add(Q, {"gone1": 0, "live1": 0, "gone2": 0, "gone3": 0, "live2": 0, "live3": 0})
    assert engine.remove(Q, ["gone1", "gone2", "gone3"]) == 3
    assert engine.claim(Q, 2) == ["live1", "live2"]
    assert entries(redis_client, engine) == ["live3"]
    assert engine.claim(Q, 2) == ["live3"]
    assert engine.stats(Q).ready == 0


def test_claim_skips_at_most_1000_tombstones_per_call_and_leaves_a_work_token(engine, redis_client):
    gone = [f"gone{i}" for i in range(1500)]
    engine.add(Q, {**dict.fromkeys(gone, 0), "live": 0})
    assert engine.remove(Q, gone) == 1500
    drain(redis_client, engine.keys(Q).notify)
    # count 1: at most 1 + 1000 entries are popped, all of them tombstones.
    assert engine.claim(Q, 1) == []
    assert len(entries(redis_client, engine)) == 1501 - 1001
    assert engine.stats(Q).ready == 1
    assert engine.wait_for_work([Q], 0.01) is True  # an idle worker tries again at once
    assert engine.claim(Q, 1) == ["live"]
    assert engine.wait_for_work([Q], 0.01) is False
    assert entries(redis_client, engine) == []


def test_ids_whose_ready_list_vanished_are_still_claimed(engine, redis_client):
    """ready_set says which ids are in ready, and add trusts it. When the ready LIST alone
    is gone (evicted under an LRU maxmemory-policy, deleted by hand) its ids could never be
    claimed, and add (reconcile's too) left them there as held: stuck for good."""
    engine.add(Q, {"a": 0, "b": 0})
    redis_client.delete(engine.keys(Q).ready)
    assert engine.add(Q, {"a": 0, "b": 0}) == []  # held, as far as add can tell
    assert sorted(engine.claim(Q, 5)) == ["a", "b"]
    assert engine.stats(Q).ready == 0
    assert engine.claim(Q, 5) == []


def test_an_id_removed_while_ready_and_added_again_is_claimed_once(engine, redis_client):
    engine.add(Q, {"a": 0, "b": 0})
    assert engine.remove(Q, ["a"]) == 1
    assert engine.add(Q, {"a": 0}) == ["a"]  # Redis no longer held it
    assert engine.add(Q, {"a": 0}) == []
    assert entries(redis_client, engine) == ["a", "b", "a"]
    # Claimed at its first entry (the old place), once; the later entry is skipped.
    assert state(redis_client, engine)["ready"] == ["a", "b"]
    assert engine.stats(Q).ready == 2
    assert engine.claim(Q, 10) == ["a", "b"]
    assert entries(redis_client, engine) == []
    assert engine.ack(Q, ["a", "b"]) == 2
    assert engine.claim(Q, 10) == []


@pytest.mark.slow
def test_add_and_remove_stay_correct_while_ready_holds_100k_ids(engine, redis_client, now):
    # Correctness at a size where a scan of ready would block Redis for seconds; how
    # fast each call is, bench/engine.py reports ("add 100 ids while ready holds ...").
    n = 100_000
    ids = [f"id{i:06d}" for i in range(n)]
    for lo in range(0, n, MAX_BATCH):
        assert engine.add(Q, dict.fromkeys(ids[lo : lo + MAX_BATCH], 0)) == ids[lo : lo + MAX_BATCH]
    k = engine.keys(Q)
    assert redis_client.llen(k.ready) == n
    # Ids at the head, middle and tail of ready are seen as held: no duplicate entry.
    assert engine.add(Q, {ids[0]: 0, ids[n // 2]: now + HOUR, ids[-1]: 0}) == []
    assert engine.add(Q, {"new": 0, "later": now + HOUR}) == ["new", "later"]
    assert redis_client.llen(k.ready) == n + 1
    assert redis_client.lindex(k.ready, -1) == b"new"
    assert engine.remove(Q, [ids[n // 2], ids[-1], "later"]) == 3
    assert engine.remove(Q, [ids[n // 2]]) == 0
    assert redis_client.llen(k.ready) == n + 1  # tombstones, no LREM
    assert engine.stats(Q).ready == n - 1
    assert engine.add(Q, {ids[-1]: 0}) == [ids[-1]]
    claimed: list[str] = []
    while batch := engine.claim(Q, MAX_BATCH, HOUR):
        claimed += batch
    expected = [i for i in ids if i != ids[n // 2]] + ["new"]
    assert claimed == expected
    assert redis_client.exists(k.ready, k.ready_set) == 0


def test_remove_after_promote_removes_from_ready(engine, redis_client):
    engine.add(Q, {"a": engine.server_time_ms() + 30, "b": engine.server_time_ms() + HOUR})
    # Promoted, or (an add that took over 30 ms on a busy machine) added to ready at once.
    wait_until(lambda: engine.promote(Q).moved or engine.stats(Q).ready)
    assert state(redis_client, engine)["ready"] == ["a"]
    assert engine.remove(Q, ["a"]) == 1
    s = state(redis_client, engine)
    assert s["ready"] == []
    assert list(s["pending"]) == ["b"]
    assert engine.stats(Q).ready == 0
    assert engine.claim(Q, 10) == []
    assert state(redis_client, engine)["unack"] == {}


def test_remove_of_an_in_flight_id_returns_zero_and_keeps_it(engine, redis_client):
    in_flight(engine, ["a"])
    lease = state(redis_client, engine)["unack"]
    assert engine.remove(Q, ["a"]) == 0
    assert state(redis_client, engine)["unack"] == lease


# -- reschedule -------------------------------------------------------------------------


def test_reschedule_moves_a_pending_id_later_or_earlier(engine, redis_client, now):
    engine.add(Q, {"a": now + HOUR, "b": now + HOUR})
    assert engine.reschedule(Q, "a", now + 2 * HOUR) is True
    assert engine.reschedule(Q, "b", now + HOUR // 2) is True
    assert state(redis_client, engine)["pending"] == {"a": now + 2 * HOUR, "b": now + HOUR // 2}


def test_reschedule_to_a_past_time_makes_the_id_ready(engine, redis_client, now):
    engine.add(Q, {"x": 0, "a": now + HOUR})
    assert engine.reschedule(Q, "a", now - 1) is True
    s = state(redis_client, engine)
    assert s["pending"] == {}
    assert s["ready"] == ["x", "a"]


def test_reschedule_after_promote_returns_false_and_does_not_resurrect(engine, redis_client):
    add_pending(engine, Q, ["a"], 30)
    wait_until(lambda: engine.promote(Q).moved)
    assert engine.reschedule(Q, "a", engine.server_time_ms() + HOUR) is False
    s = state(redis_client, engine)
    assert s["pending"] == {}
    assert s["ready"] == ["a"]
    assert engine.claim(Q, 1) == ["a"]
    assert engine.reschedule(Q, "a", 0) is False
    assert engine.ack(Q, ["a"]) == 1
    assert engine.reschedule(Q, "a", 0) is False
    assert state(redis_client, engine) == {"pending": {}, "ready": [], "unack": {}, "garbage": {}}


def test_reschedule_leaves_ready_in_flight_buried_and_unknown_ids_alone(
    populated, redis_client, now
):
    before = state(redis_client, populated)
    for id_ in ("r", "u", "g", "unknown"):
        assert populated.reschedule(Q, id_, now + 2 * HOUR) is False
        assert populated.reschedule(Q, id_, 0) is False
    assert state(redis_client, populated) == before


# -- promote ----------------------------------------------------------------------------


def test_promote_moves_due_ids_in_due_order_behind_ready_ones(engine, redis_client, now):
    overdue(engine, {"c": 3, "a": 1, "b": 2})
    engine.add(Q, {"r": 0, "later": now + HOUR})
    before = engine.server_time_ms()
    result = engine.promote(Q)
    assert result.moved == 3
    assert result.next_due_ms == now + HOUR
    assert before <= result.now_ms <= engine.server_time_ms()
    # microseconds from the exact server time: within the whole ms now_ms truncates
    until_ms = result.next_due_ms - result.now_ms
    assert until_ms * 1000 - 1000 < result.next_due_in_us <= until_ms * 1000
    s = state(redis_client, engine)
    assert s["ready"] == ["r", "a", "b", "c"]
    assert s["pending"] == {"later": now + HOUR}


def test_promote_moves_at_most_a_batch_and_reports_the_next_due_time(engine, redis_client):
    overdue(engine, {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5})
    first = engine.promote(Q, batch=2)
    assert (first.moved, first.next_due_ms) == (2, 3)
    second = engine.promote(Q, batch=2)
    assert (second.moved, second.next_due_ms) == (2, 5)
    third = engine.promote(Q, batch=2)
    assert (third.moved, third.next_due_ms) == (1, None)
    assert state(redis_client, engine)["ready"] == ["a", "b", "c", "d", "e"]


def test_promote_leaves_ids_that_are_not_due(engine, redis_client, now):
    engine.add(Q, {"a": now + HOUR, "b": now + 2 * HOUR})
    result = engine.promote(Q)
    assert (result.moved, result.next_due_ms) == (0, now + HOUR)
    assert state(redis_client, engine)["ready"] == []


# -- due times to the microsecond -------------------------------------------------------


def exact_server_time_us(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1_000_000 + micros


def test_due_times_keep_their_microseconds_wherever_they_are_stored(populated, redis_client, now):
    """A fraction of a ms is kept by add, reschedule, nack and requeue alike (truncated,
    a job was promoted up to 1 ms early)."""
    due = now + HOUR + 0.123
    assert populated.add(Q, {"a": due, "p": due + 0.001}) == ["a"]  # p: a new due time
    populated.add(Q, {"b": now + HOUR})
    assert populated.reschedule(Q, "b", due + 0.002) is True
    assert populated.nack(Q, {"u": due + 0.003}) == 1
    assert populated.requeue(Q, ["g"], due + 0.004) == ["g"]
    pending = dict(redis_client.zrange(populated.keys(Q).pending, 0, -1, withscores=True))
    assert pending == {b"a": due, b"p": due + 0.001, b"b": due + 0.002, b"u": due + 0.003,
                       b"g": due + 0.004}  # fmt: skip


def test_promote_counts_the_wait_to_the_microsecond_of_the_next_due_time(engine, redis_client):
    start = exact_server_time_us(redis_client)
    due_us = start + HOUR * 1000 + 999  # 0.999 ms past a whole ms
    engine.add(Q, {"a": due_us / 1000})
    result = engine.promote(Q)
    end = exact_server_time_us(redis_client)
    assert result.moved == 0
    assert due_us - end - 1 <= result.next_due_in_us <= due_us - start + 1


def test_an_id_is_promoted_from_its_microsecond_not_from_the_next_whole_ms(engine, redis_client):
    """Each id is due at the first microsecond of the ms the server is in: a promote that
    compared due times with the server time cut to whole ms would leave it for 0.999 ms."""
    ids = [f"i{n}" for n in range(20)]
    in_flight(engine, ids)
    for id_ in ids:
        now_us = exact_server_time_us(redis_client)
        due_us = min(now_us, now_us - now_us % 1000 + 1)  # passed, even on a whole ms
        assert engine.nack(Q, {id_: due_us / 1000}) == 1
        assert engine.promote(Q).moved == 1, (id_, now_us)


# -- priority ---------------------------------------------------------------------------


def test_ids_added_due_now_enter_ready_highest_priority_first(engine, redis_client):
    engine.add(Q, {"r": 0})  # already ready: never overtaken
    engine.add(Q, dict.fromkeys("abcd", 0), {"c": 10, "b": -1})
    assert state(redis_client, engine)["ready"] == ["r", "c", "a", "d", "b"]


def test_promote_orders_the_ids_it_moves_together_by_priority_then_due_time(engine, redis_client):
    ids = ["a", "b", "c", "d", "e"]
    engine.add(Q, dict.fromkeys(ids, 0), {"b": -5, "c": 50, "e": 50})
    assert sorted(engine.claim(Q, 5, HOUR)) == ids
    # back to pending with past retry times (a retry keeps the job's priority)
    assert engine.nack(Q, {"a": 5, "b": 1, "c": 4, "d": 2, "e": 3}) == 5
    assert engine.promote(Q).moved == 5
    assert state(redis_client, engine)["ready"] == ["e", "c", "d", "a", "b"]


def test_ids_of_priority_0_write_no_priority_key(engine, redis_client, now):
    engine.add(Q, {"a": 0, "b": now + HOUR})
    engine.promote(Q)
    assert not redis_client.exists(engine.keys(Q).priority)


def test_a_priority_is_forgotten_when_its_id_leaves_redis(engine, redis_client, now):
    k = engine.keys(Q)
    engine.add(Q, {"p": now + HOUR, "r": 0, "u": 0, "g": 0}, dict.fromkeys("prug", 9))
    assert redis_client.hlen(k.priority) == 4
    assert engine.remove(Q, ["p", "r"]) == 2  # cancels: pending and ready
    assert sorted(engine.claim(Q, 2, HOUR)) == ["g", "u"]
    assert engine.ack(Q, ["u"]) == 1
    assert engine.bury(Q, ["g"]) == 1
    assert redis_client.hkeys(k.priority) == [b"g"]  # kept while buried: requeue may revive it
    assert engine.purge(Q, ["g"]) == 1
    assert not redis_client.exists(k.priority)


def test_re_adding_a_pending_id_with_priority_0_forgets_its_old_priority(engine, redis_client, now):
    """Re-added with priority 0 (later, or due now), a pending id is no longer promoted
    ahead of ids it does not outrank: ``add`` deletes the priority it had."""
    k = engine.keys(Q)
    engine.add(Q, {"a": now + HOUR, "n": now + HOUR}, {"a": 100, "n": 100})
    engine.add(Q, {"a": now + 1000})  # the same id, now of priority 0 (and due sooner)
    assert redis_client.hkeys(k.priority) == [b"n"]
    engine.add(Q, {"n": 0})  # due now: straight to ready, and its priority forgotten too
    assert not redis_client.exists(k.priority)
    engine.add(Q, {"b": now + 1000}, {"b": 50})
    wait_until(lambda: engine.promote(Q).moved)
    assert engine.claim(Q, 3) == ["n", "b", "a"]


def test_the_latest_due_time_accepted_gives_a_positive_wait(engine, now):
    """``MAX_DUE_MS`` (the end of year 9999) is accepted; a due time some 292,000 years
    away, refused by the same check, overflowed the wait in us that ``promote`` returns
    (negative, so the promoter spun)."""
    engine.add(Q, {"last": MAX_DUE_MS})
    result = engine.promote(Q)
    assert result.next_due_ms == MAX_DUE_MS
    assert result.next_due_in_us is not None and result.next_due_in_us > 0


@pytest.mark.parametrize("score", ["inf", "1e20", "1e300", "-inf", "-5"])
def test_scores_the_engine_never_writes_do_not_break_promote_or_the_readers(
    engine, redis_client, score
):
    """Another program (or a hand-typed ZADD) may leave any score in a ZSET. A pending
    +inf made promote, stats and next_due raise OverflowError (the promoter thread died,
    and the worker with it, at every restart); a finite one past ``MAX_DUE_MS``
    overflowed the wait in us (negative: the promoter spun). Read back, a score lies
    within 0..``MAX_DUE_MS``."""
    k = engine.keys(Q)
    redis_client.zadd(k.pending, {"alien": score})
    redis_client.zadd(k.unack, {"held": score})
    redis_client.zadd(k.garbage, {"dead": score})
    redis_client.zadd(engine.keys(parse(Q).queue).workers, {"w": score})
    result = engine.promote(Q)
    if result.next_due_in_us is not None:
        assert result.next_due_in_us >= 0
        assert result.next_due_ms is not None and 0 <= result.next_due_ms <= MAX_DUE_MS
    stats = engine.stats(Q)
    for value in (stats.next_due_ms, stats.oldest_lease_ms):
        assert value is None or 0 <= value <= MAX_DUE_MS
    assert all(0 <= due <= MAX_DUE_MS for _, due in engine.next_due(Q))
    assert all(0 <= died <= MAX_DUE_MS for _, died in engine.garbage(Q))
    assert all(0 <= w["expires_ms"] <= MAX_DUE_MS for w in engine.workers(Q))


# -- turns --------------------------------------------------------------------------------


def test_one_caller_takes_a_turn_until_it_ends(engine, redis_client):
    assert engine.take_turn("prune", 60_000) == 0
    other = Engine(redis_client, prefix="t")
    assert 59_000 < other.take_turn("prune", 60_000) <= 60_000  # held: ms until it ends
    assert other.take_turn("other-task", 50) == 0  # turns of different names are separate
    wait_until(lambda: other.take_turn("other-task", 50) == 0)  # free once it ran out
    with pytest.raises(ValueError, match="turn name"):
        engine.take_turn("a:b", 1000)
    with pytest.raises(ValueError, match="non-negative"):
        engine.take_turn("prune", -1)


# -- claim and leases -------------------------------------------------------------------


def test_claim_takes_the_head_of_ready_with_a_lease_from_server_time(engine, redis_client):
    engine.add(Q, {"a": 0, "b": 0, "c": 0})
    before = engine.server_time_ms()
    assert engine.claim(Q, 2, lease_ms=60_000) == ["a", "b"]
    after = engine.server_time_ms()
    s = state(redis_client, engine)
    assert s["ready"] == ["c"]
    assert set(s["unack"]) == {"a", "b"}
    for deadline in s["unack"].values():
        assert before + 60_000 <= deadline <= after + 60_000
    assert engine.claim(Q, 5) == ["c"]
    assert engine.claim(Q, 5) == []


def test_a_lease_that_runs_out_is_recovered_at_the_head_of_ready(engine, redis_client):
    engine.add(Q, {"a": 0})
    claimed_at = engine.server_time_ms()
    assert engine.claim(Q, 1, lease_ms=50) == ["a"]
    engine.add(Q, {"b": 0})
    recovered = wait_until(lambda: engine.recover_expired(Q))
    assert recovered == ["a"]
    assert engine.server_time_ms() >= claimed_at + 50
    s = state(redis_client, engine)
    assert s["ready"] == ["a", "b"]
    assert s["unack"] == {}
    assert engine.stats(Q).counters == {"added": 2, "recovered": 1}
    assert engine.claim(Q, 1) == ["a"]


def test_recover_expired_leaves_live_leases_and_respects_the_batch(engine, redis_client):
    engine.add(Q, {"a": 0, "b": 0, "c": 0, "live": 0})
    assert engine.claim(Q, 3, lease_ms=0) == ["a", "b", "c"]
    assert engine.claim(Q, 1, lease_ms=HOUR) == ["live"]
    assert engine.recover_expired(Q, batch=2) == ["a", "b"]
    assert engine.recover_expired(Q, batch=2) == ["c"]
    assert engine.recover_expired(Q, batch=2) == []
    s = state(redis_client, engine)
    assert s["ready"] == ["c", "a", "b"]
    assert list(s["unack"]) == ["live"]


def test_extend_lease_returns_only_ids_still_held(engine, redis_client):
    engine.add(Q, {"a": 0, "b": 0, "c": 0})
    assert engine.claim(Q, 3, lease_ms=1000) == ["a", "b", "c"]
    engine.ack(Q, ["b"])
    engine.bury(Q, ["c"])
    before = engine.server_time_ms()
    assert engine.extend_lease(Q, ["a", "b", "c", "never"], 60_000) == ["a"]
    after = engine.server_time_ms()
    s = state(redis_client, engine)
    assert before + 60_000 <= s["unack"]["a"] <= after + 60_000
    assert set(s["unack"]) == {"a"}
    assert list(s["garbage"]) == ["c"]


def test_a_repeated_id_is_handled_and_counted_once(populated):
    assert populated.extend_lease(Q, ["u", "u", "r", "u"], HOUR) == ["u"]
    assert populated.remove(Q, ["r", "r", "p", "p"]) == 2
    assert populated.requeue(Q, ["g", "g"]) == ["g"]
    assert populated.claim(Q, 5, HOUR) == ["g"]
    assert populated.bury(Q, ["g", "g"]) == 1
    assert populated.purge(Q, ["g", "g"]) == 1
    assert populated.ack(Q, ["u", "u"]) == 1
    assert populated.stats(Q).counters == {"added": 4, "removed": 2, "acked": 1, "buried": 2}


def test_extend_lease_after_recovery_does_not_put_the_id_back_in_flight(engine, redis_client):
    in_flight(engine, ["a"], lease_ms=0)
    assert engine.recover_expired(Q) == ["a"]
    assert engine.extend_lease(Q, ["a"], HOUR) == []
    s = state(redis_client, engine)
    assert s["unack"] == {}
    assert s["ready"] == ["a"]


def test_extend_lease_rescues_an_expired_lease_not_yet_recovered(engine, redis_client):
    in_flight(engine, ["a"], lease_ms=0)
    assert engine.extend_lease(Q, ["a"], HOUR) == ["a"]
    assert engine.recover_expired(Q) == []
    assert list(state(redis_client, engine)["unack"]) == ["a"]


def test_adopt_puts_only_ids_held_nowhere_or_in_garbage_in_flight_with_a_lease(
    populated, redis_client
):
    """Reconcile's move for running jobs Redis lost: pending, ready and in flight ids are
    left as they are; a new one goes in flight, and its lease ends like a claim's; one in
    garbage (a stale copy: its row says it runs) is moved in flight."""
    before_s = state(redis_client, populated)
    before = populated.server_time_ms()
    assert populated.adopt(Q, ["p", "r", "u", "g", "new", "new"], 60_000) == ["g", "new"]
    after = populated.server_time_ms()
    s = state(redis_client, populated)
    for id_ in ("g", "new"):
        assert before + 60_000 - 1 <= s["unack"][id_] <= after + 60_000
    assert {k: v for k, v in s["unack"].items() if k not in ("g", "new")} == before_s["unack"]
    assert "g" not in s["garbage"] and before_s["garbage"].keys() - {"g"} == s["garbage"].keys()
    for place in ("pending", "ready"):
        assert s[place] == before_s[place]
    assert populated.adopt(Q, ["x"], 0) == ["x"]  # a lease already over
    assert "x" in populated.recover_expired(Q)


def test_add_only_earlier_moves_a_pending_id_only_to_an_earlier_time(engine, redis_client):
    now = engine.server_time_ms()
    engine.add(Q, {"a": now + HOUR, "b": now + HOUR})
    engine.add(Q, {"a": now + 2 * HOUR, "b": now + HOUR / 2}, only_earlier=True)
    pending = state(redis_client, engine)["pending"]
    assert pending == {"b": now + HOUR / 2, "a": now + HOUR}
    engine.add(Q, {"a": now + 2 * HOUR})  # by default the time given wins
    assert state(redis_client, engine)["pending"]["a"] == now + 2 * HOUR


# -- finishing: ack, nack, bury ---------------------------------------------------------


def test_ack_forgets_in_flight_ids_only(populated, redis_client):
    populated.add(Q, {"u2": 0})
    populated.claim(Q, 2)  # r, u2
    assert populated.ack(Q, ["u", "u2", "p", "g", "unknown"]) == 2
    s = state(redis_client, populated)
    assert list(s["unack"]) == ["r"]
    assert list(s["pending"]) == ["p"]
    assert list(s["garbage"]) == ["g"]
    assert populated.ack(Q, ["u"]) == 0
    assert populated.stats(Q).counters == {"added": 5, "acked": 2, "buried": 1}


def test_nack_hands_in_flight_ids_back_to_pending_with_their_retry_time(
    populated, redis_client, now
):
    assert populated.nack(Q, {"u": now + HOUR // 2, "r": 5, "p": 5, "g": 5}) == 1
    s = state(redis_client, populated)
    assert s["pending"] == {"u": now + HOUR // 2, "p": now + HOUR}
    assert s["ready"] == ["r"]
    assert s["unack"] == {}
    assert list(s["garbage"]) == ["g"]
    assert populated.stats(Q).counters["nacked"] == 1


def test_a_nacked_id_with_a_past_retry_time_is_promoted(engine, redis_client):
    in_flight(engine, ["a"])
    assert engine.nack(Q, {"a": 1}) == 1
    assert engine.stats(Q).overdue == 1
    assert engine.promote(Q).moved == 1
    assert state(redis_client, engine)["ready"] == ["a"]


def test_bury_moves_in_flight_ids_to_garbage_with_the_time_they_died(populated, redis_client):
    before = populated.server_time_ms()
    assert populated.bury(Q, ["u", "r", "p", "g"]) == 1
    after = populated.server_time_ms()
    s = state(redis_client, populated)
    assert set(s["garbage"]) == {"g", "u"}
    assert before <= s["garbage"]["u"] <= after
    assert s["ready"] == ["r"]
    assert list(s["pending"]) == ["p"]
    assert s["unack"] == {}
    assert [id_ for id_, _ in populated.garbage(Q)] == ["u", "g"]
    assert populated.garbage(Q, limit=1) == [("u", s["garbage"]["u"])]
    assert populated.stats(Q).counters["buried"] == 2


# -- garbage: requeue, purge ------------------------------------------------------------


def test_requeue_gives_buried_ids_another_life_in_ready(populated, redis_client):
    assert populated.requeue(Q, ["g", "u", "r", "p"]) == ["g"]
    s = state(redis_client, populated)
    assert s["garbage"] == {}
    assert s["ready"] == ["r", "g"]
    assert list(s["unack"]) == ["u"]
    assert list(s["pending"]) == ["p"]
    assert populated.requeue(Q, ["g"]) == []


def test_requeue_with_a_later_due_time_puts_buried_ids_in_pending(populated, redis_client, now):
    drain(redis_client, populated.keys(Q).wake)
    assert populated.requeue(Q, ["g"], due_ms=now + HOUR // 2) == ["g"]
    s = state(redis_client, populated)
    assert s["pending"] == {"p": now + HOUR, "g": now + HOUR // 2}
    assert s["garbage"] == {}
    assert populated.wait_for_wake([Q], 0.01) is True


def test_purge_deletes_buried_ids_only(populated, redis_client):
    before = state(redis_client, populated)
    assert populated.purge(Q, ["g", "u", "r", "p", "unknown"]) == 1
    after = state(redis_client, populated)
    assert after == {**before, "garbage": {}}
    assert populated.purge(Q, ["g"]) == 0


# -- observing --------------------------------------------------------------------------


def test_stats_reports_every_place_and_counter(engine, redis_client, now):
    in_flight(engine, ["a", "b", "c", "d", "e"])
    engine.ack(Q, ["a"])
    engine.bury(Q, ["b"])
    engine.nack(Q, {"c": 7})  # overdue
    assert engine.extend_lease(Q, ["e"], 0) == ["e"]  # expired, not yet recovered
    engine.add(Q, {"f": 0, "g": now + HOUR, "removed": 0})
    engine.remove(Q, ["removed"])  # its tombstone in the ready LIST is not counted
    engine.heartbeat(Q, "w1", HOUR)
    before = engine.server_time_ms()
    stats = engine.stats(Q)
    assert before <= stats.now_ms <= engine.server_time_ms()
    assert stats.pending == 2
    assert stats.overdue == 1
    assert stats.ready == 1
    assert stats.in_flight == 2
    assert stats.expired_leases == 1
    assert stats.garbage == 1
    assert stats.live_workers == 1
    assert stats.next_due_ms == 7
    assert stats.oldest_lease_ms == state(redis_client, engine)["unack"]["e"]
    assert stats.counters == {"added": 8, "removed": 1, "acked": 1, "buried": 1, "nacked": 1}
    assert engine.recover_expired(Q) == ["e"]
    assert engine.stats(Q).counters["recovered"] == 1
    assert engine.stats(Q).expired_leases == 0


def test_next_due_lists_the_soonest_pending_ids(engine, now):
    engine.add(Q, {"c": now + 3 * HOUR, "a": now + HOUR, "b": now + 2 * HOUR})
    assert engine.next_due(Q, limit=2) == [("a", now + HOUR), ("b", now + 2 * HOUR)]


def test_heartbeat_records_live_workers_and_ttl_0_removes_one(engine, redis_client):
    assert engine.heartbeat(Q, "w1", HOUR, {"host": "h1", "pid": 1}) == 1
    before = engine.server_time_ms()
    assert engine.heartbeat(Q, "w2", HOUR, {"host": "h2"}) == 2
    after = engine.server_time_ms()
    workers = {w["id"]: w for w in engine.workers(Q)}
    assert set(workers) == {"w1", "w2"}
    assert workers["w1"]["host"] == "h1"
    assert workers["w1"]["pid"] == 1
    assert before + HOUR <= workers["w2"]["expires_ms"] <= after + HOUR
    assert engine.heartbeat(Q, "w1", 0) == 1
    assert [w["id"] for w in engine.workers(Q)] == ["w2"]
    # Workers are recorded per queue, whatever shard name they were given.
    assert redis_client.hkeys(engine.keys(base(Q)).worker_info) == [b"w2"]
    assert engine.stats(Q).live_workers == 1


def test_a_worker_whose_heartbeat_expired_is_not_listed_and_is_forgotten(engine, redis_client):
    engine.heartbeat(Q, "w1", HOUR)
    engine.heartbeat(Q, "gone", 1)
    wait_until(lambda: [w["id"] for w in engine.workers(Q)] == ["w1"])
    assert engine.stats(Q).live_workers == 1
    assert engine.heartbeat(Q, "w1", HOUR) == 1
    k = engine.keys(base(Q))
    assert redis_client.zrange(k.workers, 0, -1) == [b"w1"]
    assert redis_client.hkeys(k.worker_info) == [b"w1"]


# -- wake-ups ---------------------------------------------------------------------------


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append((fn(), time.monotonic())))
    thread.start()
    return thread, out


def test_wait_for_wake_times_out_when_nothing_earlier_was_added(engine, redis_client, now):
    engine.add(Q, {"a": now + HOUR})
    drain(redis_client, engine.keys(Q).wake)
    engine.add(Q, {"b": now + 2 * HOUR})  # later than the earliest: no reason to wake
    engine.add(Q, {"c": 0})  # straight to ready: wakes workers, not the promoter
    start = time.monotonic()
    assert engine.wait_for_wake([Q], 0.05) is False
    assert time.monotonic() - start >= 0.04


def test_adding_an_earlier_due_time_wakes_a_waiting_promoter_promptly(engine, redis_client, now):
    engine.add(Q, {"a": now + HOUR})
    drain(redis_client, engine.keys(Q).wake)
    thread, out = _in_thread(lambda: engine.wait_for_wake(["other", Q], 10))
    time.sleep(0.05)  # let it block; the result does not depend on this
    added_at = time.monotonic()
    engine.add(Q, {"b": now + HOUR // 2})
    thread.join(10)
    assert out, "wait_for_wake did not return"
    woken, woken_at = out[0]
    assert woken is True
    assert woken_at - added_at < 1.0
    assert engine.wait_for_wake([Q], 0.01) is False  # one token, consumed


def test_an_earlier_reschedule_or_nack_wakes_the_promoter(engine, redis_client, now):
    wake = engine.keys(Q).wake
    engine.add(Q, {"a": now + HOUR, "b": now + 2 * HOUR})
    drain(redis_client, wake)
    assert engine.reschedule(Q, "b", now + 3 * HOUR) is True
    assert engine.wait_for_wake([Q], 0.01) is False
    assert engine.reschedule(Q, "b", now + HOUR // 2) is True
    assert engine.wait_for_wake([Q], 0.01) is True
    engine.add(Q, {"x": 0})
    engine.claim(Q, 1)
    assert engine.nack(Q, {"x": now + HOUR // 4}) == 1
    assert engine.wait_for_wake([Q], 0.01) is True


def test_wait_for_work_returns_after_promote_moves_ids(engine, redis_client):
    add_pending(engine, Q, ["a"], 100)
    assert engine.wait_for_work([Q], 0.01) is False
    thread, out = _in_thread(lambda: engine.wait_for_work([Q], 10))
    moved_at = wait_until(lambda: engine.promote(Q).moved and time.monotonic())
    thread.join(10)
    assert out, "wait_for_work did not return"
    woken, woken_at = out[0]
    assert woken is True
    assert woken_at - moved_at < 1.0
    assert engine.claim(Q, 1) == ["a"]


def test_ids_entering_ready_leave_at_most_64_work_tokens(engine, redis_client):
    engine.add(Q, {f"id{i}": 0 for i in range(100)})
    assert redis_client.llen(engine.keys(Q).notify) == 64
    assert engine.wait_for_work([Q], 0.01) is True


# -- bad input: refused before anything reaches Redis -----------------------------------

_TOO_MANY = [f"id{i}" for i in range(MAX_BATCH + 1)]
_BAD_QUEUES = ["", "a{b", "a}b", "a:b", "a b", "a\nb", "é", "x" * 65, 1, None, b"q"]
_BAD_TIMES = [
    (math.nan, ValueError),
    (math.inf, ValueError),
    (-math.inf, ValueError),
    (-1, ValueError),
    (10**400, ValueError),  # too large for a float: not OverflowError
    (True, TypeError),
    ("1", TypeError),
    (None, TypeError),
]
_FAR_DUES = [MAX_DUE_MS + 1, 1e16]  # after year 9999; 1e16: year ~318,000
_BAD_IDS = [
    ("a", TypeError),  # a single string, not a collection
    (b"a", TypeError),
    ([b"a"], TypeError),
    ([1], TypeError),
    ([None], TypeError),
    (["a", 2], TypeError),
    ([], ValueError),
    ([""], ValueError),
    (["a b"], ValueError),
    (["a\n"], ValueError),
    (["x" * 129], ValueError),
    (_TOO_MANY, ValueError),
]

BAD_CALLS: list[tuple[str, Callable[[Engine], Any], type[Exception]]] = []
for _i, (_ids, _exc) in enumerate(_BAD_IDS):
    for _name, _call in {
        "remove": lambda e, ids=_ids: e.remove(Q, ids),
        "ack": lambda e, ids=_ids: e.ack(Q, ids),
        "bury": lambda e, ids=_ids: e.bury(Q, ids),
        "purge": lambda e, ids=_ids: e.purge(Q, ids),
        "requeue": lambda e, ids=_ids: e.requeue(Q, ids),
        "extend_lease": lambda e, ids=_ids: e.extend_lease(Q, ids, 1000),
        "adopt": lambda e, ids=_ids: e.adopt(Q, ids, 1000),
    }.items():
        BAD_CALLS.append((f"{_name}-ids{_i}", _call, _exc))
for _i, (_t, _exc) in enumerate(_BAD_TIMES):
    BAD_CALLS += [
        (f"add-due{_i}", lambda e, t=_t: e.add(Q, {"ok": 1, "a": t}), _exc),
        (f"nack-due{_i}", lambda e, t=_t: e.nack(Q, {"u": t}), _exc),
        (f"reschedule-due{_i}", lambda e, t=_t: e.reschedule(Q, "p", t), _exc),
        (f"requeue-due{_i}", lambda e, t=_t: e.requeue(Q, ["g"], due_ms=t), _exc),
        (f"claim-lease{_i}", lambda e, t=_t: e.claim(Q, 1, lease_ms=t), _exc),
        (f"extend-lease{_i}", lambda e, t=_t: e.extend_lease(Q, ["u"], t), _exc),
        (f"adopt-lease{_i}", lambda e, t=_t: e.adopt(Q, ["n"], t), _exc),
        (f"heartbeat-ttl{_i}", lambda e, t=_t: e.heartbeat(Q, "w", t), _exc),
    ]
for _i, _t in enumerate(_FAR_DUES):
    BAD_CALLS += [
        (f"add-far{_i}", lambda e, t=_t: e.add(Q, {"ok": 1, "a": t}), ValueError),
        (f"nack-far{_i}", lambda e, t=_t: e.nack(Q, {"u": t}), ValueError),
        (f"reschedule-far{_i}", lambda e, t=_t: e.reschedule(Q, "p", t), ValueError),
        (f"requeue-far{_i}", lambda e, t=_t: e.requeue(Q, ["g"], due_ms=t), ValueError),
    ]
for _i, (_b, _exc) in enumerate(
    [(0, ValueError), (-1, ValueError), (MAX_BATCH + 1, ValueError), (True, TypeError),
     (1.5, TypeError), ("10", TypeError), (None, TypeError)]
):  # fmt: skip
    BAD_CALLS += [
        (f"promote-batch{_i}", lambda e, b=_b: e.promote(Q, batch=b), _exc),
        (f"recover-batch{_i}", lambda e, b=_b: e.recover_expired(Q, batch=b), _exc),
        (f"claim-count{_i}", lambda e, b=_b: e.claim(Q, b), _exc),
        (f"garbage-limit{_i}", lambda e, b=_b: e.garbage(Q, limit=b), _exc),
        (f"next_due-limit{_i}", lambda e, b=_b: e.next_due(Q, limit=b), _exc),
    ]
for _i, _queue in enumerate(_BAD_QUEUES):
    _exc = ValueError if isinstance(_queue, str) else TypeError
    BAD_CALLS += [
        (f"add-queue{_i}", lambda e, q=_queue: e.add(q, {"a": 0}), _exc),
        (f"remove-queue{_i}", lambda e, q=_queue: e.remove(q, ["p"]), _exc),
        (f"reschedule-queue{_i}", lambda e, q=_queue: e.reschedule(q, "p", 0), _exc),
        (f"promote-queue{_i}", lambda e, q=_queue: e.promote(q), _exc),
        (f"claim-queue{_i}", lambda e, q=_queue: e.claim(q), _exc),
        (f"recover-queue{_i}", lambda e, q=_queue: e.recover_expired(q), _exc),
        (f"ack-queue{_i}", lambda e, q=_queue: e.ack(q, ["u"]), _exc),
        (f"adopt-queue{_i}", lambda e, q=_queue: e.adopt(q, ["n"], 1000), _exc),
        (f"nack-queue{_i}", lambda e, q=_queue: e.nack(q, {"u": 0}), _exc),
        (f"bury-queue{_i}", lambda e, q=_queue: e.bury(q, ["u"]), _exc),
        (f"requeue-queue{_i}", lambda e, q=_queue: e.requeue(q, ["g"]), _exc),
        (f"purge-queue{_i}", lambda e, q=_queue: e.purge(q, ["g"]), _exc),
        (f"stats-queue{_i}", lambda e, q=_queue: e.stats(q), _exc),
        (f"heartbeat-queue{_i}", lambda e, q=_queue: e.heartbeat(q, "w", 1000), _exc),
        (f"wake-queue{_i}", lambda e, q=_queue: e.wait_for_wake([Q, q], 0.01), _exc),
        (f"work-queue{_i}", lambda e, q=_queue: e.wait_for_work([q], 0.01), _exc),
    ]
for _wait in ("wait_for_wake", "wait_for_work"):
    for _i, (_t, _exc) in enumerate(_BAD_TIMES):
        BAD_CALLS.append(
            (f"{_wait}-timeout{_i}", lambda e, w=_wait, t=_t: getattr(e, w)([Q], t), _exc)
        )
    for _i, (_queues, _exc) in enumerate(
        [(Q, TypeError), (b"q", TypeError), (None, TypeError), (1, TypeError), ((), ValueError)]
    ):
        BAD_CALLS.append(
            (f"{_wait}-queues{_i}", lambda e, w=_wait, q=_queues: getattr(e, w)(q, 0.01), _exc)
        )
BAD_CALLS += [
    ("add-not-a-mapping", lambda e: e.add(Q, [("a", 0)]), TypeError),
    ("add-bytes-id", lambda e: e.add(Q, {b"a": 0}), TypeError),
    ("add-int-id", lambda e: e.add(Q, {1: 0}), TypeError),
    ("add-empty", lambda e: e.add(Q, {}), ValueError),
    ("add-only-earlier-not-a-bool", lambda e: e.add(Q, {"a": 0}, only_earlier=2), TypeError),
    ("add-too-many", lambda e: e.add(Q, dict.fromkeys(_TOO_MANY, 0)), ValueError),
    ("add-priority-too-high", lambda e: e.add(Q, {"a": 0}, {"a": 101}), ValueError),
    ("add-priority-too-low", lambda e: e.add(Q, {"a": 0}, {"a": -101}), ValueError),
    ("add-priority-bool", lambda e: e.add(Q, {"a": 0}, {"a": True}), TypeError),
    ("add-priority-float", lambda e: e.add(Q, {"a": 0}, {"a": 1.5}), TypeError),
    ("add-priority-str", lambda e: e.add(Q, {"a": 0}, {"a": "5"}), TypeError),
    ("add-priority-other-id", lambda e: e.add(Q, {"a": 0}, {"b": 5}), ValueError),
    ("add-priority-not-a-mapping", lambda e: e.add(Q, {"a": 0}, [("a", 5)]), TypeError),
    ("nack-empty", lambda e: e.nack(Q, {}), ValueError),
    ("nack-not-a-mapping", lambda e: e.nack(Q, ["u"]), TypeError),
    ("reschedule-int-id", lambda e: e.reschedule(Q, 1, 0), TypeError),
    ("reschedule-bytes-id", lambda e: e.reschedule(Q, b"p", 0), TypeError),
    ("reschedule-empty-id", lambda e: e.reschedule(Q, "", 0), ValueError),
    ("heartbeat-empty-worker", lambda e: e.heartbeat(Q, "", 1000), ValueError),
    ("heartbeat-bytes-worker", lambda e: e.heartbeat(Q, b"w", 1000), TypeError),
    ("heartbeat-info-not-json", lambda e: e.heartbeat(Q, "w", 1000, {"x": object()}), TypeError),
    ("wake-no-queues", lambda e: e.wait_for_wake([], 0.01), ValueError),
    ("work-no-queues", lambda e: e.wait_for_work([], 0.01), ValueError),
    ("workers-bad-queue", lambda e: e.workers("a:b"), ValueError),
    ("next_due-bad-queue", lambda e: e.next_due("{x}"), ValueError),
]


def _snapshot(r: redis.Redis) -> dict[bytes, bytes | None]:
    return {key: r.dump(key) for key in r.keys("*")}


@pytest.mark.parametrize(("call", "exc"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_refused_and_redis_is_unchanged(populated, redis_client, call, exc):
    before = _snapshot(redis_client)
    with pytest.raises(exc):
        call(populated)
    assert _snapshot(redis_client) == before


@WITHOUT_SHARD
def test_the_longest_valid_names_are_accepted(redis_client):
    engine = Engine(redis_client, prefix="p" * 64)
    queue = "Az09_.-" + "q" * 57
    assert engine.add(queue, {"i" * 128: 0}) == ["i" * 128]
    assert engine.known_queues() == [queue]
    assert engine.claim(queue, MAX_BATCH) == ["i" * 128]


# -- waiting: bad arguments, and the socket timeout ----------------------------------------


@WITHOUT_SHARD
@pytest.mark.parametrize("method", ["wait_for_wake", "wait_for_work"])
def test_a_wait_longer_than_the_client_socket_timeout_returns_false(redis_client, backend, method):
    client = backend.client(socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        assert getattr(Engine(client, prefix="t"), method)([Q], 0.5) is False
    finally:
        close_client(client)


@WITHOUT_SHARD
def test_a_wait_under_a_short_socket_timeout_still_wakes(redis_client, backend):
    client = backend.client(socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        engine = Engine(client, prefix="t")
        engine.add(Q, {"a": 0})
        assert engine.wait_for_work([Q], 0.5) is True
    finally:
        close_client(client)


@WITHOUT_SHARD
@pytest.mark.slow
def test_a_wait_longer_than_the_default_socket_timeout_returns_false(redis_client, backend):
    # from_url() without socket_timeout: redis-py's default applies (5 s since redis-py 8),
    # though it is missing from the pool's connection_kwargs.
    client = backend.client(retry=Retry(NoBackoff(), 0))
    try:
        assert Engine(client, prefix="t").wait_for_work([Q], 6) is False
    finally:
        close_client(client)
