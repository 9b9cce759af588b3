"""Audit of a nack that took an id out of another holder's lease.

A nack moved an id from unack to pending whoever held its lease. Worker process W1 held
job J claimed (prefetched, not started); Redis lost its data, the reconcile sweep added J
again, and worker process W2 claimed and started it. W1 reached J before an extension told
it that its lease was lost: its database claim found the row started just now by W2 and
deferred it, and that deferral's nack took J out of W2's lease into pending, due half a
lease after W2's start. An action longer than that was then taken over by a third claim
beside W2: two runs at once. A nack now moves only an id in flight under a lease of its
own engine (one that ends in its holder's fraction, see leases.py), or under a lease no
holder set (``adopt``'s).
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_delayjobs import sql
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, settle
from django_delayjobs.services import schedule
from tests.test_audit_lse import another
from tests.testapp import tasks

Q = "default"
HOUR = 3_600_000


def lease_of(engine: Engine, id_: str) -> float | None:
    return engine.client.zscore(engine.keys(Q).unack, id_)


def pending(engine: Engine) -> list[str]:
    return [i.decode() for i in engine.client.zrange(engine.keys(Q).pending, 0, -1)]


def claimed_by_another(engine: Engine, *, flush: bool) -> Engine:
    """``engine`` claimed "a"; its lease was lost (Redis lost its data and the sweep added
    the id again, or its lease ended and ``recover_expired`` handed it back), and another
    holder claimed it: returned, the id in flight under its lease."""
    other = another(engine)
    engine.add(Q, {"a": 0})
    assert engine.claim(Q, 1, lease_ms=0 if not flush else HOUR) == ["a"]
    if flush:
        engine.client.flushdb()  # a restart without persistence
        engine.add(Q, {"a": 0})  # the reconcile sweep's add
    else:
        assert engine.recover_expired(Q) == ["a"]
    assert other.claim(Q, 1, lease_ms=HOUR) == ["a"]
    return other


@pytest.mark.parametrize("flush", [True, False], ids=["data-lost", "lease-ended"])
def test_a_nack_of_an_id_another_holder_claimed_moves_nothing(engine, flush):
    other = claimed_by_another(engine, flush=flush)
    held = lease_of(engine, "a")
    assert engine.nack(Q, {"a": 0}) == 0
    assert lease_of(engine, "a") == held  # still in flight, under the other's lease
    assert pending(engine) == []
    assert other.nack(Q, {"a": 0}) == 1  # its holder's nack still moves it
    assert lease_of(engine, "a") is None
    assert pending(engine) == ["a"]


def test_a_nack_moves_its_own_ids_and_leaves_the_others(engine):
    other = claimed_by_another(engine, flush=True)
    engine.add(Q, {"b": 0})
    assert engine.claim(Q, 1, lease_ms=HOUR) == ["b"]
    assert engine.nack(Q, {"a": 0, "b": 0}) == 1
    assert pending(engine) == ["b"]
    assert lease_of(other, "a") is not None


def test_a_nack_of_an_id_its_own_extension_moved_moves_it(engine):
    """The lease was extended (a reply lost, say): another score, the holder's fraction."""
    engine.add(Q, {"a": 0})
    assert engine.claim(Q, 1, lease_ms=HOUR) == ["a"]
    assert "a" in engine.extend_lease(Q, ["a"], 2 * HOUR)
    assert engine.nack(Q, {"a": 0}) == 1


def test_an_adopted_id_is_nacked_by_the_worker_that_runs_it(engine):
    """``adopt`` (reconcile, after Redis lost a running id) sets a lease no holder set:
    the worker still running the job may nack it (a retry) before its first extension,
    as that extension (whoever holds it) would keep it."""
    assert engine.adopt(Q, ["a"], HOUR) == ["a"]
    assert lease_of(engine, "a") == int(lease_of(engine, "a") or 0)  # whole ms: no holder
    assert another(engine).nack(Q, {"a": 0}) == 1
    assert pending(engine) == ["a"]


@pytest.mark.django_db(transaction=True)
def test_a_deferral_of_a_job_another_worker_claimed_and_runs_leaves_its_id_in_flight():
    """Steps 1 to 3 of the race, by hand: W1 claimed J in Redis; Redis lost its data, the
    sweep added J again, W2 claimed it (in Redis, then in the database: its row running,
    W2's delivery). W1's delivery is deferred (the row started just now), and its settle
    must leave J in flight under W2's lease: in pending, it would be claimed again once
    half a lease after W2's start passed, and run beside W2."""
    w1 = get_engine()
    w2 = another(w1)
    job = schedule(tasks.record, in_=0, args=["j"])
    job_id = str(job.pk)
    assert w1.claim(Q, 1) == [job_id]  # prefetched by W1, not started
    w1.client.flushdb()
    w1.add(Q, {job_id: 0})  # the reconcile sweep's add
    assert w2.claim(Q, 1) == [job_id]
    assert sql.claim(job_id, "W2", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
    held = lease_of(w2, job_id)
    assert held is not None

    result = Execution(Q, job_id, "W1").run()
    assert result.outcome == Outcome.DEFERRED  # running since just now on W2
    settle(w1, Q, job_id, result)

    assert lease_of(w2, job_id) == held  # still W2's, in flight
    assert pending(w2) == []
    assert w2.claim(Q, 1) == []  # no third claim
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.worker, row.deliveries) == (Status.RUNNING, "W2", 1)
    assert w2.nack(Q, {job_id: 0}) == 1  # W2's own moves still move it
