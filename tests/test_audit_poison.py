"""Audit poison: what another program (or a bug) leaves in a queue's keys must not stop
the ids beside it. Each test is shown failing on the code before its fix, against a real
Redis (the session's private one)."""

from __future__ import annotations

import logging

import pytest
import redis
from django.core.management import call_command

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.engine.claims import Claimer
from django_delayjobs.models import Job, Status
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
