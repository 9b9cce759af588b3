"""Races the database must judge: cancel vs. claim, concurrent keyed schedules.

Run on SQLite by default and on PostgreSQL when DATABASE_URL is set (CI does both);
PostgreSQL is where the row locks really interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from django_delayjobs import schedule
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, settle
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    pass


def in_threads(*fns: Callable[[], Any]) -> list[Any]:
    """Run each function in its own thread, released together; return their results."""
    barrier = threading.Barrier(len(fns))
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def test_cancel_returns_true_exactly_when_the_job_never_runs():
    engine = get_engine()
    outcomes = {True: 0, False: 0}
    for n in range(40):
        job = schedule(tasks.record, in_=0, args=[f"run{n}"])
        # Due times round up to the next ms, so the id may sit in pending for 1 ms.
        (job_id,) = wait_for(lambda: engine.promote("default") and engine.claim("default", 1))

        def work(job_id: str = job_id) -> str:
            result = Execution("default", job_id, "racer").run()
            settle(engine, "default", job_id, result)
            return result.outcome

        def cancel(job: Job = job) -> bool:
            return Job.objects.get(pk=job.pk).cancel()

        ran, cancelled = in_threads(work, cancel)
        job.refresh_from_db()
        runs = Record.objects.filter(label=f"run{n}").count()
        if cancelled:
            assert (job.status, runs, ran) == (Status.CANCELLED, 0, Outcome.DROPPED)
        else:
            assert (job.status, runs, ran) == (Status.SUCCEEDED, 1, Outcome.SUCCEEDED)
        outcomes[cancelled] += 1
    assert sum(outcomes.values()) == 40
    assert engine.stats("default").in_flight == 0


def test_concurrent_schedules_with_one_key_make_one_row():
    def attempt() -> str:
        return str(schedule(tasks.record, in_=60, args=["x"], key="only-one").pk)

    ids = in_threads(*[attempt] * 8)
    assert len(set(ids)) == 1
    assert Job.objects.filter(key="only-one").count() == 1
    assert get_engine().stats("default").pending == 1


def test_reschedule_after_the_job_ran_returns_false_and_does_not_run_it_twice():
    job = schedule(tasks.record, in_=0, args=["once"])
    call_command("run_delayworker", "--burst", "-v", "0")
    assert job.reschedule(in_=0) is False
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Record.objects.filter(label="once").count() == 1
    assert Job.objects.get(pk=job.pk).attempts == 1
