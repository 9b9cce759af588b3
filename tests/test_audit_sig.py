"""Audit of scheduling, cancel and reschedule against the worker (PostgreSQL races with
real threads and connections; SQLite's IMMEDIATE transactions serialize them)."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.dispatch import Signal

from django_delayjobs import cancel_for, cancel_on, receivers, schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import AlreadyRunning
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, settle
from django_delayjobs.registry import DelayableMethod
from tests.helpers import wait_for
from tests.testapp.models import Thing, Ticket

pytestmark = pytest.mark.django_db(transaction=True)

JOBS_TABLE = re.compile(r'\bdjango_delayjobs_job"?\s')


def postgresql_only() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's IMMEDIATE transactions serialize the worker and the caller")


@pytest.fixture
def gated(monkeypatch) -> threading.Event:
    """``Thing.gated``: a @delayable method that waits for the returned event, then fails
    (its job is ``retrying`` afterwards, when it has attempts left)."""
    gate = threading.Event()

    def gated(self: Thing) -> None:
        assert gate.wait(30), "the test never opened the gate"
        raise RuntimeError("failing on purpose")

    method = DelayableMethod(gated)
    method.__set_name__(Thing, "gated")
    monkeypatch.setattr(Thing, "gated", method, raising=False)
    return gate


def start_worker(job: Job) -> tuple[threading.Thread, list[Any]]:
    """Run one delivery of ``job`` the way the worker does, in a thread of its own."""
    engine = get_engine()
    (job_id,) = wait_for(lambda: engine.promote(job.queue) and engine.claim(job.queue, 1))
    results: list[Any] = []

    def work() -> None:
        try:
            result = Execution(job.queue, job_id, "racer").run()
            settle(engine, job.queue, job_id, result)
            results.append(result.outcome)
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.RUNNING)
    return thread, results


def before_nth_query_on_jobs(n: int, fn: Callable[[], None]) -> Callable[..., Any]:
    """An execute wrapper that calls ``fn`` once, before the ``n``-th statement on the
    jobs table of this connection."""
    seen = [0]

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any):
        if JOBS_TABLE.search(sql):
            seen[0] += 1
            if seen[0] == n:
                fn()
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.parametrize("nth", [1, 2, 3, 4])
def test_cancel_for_fail_if_running_never_leaves_a_job_that_started_active(gated, nth):
    """cancel_for(fail_if_running=True) listed the waiting jobs, cancelled them, then
    looked for a running one. A job running when the list was read and failing its
    attempt (retrying, attempts left) before the look was neither cancelled nor reported:
    the call returned 0, the payment committed, and the auto-cancel ran again at its retry.
    Whenever the attempt fails during the call, the job must end cancelled, or the call
    must raise AlreadyRunning."""
    postgresql_only()
    thing = Thing.objects.create(name="t")
    job = schedule(thing.gated, in_=0, max_attempts=3)
    worker, outcomes = start_worker(job)

    def attempt_fails() -> None:
        gated.set()
        worker.join(30)

    cancelled: int | None = None
    try:
        with connection.execute_wrapper(before_nth_query_on_jobs(nth, attempt_fails)):
            cancelled = cancel_for(thing, fail_if_running=True)
    except AlreadyRunning:
        pass
    finally:
        gated.set()
        worker.join(30)
    assert outcomes == [Outcome.RETRYING]
    status = Job.objects.get(pk=job.pk).status
    if cancelled is None:  # refused: the job is as the worker left it
        assert status == Status.RETRYING
    else:
        assert (cancelled, status) == (1, Status.CANCELLED)


def blocked_by_me() -> bool:
    """Whether a session of the test database waits for a lock this connection holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one snapshot per transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
        )
        return bool(cursor.fetchone()[0])


def test_a_cancel_inside_a_payment_never_deadlocks_with_the_worker_claiming_ahead():
    """DESIGN rule 4: cancel takes no lock a worker holds while running an action, so a
    payment that cancels inside its transaction cannot deadlock with a worker. The worker
    claims the next job of its batch inside the outcome transaction of the one before it,
    while that one's action still holds its row locks: it waited for the row lock of a
    job a payment had just cancelled (uncommitted), and when the payment then locked a row
    the action held (here the other order's, a stock row in a shop), PostgreSQL found a
    deadlock and aborted one of them: the payment failed, or the action was rolled back
    and run again."""
    postgresql_only()
    first, second = Thing.objects.create(name="first"), Thing.objects.create(name="second")
    job = schedule(first.expire, in_=0)
    following = schedule(second.touch, in_=0)
    engine = get_engine()
    (job_id,) = wait_for(lambda: engine.promote(job.queue) and engine.claim(job.queue, 1))
    results: list[Any] = []

    def work() -> None:
        try:
            execution = Execution(job.queue, job_id, "racer", then=lambda: str(following.pk))
            results.append(execution.run())
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    with transaction.atomic():  # the payment of the second order
        assert following.cancel()
        worker.start()
        # the action holds the first order's row lock until its outcome commits
        wait_for(lambda: blocked_by_me() or not worker.is_alive())
        Thing.objects.select_for_update().get(pk=first.pk)
    worker.join(30)
    (result,) = results
    assert result.outcome == Outcome.SUCCEEDED
    assert Job.objects.get(pk=job.pk).attempts == 1
    assert Thing.objects.get(pk=first.pk).state == "expired:late"
    assert Job.objects.get(pk=following.pk).status == Status.CANCELLED


def test_the_worker_still_claims_ahead_a_following_job_no_one_holds():
    """The other side of the test above: the following job's row, locked by no one, is
    claimed in the outcome transaction of the job before it, as before."""
    first, second = Thing.objects.create(name="first"), Thing.objects.create(name="second")
    job = schedule(first.expire, in_=0)
    following = schedule(second.touch, in_=0)
    engine = get_engine()
    (job_id,) = wait_for(lambda: engine.promote(job.queue) and engine.claim(job.queue, 1))
    execution = Execution(job.queue, job_id, "racer", then=lambda: str(following.pk))
    assert execution.run().outcome == Outcome.SUCCEEDED
    assert execution.next_job is not None and execution.next_job.pk == following.pk
    assert Job.objects.get(pk=following.pk).status == Status.RUNNING


@pytest.mark.parametrize("nth", [1, 2, 3, 4, 5])
def test_replace_never_returns_a_waiting_holder_as_if_it_could_not_be_replaced(gated, nth):
    """schedule(key=..., replace=True) whose cancel of the holder lost (it was running)
    read the holder again and returned it as running, "it cannot be replaced". A holder
    whose attempt failed in between (retrying) was returned as well: nothing was
    replaced, and the old job ran again at its retry with its old arguments."""
    postgresql_only()
    thing = Thing.objects.create(name="t")
    holder = schedule(thing.gated, in_=0, max_attempts=3, key="order-1")
    worker, outcomes = start_worker(holder)

    def attempt_fails() -> None:
        gated.set()
        worker.join(30)

    try:
        with connection.execute_wrapper(before_nth_query_on_jobs(nth, attempt_fails)):
            got = schedule(thing.touch, in_=60, key="order-1", replace=True)
    finally:
        gated.set()
        worker.join(30)
    assert outcomes == [Outcome.RETRYING]
    if got.pk == holder.pk:  # not replaced: only if it was running when read
        assert got.status == Status.RUNNING
    else:
        assert Job.objects.get(pk=holder.pk).status == Status.CANCELLED
        assert Job.objects.get(pk=got.pk).status == Status.SCHEDULED


@pytest.mark.parametrize(
    ("options", "message"),
    [({"replace": True}, "needs a key"), ({"replace": "yes", "key": "k"}, "must be a bool")],
)
def test_replace_without_a_key_or_not_a_bool_is_refused_and_writes_nothing(
    redis_client, options, message
):
    """replace=True without key= was ignored: the caller meant to replace the job it
    scheduled before, and each call added one more (replace="no", truthy, replaced)."""
    thing = Thing.objects.create(name="t")
    schedule(thing.touch, in_=60, key="k")
    with pytest.raises(TypeError, match=message):
        schedule(thing.touch, in_=60, **options)
    assert Job.objects.count() == 1
    assert get_engine().stats("default").pending == 1


@pytest.mark.parametrize(
    "given", [str.upper, lambda text: text.replace("-", ""), lambda text: f"{{{text}}}"]
)
def test_a_job_on_an_object_created_with_its_uuid_as_text_is_found_by_cancel_for(given):
    """A UUID primary key given as text (an id from an API client, in capitals or without
    dashes) stays that text on the instance Django saved. schedule() stored it as it was,
    cancel_for() on the object read back (a UUID) looked for the canonical text and found
    no job: the payment cancelled nothing, and the auto-cancel ran."""
    pk = uuid.uuid4()
    ticket = Ticket.objects.create(id=given(str(pk)))
    job = schedule(ticket.touch, in_=60)
    assert cancel_for(Ticket.objects.get(pk=pk)) == 1
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED
    # and the other way round: scheduled on the row read back, cancelled through the text
    again = schedule(Ticket.objects.get(pk=pk).touch, in_=60)
    assert cancel_for(ticket) == 1
    assert Job.objects.get(pk=again.pk).status == Status.CANCELLED


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: cancel_on("order_paid", Thing.expire), "must be a django.dispatch.Signal"),
        (lambda: cancel_on(Signal(), Thing.expire, instance_kwarg=None), "instance_kwarg"),
    ],
)
def test_cancel_on_refuses_what_is_not_a_signal_or_a_keyword_when_connecting(call, message):
    """cancel_on("order_paid", ...) failed with an AttributeError from str.connect (and
    kept the half-made receiver); an instance_kwarg that is not a str connected a receiver
    that could never find the instance, failing each payment with a TypeError."""
    before = dict(receivers._receivers)
    with pytest.raises(TypeError, match=message):
        call()
    assert receivers._receivers == before
