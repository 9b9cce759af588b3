"""Audit of hand-backs: a job handed back by a worker that never started it.

1. A worker stopped past its grace handed back the ids it held that had not started, but
   one whose row the previous job's outcome had claimed (``claim_ahead``) stayed claimed:
   its attempt (and delivery) counted, its row running for half a lease under a process
   that was gone. Each such stop cost the job a delivery it never ran (``MAX_DELIVERIES``
   of them: dead). The hand-back now undoes that claim, and the thread that held it no
   longer starts it.
2. A worker thread that died from a bug left the ids it held to their lease
   (``LEASE_SECONDS``): the one it was settling, and the claimed-ahead one (its row claimed
   as in 1). They are handed back now, the claim undone where the action never started.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from django_delayjobs import schedule_many, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from django_delayjobs.task_history import History
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.helpers import in_thread
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"


def two_jobs() -> tuple[Job, Job]:
    """Two jobs due now, added in one call: one worker thread takes both in one batch."""
    first, second = (build_job(tasks.record, in_=0, args=[label]) for label in ("a", "b"))
    schedule_many([first, second])
    return first, second


def row(job: Job) -> tuple[str, int, int, str]:
    job.refresh_from_db()
    return job.status, job.attempts, job.deliveries, job.worker


@pytest.fixture
def stuck_after_success() -> Iterator[tuple[threading.Event, threading.Event, list[str]]]:
    """A ``job_succeeded`` receiver that holds its worker thread until released: by then
    the job's outcome transaction has claimed the batch's next job."""
    entered, release, seen = threading.Event(), threading.Event(), []

    def hold(sender: object, job: Job, **kwargs: object) -> None:
        seen.append(str(job.pk))
        entered.set()
        release.wait(30)

    signals.job_succeeded.connect(hold, weak=False)
    try:
        yield entered, release, seen
    finally:
        release.set()
        signals.job_succeeded.disconnect(hold)


def test_a_claimed_job_handed_back_at_exit_is_unclaimed_and_never_started(
    settings, stuck_after_success
):
    """Stopped past its grace while a ``job_succeeded`` receiver holds the thread, the
    worker hands back the next job of the batch, which the outcome claimed: its row goes
    back to waiting (no attempt, no delivery used, a ``handed_back`` event answering its
    ``started`` one), and the thread, released after, does not start it."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "SHUTDOWN_GRACE_SECONDS": 0.2}
    entered, release, seen = stuck_after_success
    jobs = two_jobs()
    engine = get_engine()
    worker = WorkerProcess(engine, Options(queues=[Q], promoter=True))
    out: list[object] = []
    thread = in_thread(worker.run, out)
    try:
        assert entered.wait(30)
        ran, handed = jobs if seen[0] == str(jobs[0].pk) else jobs[::-1]
        assert row(handed)[:2] == (Status.RUNNING, 1)  # claimed by the outcome of ``ran``
        worker.stop()
        thread.join(30)
        assert not thread.is_alive() and worker.abandoned
    finally:
        release.set()
        for left in worker.workers:
            left.join(30)
    assert row(handed) == (Status.SCHEDULED, 0, 0, "")
    kinds = list(handed.events.order_by("id").values_list("kind", "attempt"))
    assert kinds == [("scheduled", 0), ("started", 1), ("handed_back", 1)]
    assert History.of(handed).started == []  # a task's result: not started
    assert list(Record.objects.values_list("label", flat=True)) == ["a" if ran is jobs[0] else "b"]
    stats = engine.stats(Q)
    assert (stats.in_flight, stats.pending + stats.ready) == (0, 1), stats


def test_handed_back_at_every_stop_the_jobs_still_run_as_their_first_attempt(
    settings, stuck_after_success
):
    """The rolling deploy: a worker stopped that way again and again (more times than
    ``MAX_DELIVERIES``), a new job each time beside the one handed back. No job is dead,
    none waits half a lease: the last worker runs them all, each as its first attempt."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "SHUTDOWN_GRACE_SECONDS": 0.2,
                          "MAX_DELIVERIES": 2}  # fmt: skip
    entered, release, _ = stuck_after_success
    engine = get_engine()
    jobs = list(two_jobs())
    for stop in range(3):
        if stop:
            added = build_job(tasks.record, in_=0, args=[f"c{stop}"])
            schedule_many([added])
            jobs.append(added)
        entered.clear()
        release.clear()
        worker = WorkerProcess(engine, Options(queues=[Q], promoter=True))
        thread = in_thread(worker.run, [])
        try:
            assert entered.wait(30)
            worker.stop()
            thread.join(30)
        finally:
            release.set()
            for left in worker.workers:
                left.join(30)
        assert not Job.objects.filter(status=Status.RUNNING).exists()
    WorkerProcess(engine, Options(queues=[Q], burst=True)).run()
    assert [row(job)[:3] for job in jobs] == [(Status.SUCCEEDED, 1, 1)] * len(jobs)


def test_a_worker_thread_killed_by_a_bug_hands_its_ids_back_at_once(monkeypatch):
    """A bug kills the worker thread right after the first job's outcome (which claimed the
    second): the process dies, and both ids come back now, not with their lease; the
    second's claim is undone, and a new worker runs it at once."""
    import django_delayjobs.worker as worker_module

    def bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected bug")

    monkeypatch.setattr(worker_module, "log_outcome", bug)
    first, second = two_jobs()
    engine = get_engine()
    worker = WorkerProcess(engine, Options(queues=[Q], promoter=True))
    with pytest.raises(WorkerDied, match="injected bug"):
        worker.run()
    monkeypatch.undo()
    statuses = {row(first)[0], row(second)[0]}
    assert statuses == {Status.SUCCEEDED, Status.SCHEDULED}, statuses
    stats = engine.stats(Q)
    assert stats.in_flight == 0, stats  # none waits for its lease
    WorkerProcess(engine, Options(queues=[Q], burst=True)).run()
    assert (row(first)[:2], row(second)[:2]) == ((Status.SUCCEEDED, 1),) * 2
    assert sorted(Record.objects.values_list("label", flat=True)) == ["a", "b"]
