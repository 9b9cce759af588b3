"""Review rv4: bugs found in a fresh-eyes review of the engine's scripts, each shown
against a real Redis (the session's private one) before its fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_delayjobs.engine import Engine, close_client
from tests.conftest import cluster_client

Q = "q"
HOUR = 3_600_000


def now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def queue_with_one_id_in_each_place(engine: Engine) -> None:
    """P pending (later), R ready, F in flight with an expired lease, G in garbage."""
    engine.add(Q, {"F": 0, "G": 0})
    assert sorted(engine.claim(Q, count=2, lease_ms=0)) == ["F", "G"]
    assert engine.bury(Q, ["G"]) == 1
    engine.add(Q, {"P": now_ms(engine.client) + HOUR, "R": 0})


# Each move that counts itself, with what it must have done. The counter it writes holds
# another program's value (not an integer): the move is made, and it must not then fail
# with "Redis refused the command" (which says nothing was changed; a caller retries, a
# worker logs an outage for every job it settles, an add skips listing a shard).
MOVES: dict[str, tuple[str, Callable[[Engine], Any], Callable[[Engine], bool]]] = {
    "add": ("added", lambda e: e.add(Q, {"N": 0}) == ["N"],
            lambda e: e.client.sismember(e.keys(Q).ready_set, "N")),
    "remove": ("removed", lambda e: e.remove(Q, ["P"]) == 1,
               lambda e: e.client.zscore(e.keys(Q).pending, "P") is None),
    "ack": ("acked", lambda e: e.ack(Q, ["F"]) == 1,
            lambda e: e.client.zscore(e.keys(Q).unack, "F") is None),
    "nack": ("nacked", lambda e: e.nack(Q, {"F": 0}) == 1,
             lambda e: e.client.zscore(e.keys(Q).pending, "F") is not None),
    "bury": ("buried", lambda e: e.bury(Q, ["F"]) == 1,
             lambda e: e.client.zscore(e.keys(Q).garbage, "F") is not None),
    "recover_expired": ("recovered", lambda e: e.recover_expired(Q) == ["F"],
                        lambda e: e.client.sismember(e.keys(Q).ready_set, "F")),
}  # fmt: skip


@pytest.mark.parametrize(("counter", "move", "done"), MOVES.values(), ids=MOVES.keys())
def test_a_counter_of_another_program_does_not_fail_a_move_already_made(
    engine: Engine, redis_client: redis.Redis, counter: str, move: Any, done: Any
) -> None:
    queue_with_one_id_in_each_place(engine)
    redis_client.hset(engine.keys(Q).counters, counter, "not a number")
    assert move(engine)
    assert done(engine)
    # The field is left as it was, as fold_counters leaves it; readers skip it.
    assert redis_client.hget(engine.keys(Q).counters, counter) == b"not a number"
    assert counter not in engine.stats(Q).counters


def test_moving_an_id_out_of_an_old_shard_does_not_fail_on_its_counter(
    redis_client: redis.Redis,
) -> None:
    old = Engine(redis_client, prefix="t")
    old.add(Q, {"W": now_ms(redis_client) + HOUR})
    redis_client.hset(old.keys(Q).counters, "removed", "x")  # withdraw counts it there
    new = Engine(redis_client, prefix="t", shards={Q: 4})
    added = new.add(Q, {"W": now_ms(redis_client) + HOUR})
    assert added.moved == ["W"]
    assert redis_client.zcard(old.keys(Q).pending) == 0


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def any_client(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Iterator[Any]:
    """The session's Redis, or (``-m cluster``) a client of its Redis Cluster, flushed."""
    if request.param == "single":
        yield redis_client
        return
    cluster = request.getfixturevalue("redis_cluster")
    cluster.wait_healthy()
    client = cluster_client(cluster.url)
    client.flushdb()
    yield client
    close_client(client)


def test_adopt_takes_a_running_job_out_of_the_garbage_of_an_old_shard(any_client: Any) -> None:
    """A running job whose id Redis holds only in garbage (a snapshot restored from
    while it was dead, before its retry) is put back in flight, so that its lease can
    end and another worker run it if its own died. In its own shard it was; in a shard of
    an older count (the queue's QUEUE_SHARDS changed) it was left in garbage, in flight
    nowhere, and the job stayed running for good."""
    old = Engine(any_client, prefix="t")
    old.add(Q, {"X": 0, "Y": 0})
    assert sorted(old.claim(Q, count=2, lease_ms=HOUR)) == ["X", "Y"]
    assert old.bury(Q, ["X"]) == 1
    new = Engine(any_client, prefix="t", shards={Q: 4})
    assert sorted(new.adopt(Q, ["X", "Y", "Z"], 0)) == ["X", "Z"]
    k = old.keys(Q)
    assert any_client.zscore(k.garbage, "X") is None
    assert any_client.zscore(k.unack, "X") is not None  # in flight where it was
    assert any_client.zscore(k.unack, "Y") is not None  # in flight: left alone
    # Its lease (0) has run out: recovered and delivered, as from its own shard.
    assert "X" in new.recover_expired(Q)
    assert "X" in new.claim(Q, count=5)


# An id another program wrote that is not UTF-8: read back with the bytes it holds as
# surrogate escapes (``surrogateescape``), and sent back as the same bytes.
ALIEN = b"\xff\xfeid"


@pytest.mark.parametrize("count", [1, 4], ids=["one-shard", "four-shards"])
def test_an_id_that_is_not_utf8_is_claimed_acked_and_read_without_a_crash(
    redis_client: redis.Redis, count: int
) -> None:
    """Claim (and recover_expired) moved such an id, then raised UnicodeDecodeError while
    reading the reply: not an engine error, so the worker's claim thread (or the
    promoter's) died, and with it the worker; the restarted worker met the same id once
    its lease ended. Nor could the worker remove the id (it acks what is not a job id)."""
    engine = Engine(redis_client, prefix="t", shards={Q: count})
    k = engine.keys(engine.home(Q, "J"))
    engine.add(Q, {"J": 0})
    redis_client.rpush(k.ready, ALIEN)
    redis_client.sadd(k.ready_set, ALIEN)
    claimed = engine.claim(engine.home(Q, "J"), 5, lease_ms=0)
    assert len(claimed) == 2 and "J" in claimed
    (alien,) = [id_ for id_ in claimed if id_ != "J"]
    assert engine.recover_expired(Q) and engine.claim(engine.home(Q, "J"), 5) == claimed
    assert engine.garbage(Q) == [] and engine.next_due(Q) == []
    assert engine.bury(engine.home(Q, "J"), [alien]) == 1
    assert [id_ for id_, _ in engine.garbage(Q)] == [alien]
    assert engine.purge(engine.home(Q, "J"), [alien]) == 1
    assert engine.ack(engine.home(Q, "J"), ["J"]) == 1
    assert redis_client.zcard(k.unack) == redis_client.zcard(k.garbage) == 0


def test_only_the_spelling_text_reads_back_is_an_id(engine: Engine) -> None:
    # "\udcc3\udca9" is the bytes of "é" spelled with escapes: a second id for one member.
    with pytest.raises(ValueError, match="printable"):
        engine.ack(Q, ["é", "\udcc3\udca9"])
    with pytest.raises(ValueError, match="printable"):
        engine.ack(Q, ["\ud800"])  # no bytes read back stand for it


@pytest.mark.django_db(transaction=True)
def test_a_worker_removes_an_id_that_is_not_utf8_and_runs_the_jobs_beside_it(
    redis_client: redis.Redis,
) -> None:
    """End to end: the worker's claim thread died on such an id (and the worker with it);
    now the id is removed as any id that is not a job id, and the real job runs."""
    from django.core.management import call_command

    from django_delayjobs import schedule
    from django_delayjobs.connection import get_engine
    from django_delayjobs.models import Job, Status
    from tests.testapp import tasks

    engine = get_engine()
    k = engine.keys("default")
    redis_client.rpush(k.ready, ALIEN)
    redis_client.sadd(k.ready_set, ALIEN)
    job = schedule(tasks.record, in_=0, args=["real"])
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    stats = engine.stats("default")
    assert (stats.ready, stats.in_flight, stats.pending, stats.garbage) == (0, 0, 0, 0)
