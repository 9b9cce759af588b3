"""A worker's liveness against a database that stops answering: no failure leaves a
process that looks alive but does nothing."""

from __future__ import annotations

import contextlib

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, OperationalError, connection

from django_delayjobs import schedule
from django_delayjobs.models import Status
from tests.helpers import exit_code, start_worker, stop, wait_for
from tests.test_worker_processes import DatabaseOutage, live_workers
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def proxied_database() -> DatabaseOutage:
    """PostgreSQL through a proxy that can go silent (``DatabaseOutage.proxy``)."""
    if connection.vendor != "postgresql":
        pytest.skip("a connection left half-open (PostgreSQL through a proxy)")
    outage = DatabaseOutage()
    assert outage.proxy is not None
    return outage


def test_an_idle_worker_thread_does_not_wait_on_a_silent_connection_after_an_error(
    redis_url, tmp_path
):
    """A ``job_succeeded`` receiver's failed query leaves the worker thread's connection
    marked (``errors_occurred``); idle, the thread then checked it with Django's ``SELECT
    1``, which over a connection gone silent waited for good, unwatched, while the process
    heartbeat: no job ran again. It closes such a connection instead."""
    outage = proxied_database()
    assert outage.proxy is not None
    outage.proxy.silence(b"SELECT 1\x00")  # Django's is_usable(), and only it
    log = tmp_path / "w.log"
    worker = start_worker(redis_url, env={**outage.env, "DELAYJOBS_TEST_FAILED_QUERY": "1"},
                          log=log)  # fmt: skip
    try:
        wait_for(live_workers)
        first = schedule(tasks.record, args=["first"], in_=0)
        wait_for(lambda: first.refresh_from_db() or first.status == Status.SUCCEEDED)
        then = schedule(tasks.record, args=["then"], in_=1.5)  # after an idle tick (1 s)
        wait_for(lambda: then.refresh_from_db() or then.status == Status.SUCCEEDED, 30)
    finally:
        code = stop(worker)
        outage.proxy.down()
    assert code == 0, log.read_text()


def test_a_claim_on_a_silent_connection_stops_its_worker_with_no_max_run_seconds(
    redis_url, tmp_path
):
    """With ``MAX_RUN_SECONDS = None`` nothing watched a worker thread outside its action:
    a claim whose connection went silent held it for good, the process heartbeating. It
    now stops once stuck 30 ``HEARTBEAT_SECONDS`` (6 s here), as the database threads."""
    outage = proxied_database()
    assert outage.proxy is not None
    env = {**outage.env, "DELAYJOBS_HEARTBEAT_SECONDS": "0.2",
           "DELAYJOBS_TEST_HTTP": '{"MAX_RUN_SECONDS": null}'}  # fmt: skip
    log = tmp_path / "w.log"
    worker = start_worker(redis_url, "--worker-only", env=env, log=log)
    try:
        wait_for(live_workers)
        outage.proxy.silence(b'"deliveries" = CASE')  # the claim's UPDATE
        schedule(tasks.record, args=["claimed"], in_=0)
        assert exit_code(worker, 60) == 1, log.read_text()
    finally:
        outage.proxy.down()
    assert "outside the action for more than 30 HEARTBEAT_SECONDS (6 s)" in log.read_text()


def test_a_start_up_error_of_another_database_is_not_blamed_on_the_jobs_one(monkeypatch):
    """The command named the jobs' database when its connection had ever failed: Django
    never resets that flag in autocommit, so an error of the caller's before an in-process
    call (caught there) made a tasks module's error on another database the jobs'."""
    with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT * FROM delayjobs_no_such_table")  # the caller's, caught

    def tasks_module_fails(name: str) -> None:  # a tasks module's query on its own database
        raise OperationalError("unable to open database file (the project's 'legacy')")

    monkeypatch.setattr("django_delayjobs.management.commands.run_delayworker."
                        "autodiscover_modules", tasks_module_fails)  # fmt: skip
    with pytest.raises(CommandError) as raised:
        call_command("run_delayworker", "--burst", "-v", "0")
    assert str(raised.value).startswith("the database is unavailable: unable to open"), raised
