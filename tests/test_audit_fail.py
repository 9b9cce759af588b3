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
