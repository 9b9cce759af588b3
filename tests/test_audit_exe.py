"""Hostile actions against the transaction around them, run by a real worker (--burst in
this process, or a worker process): whatever an action does, its job ends done, scheduled
for a retry or visibly dead, and its history tells the truth."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_delayjobs import Retry, delayable, schedule, schedule_many, signals
from django_delayjobs.execution import current_job
from django_delayjobs.models import Job, Status
from django_delayjobs.services import build_job
from tests.helpers import burst_worker
from tests.testapp import tasks
from tests.testapp.models import Record, Thing

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def history(job: Job) -> list[tuple[str, int]]:
    return list(job.events.order_by("at", "id").values_list("kind", "attempt"))


# -- the job an action is handed -----------------------------------------------------------


@delayable
def copy_own_job(label: str) -> str:
    """Schedules a follow-up by copying its own job the way Django documents copying a
    model instance (``pk = None``, ``save()``), for an hour later."""
    job = current_job.get()
    assert job is not None
    job.pk, job._state.adding = None, True
    job.status, job.attempts, job.deliveries = Status.SCHEDULED, 0, 0
    job.run_at = timezone.now() + timedelta(hours=1)
    job.save()
    Record.objects.create(label=label)
    return str(job.pk)


@delayable
def change_own_job(label: str) -> str:
    """Changes the fields of the job it is handed, in memory only."""
    job = current_job.get()
    assert job is not None
    job.attempts, job.deliveries, job.status = 7, 7, Status.SCHEDULED
    Record.objects.create(label=label)
    return label


def change_started_job(sender: object, job: Job, **kwargs: object) -> None:
    job.attempts, job.deliveries = 7, 7


@pytest.mark.parametrize(
    ("action", "receiver"),
    [(copy_own_job, None), (change_own_job, None), (tasks.record, change_started_job)],
    ids=["copied", "changed", "changed-by-job_started"],
)
def test_what_user_code_does_to_the_job_it_is_handed_cannot_move_its_fence(action, receiver):
    """The fence (the row's id, attempt and delivery) is the worker's own: an action that
    copied or changed the ``Job`` that ``current_job`` handed it (or a receiver of
    ``job_started`` that changed its ``job``) once left its job running, its effects
    rolled back as if another worker had overtaken it (or its success recorded in the
    copy), to be run again after its lease."""
    job = build_job(action, at=timezone.now(), args=["ran"], max_attempts=1)
    schedule_many([job])
    if receiver is not None:
        signals.job_started.connect(receiver)
    try:
        burst()
    finally:
        signals.job_started.disconnect(receiver)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.SUCCEEDED, 1, 1), job.last_error
    assert history(job) == [("scheduled", 0), ("started", 1), ("succeeded", 1)]
    assert Record.objects.filter(label="ran").count() == 1
    others = Job.objects.exclude(pk=job.pk)
    if action is copy_own_job:
        copy = others.get()
        assert str(copy.pk) == job.result
        assert (copy.status, copy.attempts) == (Status.SCHEDULED, 0)
        assert not copy.events.exists()
    else:
        assert not others.exists()


# -- an action that forks ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("action", [tasks.fork_and_wait, tasks.fork_and_wait_async],
                         ids=["sync", "async"])  # fmt: skip
@pytest.mark.parametrize(
    ("child", "code"), [("exit", 3), ("exit-huge", 4), ("return", 0), ("raise", 1)]
)
def test_a_child_an_action_forks_ends_with_the_action_never_running_the_worker(
    redis_url, tmp_path, action, child, code
):
    """A child process the action forked and that ends by raising (``sys.exit()``, an
    error) or returning, not by ``os._exit()``, came back into the worker: it recorded an
    outcome for the job on its parent's database connection, and went on claiming jobs
    as a worker with no heartbeat. It now exits there, with the code its end asks for."""
    job = schedule(action, in_=0, args=[child, 10.0], max_attempts=1)
    log = tmp_path / "worker.log"
    assert burst_worker(redis_url, log, "-v", "3") == 0, log.read_text()
    job.refresh_from_db()
    assert (job.status, job.result) == (Status.SUCCEEDED, code), job.last_error
    assert history(job) == [("scheduled", 0), ("started", 1), ("succeeded", 1)]
    text = log.read_text()
    assert text.count(f"job {job.pk}: succeeded") == 1, text  # the parent's line alone


# -- the exception an action raises --------------------------------------------------------


class Later(Retry):
    """A ``Retry`` of the action's own that never calls ``Retry.__init__`` (so has no
    ``after``), a common slip in a subclass."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __str__(self) -> str:
        return f"later: {self.reason}"


class AfterChanged(Retry):
    """A ``Retry`` whose ``after`` was set after ``Retry.__init__`` checked it."""

    def __init__(self) -> None:
        super().__init__("the receiver is busy")
        self.after = "in a minute"  # type: ignore[assignment]


@delayable
def raise_retry(kind: str) -> None:
    Record.objects.create(label=kind)
    raise Later("busy") if kind == "no-after" else AfterChanged()


@pytest.mark.parametrize("kind", ["no-after", "after-changed"])
def test_a_retry_without_a_usable_delay_is_retried_with_the_usual_backoff(kind):
    """Reading its ``after`` raised in the worker, not the action: the delivery was handed
    back as after a bug, the job left running, and run again and again as the same attempt
    until it was dead as a job that kills its workers."""
    job = build_job(raise_retry, at=timezone.now(), args=[kind], max_attempts=3)
    after = build_job(tasks.record, at=timezone.now() + timedelta(milliseconds=1), args=["after"])
    schedule_many([job, after])
    started = timezone.now()
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.deliveries) == (Status.RETRYING, 1, 1), job.last_error
    # The usual backoff: RETRY_BACKOFF_SECONDS (10) times 0.5-1.0 for a first failure.
    assert started + timedelta(seconds=5) <= job.run_at <= timezone.now() + timedelta(seconds=10)
    assert history(job) == [("scheduled", 0), ("started", 1), ("failed", 1)]
    assert job.last_error.splitlines()[0].startswith(f"{__name__}."), job.last_error
    assert not Record.objects.filter(label=kind).exists()
    assert Job.objects.get(pk=after.pk).status == Status.SUCCEEDED


# -- the claim of the next job, refused -----------------------------------------------------


@pytest.fixture
def refuse_one_claim():
    """Returns a function that makes PostgreSQL refuse, once, the claim of the job with the
    given id with a serialization failure: what a claim in a SERIALIZABLE or REPEATABLE
    READ transaction meets when a cancel or a reschedule of that job commits meanwhile."""
    if connection.vendor != "postgresql":
        pytest.skip("a claim that PostgreSQL refuses (SQLite's write lock serializes them)")
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE delayjobs_test_refusals")

    def refuse(job_id: object) -> None:
        with connection.cursor() as cursor:
            # nextval() is not rolled back with the refused claim: the next claim goes by.
            cursor.execute(f"""
                CREATE FUNCTION delayjobs_test_refuse() RETURNS trigger AS $$ BEGIN
                  IF NEW.id = '{job_id}' AND NEW.status = 'running'
                     AND nextval('delayjobs_test_refusals') = 1 THEN
                    RAISE EXCEPTION 'could not serialize access due to concurrent update'
                      USING ERRCODE = '40001';
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql""")  # fmt: skip
            cursor.execute(f"CREATE TRIGGER delayjobs_test_refuse BEFORE UPDATE ON {table} "
                           "FOR EACH ROW EXECUTE FUNCTION delayjobs_test_refuse()")  # fmt: skip

    try:
        yield refuse
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS delayjobs_test_refuse ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS delayjobs_test_refuse()")
            cursor.execute("DROP SEQUENCE delayjobs_test_refusals")


def test_a_refused_claim_of_the_next_job_never_runs_a_non_atomic_action_again(refuse_one_claim):
    """A success claims the next job of the batch in the same transaction; when the
    database refused that claim, the transaction was lost and the job handed back, so a
    non-atomic action (an HTTP callback) whose outside effect had happened ran again. Its
    success is now written alone, and the next job claimed on its own."""
    past = timezone.now() - timedelta(seconds=1)
    first = build_job(tasks.outside_call, at=past, args=["called out", False], max_attempts=1)
    after = build_job(tasks.record, at=past + timedelta(milliseconds=1), args=["after"])
    schedule_many([first, after])
    refuse_one_claim(after.pk)
    burst()
    first.refresh_from_db()
    assert (first.status, first.attempts, first.deliveries) == (Status.SUCCEEDED, 1, 1)
    assert Record.objects.filter(label="called out").count() == 1  # its outside effect, once
    assert history(first) == [("scheduled", 0), ("started", 1), ("succeeded", 1)]
    after.refresh_from_db()
    assert (after.status, after.attempts, after.deliveries) == (Status.SUCCEEDED, 1, 1)
    assert Record.objects.filter(label="after").count() == 1


# -- an action that cancels the jobs of its own target -------------------------------------


def test_cancel_for_fail_if_running_inside_an_action_does_not_count_the_action_itself():
    """An action that cancels its target's other jobs with ``fail_if_running=True`` (a
    payment, run as a job) found its own job running and raised ``AlreadyRunning``: it
    could never succeed. Its own job is not one that ``cancel_for`` must stop."""
    thing = Thing.objects.create(name="order")
    reminder = schedule(thing.touch, in_=3600)
    job = schedule(thing.settle, in_=0, max_attempts=1)
    burst()
    job.refresh_from_db()
    assert (job.status, job.result) == (Status.SUCCEEDED, 1), job.last_error
    reminder.refresh_from_db()
    assert reminder.status == Status.CANCELLED
    thing.refresh_from_db()
    assert thing.state == "settled"


def test_cancel_for_fail_if_running_inside_an_action_still_refuses_another_running_job():
    """Another job of the same target that runs (here: its row as a worker left it) is
    still refused, the action's writes rolled back with it."""
    thing = Thing.objects.create(name="order")
    running = schedule(thing.touch, in_=3600)
    Job.objects.filter(pk=running.pk).update(status=Status.RUNNING, attempts=1, deliveries=1)
    job = schedule(thing.settle, in_=0, max_attempts=1)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert job.last_error.startswith("django_delayjobs.exceptions.AlreadyRunning:"), job.last_error
    thing.refresh_from_db()
    assert thing.state == "new"
