"""Audit of failure handling: faults that leave a job lost, stuck or misreported."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command

from django_delayjobs import delayable, schedule
from django_delayjobs.models import Job, Status

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


@delayable
def raise_text(text: str) -> None:
    raise RuntimeError(text.encode().decode("unicode_escape"))


@pytest.mark.parametrize("text", ["r\\udce9sum", "a\\x00b"])
def test_an_exception_text_with_a_lone_surrogate_is_the_actions_failure(caplog, text):
    job = schedule(raise_text, in_=0, args=[text], max_attempts=1)
    burst()
    job.refresh_from_db()
    print(job.status, job.attempts, job.deliveries, repr(job.last_error[:300]))
    print([ (r.levelname, r.getMessage()[:200]) for r in caplog.records])
    assert job.status == Status.DEAD
    assert [e.kind for e in job.events.order_by("at", "id")] == ["scheduled", "started", "failed", "dead"]


def test_a_row_whose_queue_is_not_a_valid_name_does_not_stop_the_worker(redis_client):
    """A poison row (raw SQL, an older version): its queue cannot name Redis keys. The
    reconcile sweep must skip it (as it skips a row whose id is not one), not die and
    take the worker process down with it at every start."""
    import threading

    from django.db import connection

    from django_delayjobs.connection import get_engine
    from django_delayjobs.worker import Options, WorkerDied, WorkerProcess
    from tests.helpers import wait_for
    from tests.testapp import tasks
    from tests.testapp.models import Record

    bad = schedule(tasks.record, in_=60, args=["poison"])  # due within the sweep's horizon
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Job._meta.db_table} SET queue = %s WHERE id = %s",
                       ["old queue", Job._meta.pk.get_db_prep_value(bad.pk, connection)])
    process = WorkerProcess(get_engine(), Options(queues=["default"], tick=0.1))
    died: list[BaseException] = []

    def run() -> None:
        try:
            process.run()
        except WorkerDied as exc:
            died.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        time.sleep(1.5)
        schedule(tasks.record, in_=0, args=["healthy"])
        time.sleep(1.5)
        assert not died, died
        assert thread.is_alive()
        wait_for(lambda: Record.objects.filter(label="healthy").exists(), timeout=5)
    finally:
        process.stop()
        thread.join(10)


@delayable
def retry_after_nan() -> None:
    from django_delayjobs import Retry

    raise Retry("receiver busy", after=float("nan"))  # e.g. computed from a bad header


def test_retry_with_a_nan_delay_is_still_the_actions_failure(caplog):
    job = schedule(retry_after_nan, in_=0, max_attempts=2)
    burst()
    job.refresh_from_db()
    lines = [r.getMessage() for r in caplog.records]
    assert not any("database is unavailable" in line for line in lines), lines
    assert (job.status, job.attempts) == (Status.RETRYING, 1), (job.status, job.last_error)
    assert job.last_error == "Retry: receiver busy"


class Unwind(BaseException):
    """What a library may raise to unwind everything (gevent's Timeout, trio's Cancelled)."""


def test_a_signal_receiver_raising_a_base_exception_is_logged_and_the_worker_goes_on(caplog):
    """signals.send: "a failing receiver is logged, never raised to the worker"."""
    from django_delayjobs import signals
    from django.core.management.base import CommandError

    from django_delayjobs.connection import get_engine
    from tests.testapp import tasks

    def receiver(sender, job, **kwargs):
        if job.args == ["first"]:
            raise Unwind("receiver unwinds")

    signals.job_succeeded.connect(receiver)
    try:
        first = schedule(tasks.record, in_=0, args=["first"])
        second = schedule(tasks.record, in_=0, args=["second"])
        try:
            burst()
        except CommandError as exc:
            died = str(exc)
        else:
            died = ""
    finally:
        signals.job_succeeded.disconnect(receiver)
    assert not died
    assert Job.objects.get(pk=first.pk).status == Status.SUCCEEDED
    assert Job.objects.get(pk=second.pk).status == Status.SUCCEEDED


def test_a_worker_thread_that_dies_hands_back_the_rest_of_its_batch():
    """worker.md: when a thread dies the process "finishes or hands back what it holds and
    exits 1". Here a job_succeeded receiver kills the thread after the first job of a
    batch of three: the second was already claimed in the first's outcome transaction,
    the third not at all. Neither may wait LEASE_SECONDS (300 s) in unack."""
    from django.core.management.base import CommandError

    from django_delayjobs import schedule_many, signals
    from django_delayjobs.connection import get_engine
    from django_delayjobs.services import build_job
    from tests.testapp import tasks

    def receiver(sender, job, **kwargs):
        if job.args == ["first"]:
            raise Unwind("receiver unwinds")

    jobs = [build_job(tasks.record, in_=0, args=[label]) for label in ("first", "second", "third")]
    schedule_many(jobs)  # one add: one batch, in this order
    signals.job_succeeded.connect(receiver)
    try:
        with pytest.raises(CommandError, match="died"):
            burst()
    finally:
        signals.job_succeeded.disconnect(receiver)
    statuses = [Job.objects.get(pk=j.pk).status for j in jobs]
    stats = get_engine().stats("default")
    assert statuses[0] == Status.SUCCEEDED
    assert stats.in_flight == 0, (statuses, stats.in_flight, stats.pending, stats.ready)


def test_a_receivers_redirect_with_a_nul_in_location_ends_the_callback_dead_once(
    settings, redis_client, callback_server
):
    """A 302 is GiveUp: dead at once, one request. The receiver's Location header goes
    into the job's error; PostgreSQL refuses a NUL in text, so the outcome is "handed
    back" as if the database were down, the request is sent again on every delivery, and
    the job finally dies for a reason that is not true."""
    from django.db import connection

    from django_delayjobs import schedule_http
    from django_delayjobs.callbacks.signing import new_secret
    from tests.callback_server import Reply

    if connection.vendor != "postgresql":
        pytest.skip("SQLite stores a NUL")
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    callback_server.script("/hook", *[Reply(302, b"", {"Location": "/next\x00"})] * 5)
    job = schedule_http(callback_server.url(), in_=0, max_attempts=5)
    for _ in range(6):
        burst()
        time.sleep(1.1)  # a hand-back is due again in 1 s
    job.refresh_from_db()
    print(job.status, job.attempts, job.deliveries, callback_server.count(), job.last_error[:200])
    assert job.status == Status.DEAD and "redirect is not followed" in job.last_error
    assert callback_server.count() == 1


def test_a_job_settled_earlier_in_the_batch_is_not_reported_as_a_lost_lease(settings, caplog):
    """A failed job is nacked to pending at once, but stays in the worker's held ids until
    its whole batch ends: the housekeeping thread then warns that its lease was lost and
    "another worker may take it", which is false (and cries wolf on a real lost lease)."""
    from django_delayjobs import schedule_many
    from django_delayjobs.services import build_job
    from tests.testapp import tasks

    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1.5}  # extended every 0.5 s
    failing = build_job(tasks.fail, in_=0, args=["first"], max_attempts=3)
    slow = build_job(tasks.slow, in_=0, args=["slow", 2.0])
    schedule_many([failing, slow])  # one add: one batch, in this order
    burst()
    assert Job.objects.get(pk=failing.pk).status == Status.RETRYING
    assert Job.objects.get(pk=slow.pk).status == Status.SUCCEEDED
    lost = [r.getMessage() for r in caplog.records if "lost the lease" in r.getMessage()]
    assert lost == []


@delayable(atomic=False)
def retry_then_call_out(seconds: float) -> None:
    """Attempt 1 asks to be retried at once; attempt 2 is a long outside call (an HTTP
    request, say), recorded once per run."""
    from django_delayjobs import Retry
    from django_delayjobs.execution import current_job
    from tests.testapp.models import Record

    job = current_job.get()
    assert job is not None
    if job.attempts == 1:
        raise Retry("the receiver is busy", after=0)
    Record.objects.create(label=f"called out: attempt {job.attempts} delivery {job.deliveries}")
    time.sleep(seconds)


def test_a_job_another_thread_runs_keeps_its_lease_when_its_first_batch_ends(settings):
    """Thread 1 takes a batch [A, B]. A fails and asks to be retried at once; thread 2
    (same process) claims A and runs it. When thread 1's batch ends it forgets A's lease
    (settle_batch pops every id of its batch from the shared ``held``), so nobody extends
    it: the lease runs out while A runs, A is delivered again and its outside call is
    made twice, as if the worker had died (worker.md: "the worker extends the lease every
    LEASE_SECONDS / 3 while it runs, so nobody else takes it")."""
    import threading

    from django_delayjobs import schedule_many
    from django_delayjobs.connection import get_engine
    from django_delayjobs.services import build_job
    from django_delayjobs.worker import Options, WorkerProcess
    from tests.helpers import wait_for
    from tests.testapp import tasks
    from tests.testapp.models import Record

    settings.DELAYJOBS = {**settings.DELAYJOBS, "LEASE_SECONDS": 1.5}  # extended every 0.5 s
    a = build_job(retry_then_call_out, in_=0, args=[5.0])
    b = build_job(tasks.slow, in_=0, args=["b", 0.5])
    schedule_many([a, b])  # one add: one batch, in this order
    process = WorkerProcess(get_engine(), Options(queues=["default"], concurrency=2, tick=0.1))
    thread = threading.Thread(target=process.run)
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=a.pk).status == Status.SUCCEEDED, timeout=30)
        time.sleep(1)
    finally:
        process.stop()
        thread.join(30)
    calls = sorted(Record.objects.filter(label__startswith="called out")
                   .values_list("label", flat=True))  # fmt: skip
    assert calls == ["called out: attempt 2 delivery 1"]


def test_a_database_locked_for_a_moment_costs_no_attempt(settings):
    """SQLite: another process holds the write lock a little longer than the worker's busy
    timeout, just as the action's transaction begins (BEGIN IMMEDIATE). That is the
    database refusing, not the action failing: worker.md says no attempt is used and the
    delivery is handed back. Instead the attempt fails with "database is locked" and a
    job with max_attempts=1 is dead although its action never ran."""
    import sqlite3
    import threading

    from django.db import connection, connections

    from django_delayjobs import signals
    from tests.testapp import tasks
    from tests.testapp.models import Record

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    path = connection.settings_dict["NAME"]
    options = connections.settings["default"].setdefault("OPTIONS", {})
    saved = options.get("timeout")
    locked = threading.Event()

    def hold_the_write_lock() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(1.0)  # twice the worker's busy timeout
        other.execute("COMMIT")
        other.close()

    def on_started(sender, job, **kwargs):
        threading.Thread(target=hold_the_write_lock, daemon=True).start()
        locked.wait(5)

    job = schedule(tasks.record, in_=0, args=["ran"], max_attempts=1)
    options["timeout"] = 0.5  # the burst's worker thread opens its connection with it
    signals.job_started.connect(on_started)
    try:
        burst()
    finally:
        signals.job_started.disconnect(on_started)
        options["timeout"] = saved
    job.refresh_from_db()
    print(job.status, job.attempts, job.deliveries, job.last_error.strip().splitlines()[-1:])
    assert job.status != Status.DEAD, job.last_error.strip().splitlines()[-1]
    assert [e.kind for e in job.events.all()].count("failed") == 0
    assert not Record.objects.exists() or job.status == Status.SUCCEEDED
