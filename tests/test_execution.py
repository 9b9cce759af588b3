"""What an action can do to its job, run by the worker in this process (--burst).

Anything an action raises is its failure, never the worker's; the outcome it asks for
(``Retry``, ``GiveUp``) is the one recorded; what it returns must be storable; ``async``
actions run to completion in the job's transaction; a row that cannot be read is dead.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_delayjobs import schedule, schedule_many, signals
from django_delayjobs.connection import get_engine
from django_delayjobs.execution import EARLY_WAIT, Execution, note
from django_delayjobs.models import Job, Status
from django_delayjobs.outcomes import Outcome, settle
from django_delayjobs.reconcile import reconcile
from django_delayjobs.services import build_job
from django_delayjobs.timing import to_ms
from tests.helpers import database_down, free_port, wait_for
from tests.testapp import tasks
from tests.testapp.models import Record

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def events(job: Job) -> list[tuple[str, str]]:
    return list(job.events.order_by("at", "id").values_list("kind", "message"))


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "custom"])
def test_a_base_exception_is_the_actions_failure_and_the_worker_goes_on(kind):
    failing = schedule(tasks.raise_base, in_=0, args=[kind], max_attempts=1)
    after = schedule(tasks.record, in_=0, args=["after"])
    burst()  # one worker thread: it must survive the first job to run the second
    failing.refresh_from_db()
    assert failing.status == Status.DEAD
    assert kind.replace("custom", "CustomBaseException") in failing.last_error
    assert [k for k, _ in events(failing)] == ["scheduled", "started", "failed", "dead"]
    assert not Record.objects.filter(label=f"before:{kind}").exists()  # rolled back
    assert Job.objects.get(pk=after.pk).status == Status.SUCCEEDED
    assert get_engine().stats("default").garbage == 1


def test_an_exception_whose_text_cannot_be_had_is_still_the_actions_failure():
    """Its ``__str__`` raises a BaseException: the attempt failed like any other, and the
    worker thread goes on with the next job."""
    failing = schedule(tasks.raise_unprintable, in_=0, max_attempts=1)
    after = schedule(tasks.record, in_=0, args=["after"])
    burst()
    failing.refresh_from_db()
    assert failing.status == Status.DEAD
    assert failing.last_error.startswith(
        "tests.testapp.tasks.Unprintable: <exception str() failed>\n"
    )
    assert [k for k, _ in events(failing)] == ["scheduled", "started", "failed", "dead"]
    assert not Record.objects.filter(label="before:unprintable").exists()
    assert Job.objects.get(pk=after.pk).status == Status.SUCCEEDED


@pytest.mark.parametrize("kind", ["RuntimeError", "SystemExit"])
def test_an_on_commit_callback_that_raises_leaves_the_committed_success_as_it_is(caplog, kind):
    """The action's transaction committed, with its outcome and the claim of the next job
    of its batch; a callback it left for after the commit then raised. The job succeeded:
    it is acked and signalled as such, and the next job runs on the claim that committed."""
    succeeded = []

    def on_succeeded(sender, job, **kwargs):
        succeeded.append(job.pk)

    signals.job_succeeded.connect(on_succeeded)
    try:
        past = timezone.now() - timedelta(seconds=1)
        hooked = build_job(tasks.record_then_hook_raises, at=past, args=["hooked", kind])
        following = build_job(tasks.record, at=past, args=["following"])
        schedule_many([hooked, following])  # one batch: the first claims the second
        burst()
    finally:
        signals.job_succeeded.disconnect(on_succeeded)
    hooked.refresh_from_db()
    assert (hooked.status, hooked.attempts, hooked.deliveries) == (Status.SUCCEEDED, 1, 1)
    assert [k for k, _ in events(hooked)] == ["scheduled", "started", "succeeded"]
    following.refresh_from_db()
    assert (following.status, following.deliveries) == (Status.SUCCEEDED, 1)
    assert [k for k, _ in events(following)] == ["scheduled", "started", "succeeded"]
    assert succeeded == [hooked.pk, following.pk]
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)
    assert "taken over" not in caplog.text
    assert "on-commit callback" in caplog.text


def test_an_action_that_marks_its_transaction_for_rollback_fails_with_a_clear_error():
    """``transaction.set_rollback(True)`` (or an error caught inside an atomic block without
    a savepoint): its writes roll back, so the attempt failed, and the history says why
    instead of quoting Django's refusal of the worker's own outcome statement."""
    job = schedule(tasks.record_then_set_rollback, in_=0, args=["rolled back"], max_attempts=2)
    after = schedule(tasks.record, in_=0, args=["after"])
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1)
    assert job.last_error.startswith(
        "django.db.transaction.TransactionManagementError: the action returned with its "
        "transaction marked for rollback"
    ), job.last_error
    assert list(Record.objects.values_list("label", flat=True)) == ["after"]
    after.refresh_from_db()
    assert after.status == Status.SUCCEEDED


def test_an_action_that_leaves_autocommit_off_fails_and_the_next_jobs_commit():
    """Its write was never committed: rolled back, the attempt failed, saying why. Left
    off, every later outcome and claim of the thread would go into one transaction that
    never commits, while the worker reported them done (and Redis acked them)."""
    past = timezone.now() - timedelta(seconds=1)
    manual = build_job(tasks.autocommit_off_then_record, at=past, args=["manual"],
                       max_attempts=2)  # fmt: skip
    after = [build_job(tasks.record, at=past, args=[f"after {n}"]) for n in range(2)]
    schedule_many([manual, *after])
    burst()
    manual.refresh_from_db()
    assert (manual.status, manual.attempts) == (Status.RETRYING, 1)
    assert "autocommit" in manual.last_error.splitlines()[0], manual.last_error
    for job in after:
        job.refresh_from_db()
        assert (job.status, job.deliveries) == (Status.SUCCEEDED, 1)
    assert sorted(Record.objects.values_list("label", flat=True)) == ["after 0", "after 1"]


@pytest.mark.parametrize("signal_name", ["job_started", "job_succeeded"])
def test_a_receiver_that_leaves_autocommit_off_costs_no_job_its_outcome(signal_name):
    """As for an action: autocommit is turned on again (on SQLite the driver's own
    transaction handling happened to commit anyway; on PostgreSQL nothing did)."""

    def manual(sender, job, **kwargs):
        if job.args == ["first"]:
            transaction.set_autocommit(False)

    getattr(signals, signal_name).connect(manual)
    try:
        past = timezone.now() - timedelta(seconds=1)
        jobs = [build_job(tasks.record, at=past, args=[label]) for label in ("first", "next")]
        schedule_many(jobs)
        burst()
    finally:
        getattr(signals, signal_name).disconnect(manual)
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.deliveries) == (Status.SUCCEEDED, 1)
    assert sorted(Record.objects.values_list("label", flat=True)) == ["first", "next"]


def test_retry_after_sets_the_next_attempt_time_and_its_message_is_the_history():
    job = schedule(tasks.retry_later, in_=0, args=[30, "second"])
    before = timezone.now()
    burst()
    job.refresh_from_db()
    assert job.status == Status.RETRYING and job.attempts == 1
    assert before + timedelta(seconds=29) < job.run_at < timezone.now() + timedelta(seconds=31)
    failed = job.events.get(kind="failed").message
    assert failed == "django_delayjobs.exceptions.Retry: not yet, try in 30 s"  # not a traceback
    assert get_engine().stats("default").pending == 1
    Job.objects.filter(pk=job.pk).update(run_at=timezone.now() - timedelta(seconds=1))
    get_engine().add("default", {str(job.pk): 0})  # due now
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert Record.objects.filter(label="second").count() == 1


def test_retry_is_still_bounded_by_max_attempts():
    job = schedule(tasks.retry_later, in_=0, args=[30, "never"], max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD and "not yet" in job.last_error


@pytest.mark.parametrize(
    ("after", "least", "most"),
    [
        ("nan", 5, 10),  # no delay at all: the usual backoff (RETRY_BACKOFF_SECONDS 10)
        ("inf", 86_399, 86_400),  # at most a day
        ("1e308", 86_399, 86_400),
    ],
)
def test_a_retry_delay_out_of_range_is_bounded_and_still_the_actions_failure(
    caplog, after, least, most
):
    job = schedule(tasks.retry_after_text, in_=0, args=[after], max_attempts=2)
    before = timezone.now()
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.RETRYING, 1), job.last_error
    assert job.last_error == "django_delayjobs.exceptions.Retry: receiver busy"
    assert [k for k, _ in events(job)] == ["scheduled", "started", "failed"]
    assert before + timedelta(seconds=least) <= job.run_at
    assert job.run_at <= timezone.now() + timedelta(seconds=most)
    assert "database is unavailable" not in caplog.text


def test_a_retry_delay_that_is_not_a_number_is_refused_where_it_is_raised():
    from django_delayjobs import Retry

    with pytest.raises(TypeError, match="after must be a timedelta or seconds, not str"):
        Retry("busy", after="60")  # type: ignore[arg-type]
    assert Retry("busy", after=timedelta(minutes=1)).after == 60


@pytest.mark.parametrize("escaped", ["r\\udce9sum", "a\\x00b"])
def test_an_error_text_the_database_cannot_store_is_still_the_actions_failure(caplog, escaped):
    """A lone surrogate (and, on PostgreSQL, a NUL) is stored escaped: the failure is
    recorded and signalled, not handed back as a database outage until the job dies
    for a reason that is not true."""
    failed = []

    def on_failed(sender, job, error, **kwargs):
        failed.append(error)

    signals.job_failed.connect(on_failed)
    try:
        job = schedule(tasks.raise_text, in_=0, args=[escaped], max_attempts=1)
        burst()
    finally:
        signals.job_failed.disconnect(on_failed)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.DEAD, 1, 1)
    assert f"RuntimeError: {escaped}\n" in job.last_error  # as written, escaped
    assert [k for k, _ in events(job)] == ["scheduled", "started", "failed", "dead"]
    assert failed == [job.last_error]
    assert "database is unavailable" not in caplog.text


def test_give_up_ends_the_job_dead_with_attempts_left():
    received = []

    def on_dead(sender, job, error, **kwargs):
        received.append(error)

    signals.job_dead.connect(on_dead)
    try:
        job = schedule(tasks.give_up, in_=0, args=["the receiver said 404"], max_attempts=5)
        burst()
    finally:
        signals.job_dead.disconnect(on_dead)
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.DEAD, 1)
    assert job.last_error == "django_delayjobs.exceptions.GiveUp: the receiver said 404"
    assert received == ["django_delayjobs.exceptions.GiveUp: the receiver said 404"]
    assert not Record.objects.exists()


def test_notes_reach_the_attempts_history_event():
    job = schedule(tasks.noted, in_=0, args=["status 200 in 4 ms", "body: ok"])
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED
    assert job.events.get(kind="succeeded").message == "status 200 in 4 ms\nbody: ok"


def test_note_refuses_to_work_outside_an_action():
    with pytest.raises(RuntimeError, match="only inside an action"):
        note("hello")


def test_an_async_action_runs_in_the_jobs_transaction():
    job = schedule(tasks.async_record, in_=0, args=["async ran"])
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED, job.last_error
    assert job.result == {"label": "async ran"}
    assert Record.objects.filter(label="async ran").count() == 1


def test_a_return_value_that_cannot_be_stored_fails_the_attempt_and_rolls_back():
    job = schedule(tasks.return_unstorable, in_=0, args=["written"], max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert "TypeError" in job.last_error and "return value" in job.last_error
    assert not Record.objects.exists()


def test_a_return_value_over_the_size_limit_fails_the_attempt_and_rolls_back(settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_JSON_BYTES": 1024}
    small = schedule(tasks.return_large, in_=0, args=["small", 1022])  # "x..." is 1,024
    large = schedule(tasks.return_large, in_=0, args=["large", 1023], max_attempts=1)
    burst()
    small.refresh_from_db()
    large.refresh_from_db()
    assert small.status == Status.SUCCEEDED and small.result == "x" * 1022
    assert large.status == Status.DEAD
    assert "1,025 bytes" in large.last_error and "MAX_JSON_BYTES" in large.last_error
    assert list(Record.objects.values_list("label", flat=True)) == ["small"]


def test_an_unreadable_row_is_dead_with_the_reason_and_the_queue_goes_on(redis_client):
    poison = schedule(tasks.record, in_=0, args=["poison"])
    healthy = schedule(tasks.record, in_=0, args=["healthy"])
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # past datetime.max: psycopg cannot read it
            cursor.execute(f"UPDATE {table} SET expires_at = '10000-01-01' WHERE id = %s",
                           [poison.pk])  # fmt: skip
        else:  # not a date: it reads back as None
            cursor.execute(f"UPDATE {table} SET run_at = 'soon' WHERE id = %s",
                           [poison.pk.hex])  # fmt: skip
    burst()
    row = Job.objects.filter(pk=poison.pk).values("status", "last_error").get()
    assert row["status"] == Status.DEAD
    assert "cannot be read back" in row["last_error"]
    assert Job.objects.get(pk=healthy.pk).status == Status.SUCCEEDED
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.pending, stats.garbage) == (0, 0, 0, 1)


def test_ids_that_are_not_job_ids_are_removed_once_with_one_log_line(caplog):
    engine = get_engine()
    engine.add("default", {"not-a-uuid": 0, "../../etc": 0})
    job = schedule(tasks.record, in_=0, args=["real"])
    burst()
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    stats = engine.stats("default")
    assert (stats.ready, stats.in_flight, stats.pending) == (0, 0, 0)
    lines = [r.getMessage() for r in caplog.records if "not a job id" in r.getMessage()]
    assert len(lines) == 2 and all("removed" in line for line in lines)


def test_another_spelling_of_a_job_id_is_removed_not_delivered(caplog):
    """Held ids are told apart by their text: a second spelling of a job's id (another
    program's) would be a second delivery of its row beside the first."""
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["once"])
    engine.add("default", {str(job.pk).upper(): 0, job.pk.hex: 0})
    burst()
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED
    assert Record.objects.filter(label="once").count() == 1
    lines = [r.getMessage() for r in caplog.records if "not a job id" in r.getMessage()]
    assert len(lines) == 2


def test_a_missing_row_is_dropped():
    get_engine().add("default", {str(uuid.uuid4()): 0})
    burst()
    stats = get_engine().stats("default")
    assert (stats.ready, stats.in_flight, stats.garbage) == (0, 0, 0)
    assert stats.counters["acked"] == 1


def test_a_non_atomic_action_runs_outside_any_transaction():
    job = schedule(tasks.outside_call, in_=0, args=["outside", False])
    burst()
    job.refresh_from_db()
    assert (job.status, job.result) == (Status.SUCCEEDED, False)  # not in a transaction
    failing = schedule(tasks.outside_call, in_=0, args=["stays", True], max_attempts=1)
    burst()
    assert Job.objects.get(pk=failing.pk).status == Status.DEAD
    # nothing to roll back: what it wrote before failing is there (documented)
    assert Record.objects.filter(label="stays").count() == 1


def test_the_job_claimed_with_the_previous_outcome_may_be_a_poison_row():
    """A success claims the next id of the batch in its own outcome transaction; a row
    that cannot be read there is left to the normal claim, which settles it dead."""
    past = timezone.now() - timedelta(seconds=1)
    healthy = build_job(tasks.record, at=past, args=["first"])
    poison = build_job(tasks.record, at=past, args=["poison"])
    after = build_job(tasks.record, at=past, args=["after"])
    schedule_many([healthy, poison, after])  # one add: one batch, in this order
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"UPDATE {table} SET expires_at = '10000-01-01' WHERE id = %s",
                           [poison.pk])  # fmt: skip
        else:
            cursor.execute(f"UPDATE {table} SET run_at = 'soon' WHERE id = %s",
                           [poison.pk.hex])  # fmt: skip
    burst()
    statuses = dict(Job.objects.values_list("id", "status"))
    assert statuses == {healthy.pk: Status.SUCCEEDED, poison.pk: Status.DEAD,
                        after.pk: Status.SUCCEEDED}  # fmt: skip
    assert sorted(Record.objects.values_list("label", flat=True)) == ["after", "first"]
    started = Job.objects.get(pk=after.pk).events.filter(kind="started").count()
    assert started == 1


def test_a_reschedule_between_a_failure_and_its_nack_is_not_overwritten(settings):
    """A failed attempt commits ``status='retrying', run_at=<retry time>`` first; the worker
    nacks the id afterwards with that retry time. A ``reschedule`` committed in between
    wins in the database, but its ``add`` finds the id in flight and leaves it alone: the
    nack must not leave the id due at the old retry time (30-60 s away here), so the
    worker reads the row's ``run_at`` again after the nack and moves the id there."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}
    engine = get_engine()
    job = schedule(tasks.fail, in_=0, max_attempts=3)
    (job_id,) = wait_for(lambda: engine.promote("default") and engine.claim("default", 1))
    result = Execution("default", job_id, "w").run()  # the failure is committed
    assert result.outcome == Outcome.RETRYING
    assert job.reschedule(in_=5) is True  # a user asks for the retry sooner
    settle(engine, "default", job_id, result)  # the worker nacks its delivery
    row = Job.objects.get(pk=job.pk)
    score = engine.client.zscore(engine.keys("default").pending, job_id)
    assert score is not None
    late_s = (score - to_ms(row.run_at)) / 1000
    assert late_s <= 1, f"the row is due at {row.run_at}, Redis holds it {late_s:.1f} s later"


def test_a_row_unreadable_after_the_nack_is_left_to_reconcile(settings, tmp_path, caplog):
    """The read of ``run_at`` after the nack fails (the database went away): the settle
    neither raises nor loses the id, which stays due at the nacked retry time, and the
    next reconcile sweep moves it to the row's rescheduled time."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 60}
    engine = get_engine()
    job = schedule(tasks.fail, in_=0, max_attempts=3)
    (job_id,) = wait_for(lambda: engine.promote("default") and engine.claim("default", 1))
    result = Execution("default", job_id, "w").run()
    assert job.reschedule(in_=5) is True
    nacked = to_ms(result.retry_at)
    with caplog.at_level("DEBUG", "django_delayjobs"), database_down(tmp_path):
        settle(engine, "default", job_id, result)
    assert "could not read it back after its push to Redis" in caplog.text
    pending = engine.keys("default").pending
    assert engine.client.zscore(pending, job_id) == nacked  # the old retry time, not lost
    reconcile(engine)
    assert engine.client.zscore(pending, job_id) == to_ms(Job.objects.get(pk=job.pk).run_at)


def test_a_deferral_settled_with_redis_down_is_not_lost(settings, caplog):
    """A deferral asks Redis for its clock before the nack: with Redis gone, the settle
    neither raises nor drops the id, which stays in flight until its lease ends and then
    comes back, and the job runs once, at its time."""
    engine = get_engine()
    job = schedule(tasks.record, in_=0, args=["deferred"])
    (job_id,) = wait_for(lambda: engine.promote("default") and engine.claim("default", 1, 200))
    soon = timezone.now() + EARLY_WAIT * 1.5  # not run early: handed back to wait
    Job.objects.filter(pk=job.pk).update(run_at=soon)  # a reschedule Redis did not see
    result = Execution("default", job_id, "w").run()
    assert result.outcome == Outcome.DEFERRED
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    with (
        caplog.at_level("WARNING", "django_delayjobs"),
        override_settings(DELAYJOBS={**settings.DELAYJOBS, "REDIS_URL": nowhere}),
    ):
        settle(get_engine(), "default", job_id, result)
    assert "Redis is unavailable" in caplog.text
    assert engine.client.zscore(engine.keys("default").unack, job_id) is not None  # in flight
    wait_for(lambda: engine.recover_expired("default"), timeout=5)  # its lease ended
    wait_for(lambda: timezone.now() >= soon, timeout=5)
    burst()
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == (Status.SUCCEEDED, 1), row.last_error
    assert row.started_at >= soon
    assert Record.objects.filter(label="deferred").count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's session settings")
@pytest.mark.parametrize("prefetch", [1, 10])
@pytest.mark.parametrize(
    "statement",
    [
        "SET DateStyle = 'SQL, DMY'",  # psycopg cannot read timestamps any more
        "SET client_encoding = 'LATIN1'",  # nor text outside Latin-1
        "SET default_transaction_read_only = on",  # and no transaction may write
    ],
)
def test_a_session_setting_an_action_leaves_behind_never_reaches_the_next_job(
    settings, prefetch, statement
):
    """A ``SET`` commits with the action's transaction and stays with its connection. The
    jobs after it (claimed in that transaction, or in the next batch) must run on a session
    as Django opened it: not buried as unreadable rows, not handed back as refused."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PREFETCH": prefetch}
    past = timezone.now() - timedelta(seconds=1)
    changer = build_job(tasks.change_session, at=past, args=[statement])
    following = [build_job(tasks.record, at=past, args=[f"中文 {n}"]) for n in range(2)]
    schedule_many([changer, *following])
    burst()
    for job in [changer, *following]:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), (
            job.last_error
        )
    assert sorted(Record.objects.values_list("label", flat=True)) == ["中文 0", "中文 1"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's session settings")
@pytest.mark.parametrize("prefetch", [1, 10])
@pytest.mark.parametrize("signal_name", ["job_started", "job_succeeded"])
def test_a_session_setting_a_signal_receiver_leaves_behind_never_reaches_the_next_job(
    settings, prefetch, signal_name
):
    """Receivers run in the worker thread, on its connection, as the action does."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "PREFETCH": prefetch}

    def change(sender, job, **kwargs):
        if job.args == ["change"]:
            with connection.cursor() as cursor:
                cursor.execute("SET DateStyle = 'SQL, DMY'")

    getattr(signals, signal_name).connect(change)
    try:
        past = timezone.now() - timedelta(seconds=1)
        jobs = [build_job(tasks.record, at=past, args=[label]) for label in ("change", "a", "b")]
        schedule_many(jobs)
        burst()
    finally:
        getattr(signals, signal_name).disconnect(change)
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), (
            job.last_error
        )
