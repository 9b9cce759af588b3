"""Audit of the hand-back's undo of unstarted claims (second round).

1. The claim was undone whenever the action had not been called, but ``job_started``'s
   receivers, ``resolve()`` and the arguments run before that: a receiver that hangs
   stopped every worker past MAX_RUN_SECONDS, each stop undid the claim, and the job was
   never counted as delivered, never ``dead``: a crash loop across every worker. Only a
   claim the worker had not kept yet (right after it commits) may be undone.
2. The undo was fenced by attempt, delivery and worker, which a later claim of the same
   id by the same process repeats once the undo lands: an undo late by a slow database
   reverted a sibling thread's live claim (its action then ran twice). It is fenced by
   the claim's start too; a dying thread stops the process before it hands its ids back,
   and the undo starts nothing past its deadline.
4. That deadline was per shard and part (2 s each: a stop with the database slow took
   2 s x shards), and the helper could go on using its connection after the worker had
   returned. It is one deadline for the whole hand-back, each statement waits only for
   the time left, and the helper has ended when the worker returns.
6. A claim its thread undid was counted and logged as ``overtaken`` (a lost lease); it is
   ``unclaimed`` now.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from django_delayjobs import schedule, schedule_many, signals, sql
from django_delayjobs.conf import delayjobs_settings
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import unclaim
from django_delayjobs.models import Job, Status
from django_delayjobs.preflight import check_owner
from django_delayjobs.services import build_job
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.helpers import database_down, in_thread, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)
Q = "default"


@pytest.fixture
def hanging_start() -> Iterator[threading.Event]:
    """A ``job_started`` receiver that holds its worker thread until the test ends."""
    release = threading.Event()

    def hang(sender: object, **kwargs: object) -> None:
        release.wait(60)

    signals.job_started.connect(hang, weak=False)
    try:
        yield release
    finally:
        release.set()
        signals.job_started.disconnect(hang)


def test_a_job_whose_started_receiver_hangs_ends_dead_after_max_deliveries(settings, hanging_start):
    """Each worker that claims it stops past MAX_RUN_SECONDS and hands its id back: the
    claim is kept (its receivers ran), so each stop uses a delivery, and after
    ``MAX_DELIVERIES`` of them the job is ``dead``, naming the cause, instead of
    stopping every worker that takes it, for ever."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 1, "LEASE_SECONDS": 1,
                          "SHUTDOWN_GRACE_SECONDS": 0, "MAX_DELIVERIES": 2}  # fmt: skip
    job = schedule(tasks.record, in_=0, args=["ran"])
    check_owner(get_engine())  # as run_delayworker does before its threads start
    processes: list[WorkerProcess] = []
    stops = 0

    def dead() -> bool:
        nonlocal stops
        process = WorkerProcess(get_engine(), Options(queues=[Q], burst=True))
        processes.append(process)
        try:
            process.run()
        except WorkerDied:
            stops += 1
        return Job.objects.get(pk=job.pk).status == Status.DEAD

    try:
        wait_for(dead, timeout=30, every=0.2)
    finally:
        hanging_start.set()
        for process in processes:
            for thread in process.threads:
                thread.join(10)
    job.refresh_from_db()
    assert (job.attempts, job.deliveries, stops) == (1, 2, 2)
    assert "stopped when the action ran past MAX_RUN_SECONDS" in job.last_error
    kinds = list(job.events.order_by("id").values_list("kind", flat=True))
    assert kinds == ["scheduled", "started", "started", "dead"]


def claim(job: Job) -> Job:
    with transaction.atomic():
        row = sql.claim(str(job.pk), "w1", timezone.now(), delayjobs_settings.MAX_DELIVERIES)
    assert row is not None
    return row


def test_a_late_undo_does_not_revert_a_later_claim_of_the_same_attempt():
    """Undone, the row is claimed again by the same worker: same attempt, delivery and
    worker as the first claim. An undo of the first claim that lands only now (a slow
    database) matches nothing: the second claim's start is its own."""
    job = schedule(tasks.record, in_=0, args=["x"])
    first = claim(job)
    assert unclaim(first, "w1")
    second = claim(job)
    assert (second.attempts, second.deliveries) == (first.attempts, first.deliveries) == (1, 1)
    assert not unclaim(first, "w1")  # late
    job.refresh_from_db()
    assert (job.status, job.attempts, job.started_at) == (Status.RUNNING, 1, second.started_at)


def test_a_dying_worker_thread_stops_the_process_before_it_hands_its_ids_back(monkeypatch):
    """No other thread of the process may claim an id the dying thread hands back."""
    import django_delayjobs.worker as worker_module

    def bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected bug")

    stopping_at_hand_back: list[bool] = []
    hand_back = WorkerProcess.hand_back

    def spy(self: WorkerProcess, queue: str, ids: list[str], owner: int | None = None) -> bool:
        if ids:
            stopping_at_hand_back.append(self.stopping.is_set())
        return hand_back(self, queue, ids, owner)

    monkeypatch.setattr(worker_module, "log_outcome", bug)
    monkeypatch.setattr(WorkerProcess, "hand_back", spy)
    schedule_many([build_job(tasks.record, in_=0, args=[label]) for label in ("a", "b")])
    with pytest.raises(WorkerDied, match="injected bug"):
        WorkerProcess(get_engine(), Options(queues=[Q], promoter=True)).run()
    assert stopping_at_hand_back == [True]


@pytest.fixture
def held_after_success(settings, monkeypatch) -> Iterator[tuple[WorkerProcess, threading.Thread]]:
    """A running worker whose three threads each hold a job that the outcome of the one
    before it claimed ahead (a ``job_succeeded`` receiver holds the thread); its hand-back
    moves each id in a part of its own (``MAX_BATCH`` = 1), as for three shards."""
    import django_delayjobs.worker as worker_module

    monkeypatch.setattr(worker_module, "MAX_BATCH", 1)
    settings.DELAYJOBS = {**settings.DELAYJOBS, "SHUTDOWN_GRACE_SECONDS": 0.2}
    entered: list[str] = []
    release = threading.Event()

    def hold(sender: object, job: Job, **kwargs: object) -> None:
        entered.append(str(job.pk))
        release.wait(30)

    signals.job_succeeded.connect(hold, weak=False)
    worker = WorkerProcess(get_engine(), Options(queues=[Q], concurrency=3, promoter=True))
    thread = in_thread(worker.run, [])
    try:
        for n in range(3):  # a pair at a time: each is one batch, of an idle thread
            pair = [build_job(tasks.record, in_=0, args=[f"{n}"]) for _ in range(2)]
            schedule_many(pair)
            wait_for(lambda n=n: len(entered) == n + 1, timeout=30)
        assert len(ahead()) == 3
        yield worker, thread
    finally:
        worker.stop()
        release.set()
        thread.join(30)
        signals.job_succeeded.disconnect(hold)
        for left in worker.workers:
            left.join(30)


def ahead() -> list[Job]:
    """The jobs claimed ahead, left running."""
    return list(Job.objects.filter(status=Status.RUNNING))


def stop_past_the_grace(worker: WorkerProcess, thread: threading.Thread, during) -> tuple:
    """Stop ``worker`` (run by ``thread``) inside ``during`` (a context); return how long
    the stop took and the undo helpers left when it returned."""
    with during:
        started = time.monotonic()
        worker.stop()
        thread.join(30)
        took = time.monotonic() - started
        left = [t for t in threading.enumerate() if t.name == "delayjobs-unclaim"]
    assert not thread.is_alive() and worker.abandoned
    return took, left


class held_database:
    """The jobs' table locked by this test's own transaction (a slow database)."""

    def __enter__(self) -> None:
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        list(Job.objects.select_for_update())  # PostgreSQL: the rows
        Record.objects.create(label="lock")  # SQLite: the write lock

    def __exit__(self, *exc: object) -> None:
        self.atomic.__exit__(None, None, None)


def test_the_undo_has_one_deadline_for_the_whole_hand_back(monkeypatch, held_after_success):
    """The database held by another transaction as the worker stops past its grace with a
    claimed-ahead job in each of three parts: the undo gives up once, at its deadline,
    not at one deadline per part (or shard); its helper has ended when the worker returns, and each
    id is handed back all the same, its row left running to its takeover."""
    import django_delayjobs.worker as worker_module

    monkeypatch.setattr(worker_module, "UNCLAIM_SECONDS", 3.0)
    took, left = stop_past_the_grace(*held_after_success, held_database())
    assert took < 6.0, took  # one deadline (3 s), plus the grace; not 3 x 3 s
    assert left == []
    assert len(ahead()) == 3  # not undone: left to the takeover
    assert Record.objects.filter(label="lock").count() == 1
    stats = get_engine().stats(Q)  # those whose receivers hold: left to their lease
    assert (stats.in_flight, stats.pending + stats.ready) == (3, 3), stats


def test_the_database_down_during_the_undo(held_after_success, tmp_path: Path):
    """The database cannot be reached as the worker hands back: the ids go back, the rows
    are left running to their takeover, and the worker returns."""
    took, left = stop_past_the_grace(*held_after_success, database_down(tmp_path))
    assert took < 3.0, took
    assert left == []
    assert len(ahead()) == 3
    stats = get_engine().stats(Q)  # those whose receivers hold: left to their lease
    assert (stats.in_flight, stats.pending + stats.ready) == (3, 3), stats


def test_a_claim_that_lands_after_the_hand_back_is_undone_by_its_thread(monkeypatch, settings):
    """The worker stops past its grace while its thread's claim waits on the database: the
    id is handed back, and the claim, landing after, is undone by the thread itself, never
    kept: the job waits as it did, claimable at once, and its action never runs here."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "SHUTDOWN_GRACE_SECONDS": 0.2}
    entered, release = threading.Event(), threading.Event()
    real_claim = sql.claim

    def slow_claim(*args: object, **kwargs: object) -> Job | None:
        row = real_claim(*args, **kwargs)
        entered.set()
        release.wait(30)  # its COMMIT comes after the hand-back
        return row

    monkeypatch.setattr(sql, "claim", slow_claim)
    job = schedule(tasks.record, in_=0, args=["never"])
    worker = WorkerProcess(get_engine(), Options(queues=[Q], promoter=True))
    out: list[object] = []
    thread = in_thread(worker.run, out)
    try:
        assert entered.wait(30)
        worker.stop()
        thread.join(30)
        assert not thread.is_alive() and worker.abandoned
    finally:
        release.set()
        for left in worker.workers:
            left.join(30)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries, job.worker) == (Status.SCHEDULED, 0, 0, "")
    kinds = list(job.events.order_by("id").values_list("kind", flat=True))
    assert kinds == ["scheduled", "started", "handed_back"]
    assert not Record.objects.exists()
    assert dict(worker.stats.outcomes) == {"unclaimed": 1}  # no lease was lost: not overtaken
    stats = get_engine().stats(Q)
    assert (stats.in_flight, stats.pending + stats.ready) == (0, 1), stats
