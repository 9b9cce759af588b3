"""Audit of scheduling, cancel and reschedule against the worker (PostgreSQL races with
real threads and connections; SQLite's IMMEDIATE transactions serialize them)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_delayjobs import cancel_for, schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.exceptions import AlreadyRunning
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, settle
from django_delayjobs.registry import DelayableMethod
from tests.helpers import wait_for
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)

JOBS_TABLE = re.compile(r'\bdjango_delayjobs_job"?\s')


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


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
