"""Audit poison: what another program (or a bug) leaves in a queue's keys must not stop
the ids beside it. Each test is shown failing on the code before its fix, against a real
Redis (the session's private one)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
import redis
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, EngineUnavailable, WrongType
from django_delayjobs.engine.claims import Claimer
from django_delayjobs.engine.results import Leased
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job, schedule_many
from django_delayjobs.worker import Options, WorkerProcess
from tests.testapp import tasks

Q = "q"

#: Members the engine's own id check refuses (``check_ids``): every other engine call
#: (ack, extend_lease...) raised ValueError on them.
FOREIGN = {
    "empty": b"",
    "newline": b"bad\nid",
    "space": b"bad id",
    "control": b"bad\x01id",
    "too long": b"x" * 129,
}


def plant(client: redis.Redis, engine: Engine, shard: str, member: bytes) -> None:
    """Put ``member`` in ``shard``'s ready list and ready_set, as another program would."""
    k = engine.keys(shard)
    client.rpush(k.ready, member)
    client.sadd(k.ready_set, member)


def left_anywhere(client: redis.Redis, engine: Engine, shard: str, member: bytes) -> bool:
    k = engine.keys(shard)
    return (
        member in client.lrange(k.ready, 0, -1)
        or bool(client.sismember(k.ready_set, member))
        or client.zscore(k.unack, member) is not None
    )


@pytest.mark.parametrize("member", FOREIGN.values(), ids=FOREIGN.keys())
@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token"])
def test_a_claim_never_returns_an_id_the_engine_refuses_and_takes_it_out(
    redis_client: redis.Redis, engine: Engine, member: bytes, with_token: bool
) -> None:
    """Claim returned such a member; the worker then held it and its ack (and every lease
    extension) raised ValueError from the engine's own id check: the worker thread and the
    housekeeping thread died, and the member came back after its lease to kill the next."""
    engine.add(Q, {"J": 0})
    plant(redis_client, engine, Q, member)
    engine.add(Q, {"K": 0})
    token = Claimer().token(Q) if with_token else None
    claimed = engine.claim(Q, 5, token=token)
    assert sorted(claimed) == ["J", "K"] and set(claimed.leases) == {"J", "K"}
    assert claimed.dropped == [member.decode()]
    assert not left_anywhere(redis_client, engine, Q, member)
    assert engine.ack(Q, claimed) == 2  # what it returned, the engine takes back
    if with_token:  # the same call sent again returns nothing it refuses either
        assert list(engine.claim(Q, 5, token=token)) == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_removes_a_foreign_member_once_and_runs_the_job_beside_it(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The burst died (exit 1): the batch's ack raised ValueError, the job's id stayed in
    flight, and every restart met the member again once its lease ended."""
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["real"])
    plant(redis_client, engine, "default", FOREIGN["newline"])
    with caplog.at_level(logging.WARNING, logger="django_delayjobs"):
        call_command("run_delayworker", "--burst", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert not left_anywhere(redis_client, engine, "default", FOREIGN["newline"])
    stats = engine.stats("default")
    assert (stats.ready, stats.in_flight, stats.pending, stats.garbage) == (0, 0, 0, 0)
    lines = [r.getMessage() for r in caplog.records if "not a job id" in r.getMessage()]
    assert len(lines) == 1 and "removed" in lines[0]


def broken_old_shard(redis_client: redis.Redis, old: Engine, queue: str = Q) -> None:
    """List both shards of ``queue``'s count of 2 (as adds under that count did), leave
    them empty, and give the first one's ready list another program's type."""
    for shard in old.shards(queue):
        member = str(uuid.uuid4())
        old.add(shard, {member: 0})
        assert old.claim(shard, 1) == [member] and old.ack(shard, [member]) == 1
    redis_client.set(old.keys(old.shards(queue)[0]).ready, "another program's")


@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token"])
def test_a_claim_over_several_shards_returns_what_it_took_when_a_later_shard_fails(
    redis_client: redis.Redis, with_token: bool
) -> None:
    """After the count went from 2 to 1, a claim of the queue took the ids of its current
    shard, then raised WrongType on the old shard's key: the ids it took were in flight,
    held by nobody, and once their lease ended the next claim stranded them again."""
    broken_old_shard(redis_client, Engine(redis_client, prefix="t", shards={Q: 2}))
    engine = Engine(redis_client, prefix="t")
    assert engine.shards(Q)[0] == Q and len(engine.shards(Q)) == 3  # current shard first
    engine.add(Q, {"A": 0, "B": 0})
    claimer = Claimer()
    claimed = engine.claim(Q, 10, token=claimer.token(Q) if with_token else None)
    assert sorted(claimed) == ["A", "B"]
    assert isinstance(claimed.failure, WrongType)
    assert engine.ack(Q, claimed) == 2
    # Nothing taken: the failure shows, as before.
    with pytest.raises(WrongType):
        engine.claim(Q, 10, token=claimer.token(Q) if with_token else None)


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_the_jobs_of_the_healthy_shard_beside_a_broken_old_one(
    redis_client: redis.Redis, settings: Any
) -> None:
    """The worker's claim by the queue's name (its shard of 1, which took from the old
    shards too; it now claims each shard alone) raised WrongType after taking the ids: the
    burst ended with them in flight, and the jobs never ran."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 2}}
    broken_old_shard(redis_client, get_engine(), "orders")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 1}}
    jobs = schedule_many([build_job(tasks.record, in_=0, args=[f"j{n}"], queue="orders")
                          for n in range(3)])  # fmt: skip
    call_command("run_delayworker", "--burst", "--queues", "orders", "-v", "0")
    statuses = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True))
    assert statuses == {Status.SUCCEEDED}
    assert redis_client.zcard(get_engine().keys("orders").unack) == 0


@pytest.mark.django_db(transaction=True)
def test_a_worker_reports_the_broken_old_shard_and_claims_anew_after_it(
    redis_client: redis.Redis, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong type makes the script fail before it takes anything. The worker claims each
    shard alone (the queue's own by ``orders#0/1``): the healthy one gives its ids, and the
    broken one is met, and reported, by the claim that comes to it by its own name; each
    answered claim ends its token."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 2}}
    broken_old_shard(redis_client, get_engine(), "orders")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 1}}
    engine = get_engine()
    engine.add("orders", {"A": 0, "B": 0})
    process = WorkerProcess(engine, Options(queues=["orders"]))
    claimer = Claimer()
    sent = claimer.token("orders")
    with caplog.at_level(logging.ERROR, logger="django_delayjobs"):
        claimed = process.claim(["orders"], claimer)
        assert process.claim(["orders"], claimer) is None  # the old shards' turn
    assert claimed is not None and claimed[0] == "orders" and sorted(claimed[1]) == ["A", "B"]
    assert "is not served" in caplog.text and "WRONGTYPE" in caplog.text
    assert claimer.token("orders") != sent
    assert sorted(process.release(["A", "B"])) == ["A", "B"]


def test_a_claim_that_only_dropped_members_before_a_shard_failed_still_names_them(
    redis_client: redis.Redis,
) -> None:
    """The current shard held a foreign member only, which the claim took out of Redis;
    the old shard then raised, nothing had been claimed, and the claim raised: the member
    was gone from Redis and never logged. It now returns nothing, with the member in
    ``dropped`` and the error in ``failure``."""
    broken_old_shard(redis_client, Engine(redis_client, prefix="t", shards={Q: 2}))
    engine = Engine(redis_client, prefix="t")
    plant(redis_client, engine, Q, b"bad id")
    claimed = engine.claim(Q, 10)  # a new engine's first claim starts at the current shard
    assert list(claimed) == [] and claimed.dropped == ["bad id"]
    assert isinstance(claimed.failure, WrongType)
    assert not left_anywhere(redis_client, engine, Q, b"bad id")


@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_anew_after_a_shard_that_did_not_answer_and_says_so(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim that returned its ids with a failure (not a wrong type: a drop of members
    that are no ids that was not answered, or, before the worker claimed each shard alone,
    another shard's master down) kept its token, so every later claim sent that call
    again: the shard that answered only replayed its record (two thirds of the lease) and
    the failure was logged nowhere. The next claim is a new call, and the failure is
    logged."""
    engine = get_engine()
    process = WorkerProcess(engine, Options(queues=["orders"]))
    claimer = Claimer()
    sent = claimer.token("orders")
    failed = Leased({"A": "1"}, failure=EngineUnavailable("the master of {dj:orders#1/2} is down"))
    with caplog.at_level(logging.WARNING, logger="django_delayjobs"):
        process.took("orders", failed, claimer, 0.0)
    assert claimer.token("orders") != sent
    assert "{dj:orders#1/2} is down" in caplog.text
