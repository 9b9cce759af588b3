"""Audit of the exactly-once promise, second round: the verbs committed (or rolled back) in
the very instant a worker claims, keyed schedules racing a rollback, the outbox under
rollbacks and a refused COMMIT, a worker killed at each step of a delivery, Redis losing
its data mid-flight, and a lease that ends as the action commits.

The interleavings are forced (events, and on PostgreSQL a wait until the other session is
seen waiting for the row's lock); SQLite serializes writers, so there the same test runs
the two in some order and checks the same end state.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from contextlib import suppress
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from django_delayjobs import schedule, schedule_many, signals, sql
from django_delayjobs.connection import get_engine
from django_delayjobs.engine import EngineUnavailable
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, JobEvent, Status
from django_delayjobs.outcomes import Outcome, Result, settle
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job, reschedule
from django_delayjobs.worker import Backoff, Options, WorkerProcess
from tests.helpers import in_thread, start_worker, stop, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


class Refused(Exception):
    """What makes a caller's transaction roll back (a payment refused after its cancel)."""


def waiting_for_a_lock() -> int:
    """Sessions of the test database waiting for a lock (0 on SQLite, which has none)."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def until_blocked() -> None:
    """On PostgreSQL, wait until one session waits for a lock (SQLite: its writers
    serialize, in whichever order they come)."""
    if connection.vendor == "postgresql":
        wait_for(lambda: waiting_for_a_lock() == 1)


def claimed_in_redis(*jobs: Job, lease_ms: float = 300_000) -> list[str]:
    """Promote and claim the ids of ``jobs`` (due now) as a worker would."""
    engine = get_engine()
    ids: list[str] = []

    def claim() -> bool:
        # Due times round up to the next ms: an id may sit in pending for 1 ms.
        engine.promote("default")
        ids.extend(engine.claim("default", len(jobs) - len(ids), lease_ms))
        return len(ids) == len(jobs)

    wait_for(claim)
    assert set(ids) == {str(job.pk) for job in jobs}
    return ids


def deliver(job_id: str, worker: str = "w1") -> Result:
    result = Execution("default", job_id, worker).run()
    settle(get_engine(), "default", job_id, result)
    return result


def held_by_redis() -> tuple[int, int, int, int]:
    stats = get_engine().stats("default")
    return stats.pending, stats.ready, stats.in_flight, stats.garbage


def pending_ids() -> set[str]:
    engine = get_engine()
    return {i.decode() for i in engine.client.zrange(engine.keys("default").pending, 0, -1)}


def kinds(job: Job) -> list[str]:
    return list(job.events.order_by("pk").values_list("kind", flat=True))


# -- cancel and reschedule in the instant of the claim ---------------------------------


def paying(job: Job, ending: str) -> tuple[threading.Thread, list[Any], threading.Event]:
    """A payment that cancels ``job`` and holds its transaction open until released, then
    ``ending`` ("rolls back": ``Refused`` carrying the cancel's answer; or "commits"):
    its thread, where it puts the cancel's answer, and its release."""
    cancelled, release = threading.Event(), threading.Event()

    def payment() -> bool:
        with transaction.atomic():
            won = job.cancel()
            cancelled.set()
            assert release.wait(30)
            if ending == "rolls back":
                raise Refused(won)
        return won

    paid: list[Any] = []
    payer = in_thread(payment, paid)
    assert cancelled.wait(30)
    return payer, paid, release


@pytest.mark.parametrize("ending", ["rolls back", "commits"])
def test_a_cancel_the_claim_waits_for_decides_whether_the_job_runs(ending):
    """A payment cancels the job while a worker's claim waits for the row. Rolled back
    (the payment failed after its cancel), the claim goes ahead and Redis never heard of
    the cancel; committed, the claim finds the job cancelled and the id is let go."""
    job = schedule(tasks.record, in_=0, args=["ran"])
    (job_id,) = claimed_in_redis(job)
    payer, paid, release = paying(job, ending)
    delivered: list[Any] = []
    worker = in_thread(lambda: deliver(job_id), delivered)
    until_blocked()  # the claim waits for the cancel's row lock
    release.set()
    payer.join(30)
    worker.join(30)
    [won], [result] = paid, delivered
    runs = Record.objects.filter(label="ran").count()
    if ending == "rolls back":
        assert isinstance(won, Refused) and won.args == (True,)
        assert (result.outcome, runs) == (Outcome.SUCCEEDED, 1)
        assert kinds(job) == ["scheduled", "started", "succeeded"]
    else:
        assert (won, result.outcome, runs) == (True, Outcome.DROPPED, 0)
        assert kinds(job) == ["scheduled", "cancelled"]
    assert held_by_redis() == (0, 0, 0, 0)


@pytest.mark.parametrize("verb", ["cancel", "reschedule"])
def test_a_verb_while_the_claim_is_uncommitted_loses_and_the_job_runs_once(monkeypatch, verb):
    """Redis handed the id out and the worker's claim UPDATE ran but has not committed:
    a cancel or a reschedule (in a payment that then rolls back) waits for it, then finds
    the job running and says so (False), and the job runs once, at its first due time."""
    job = schedule(tasks.record, in_=0, args=["ran"])
    (job_id,) = claimed_in_redis(job)
    claimed, go = threading.Event(), threading.Event()
    real = Execution.started_message

    def started_message(self: Execution, row: Job) -> str:  # inside the claim's transaction
        claimed.set()
        assert go.wait(30)
        return real(self, row)

    def payment() -> bool:
        with transaction.atomic():
            won = job.cancel() if verb == "cancel" else reschedule(job.pk, in_=3600)
            raise Refused(won)

    monkeypatch.setattr(Execution, "started_message", started_message)
    delivered: list[Any] = []
    worker = in_thread(lambda: deliver(job_id), delivered)
    assert claimed.wait(30)
    paid: list[Any] = []
    payer = in_thread(payment, paid)
    until_blocked()
    go.set()
    worker.join(30)
    payer.join(30)
    [refused] = paid
    assert isinstance(refused, Refused) and refused.args == (False,)
    assert delivered[0].outcome == Outcome.SUCCEEDED
    assert Record.objects.filter(label="ran").count() == 1
    assert kinds(job) == ["scheduled", "started", "succeeded"]
    assert held_by_redis() == (0, 0, 0, 0)


def test_a_reschedule_the_claim_waits_for_defers_the_job_to_its_new_time():
    """Redis handed the id out, and a reschedule holds the row while the worker's claim
    waits for it: the claim finds the job not due, hands the id back to Redis for the new
    time, and the job runs once then."""
    job = schedule(tasks.record, in_=0, args=["ran"])
    (job_id,) = claimed_in_redis(job)
    moved, release = threading.Event(), threading.Event()

    def move() -> bool:
        with transaction.atomic():
            won = reschedule(job.pk, in_=2)  # past EARLY_WAIT: not waited for in the thread
            moved.set()
            assert release.wait(30)
        return won

    won: list[Any] = []
    delivered: list[Any] = []  # apart: either thread may end first once the move commits
    mover = in_thread(move, won)
    assert moved.wait(30)
    worker = in_thread(lambda: deliver(job_id), delivered)
    until_blocked()
    release.set()
    mover.join(30)
    worker.join(30)
    assert won == [True] and delivered[0].outcome == Outcome.DEFERRED
    assert not Record.objects.exists()
    job.refresh_from_db()
    (again,) = claimed_in_redis(job)
    assert deliver(again).outcome == Outcome.SUCCEEDED
    assert Record.objects.get(label="ran").created >= job.run_at
    assert held_by_redis() == (0, 0, 0, 0)


@pytest.mark.parametrize("where", ["ready", "claimed in Redis"])
def test_a_retrying_job_cancelled_as_its_retry_is_promoted_never_runs_again(where):
    job = schedule(tasks.retry_later, in_=0, args=[0.01, "second"])
    assert deliver(*claimed_in_redis(job)).outcome == Outcome.RETRYING
    engine = get_engine()
    wait_for(lambda: engine.promote("default").moved)  # the retry is due: in ready
    job_id = engine.claim("default", 1)[0] if where == "claimed in Redis" else None
    assert job.cancel() is True
    if job_id is not None:
        assert deliver(job_id).outcome == Outcome.DROPPED
    assert engine.claim("default", 1) == []
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.CANCELLED, 1)
    assert not Record.objects.exists()
    assert held_by_redis() == (0, 0, 0, 0)


# -- keys, rollbacks and the outbox --------------------------------------------------------


@pytest.mark.parametrize("first", ["rolls back", "commits"])
def test_a_key_scheduled_twice_at_once_while_the_first_transaction_ends(first):
    """Two processes schedule the same key; the second's INSERT waits for the first's
    transaction. Rolled back, the second gets a job of its own; committed, the first's."""
    inserted, release = threading.Event(), threading.Event()

    def order() -> Job:
        with transaction.atomic():
            mine = schedule(tasks.record, in_=60, args=["first"], key="order-1-autocancel")
            inserted.set()
            assert release.wait(30)
            if first == "rolls back":
                raise Refused(mine.pk)
        return mine

    firsts: list[Any] = []
    one = in_thread(order, firsts)
    assert inserted.wait(30)
    seconds: list[Any] = []
    two = in_thread(lambda: schedule(tasks.record, in_=60, args=["second"],
                                  key="order-1-autocancel"), seconds)  # fmt: skip
    until_blocked()  # the second INSERT waits on the key's unique index
    release.set()
    one.join(30)
    two.join(30)
    [a], [b] = firsts, seconds
    assert isinstance(b, Job), b
    rows = list(Job.objects.values_list("pk", "status"))
    assert rows == [(b.pk, Status.SCHEDULED)]
    if first == "rolls back":
        assert isinstance(a, Refused) and a.args[0] != b.pk
    else:
        assert a.pk == b.pk
    reconcile(get_engine())
    assert pending_ids() == {str(b.pk)}


def test_rolled_back_schedules_leave_nothing_in_redis_for_reconcile_to_resurrect():
    with suppress(Refused), transaction.atomic():
        schedule(tasks.record, in_=0, args=["rolled back"])
        raise Refused
    with transaction.atomic():
        kept = schedule(tasks.record, in_=60, args=["kept"], key="k")
        with suppress(Refused), transaction.atomic():  # a savepoint rolled back
            schedule(tasks.record, in_=60, args=["savepoint"], key="other")
            assert kept.cancel() is True
            raise Refused
        again = schedule(tasks.record, in_=60, args=["again"], key="other")  # free again
    with suppress(Refused), transaction.atomic():  # its cancel of the holder undone too
        schedule(tasks.record, in_=60, args=["replacing"], key="k", replace=True)
        raise Refused
    reconcile(get_engine())
    assert pending_ids() == {str(kept.pk), str(again.pk)}
    assert set(Job.objects.values_list("status", flat=True)) == {Status.SCHEDULED}
    assert held_by_redis() == (2, 0, 0, 0)


def test_a_commit_the_database_refuses_sends_nothing_to_redis():
    """A deferred constraint fails at COMMIT, after ``schedule()`` registered its Redis add
    and its signal: neither runs, and no row is left for reconcile."""
    sent: list[Job] = []

    def receiver(sender: object, job: Job, **kwargs: object) -> None:
        sent.append(job)

    signals.job_scheduled.connect(receiver, weak=False, dispatch_uid="audit-rce2")
    try:
        with pytest.raises(IntegrityError), transaction.atomic():
            schedule(tasks.record, in_=0, args=["never"])
            # a foreign key checked at COMMIT (deferred, on PostgreSQL and SQLite alike)
            JobEvent.objects.create(job_id=uuid.uuid4(), kind="scheduled", attempt=0,
                                    actor="test")  # fmt: skip
    finally:
        signals.job_scheduled.disconnect(dispatch_uid="audit-rce2")
    assert not Job.objects.exists()
    assert sent == []
    assert held_by_redis() == (0, 0, 0, 0)


# -- a worker killed at each step of a delivery ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("step", ["redis-claim", "db-claim", "action", "outcome", "ack"])
def test_a_worker_killed_at_each_step_leaves_each_job_run_once(redis_url, tmp_path, step):
    """Two jobs claimed together (the second claimed by the first's outcome transaction);
    the worker is SIGKILLed at ``step`` of the first (tests/testapp/tasks.py, ``_kill_at``).
    Another worker takes both once their leases end: each runs once, none is stuck or dead,
    and Redis holds nothing of them."""
    env = {"DELAYJOBS_LEASE_SECONDS": "1"}
    jobs = schedule_many([build_job(tasks.record, in_=0, args=[f"job{n}"]) for n in range(2)])
    killed = start_worker(redis_url, "--concurrency", "1", log=tmp_path / "killed.log",
                          env={**env, "DELAYJOBS_TEST_KILL_AT": step})  # fmt: skip
    try:
        assert killed.wait(30) == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    finally:
        if killed.poll() is None:
            killed.kill()
    assert Record.objects.count() == (1 if step == "ack" else 0)
    second = start_worker(redis_url, env=env, log=tmp_path / "second.log")
    try:
        wait_for(lambda: Job.objects.filter(status=Status.SUCCEEDED).count() == 2, timeout=30)
        wait_for(lambda: held_by_redis() == (0, 0, 0, 0))
    finally:
        assert stop(second) == 0
    assert sorted(Record.objects.values_list("label", flat=True)) == ["job0", "job1"]
    for job in jobs:
        job.refresh_from_db()
        assert job.attempts == 1, (job.attempts, job.deliveries, kinds(job))


# -- a lease that ends as the action commits -------------------------------------------------


@pytest.mark.parametrize("first", ["second delivery", "outcome"])
def test_a_lease_that_ends_as_the_action_commits_gives_one_effect(monkeypatch, settings, first):
    """The first delivery's lease ended (a pause, past half a lease: a younger running row
    is not taken over) just as its action was about to commit, and another worker took the
    id. Whichever commits first wins; the other writes nothing (overtaken and rolled back,
    or finding the job finished)."""
    if first == "second delivery" and connection.vendor == "sqlite":
        pytest.skip("SQLite: the first delivery's transaction holds the write lock")
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["effect"])
    (job_id,) = claimed_in_redis(job, lease_ms=1)
    at_fence, go = threading.Event(), threading.Event()
    real = sql.update_fenced

    def update_fenced(job: Job, values: dict[str, Any]) -> bool:
        if threading.current_thread().name != "first":
            return real(job, values)
        if first == "second delivery":
            at_fence.set()
            assert go.wait(30)
            return real(job, values)
        won = real(job, values)  # the row is locked until the commit
        at_fence.set()
        assert go.wait(30)
        return won

    monkeypatch.setattr(sql, "update_fenced", update_fenced)
    results: list[Any] = []
    one = in_thread(lambda: deliver(job_id, "first"), results, "first")
    assert at_fence.wait(30)
    time.sleep(sql.takeover_delay().total_seconds())  # the pause
    assert wait_for(lambda: engine.recover_expired("default")) == [job_id]
    assert engine.claim("default", 1) == [job_id]
    two = in_thread(lambda: deliver(job_id, "second"), results)
    if first == "second delivery":
        two.join(30)
    else:
        until_blocked()  # the second claim waits for the outcome's row lock
    go.set()
    one.join(30)
    two.join(30)
    outcomes = sorted(result.outcome for result in results)
    if first == "second delivery":
        assert outcomes == sorted([Outcome.SUCCEEDED, Outcome.OVERTAKEN])
    else:
        assert outcomes == sorted([Outcome.SUCCEEDED, Outcome.DROPPED])
    assert Record.objects.filter(label="effect").count() == 1
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    wait_for(lambda: held_by_redis() == (0, 0, 0, 0))


# -- Redis loses everything mid-flight ----------------------------------------------------


@pytest.mark.slow
def test_jobs_in_every_place_when_redis_loses_its_data_each_run_once(redis_url, tmp_path,
                                                                     settings):  # fmt: skip
    """A job in ready, one claimed from Redis by a worker that died before its claim in
    the database, one whose worker died after it, and one pending; then FLUSHALL and a
    reconcile pass. Each due job runs once; the pending one waits for its time."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1}
    engine = get_engine()
    later = schedule(tasks.record, in_=3600, args=["later"])
    unacked, running = (schedule(tasks.record, in_=0, args=[label])
                        for label in ("unacked", "running"))  # fmt: skip
    claimed_in_redis(unacked, running)
    assert isinstance(Execution("default", str(running.pk), "dead").claim(), Job)
    schedule(tasks.record, in_=0, args=["ready"])
    wait_for(lambda: engine.promote("default") and held_by_redis()[1] == 1)
    assert held_by_redis() == (1, 1, 2, 0)
    engine.client.flushall()
    reconcile(engine)  # (rows this young are re-added, not counted)
    assert held_by_redis() == (1, 2, 1, 0)  # the running one in flight again, with a lease
    worker = start_worker(redis_url, env={"DELAYJOBS_LEASE_SECONDS": "1"},
                          log=tmp_path / "w.log")  # fmt: skip
    try:
        wait_for(lambda: Job.objects.filter(status=Status.SUCCEEDED).count() == 3, timeout=30)
        wait_for(lambda: held_by_redis() == (1, 0, 0, 0))
    finally:
        assert stop(worker) == 0
    assert sorted(Record.objects.values_list("label", flat=True)) == ["ready", "running",
                                                                      "unacked"]  # fmt: skip
    assert Job.objects.get(pk=running.pk).deliveries == 2
    assert pending_ids() == {str(later.pk)}
    assert Job.objects.get(pk=later.pk).status == Status.SCHEDULED


@pytest.mark.parametrize("outcome", [Outcome.RETRYING, Outcome.DEFERRED])
def test_a_job_cancelled_before_its_id_is_handed_back_leaves_no_id_in_redis(outcome):
    """The attempt failed and its retry was committed (or the claim found the job
    rescheduled for later); a cancel won before the worker handed the id back to Redis,
    and the cancel's removal leaves an id in flight alone. The nack then put the id in
    pending until the retry's time (hours, with backoff): the queue page and the metrics
    counted a cancelled job as pending until then, and a worker was handed it for nothing."""
    job = schedule(tasks.retry_later, in_=0, args=[3600, "never"])
    (job_id,) = claimed_in_redis(job)
    if outcome == Outcome.DEFERRED:
        assert job.reschedule(in_=3600) is True
    result = Execution("default", job_id, "w1").run()
    assert result.outcome == outcome
    assert job.cancel() is True
    settle(get_engine(), "default", job_id, result)
    assert held_by_redis() == (0, 0, 0, 0)


@pytest.mark.parametrize("ending", ["rolls back", "commits"])
def test_a_cancel_pending_as_the_job_before_it_succeeds_is_not_claimed_ahead(ending):
    """The second job of a batch is claimed by the first one's outcome transaction, unless
    a payment's cancel holds its row (skipped, not waited for: PostgreSQL); it is then
    claimed on its own once the payment ends, and runs only if the cancel rolled back."""
    first, second = schedule_many(
        [build_job(tasks.record, in_=0, args=[label]) for label in ("first", "second")]
    )
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    engine = process.engine
    wait_for(lambda: engine.promote("default") and held_by_redis()[1] == 2)

    def work() -> None:  # claimed in the thread that runs them, as a worker thread does
        claimed = process.claim(["default"])
        assert claimed is not None and claimed[1] == [str(first.pk), str(second.pk)]
        process.run_batch(*claimed, Backoff(process.stopping, "test"))

    payer, _, release = paying(second, ending)
    done: list[Any] = []
    worker = in_thread(work, done)
    if connection.vendor == "postgresql":
        wait_for(lambda: Job.objects.get(pk=first.pk).status == Status.SUCCEEDED)
    until_blocked()  # the second one's own claim waits for the payment
    release.set()
    payer.join(30)
    worker.join(30)
    assert done == [None]
    labels = sorted(Record.objects.values_list("label", flat=True))
    assert labels == (["first", "second"] if ending == "rolls back" else ["first"])
    wait_for(lambda: held_by_redis() == (0, 0, 0, 0))


@pytest.mark.slow
def test_a_claim_redis_ran_after_its_caller_gave_up_is_run_once_after_the_lease(
    own_jobs_redis, tmp_path
):
    """Redis froze (SIGSTOP) with a worker's claim on its way: the call timed out, and
    Redis ran it once woken, so the id went in flight for a worker that never heard of it.
    It is stranded for its lease (as after a worker killed at that step), then runs once."""
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["once"])
    wait_for(lambda: engine.promote("default") and held_by_redis()[1] == 1)
    assert engine.claim("other", 1) == []  # the script loaded: EVALSHA runs on waking
    assert own_jobs_redis.pid is not None
    os.kill(own_jobs_redis.pid, signal.SIGSTOP)
    try:
        with pytest.raises(EngineUnavailable):
            engine.claim("default", 1, 1000)
    finally:
        os.kill(own_jobs_redis.pid, signal.SIGCONT)
    wait_for(lambda: held_by_redis() == (0, 0, 1, 0))  # ran on waking: in flight, unheld
    worker = start_worker(own_jobs_redis.url, env={"DELAYJOBS_LEASE_SECONDS": "1"},
                          log=tmp_path / "w.log")  # fmt: skip
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=30)
        wait_for(lambda: held_by_redis() == (0, 0, 0, 0))
    finally:
        assert stop(worker) == 0
    assert Record.objects.filter(label="once").count() == 1
