"""Audit of lease ownership: a lease extension keeps only the lease its claimer holds.

Leases had no owner: an extension checked that an id was in flight, not that it was in
flight under its claimer's lease. An id whose lease ended without its worker noticing
(Redis lost its data and the reconcile sweep added it again, or the worker froze past its
lease), then claimed by another worker, was extended by the first one's next extension and
counted as still its own: once the job before it ended, the first worker ran it as well,
beside the other (its running row read as a delivery whose worker was lost)."""

from __future__ import annotations

import math
import os
import signal
import threading
import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_delayjobs import schedule_many
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.engine.claims import ClaimToken
from django_delayjobs.models import Job, Status
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job
from django_delayjobs.worker import Options, WorkerProcess
from tests.helpers import start_worker, stop, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

Q = "default"
HOUR = 3_600_000


def lease_of(redis_client, engine, id_: str) -> float | None:  # type: ignore[no-untyped-def]
    """The lease of ``id_`` as Redis holds it (its unack score), exactly: a float, which
    the engine's ``%.17g`` strings equal once read (as text they may differ: '…14.2859'
    is the same double as repr's '…14.286')."""
    return redis_client.zscore(engine.keys(Q).unack, id_)


def another(engine: Engine) -> Engine:
    """Another holder of the same Redis: an engine whose leases end in another fraction of
    a ms (two picked at random share it one time in 4095)."""
    other = Engine(engine.client, prefix=engine.prefix)
    mine = round(float(engine._holder.fraction) * 4096)  # 1..4095
    other._holder._fraction = repr((mine % 4095 + 1) / 4096)
    return other


def test_an_extension_of_an_id_another_claim_holds_now_is_refused(engine, redis_client):
    """The first claimer's lease ended and the id was claimed again: the first claimer's
    extension, which names the lease it holds, finds another one and reports the id lost,
    leaving the new claimer's lease as it was."""
    engine.add(Q, {"a": 0})
    assert engine.claim(Q, 1, lease_ms=0) == ["a"]
    first = lease_of(redis_client, engine, "a")
    assert engine.recover_expired(Q) == ["a"]
    other = another(engine)  # another claimer
    assert other.claim(Q, 1, lease_ms=HOUR) == ["a"]
    second = lease_of(redis_client, engine, "a")
    assert engine.extend_lease(Q, {"a": repr(first)}, HOUR) == []
    assert lease_of(redis_client, engine, "a") == second
    assert other.extend_lease(Q, {"a": repr(second)}, HOUR) == ["a"]


def test_a_claim_and_an_extension_give_back_the_leases_redis_holds(engine, redis_client):
    """What the holder passes to its next extension is the score itself, to the last bit
    of its fraction of a ms: a rounded one would make its own lease look another's."""
    engine.add(Q, {"a": 0, "b": 0})
    claimed = engine.claim(Q, 2, lease_ms=HOUR)
    assert claimed == ["a", "b"]
    assert {i: float(lease) for i, lease in claimed.leases.items()} == {
        "a": redis_client.zscore(engine.keys(Q).unack, "a"),
        "b": redis_client.zscore(engine.keys(Q).unack, "b"),
    }
    extended = engine.extend_lease(Q, claimed.leases, HOUR)
    assert extended == ["a", "b"]
    assert {i: float(lease) for i, lease in extended.leases.items()} == {
        "a": redis_client.zscore(engine.keys(Q).unack, "a"),
        "b": redis_client.zscore(engine.keys(Q).unack, "b"),
    }
    assert engine.extend_lease(Q, {**extended.leases, "b": None}, HOUR) == ["a", "b"]


def test_a_claim_sent_again_gives_back_the_lease_of_the_ids_it_took(engine):
    engine.add(Q, {"a": 0})
    token = ClaimToken("w1", 7)
    claimed = engine.claim(Q, 1, lease_ms=HOUR, token=token)
    again = engine.claim(Q, 1, lease_ms=HOUR, token=token)
    assert (again, again.leases) == (["a"], claimed.leases)
    assert engine.extend_lease(Q, again.leases, HOUR) == ["a"]


def status(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


#: The fractions of a ms the leases of the two worker processes end in: two other holders,
#: always (picked at random, they are the same one time in 4095, and then the first takes
#: the second's lease for its own: that is no lease ownership these tests could check).
FRACTIONS = (repr(1 / 4096), repr(2 / 4096))


def lease_env(n: int, **extra: str) -> dict[str, str]:
    """The environment of worker process ``n`` (0 or 1): ``extra`` and its own fraction."""
    return {**extra, "DELAYJOBS_TEST_LEASE_FRACTION": FRACTIONS[n]}


def ends_in(score: float | None, n: int) -> bool:
    """Whether a lease is one worker process ``n`` set (it ends in its fraction)."""
    return score is not None and math.fmod(score, 1) == float(FRACTIONS[n])


@pytest.mark.django_db(transaction=True)
def test_an_id_another_process_claimed_after_redis_lost_its_data_is_not_run_again(
    redis_client, redis_url, tmp_path
):
    """A worker thread claimed two ids (``PREFETCH``) and ran the first; Redis lost its
    data, the reconcile sweep added the second one again and another process ran it. The
    first process's next lease extension found the id in flight (the other's lease) and
    kept it as its own; once its first job was over it ran the second one again, beside
    the other process: an action's outside effect twice."""
    engine = get_engine()
    env = {"DELAYJOBS_LEASE_SECONDS": "4.5"}  # extensions every 1.5 s
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    go = tmp_path / "go"
    processes = [
        start_worker(redis_url, "--concurrency", "1", env=lease_env(0, **env), log=logs[0])
    ]
    try:
        wait_for(lambda: engine.stats(Q).live_workers == 1)
        a = build_job(tasks.wait_for_file_outside, in_=0, args=[str(go), 60.0])
        b = build_job(tasks.slow_outside, in_=0, args=["b", 5.0])
        schedule_many([a, b])  # one add: the one thread claims both
        wait_for(lambda: status(a) == Status.RUNNING)
        processes.append(
            start_worker(redis_url, "--concurrency", "1", env=lease_env(1, **env), log=logs[1])
        )
        wait_for(lambda: engine.stats(Q).live_workers == 2)
        # Just after the first process extended its leases, so the rest happens before
        # its next extension.
        before = lease_of(redis_client, engine, str(b.pk))
        assert ends_in(before, 0)
        wait_for(lambda: lease_of(redis_client, engine, str(b.pk)) != before)
        redis_client.flushdb()  # a restart without persistence
        reconcile(engine)  # a back in flight (adopted), b in ready: the second process's
        adopted = lease_of(redis_client, engine, str(a.pk))
        wait_for(lambda: status(b) == Status.RUNNING)
        assert ends_in(lease_of(redis_client, engine, str(b.pk)), 1)  # the second's lease
        # The first process extended a's lease (it still runs a), and b's with it, after the
        # second process claimed b: it must have found b's lease another's.
        wait_for(lambda: lease_of(redis_client, engine, str(a.pk)) != adopted)
        assert lease_of(redis_client, engine, str(b.pk)) is not None  # b still runs
        go.touch()  # a ends; b would be the first process's next job
        wait_for(lambda: {status(a), status(b)} == {Status.SUCCEEDED}, timeout=15)
    finally:
        go.touch(exist_ok=True)
        assert [stop(process) for process in processes] == [0] * len(processes)
    assert Record.objects.filter(label="b").count() == 1
    assert list(Job.objects.filter(pk__in=[a.pk, b.pk]).values_list("attempts", "deliveries")) == [
        (1, 1),
        (1, 1),
    ]
    assert f"lost the lease of job {b.pk}" in logs[0].read_text()


@pytest.mark.django_db(transaction=True)
def test_an_id_another_process_claimed_after_a_freeze_is_not_run_again(
    redis_client, redis_url, tmp_path
):
    """The same after a freeze: the first process stopped (SIGSTOP: swapping, a long GC
    pause, a frozen link to Redis) for longer than its leases; both ids went back to
    ready, and another process claimed them and ran the first one again (its delivery
    whose worker was lost). Once awake, the first process kept the lease of the second
    one as its own and, its first job over, ran it beside the other process."""
    engine = get_engine()
    env = {"DELAYJOBS_LEASE_SECONDS": "1"}
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    go = tmp_path / "go"
    processes = [
        start_worker(redis_url, "--concurrency", "1", env=lease_env(0, **env), log=logs[0])
    ]
    try:
        wait_for(lambda: engine.stats(Q).live_workers == 1)
        a = build_job(tasks.wait_for_file_outside, in_=0, args=[str(go), 60.0])
        b = build_job(tasks.slow_outside, in_=0, args=["b", 0.1])
        while str(b.pk) < str(a.pk):  # a first in ready once both are handed back
            b = build_job(tasks.slow_outside, in_=0, args=["b", 0.1])
        schedule_many([a, b])  # one add: the one thread claims both
        wait_for(lambda: status(a) == Status.RUNNING)
        processes.append(
            start_worker(redis_url, "--concurrency", "1", env=lease_env(1, **env), log=logs[1])
        )
        wait_for(lambda: engine.stats(Q).live_workers == 2)
        processes[0].send_signal(signal.SIGSTOP)
        try:  # the second process takes both, and runs a again
            wait_for(lambda: Job.objects.get(pk=a.pk).deliveries == 2)
            assert ends_in(lease_of(redis_client, engine, str(b.pk)), 1)  # the second's
        finally:
            processes[0].send_signal(signal.SIGCONT)
        wait_for(lambda: f"lost the lease of job {b.pk}" in logs[0].read_text())
        go.touch()
        wait_for(lambda: {status(a), status(b)} == {Status.SUCCEEDED}, timeout=15)
    finally:
        go.touch(exist_ok=True)
        assert [stop(process) for process in processes] == [0] * len(processes)
    assert Record.objects.filter(label="b").count() == 1
    b.refresh_from_db()
    assert (b.attempts, b.deliveries) == (1, 1)


# -- an extension whose reply was lost (audit-lse2) ---------------------------------------


def test_an_extension_whose_reply_was_lost_does_not_lose_the_lease(own_redis):
    """Redis stalled past the client's timeout (a fork for a snapshot, a slow command) and
    ran an extension whose reply never came: the lease moved from the one its holder knew
    to one it was never told. Its next extension (or a Cluster client's retry) names the
    old one: it must still find the id its own, not report it lost (it was then never
    started, and left in flight under a lease nobody held until LEASE_SECONDS ended)."""
    assert own_redis.pid is not None
    client = redis.Redis.from_url(own_redis.url, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))
    try:
        engine = Engine(client, prefix="t")
        engine.add(Q, {"a": 0})
        first = engine.claim(Q, 1, lease_ms=HOUR).leases
        first = engine.extend_lease(Q, first, HOUR).leases  # its script loaded: run at once
        os.kill(own_redis.pid, signal.SIGSTOP)  # it runs the call once woken
        waking = threading.Timer(1.5, os.kill, (own_redis.pid, signal.SIGCONT))
        waking.start()
        try:
            with pytest.raises(EngineUnavailable):
                engine.extend_lease(Q, first, HOUR)
        finally:
            waking.join()
        wait_for(lambda: lease_of(client, engine, "a") != float(first["a"]))  # it ran
        again = engine.extend_lease(Q, first, HOUR)
        assert again == ["a"]
        assert {i: float(lease) for i, lease in again.leases.items()} == {
            "a": lease_of(client, engine, "a")
        }
        # Another holder that claims it once this one's lease ended still takes it away.
        other = another(engine)
        assert engine.extend_lease(Q, ["a"], 0) == ["a"]
        assert engine.recover_expired(Q) == ["a"]
        assert other.claim(Q, 1, lease_ms=HOUR) == ["a"]
        assert engine.extend_lease(Q, again.leases, HOUR) == []
    finally:
        close_client(client)


def test_a_holder_keeps_one_fraction_for_all_its_leases(engine, redis_client):
    """Every lease one holder sets, by a claim or an extension, of any length, ends in the
    same fraction of a ms: the one its next extension recognises as its own."""
    engine.add(Q, {"a": 0, "b": 0})
    assert engine.claim(Q, 1, lease_ms=HOUR) == ["a"]
    assert engine.claim(Q, 1, lease_ms=2 * HOUR) == ["b"]
    engine.extend_lease(Q, ["a"], 3 * HOUR)
    fractions = {math.fmod(redis_client.zscore(engine.keys(Q).unack, i), 1) for i in "ab"}
    assert len(fractions) == 1 and 0 < fractions.pop() < 1


# -- a stop hands back only the ids it still holds (audit-lse2) ----------------------------


def test_a_stop_does_not_hand_back_an_id_another_worker_holds_now(engine, redis_client):
    """A worker stopping hands back the ids waiting in its batch. One whose lease it lost,
    and that another worker has claimed since, is that worker's: nacked, it left flight
    and went to pending, and a third worker ran it beside the one running it."""
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    engine.add(Q, {a: 0, b: 0})
    worker = WorkerProcess(engine, Options(queues=[Q]))
    thread = threading.get_ident()
    assert worker.hold(Q, engine.claim(Q, 2, lease_ms=0)) == [a, b]
    assert sorted(engine.recover_expired(Q)) == sorted([a, b])
    other = another(engine)  # another worker
    (a,) = other.claim(Q, 1, lease_ms=HOUR)
    (b,) = {*worker.held} - {a}
    held = lease_of(redis_client, engine, a)
    worker.extend_leases()  # a: lost (another worker's now); b: out of flight, lost too
    assert not worker.holds(a, thread)
    assert worker.hand_back(Q, [a, b], thread)
    assert lease_of(redis_client, engine, a) == held  # still the other worker's
    assert engine.stats(Q).pending == 0
    assert worker.release([a, b]) == []  # let go all the same


def test_an_exit_does_not_hand_back_an_id_another_worker_holds_now(engine, redis_client):
    """The same at exit, for the ids waiting in the batches of threads left running."""
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    engine.add(Q, {a: 0})
    worker = WorkerProcess(engine, Options(queues=[Q]))
    assert worker.hold(Q, engine.claim(Q, 1, lease_ms=0)) == [a]
    assert engine.recover_expired(Q) == [a]
    assert another(engine).claim(Q, 1, lease_ms=HOUR) == [a]
    held = lease_of(redis_client, engine, a)
    engine.add(Q, {b: 0})
    assert worker.hold(Q, engine.claim(Q, 1, lease_ms=HOUR)) == [b]
    worker.extend_leases()
    worker.hand_back_waiting()
    assert lease_of(redis_client, engine, a) == held
    assert lease_of(redis_client, engine, b) is None  # b, still its own, handed back
    assert engine.stats(Q).pending == 1
    assert worker.release([a, b]) == []
