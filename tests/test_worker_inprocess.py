"""The worker's execution path, driven in this process with --burst semantics."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sqlite3
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TypeVar

import pytest
import redis
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.utils import timezone

from django_delayjobs import schedule, schedule_many, signals, sql, walcheckpoint
from django_delayjobs.connection import SOCKET_TIMEOUT, get_engine
from django_delayjobs.engine import Engine, EngineUnavailable, close_client
from django_delayjobs.models import Job, Status
from django_delayjobs.preflight import check_owner
from django_delayjobs.promoter import Promoter
from django_delayjobs.reconcile import reconcile
from django_delayjobs.retention import AutoPrune
from django_delayjobs.services import build_job
from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Record, Sku, SpecialThing, Thing

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")


def burst(*args: str) -> None:
    call_command("run_delayworker", "--burst", "-v", "0", *args)


def test_due_job_runs_once_and_records_history():
    thing = Thing.objects.create()
    job = schedule(thing.expire, in_=0, kwargs={"reason": "unpaid"})
    burst()
    job.refresh_from_db()
    thing.refresh_from_db()
    assert thing.state == "expired:unpaid"
    assert job.status == Status.SUCCEEDED and job.attempts == 1
    assert job.result == "expired"
    assert list(job.events.values_list("kind", flat=True)) == ["scheduled", "started", "succeeded"]
    assert get_engine().stats("default").in_flight == 0
    burst()  # nothing left: runs nothing twice
    assert Job.objects.get(pk=job.pk).attempts == 1


def test_future_job_is_not_run_by_burst():
    job = schedule(tasks.record, in_=60, args=["later"])
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    assert not Record.objects.exists()


def test_cancelled_after_promotion_is_dropped():
    job = schedule(tasks.record, in_=0, args=["x"])
    Job.objects.filter(pk=job.pk).update(status=Status.CANCELLED)  # as if cancel lost Redis
    burst()
    assert not Record.objects.exists()
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)


def test_failing_action_retries_with_backoff_then_dies(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 0.01}
    job = schedule(tasks.fail, in_=0, max_attempts=3)
    for _ in range(20):
        burst()
        if Job.objects.get(pk=job.pk).status == Status.DEAD:
            break
    job.refresh_from_db()
    assert job.status == Status.DEAD and job.attempts == 3
    assert "failing on purpose" in job.last_error
    # the action's own writes were rolled back with each failed attempt
    assert not Record.objects.exists()
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.count("failed") == 3 and kinds[-1] == "dead"
    assert "Traceback" in job.events.filter(kind="failed").first().message
    stats = get_engine().stats("default")
    assert stats.garbage == 1 and stats.counters["buried"] == 1


def test_deleted_target_is_skipped():
    thing = Thing.objects.create()
    job = schedule(thing.expire, in_=0)
    thing.delete()
    burst()
    job.refresh_from_db()
    assert job.status == Status.SKIPPED


def test_expired_job_is_skipped():
    job = schedule(tasks.record, in_=0, args=["x"], expires=0.001)
    Job.objects.filter(pk=job.pk).update(expires_at=job.run_at)
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SKIPPED
    assert not Record.objects.exists()


def test_unknown_action_goes_dead():
    job = schedule(tasks.record, in_=0, args=["x"])
    Job.objects.filter(pk=job.pk).update(action="os.system")
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert "no @delayable function named 'os.system'" in job.last_error


def test_a_method_job_runs_only_on_the_model_its_action_names():
    """The action ``testapp.Thing.touch`` names its model: a row whose target_type points
    at another model with a ``touch`` (Sku) is dead as an unknown action, nothing runs."""
    thing = Thing.objects.create(name="t")
    sku = Sku.objects.create(code="SKU-1")
    job = schedule(thing.touch, in_=0)
    assert job.action == "testapp.Thing.touch"
    Job.objects.filter(pk=job.pk).update(
        target_type=ContentType.objects.get_for_model(Sku), target_id=sku.pk
    )
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert "'testapp.Thing.touch' is a method of testapp.Thing" in job.last_error
    assert "testapp.Sku" in job.last_error


def test_a_method_job_on_a_proxy_runs_on_the_proxy_and_only_there():
    """A job scheduled on a proxy instance names the proxy; it runs (target_type is the
    proxy's), and the same action on the concrete model's content type is dead."""
    special = SpecialThing.objects.create(name="s")
    job = schedule(special.touch, in_=0)
    assert job.action == "testapp.SpecialThing.touch"
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert Thing.objects.get(pk=special.pk).touched == 1
    moved = schedule(special.touch, in_=0)
    Job.objects.filter(pk=moved.pk).update(target_type=ContentType.objects.get_for_model(Thing))
    burst()
    assert Job.objects.get(pk=moved.pk).status == Status.DEAD
    assert Thing.objects.get(pk=special.pk).touched == 1


def test_rescheduled_after_promotion_waits_for_new_time():
    job = schedule(tasks.record, in_=0, args=["x"])
    with transaction.atomic():
        assert job.reschedule(in_=3600)
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    assert get_engine().stats("default").pending == 1


def test_queue_priority_is_strict():
    past = timezone.now() - timedelta(seconds=1)  # all ready at once (in_=0 may wait 1 ms)
    for n in range(3):
        schedule(tasks.record, at=past, args=[f"low{n}"], queue="low")
        schedule(tasks.record, at=past, args=[f"high{n}"], queue="high")
    burst("--queues", "high,low")
    labels = list(Record.objects.order_by("id").values_list("label", flat=True))
    assert labels == ["high0", "high1", "high2", "low0", "low1", "low2"]


def test_a_queue_given_twice_is_served_once_in_its_first_place():
    from django_delayjobs.management.commands.run_delayworker import queue_list

    assert queue_list("high,low,high, low") == ["high", "low"]  # was claimed from twice


def test_a_sharded_queue_after_another_has_every_shard_claimed_from_in_turn(settings):
    """Every shard of a queue is tried first in turn, whatever queues come before it: a
    worker on ``default,orders`` with ``default`` empty claimed from shards 1, 3 and 5 of
    ``orders`` only (each claim took two turns, one per queue), so while those had ids
    the other three starved."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "QUEUE_SHARDS": {"orders": 6}}
    engine = get_engine()
    now = engine.server_time_ms()
    for shard in engine.shards("orders"):
        engine.add(shard, {str(uuid.uuid4()): now for _ in range(2)})
    queues = ["default", "orders"]
    process = WorkerProcess(engine, Options(queues=queues))
    claimed = [process.claim(queues) for _ in range(6)]  # ids left in every shard
    assert Counter(shard for shard, _ in claimed) == dict.fromkeys(engine.shards("orders"), 1)


def test_due_jobs_of_a_queue_start_highest_priority_first():
    past = timezone.now() - timedelta(seconds=1)  # all due in the same promote pass
    for n, priority in enumerate([0, -10, 100, 5, 0, 5]):
        schedule(tasks.record, in_=3600, args=[f"{n}:{priority}"], priority=priority)
    Job.objects.update(run_at=past)
    get_engine().remove("default", [str(pk) for pk in Job.objects.values_list("pk", flat=True)])
    call_command("delayjobs_reconcile", verbosity=0)  # Redis learns them again from the rows
    burst()
    labels = list(Record.objects.order_by("id").values_list("label", flat=True))
    # reconcile reads the rows in no particular order: equal priorities in any order
    assert [int(label.split(":")[1]) for label in labels] == [100, 5, 5, 0, 0, -10]


def test_jobs_scheduled_together_keep_their_order_within_a_priority():
    past = timezone.now() - timedelta(seconds=1)
    priorities = [0, -10, 100, 5, 0, 5]
    schedule_many(build_job(tasks.record, at=past, args=[f"{n}:{p}"], priority=p)
                  for n, p in enumerate(priorities))  # fmt: skip
    burst()
    labels = list(Record.objects.order_by("id").values_list("label", flat=True))
    assert labels == ["2:100", "3:5", "5:5", "0:0", "4:0", "1:-10"]


def test_a_failing_signal_receiver_neither_breaks_the_job_nor_the_worker(caplog):
    from django_delayjobs import signals

    def broken(sender, job, **kwargs):
        raise RuntimeError("receiver bug")

    signals.job_started.connect(broken)
    signals.job_scheduled.connect(broken)
    try:
        job = schedule(tasks.record, in_=0, args=["still runs"])
        burst()
    finally:
        signals.job_started.disconnect(broken)
        signals.job_scheduled.disconnect(broken)
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert Record.objects.filter(label="still runs").count() == 1
    assert "receiver" in caplog.text and "receiver bug" in caplog.text


def test_a_signal_receiver_raising_a_base_exception_is_logged_and_the_worker_goes_on(caplog):
    """As an action's ``SystemExit`` is: it used to kill the worker thread (exit 1)."""
    from django_delayjobs import signals

    def unwinds(sender, job, **kwargs):
        if job.args == ["first"]:
            raise tasks.CustomBaseException("receiver unwinds")

    signals.job_succeeded.connect(unwinds)
    try:
        jobs = [schedule(tasks.record, in_=0, args=[label]) for label in ("first", "second")]
        burst()  # one worker thread: it must survive the first job to run the second
    finally:
        signals.job_succeeded.disconnect(unwinds)
    assert [Job.objects.get(pk=j.pk).status for j in jobs] == [Status.SUCCEEDED] * 2
    assert "CustomBaseException('receiver unwinds')" in caplog.text
    assert "died" not in caplog.text


def test_a_prefetched_job_is_claimed_only_when_it_starts_so_a_cancel_still_wins():
    past = timezone.now() - timedelta(seconds=1)
    victim = build_job(tasks.record, at=past, args=["victim ran"])
    canceller = build_job(tasks.cancel_job, at=past, args=[str(victim.pk)])
    schedule_many([canceller, victim])  # one add: the worker takes both ids at once
    burst()
    assert list(Record.objects.values_list("label", flat=True)) == ["cancelled:True"]
    assert Job.objects.get(pk=victim.pk).status == Status.CANCELLED
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)
    assert stats.counters["acked"] == 2


def test_a_busy_worker_keeps_its_database_connection_between_jobs():
    tasks.seen_connections.clear()
    past = timezone.now() - timedelta(seconds=1)
    schedule_many(build_job(tasks.note_connection, at=past) for _ in range(25))
    burst()  # more jobs than PREFETCH: several claims, one busy stretch
    assert len(tasks.seen_connections) == 25
    assert len({id(c) for c in tasks.seen_connections}) == 1


sqlite_only = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="WAL checkpoints are SQLite's"
)


def in_a_new_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a database connection of its own, opened now."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: (fn(), connections.close_all())[0]).result()


def autocheckpoint() -> int:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's write lock")
def test_a_database_locked_for_a_moment_as_the_action_begins_costs_no_attempt(settings):
    """Another connection holds SQLite's write lock past the worker's busy timeout just as
    the action's transaction begins (BEGIN IMMEDIATE): the database refused, the action
    never ran. It used to fail the attempt ("database is locked"), and a job with
    max_attempts=1 was dead although its action never ran."""
    from django_delayjobs import signals

    options = connections.settings["default"].setdefault("OPTIONS", {})
    saved = options.get("timeout")
    locked = threading.Event()

    def hold_the_write_lock() -> None:
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(0.75)  # past the busy timeout, not past the next write's
        other.execute("COMMIT")
        other.close()

    def on_started(sender, job, **kwargs):
        threading.Thread(target=hold_the_write_lock, daemon=True).start()
        locked.wait(5)

    job = schedule(tasks.record, in_=0, args=["ran"], max_attempts=1)
    options["timeout"] = 0.5  # the burst's worker thread opens its connection with it
    signals.job_started.connect(on_started)
    try:
        with pytest.raises(CommandError, match=r"--burst: handed back 1 job\(s\)"):
            burst()  # a burst that fell short exits 1
    finally:
        signals.job_started.disconnect(on_started)
        options["timeout"] = saved
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.RUNNING, 1, 1)
    assert not Record.objects.exists()

    # The hand-back is due again in 1 s; its row, left running, is delivered again once
    # it started half a lease ago (1 s here: the claims defer it until then).
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 2}

    def run_again() -> bool:
        burst()
        job.refresh_from_db()
        return job.status != Status.RUNNING

    wait_for(run_again, timeout=10, every=0.2)
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 2)
    assert "failed" not in job.events.values_list("kind", flat=True)
    assert Record.objects.filter(label="ran").count() == 1


@sqlite_only
def test_on_sqlite_the_worker_threads_leave_wal_checkpoints_to_the_housekeeping_thread():
    schedule(tasks.note_autocheckpoint, in_=0)
    burst()
    assert list(Record.objects.values_list("label", flat=True)) == ["autocheckpoint:0"]
    # Once the worker has stopped, new connections of this process are SQLite's default.
    assert in_a_new_thread(autocheckpoint) == 1000


@sqlite_only
@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_checkpoint_copies_the_wal_into_the_database_so_that_it_starts_again(checkpointed):
    def write() -> int:
        assert autocheckpoint() == 0
        for n in range(1500):  # one commit each: well over 1,000 WAL pages
            Record.objects.create(label=f"wal {n}")
        if checkpointed:
            walcheckpoint.checkpoint()
        Record.objects.create(label="after")  # restarts a WAL that was copied whole
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            return cursor.fetchone()[1]  # pages in the WAL

    walcheckpoint.take_over()
    try:
        pages = in_a_new_thread(write)
    finally:
        walcheckpoint.give_back()
    # Not checkpointed, the WAL holds every commit: its connection never checkpoints.
    assert pages < 20 if checkpointed else pages > 1500


@sqlite_only
@pytest.mark.parametrize("restart_pages", [100, 10**9])
def test_checkpoints_beside_a_writer_that_never_stops_start_a_long_wal_again(
    monkeypatch, restart_pages
):
    """The worker threads commit while the housekeeping thread checkpoints: a PASSIVE
    checkpoint then never finds the WAL all copied, and alone it lets the WAL grow for
    as long as the worker is busy."""
    monkeypatch.setattr(walcheckpoint, "RESTART_PAGES", restart_pages)
    # A RESTART that cannot have the write lock in time leaves it to the next checkpoint
    # (the next test); here a loaded machine's scheduling must not decide the outcome.
    monkeypatch.setattr(walcheckpoint, "RESTART_WAIT_MS", 100)
    wal = f"{connection.settings_dict['NAME']}-wal"
    stop = threading.Event()
    commits = 0
    salts: set[bytes] = set()  # the WAL header's salts: new each time the WAL starts over

    def writer() -> None:
        nonlocal commits
        while not stop.is_set():
            Record.objects.create(label=f"busy {commits}")
            commits += 1
            time.sleep(0.0002)  # a worker's round trip to Redis between two commits

    def checkpoints() -> int:
        try:
            for _ in range(20):
                time.sleep(0.05)
                walcheckpoint.checkpoint()
                with open(wal, "rb") as file:
                    salts.add(file.read(24)[16:])
        finally:
            stop.set()
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout")
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:  # this connection stays open: closing the last
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # one would empty the WAL
        cursor.execute("PRAGMA page_size")
        frame = cursor.fetchone()[0] + 24
    walcheckpoint.take_over()
    try:
        with ThreadPoolExecutor(2) as pool:
            done = [pool.submit(lambda fn=fn: (fn(), connections.close_all())[0])
                    for fn in (writer, checkpoints)]  # fmt: skip
            waits = [future.result() for future in done][1]
    finally:
        walcheckpoint.give_back()
    # The RESTART's short wait is the checkpointing connection's only while it runs.
    assert waits == connection.settings_dict["OPTIONS"]["timeout"] * 1000
    assert commits > 200
    if restart_pages == 100:  # started over at most checkpoints, past 100 pages each time
        assert len(salts) > 5, (salts, commits)
    else:  # each commit writes a page or more: the WAL holds most of them
        assert os.path.getsize(wal) // frame > commits / 2, (salts, commits)


@sqlite_only
def test_a_restart_that_a_reader_holds_up_gives_up_at_once_and_is_tried_again(monkeypatch):
    """RESTART holds the write lock while it waits for readers still on the WAL: it must
    not wait the connection's busy timeout (30 s in the tests) with every commit held up."""
    monkeypatch.setattr(walcheckpoint, "RESTART_PAGES", 1)

    def pages_after_a_write() -> int:
        Record.objects.create(label="one more")
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            return cursor.fetchone()[1]

    def checkpoint_beside_the_reader() -> tuple[float, int]:
        for n in range(30):
            Record.objects.create(label=f"wal {n}")
        started = time.monotonic()
        walcheckpoint.checkpoint()
        return time.monotonic() - started, pages_after_a_write()

    def checkpoint_alone() -> int:
        walcheckpoint.checkpoint()
        return pages_after_a_write()

    # A read transaction on the WAL, held open (a plain DEFERRED one: the tests' Django
    # connections begin IMMEDIATE, which would take the write lock).
    reader = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    walcheckpoint.take_over()
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM testapp_record").fetchone()
        took, pages = in_a_new_thread(checkpoint_beside_the_reader)
        reader.execute("COMMIT")
        assert took < 3  # gave up after RESTART_WAIT_MS (and a PASSIVE checkpoint)
        assert pages > 30  # not started over: the write went on after the 30 rows
        assert in_a_new_thread(checkpoint_alone) < 5  # the reader gone, it is started over
    finally:
        reader.close()
        walcheckpoint.give_back()


@sqlite_only
def test_the_housekeeping_thread_checkpoints_after_jobs_and_never_when_idle(monkeypatch):
    def write(rows: int) -> None:  # one commit each, on a connection that never checkpoints
        in_a_new_thread(lambda: [Record.objects.create(label=f"wal {n}") for n in range(rows)])

    def wal_pages() -> int:
        """Write one row (which starts the WAL again if it was all copied back), then
        checkpoint it all; return how many pages the WAL held."""

        def measure() -> int:
            Record.objects.create(label="measure")
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                return cursor.fetchone()[1]

        return in_a_new_thread(measure)

    checkpoints: list[None] = []  # one for each of the worker's, once it has ended
    real_checkpoint = walcheckpoint.checkpoint
    monkeypatch.setattr(walcheckpoint, "checkpoint",
                        lambda: checkpoints.append(real_checkpoint()))  # fmt: skip
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()  # take_over(): connections opened from now on never checkpoint
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 1)
        # This thread's connection, opened again (so it never checkpoints either), stays
        # open: closing the last connection to a database checkpoints it.
        connections.close_all()
        assert autocheckpoint() == 0
        write(1500)
        time.sleep(2.5)  # two checkpoint periods: an idle worker leaves the WAL alone
        assert not checkpoints and wal_pages() > 1500
        write(1500)
        schedule(tasks.record, in_=0, args=["work"])
        wait_for(lambda: Record.objects.filter(label="work").exists())
        # A job was settled since the last checkpoint: the next one runs (within a period,
        # which a fixed sleep of 2.5 s assumed a loaded machine would keep to).
        wait_for(lambda: checkpoints)
        assert wal_pages() < 20
    finally:
        process.stop()
        thread.join(10)


def test_an_idle_worker_lets_django_close_its_connection_after_a_tick():
    tasks.seen_connections.clear()
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        schedule(tasks.note_connection, in_=0)
        wait_for(lambda: len(tasks.seen_connections) == 1)
        time.sleep(0.5)  # several ticks without work: CONN_MAX_AGE = 0 closes it
        schedule(tasks.note_connection, in_=0)
        wait_for(lambda: len(tasks.seen_connections) == 2)
    finally:
        process.stop()
        thread.join(10)
    first, second = tasks.seen_connections
    assert first is not second


def test_a_success_refused_at_commit_leaves_the_next_job_of_the_batch_to_its_own_claim():
    """A success claims the next job of its batch in its outcome transaction. When the
    database refuses that transaction at COMMIT, the claim is rolled back with it: the next
    job is claimed again, not run on the row of a claim that never was (its outcome then
    finds the row not running, rolls back as overtaken, and the job waits for its lease)."""
    past = timezone.now() - timedelta(seconds=1)
    refused = build_job(tasks.refused_at_commit, at=past, args=["refused"], max_attempts=1)
    following = build_job(tasks.record, at=past, args=["following ran"])
    schedule_many([refused, following])  # one add: the worker takes both ids at once
    burst()
    assert Job.objects.get(pk=refused.pk).status == Status.DEAD
    assert Job.objects.get(pk=following.pk).status == Status.SUCCEEDED
    assert list(Record.objects.values_list("label", flat=True)) == ["following ran"]
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)


def run_past_the_limit() -> float:
    """Run a worker with MAX_RUN_SECONDS = 1 until it stops with an error; the seconds
    that took (the shutdown grace lets an action that ends within it end). The actions
    run 4 s: the housekeeping thread, which looks once a second, has 3 s to see them."""
    check_owner(get_engine())  # as run_delayworker does before its threads start
    process = WorkerProcess(get_engine(), Options(queues=["default"], burst=True))
    started = time.monotonic()
    with pytest.raises(WorkerDied, match=r"ran past MAX_RUN_SECONDS \(1 s\)"):
        process.run()
    return time.monotonic() - started


@pytest.mark.parametrize("max_attempts", [2, 1])
def test_an_action_past_max_run_seconds_fails_its_attempt_and_stops_the_worker(
    settings, max_attempts
):
    """A running action cannot be stopped: past MAX_RUN_SECONDS the housekeeping thread
    fails its attempt and the process stops with an error, for its supervisor to start a
    new one. The failure is fenced like any outcome: the action, when it ends within the
    shutdown grace, finds its delivery overtaken. (Not atomic: no transaction of its own
    holds SQLite's write lock meanwhile; its write outside one stays, as always.)"""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 1,
                          "SHUTDOWN_GRACE_SECONDS": 30}  # fmt: skip
    job = schedule(tasks.slow_outside, in_=0, args=["late", 4.0], max_attempts=max_attempts)
    assert run_past_the_limit() >= 4.0  # the grace let the action end
    job.refresh_from_db()
    assert job.status == (Status.RETRYING if max_attempts == 2 else Status.DEAD)
    assert job.attempts == 1
    assert job.last_error.startswith(
        "django_delayjobs.exceptions.TimeLimitExceeded: the action ran for more than 1 s"
    )
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds == ["scheduled", "started", "failed", *(["dead"] if max_attempts == 1 else [])]
    assert Record.objects.filter(label="late").count() == 1  # it did end, once
    stats = get_engine().stats("default")
    assert (stats.in_flight, stats.live_workers) == (0, 0)
    assert (stats.pending, stats.garbage) == ((1, 0) if max_attempts == 2 else (0, 1))


def test_an_atomic_action_past_max_run_seconds_rolls_back_or_on_sqlite_waits(settings):
    """An atomic action's transaction is open while it runs. On PostgreSQL the failure is
    written beside it, and the action's own outcome, once it ends, is overtaken and rolls
    its write back. SQLite has one write lock, which the action's transaction holds from
    its start (BEGIN IMMEDIATE here): the failure waits for it, so an action that ends
    within the database's busy timeout keeps its own outcome. The worker stops either
    way."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 1,
                          "SHUTDOWN_GRACE_SECONDS": 30}  # fmt: skip
    job = schedule(tasks.slow, in_=0, args=["late", 4.0])
    assert run_past_the_limit() >= 4.0
    job.refresh_from_db()
    if connection.vendor == "sqlite":
        assert job.status == Status.SUCCEEDED and Record.objects.filter(label="late").exists()
    else:
        assert job.status == Status.RETRYING and "MAX_RUN_SECONDS" in job.last_error
        assert not Record.objects.exists()  # rolled back with its late outcome


@pytest.mark.parametrize(
    ("signal_name", "status"),
    [("job_started", Status.RUNNING), ("job_succeeded", Status.SUCCEEDED)],
)
def test_a_signal_receiver_that_never_returns_stops_the_worker_past_max_run_seconds(
    settings, signal_name, status
):
    """A receiver runs in the worker thread, as the action does: one that never returns
    (a call with no timeout) would leave a process that heartbeats and does nothing. Past
    MAX_RUN_SECONDS the process stops with an error, as for an action."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 1,
                          "SHUTDOWN_GRACE_SECONDS": 0}  # fmt: skip
    release = threading.Event()

    def stuck(sender, job, **kwargs):
        release.wait(10)  # far past the limit; released once the worker has stopped

    getattr(signals, signal_name).connect(stuck)
    job = schedule(tasks.record, in_=0, args=["ran"])
    check_owner(get_engine())  # as run_delayworker does before its threads start
    process = WorkerProcess(get_engine(), Options(queues=["default"], burst=True))
    started = time.monotonic()
    try:
        with pytest.raises(WorkerDied, match=r"outside the action .*MAX_RUN_SECONDS \(1 s\)"):
            process.run()
        assert time.monotonic() - started < 8  # not when the receiver gave up
        assert Job.objects.get(pk=job.pk).status == status
    finally:
        release.set()
        getattr(signals, signal_name).disconnect(stuck)
        for thread in process.threads:
            thread.join(10)
    assert get_engine().stats("default").live_workers == 0
    assert Record.objects.filter(label="ran").count() == 1  # it ends once released


def test_an_action_that_ends_within_max_run_seconds_is_not_touched(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_RUN_SECONDS": 2}
    job = schedule(tasks.slow, in_=0, args=["in time", 1.0])
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED and Record.objects.filter(label="in time").exists()


def test_a_second_signal_inside_the_first_ones_log_call_exits(monkeypatch):
    """A second SIGTERM can run the handler again while the first is still logging (Python
    re-enters signal handlers); the first has already set ``signalled``, so it exits."""
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    previous = process.install_signal_handlers()
    handle = signal.getsignal(signal.SIGTERM)
    exits: list[int] = []

    class Exited(Exception):
        pass

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise Exited

    def warning(message: str, *args: object) -> None:
        if message.startswith("signal") and not landed:  # the second signal lands here
            landed.append(True)
            handle(signal.SIGTERM, None)

    landed: list[bool] = []

    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr("django_delayjobs.worker.logger.warning", warning)
    try:
        with pytest.raises(Exited):
            handle(signal.SIGTERM, None)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert exits == [1] and process.signalled


def test_a_burst_runs_a_job_whose_lease_ran_out():
    """A worker killed (kill -9, OOM) after claiming an id leaves it in flight until its
    lease ends. A burst runs no promoter thread, yet it recovers expired leases as the
    promoter does: a deployment that drains with bursts (cron) runs that job."""
    job = schedule(tasks.record, in_=0, args=["orphan"])
    engine = get_engine()
    engine.promote("default", 10)
    assert engine.claim("default", 1, 1) == [str(job.pk)]  # a worker that died at once
    time.sleep(0.05)  # its 1 ms lease is over
    burst()
    assert Record.objects.filter(label="orphan").count() == 1
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_a_process_that_has_stopped_never_heartbeats_again(monkeypatch):
    """The housekeeping thread is between its owner check (a database query) and its
    heartbeat as the process stops: the main thread unregisters first, and the heartbeat
    that follows must write nothing (it used to record the stopped process as live for
    three HEARTBEAT_SECONDS, counted by the admin and ``delayjobs_health``)."""
    from django_delayjobs import worker

    real_check, real_beat = worker.check_owner, WorkerProcess.heartbeat
    released, beaten = threading.Event(), threading.Event()

    def slow_database(engine, *args):  # the owner check waits on a busy database
        released.wait(10)
        real_check(engine, *args)

    def heartbeat(self, ttl_ms):
        real_beat(self, ttl_ms)
        if ttl_ms:
            beaten.set()

    monkeypatch.setattr(worker, "check_owner", slow_database)
    monkeypatch.setattr(WorkerProcess, "heartbeat", heartbeat)
    burst()  # nothing due: ends at once, while housekeeping is still in its owner check
    released.set()
    assert beaten.wait(10)  # housekeeping went on to its heartbeat
    assert get_engine().stats("default").live_workers == 0


def test_a_thread_that_cannot_start_stops_the_others_and_exits_1(monkeypatch):
    """``Thread.start()`` raises RuntimeError ("can't start new thread") at a process or
    memory limit. Part-way through, it used to escape as a traceback and leave the threads
    already started claiming jobs: the process stops them and exits 1 with one line."""
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "delayjobs-worker-1":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(CommandError, match="cannot start thread delayjobs-worker-1: can't"):
        call_command("run_delayworker", "--concurrency", "2", "-v", "0")
    monkeypatch.undo()
    alive = lambda: [t.name for t in threading.enumerate() if t.name.startswith("delayjobs")]  # noqa: E731
    wait_for(lambda: not alive(), timeout=5)


def test_a_broken_connection_that_fails_to_close_between_jobs_kills_no_thread(
    monkeypatch, settings
):
    """After a job, a connection that saw an error is closed; closing a broken one can
    itself raise a DatabaseError, which used to escape ``process()`` and kill the worker
    thread (and so the process)."""
    from django.db import DatabaseError

    def close() -> None:
        raise DatabaseError("server closed the connection unexpectedly")

    connection.ensure_connection()
    monkeypatch.setattr(connection, "errors_occurred", True)
    monkeypatch.setattr(connection, "close", close)
    sql.close_stale(between_jobs=True)
    # Django's close_old_connections() closes the same way, unguarded: the worker's
    # idle/burst/reconcile/heartbeat paths and the automatic prune (whose step() "never
    # raises") called it, and died of it.
    sql.close_stale()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PRUNE_AFTER_SECONDS": 3600}
    AutoPrune(get_engine()).step()  # nothing to prune; it closes, and must not raise


def test_the_first_signal_after_a_fatal_error_still_lets_the_process_finish(monkeypatch):
    """A process that is stopping because something broke (an action past
    MAX_RUN_SECONDS: ``die()``) has ``stopping`` set for its grace period; a SIGTERM then
    (systemd stopping it meanwhile) is the first signal, not the second: it must not
    ``os._exit(1)`` at once, skipping the hand-back of what never started."""
    process = WorkerProcess(get_engine(), Options(queues=["default"]))
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    process.die("an action ran past MAX_RUN_SECONDS")
    process.on_signal(signal.SIGTERM)
    assert exits == []
    process.on_signal(signal.SIGTERM)  # a real second signal still exits at once
    assert exits == [1]


# -- the ids a process holds: whose lease it extends, what it hands back ---------------------


class Unwind(BaseException):
    """A bug that ends a worker thread (nothing in the package raises it on purpose)."""


def test_a_worker_thread_that_dies_hands_back_the_rest_of_its_batch(monkeypatch, settings):
    """A thread dies after the first job of a batch of three, whose outcome transaction
    claimed the second. The second and third never started: they are handed back at once,
    not left in flight for LEASE_SECONDS, and run once by the next worker (the second's
    claim undone: it runs at once, as its first delivery)."""
    from django_delayjobs import worker

    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 2}

    def log_outcome(queue, job_id, result):
        raise Unwind("a bug after the first job")

    jobs = [build_job(tasks.record, in_=0, args=[label]) for label in ("first", "second", "third")]
    schedule_many(jobs)  # one add: one batch, in this order
    monkeypatch.setattr(worker, "log_outcome", log_outcome)
    with pytest.raises(WorkerDied, match="Unwind"):
        WorkerProcess(get_engine(), Options(queues=["default"], burst=True)).run()
    stats = get_engine().stats("default")
    assert (stats.in_flight, stats.pending + stats.ready) == (0, 2)
    assert Job.objects.get(pk=jobs[0].pk).status == Status.SUCCEEDED
    monkeypatch.undo()

    def all_ran() -> bool:
        burst()
        return [Job.objects.get(pk=j.pk).status for j in jobs] == [Status.SUCCEEDED] * 3

    wait_for(all_ran, timeout=10, every=0.2)
    assert Job.objects.get(pk=jobs[1].pk).deliveries == 1
    assert sorted(Record.objects.values_list("label", flat=True)) == ["first", "second", "third"]


def test_a_job_that_left_flight_early_in_its_batch_is_not_reported_as_a_lost_lease(
    settings, caplog
):
    """A failed job goes back to pending at once, while the rest of its batch runs: its
    lease is no longer this worker's to extend, and no "lost the lease" warning cries wolf."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1.5}  # extended every 0.5 s
    failing = build_job(tasks.fail, in_=0, args=["first"], max_attempts=3)
    slow = build_job(tasks.slow, in_=0, args=["slow", 2.0])
    schedule_many([failing, slow])  # one add: one batch, in this order
    burst()
    assert Job.objects.get(pk=failing.pk).status == Status.RETRYING
    assert Job.objects.get(pk=slow.pk).status == Status.SUCCEEDED
    assert not [r for r in caplog.records if "lost the lease" in r.getMessage()]


def test_a_lease_extension_between_a_retry_and_its_release_does_not_cry_wolf(caplog):
    """The extension that runs after a failed job went back to pending, but before its
    worker thread stopped holding it (a window of a query or two: 1 run in 19 of the test
    above met it), found it out of flight and warned "lost the lease". Here the extension
    runs in that window for sure: from the job's ``job_failed`` receiver."""
    failing = build_job(tasks.fail, in_=0, args=["first"], max_attempts=3)
    slow = build_job(tasks.slow, in_=0, args=["slow", 0.2])
    schedule_many([failing, slow])  # one add: one batch, in this order
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))

    def extend(**kwargs: object) -> None:
        process.extend_leases()

    signals.job_failed.connect(extend, dispatch_uid="test-extend")
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=slow.pk).status == Status.SUCCEEDED, timeout=30)
    finally:
        signals.job_failed.disconnect(dispatch_uid="test-extend")
        process.stop()
        thread.join(30)
    assert Job.objects.get(pk=failing.pk).status == Status.RETRYING
    assert not [r for r in caplog.records if "lost the lease" in r.getMessage()]


def test_a_lease_extension_between_a_batchs_ack_and_its_release_does_not_cry_wolf(caplog):
    """The same window at the batch's end: its succeeded ids are acked in one call, and an
    extension that ran before the batch stopped holding them found them out of flight and
    warned "lost the lease" (1 CI run of the test above). Here it runs in that window for
    sure: right after the real ack."""
    job = build_job(tasks.record, in_=0, args=["done"])
    schedule_many([job])
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    ack = process.engine.ack

    def ack_then_extend(queue: str, ids: list[str]) -> int:
        acked = ack(queue, ids)
        process.extend_leases()
        return acked

    process.engine.ack = ack_then_extend  # type: ignore[method-assign]
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Status.SUCCEEDED, timeout=30)
        wait_for(lambda: get_engine().stats("default").in_flight == 0)
    finally:
        process.stop()
        thread.join(30)
    assert not [r for r in caplog.records if "lost the lease" in r.getMessage()]


def test_a_job_another_thread_claims_again_keeps_its_lease_when_the_first_batch_ends(settings):
    """Thread 1 takes [A, B]; A asks to be retried at once, and thread 2 claims A again and
    runs it for 5 s, three leases long. Thread 1's batch ending must not stop the extension
    of A's lease: A is delivered once more only if it was lost, and its call made twice."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1.5}  # extended every 0.5 s
    a = build_job(tasks.retry_then_call_out, in_=0, args=[5.0])
    b = build_job(tasks.slow, in_=0, args=["b", 0.5])
    schedule_many([a, b])  # one add: one batch, in this order
    process = WorkerProcess(get_engine(), Options(queues=["default"], concurrency=2, tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=a.pk).status == Status.SUCCEEDED, timeout=30)
        time.sleep(1)  # a second delivery, if A's lease was lost, would start now
    finally:
        process.stop()
        thread.join(30)
    calls = Record.objects.filter(label__startswith="called out").values_list("label", flat=True)
    assert list(calls) == ["called out: attempt 2 delivery 1"]


def test_a_sleeping_promoter_is_woken_by_an_earlier_job_after_its_blpop_was_cut_short(redis_url):
    """The package's client has ``socket_timeout=1`` s, so one ``wait_for_wake`` blocks at
    most 0.5 s. With a 5 s tick, a job added 1 s into an idle promoter's sleep, due 100 ms
    later, must still wake it: ``Promoter.sleep`` waits on the wake list again and again
    until the last precise stretch (it once slept the rest of the tick where no wake token
    could reach it, and started such a job up to a tick late)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=SOCKET_TIMEOUT)
    engine = Engine(client, prefix="t")
    stop = threading.Event()
    promoter = Promoter(engine, ["q"], tick=5.0, stop=stop)

    def loop() -> None:
        while not stop.is_set():
            # On a loaded machine Redis may answer past the 1 s socket timeout (a cut-short
            # BLPOP has 0.4 s to spare; seen once beside a CPU hog): go on, as the worker's
            # promote_loop does, not die with the thread.
            with contextlib.suppress(EngineUnavailable):
                promoter.sleep(promoter.step())

    thread = threading.Thread(target=loop, daemon=True)
    try:
        thread.start()
        time.sleep(1.0)  # the promoter is idle, sleeping one tick (nothing is pending)
        due = engine.server_time_ms() + 100
        engine.add("q", {"job": due})  # the earliest pending id: pushes a wake token
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and not client.sismember(
            engine.keys("q").ready_set, "job"
        ):
            time.sleep(0.01)
        late_ms = engine.server_time_ms() - due
        assert client.sismember(engine.keys("q").ready_set, "job"), (
            f"due 100 ms after it was added, still not promoted {late_ms} ms after its due time"
        )
    finally:
        stop.set()
        thread.join(10)
        close_client(client)


@pytest.mark.parametrize("score", ["inf", "1e20"])
def test_a_pending_score_no_add_writes_neither_kills_nor_spins_the_promoter(redis_client, score):
    """+inf raised OverflowError out of ``step`` (the promoter thread died, and its worker);
    1e20 gave a wait of -9e12 s (the promoter spun at full CPU)."""
    engine = get_engine()
    redis_client.zadd(engine.keys("default").pending, {"alien": score})
    assert 0 < Promoter(engine, ["default"], tick=1.0).step() <= 1.0


def test_a_burst_ends_and_runs_a_job_whose_ready_entry_was_evicted(redis_client):
    """ready_set counted the job as ready, claim found nothing in the LIST: the burst
    looped at full CPU forever (and the job never ran)."""
    job = schedule(tasks.record, in_=0, args=["evicted"])
    engine = get_engine()
    redis_client.delete(engine.keys("default").ready)  # as an LRU eviction would
    reconcile(engine)  # changes nothing: Redis holds the id, as far as add can tell
    process = WorkerProcess(engine, Options(queues=["default"], burst=True))
    thread = threading.Thread(target=process.run, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        process.stop()
        thread.join(20)
        pytest.fail("the burst did not end")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_burst_called_in_process_freezes_nothing_of_its_caller():
    """run_delayworker freezes what is loaded (``gc.freeze()``) and never gave it back:
    called in-process, each call froze the garbage of the cycles left since the last one
    for the life of the process. A traceback that held a failed job's cursor kept its
    closed SQLite connection open (its lock, its files): SQLite then gave that database's
    read-write file to a later connection of the database made read-only. Collecting
    first instead cost each in-process call a full collection of the caller's heap (0.2 s
    in the test suite's process). Only a worker run from the command line freezes."""
    before = Cycle()
    garbage = weakref.ref(before)
    frozen = gc.get_freeze_count()
    del before
    burst()
    assert gc.get_freeze_count() == frozen
    gc.collect()
    assert garbage() is None, "frozen by the burst"
