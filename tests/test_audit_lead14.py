"""Audit of a worker's way out: an action past ``MAX_RUN_SECONDS`` keeps running until its
process exits, so its retry must not be due before then."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F
from django.utils import timezone

from django_delayjobs import schedule, signals, sql
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import Execution
from django_delayjobs.models import EventKind, Job, Status
from django_delayjobs.worker import OVERRUN_SLACK
from tests.helpers import WritesLocked, set_read_only, start_worker, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_retry_of_an_action_past_max_run_seconds_is_due_only_once_its_process_is_gone(
    redis_url, tmp_path
):
    """The attempt is failed while its action still runs, in a process that lives on for
    up to its shutdown grace, then as long again for the interpreter's exit. A retry due
    in its usual backoff (here 0.25-0.5 s) would have another worker run the next attempt
    beside the one still running: the outside effects twice at once."""
    grace = 3.0
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": str(grace),
           "DELAYJOBS_RETRY_BACKOFF_SECONDS": "0.5"}  # fmt: skip
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 1)
        # Not atomic: no transaction of the action's holds the failure's write back.
        job = schedule(tasks.slow_outside, in_=0, args=["stuck", 600.0])
        assert worker.wait(60) == 1
        exited = timezone.now()
    finally:
        if worker.poll() is None:
            worker.kill()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and "MAX_RUN_SECONDS" in job.last_error
    failed_at = job.events.get(kind=EventKind.FAILED).at
    # the event is stamped as it is written, a few ms after the retry's time was taken
    assert job.run_at >= failed_at + timedelta(seconds=grace + OVERRUN_SLACK - 1), job.run_at
    assert exited < job.run_at  # the process was gone well before
    engine = get_engine()  # Redis holds the same due time: the nack's
    score = engine.client.zscore(
        engine.keys(engine.home("default", str(job.pk))).pending, str(job.pk)
    )
    assert score is not None and score >= job.run_at.timestamp() * 1000 - 1, (score, job.run_at)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a read-only database: PostgreSQL")
def test_an_overrun_whose_failure_the_database_refuses_is_left_to_its_lease(redis_url, tmp_path):
    """Handed back (the database refused to record the failure), the id was due again in
    a second, while its row, running since past MAX_RUN_SECONDS, could be taken over at
    once: another worker would run the job beside the stuck action. It is left in flight,
    due again once its lease ends, after the process has exited."""
    env = {"DELAYJOBS_MAX_RUN_SECONDS": "1", "DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}
    worker = start_worker(redis_url, env=env, log=tmp_path / "w.log")
    try:
        wait_for(lambda: get_engine().stats("default").live_workers == 1)
        job = schedule(tasks.slow_outside, in_=0, args=["stuck", 600.0])
        wait_for(lambda: status_of(job) == Status.RUNNING)
        set_read_only(True)  # a failover onto a standby, as the action runs
        assert worker.wait(60) == 1
    finally:
        set_read_only(False)
        if worker.poll() is None:
            worker.kill()
    assert "its failure could not be recorded" in (tmp_path / "w.log").read_text()
    assert status_of(job) == Status.RUNNING
    stats = get_engine().stats("default")
    assert (stats.in_flight, stats.pending + stats.ready) == (1, 0), stats


def status_of(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).get()


def test_a_job_whose_claim_waits_past_the_grace_is_handed_back_not_left_to_its_lease(
    redis_url, tmp_path
):
    """Stopped (SIGTERM) while a worker thread's claim waits on the database, the process
    exits after its grace without that thread. The job never started: it is handed back,
    due at once, as the rest of a batch is; left in flight it waited for its lease
    (LEASE_SECONDS, 5 minutes by default). And the log does not call it a running action."""
    env = {"DELAYJOBS_SHUTDOWN_GRACE_SECONDS": "1"}
    lock = WritesLocked()
    worker = start_worker(redis_url, "--concurrency", "1", env=env, log=tmp_path / "w.log")
    try:
        engine = get_engine()
        job = schedule(tasks.record, in_=3600, args=["held"])
        wait_for(lambda: engine.stats("default").live_workers == 1)
        lock.hold()
        assert engine.reschedule("default", str(job.pk), 0)  # due now, in Redis alone
        wait_for(lambda: engine.stats("default").in_flight == 1)
        time.sleep(0.5)  # the claim is sent, and waits on the lock
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        stats = engine.stats("default")
        assert (stats.in_flight, stats.pending + stats.ready) == (0, 1), stats
    finally:
        lock.release()
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "w.log").read_text()
    assert "running no action" in log and "actions still running" not in log, log


@contextlib.contextmanager
def reply_lost_after(
    kinds: set[str], reconnect_fails: bool, meanwhile: Callable[[], object] = lambda: None
) -> Iterator[list[str]]:
    """The first COMMIT of a transaction that wrote an event of ``kinds`` reaches the
    database, then its reply is lost: the connection closes and the worker meets the
    error a network cut at that moment gives, and with ``reconnect_fails`` the new
    connection Django opens at once is refused too (a failover under way); ``meanwhile``
    runs between the COMMIT and the error (another worker's write). The one fault
    made in this process: which side of a COMMIT a cut falls on cannot be chosen on a
    real network."""
    fired: list[str] = []
    pending = threading.local()
    insert_events, commit = sql.insert_events, BaseDatabaseWrapper._commit
    connect = BaseDatabaseWrapper.connect
    refuse = threading.local()

    def refusing(self):  # type: ignore[no-untyped-def]
        if getattr(refuse, "once", False):
            refuse.once = False
            raise OperationalError("could not connect to server: Connection refused")
        return connect(self)

    def noting(events, cursor=None):  # type: ignore[no-untyped-def]
        events = list(events)
        pending.kind = next((kind for _, kind, _, _ in events if kind in kinds), None)
        return insert_events(events, cursor)

    def cut(self):  # type: ignore[no-untyped-def]
        kind, pending.kind = getattr(pending, "kind", None), None
        done = commit(self)
        if kind is not None and not fired:
            fired.append(kind)
            self.close()
            meanwhile()
            refuse.once = reconnect_fails
            raise OperationalError("server closed the connection unexpectedly")
        return done

    with (
        mock.patch.object(sql, "insert_events", noting),
        mock.patch.object(BaseDatabaseWrapper, "_commit", cut),
        mock.patch.object(BaseDatabaseWrapper, "connect", refusing),
    ):
        yield fired


@pytest.mark.parametrize("reconnect_fails", [False, True], ids=["reconnected", "refused"])
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_a_non_atomic_outcome_whose_commit_landed_though_its_reply_was_lost(
    fail, reconnect_fails, caplog
):
    """Django opens a new connection as soon as the COMMIT fails: the outcome was handed
    back (its signal never sent, the log saying the database was unavailable), or, once
    written again, read as a takeover. The row holds this very outcome: it is the outcome
    written. Its signal is sent and the action ran once."""
    sent: list[str] = []

    def received(signal, sender, **kwargs):  # type: ignore[no-untyped-def]
        sent.append("succeeded" if signal is signals.job_succeeded else "failed")

    signals.job_succeeded.connect(received, weak=False)
    signals.job_failed.connect(received, weak=False)
    job = schedule(tasks.outside_call, in_=0, args=["called", fail])
    kind = "failed" if fail else "succeeded"
    try:
        with reply_lost_after({"succeeded", "failed"}, reconnect_fails) as fired:
            call_command("run_delayworker", "--burst", "-v", "0")
    finally:
        signals.job_succeeded.disconnect(received)
        signals.job_failed.disconnect(received)
    assert fired == [kind]
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING if fail else Status.SUCCEEDED, 1)
    assert job.events.filter(kind=kind).count() == 1 and sent == [kind]
    assert "handed back" not in caplog.text and "not recorded" not in caplog.text
    assert Record.objects.filter(label="called").count() == 1  # the action ran once
    if fail:  # due again at its retry time, in Redis too
        engine = get_engine()
        pending = engine.keys(engine.home("default", str(job.pk))).pending
        score = engine.client.zscore(pending, str(job.pk))
        assert score is not None and abs(score - job.run_at.timestamp() * 1000) < 2


@pytest.mark.parametrize("taken_over", [False, True], ids=["held", "taken-over"])
def test_a_claim_ahead_whose_commit_landed_though_its_reply_was_lost(taken_over):
    """The outcome transaction that landed also claimed the next job of the batch: that
    claim is the next job's delivery. Claimed again, it was counted as a second delivery
    of its attempt, with a second ``started`` event. Unless another delivery has taken
    the row over meanwhile: then it is not run here."""
    first = schedule(tasks.outside_call, at=timezone.now() - timedelta(seconds=1),
                     args=["first", False])  # fmt: skip
    second = schedule(tasks.outside_call, in_=0, args=["second", False])
    ahead: list[object] = []
    claim_ahead = Execution.claim_ahead

    def spied(self):  # type: ignore[no-untyped-def]
        ahead.append(claimed := claim_ahead(self))
        return claimed

    def take_over() -> None:  # as another worker's claim would, on its own connection
        Job.objects.filter(pk=second.pk).update(deliveries=F("deliveries") + 1, worker="other")

    with (
        mock.patch.object(Execution, "claim_ahead", spied),
        reply_lost_after({"succeeded"}, False, take_over if taken_over else lambda: None) as fired,
    ):
        call_command("run_delayworker", "--burst", "-v", "0")
    assert fired == ["succeeded"]
    assert [getattr(job, "pk", None) for job in ahead[:1]] == [second.pk]  # claimed ahead
    first.refresh_from_db()
    assert (first.status, first.attempts, first.deliveries) == (Status.SUCCEEDED, 1, 1)
    second.refresh_from_db()
    assert second.events.filter(kind=EventKind.STARTED).count() == 1
    if taken_over:  # left to the delivery that holds it
        assert (second.status, second.deliveries, second.worker) == (Status.RUNNING, 2, "other")
        assert not Record.objects.filter(label="second").exists()
    else:
        assert (second.status, second.attempts, second.deliveries) == (Status.SUCCEEDED, 1, 1)
        assert Record.objects.filter(label="second").count() == 1
