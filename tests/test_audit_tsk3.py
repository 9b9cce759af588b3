"""Audit of the django.tasks backend, round 3: signals, validation, several databases."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_delayjobs import signals, sql
from django_delayjobs.backends import InvalidTask, TaskResultStatus
from django_delayjobs.models import Job, Status
from tests.helpers import run_in_web_process
from tests.testapp import task_functions as t

try:
    from django.tasks import default_task_backend
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


@pytest.fixture
def finished():
    """The task results ``task_finished`` was sent with, and the jobs ``job_succeeded``,
    ``job_failed`` and ``job_dead`` were sent with (as (signal, job) pairs)."""
    seen: dict[str, list] = {"tasks": [], "jobs": []}

    def on_task(sender, task_result, **kwargs):
        seen["tasks"].append(task_result)

    def on_job(signal):
        def receiver(sender, job, **kwargs):
            seen["jobs"].append((signal, job))

        return receiver

    receivers = {name: on_job(name) for name in ("job_succeeded", "job_failed", "job_dead")}
    task_signals.task_finished.connect(on_task)
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    yield seen
    task_signals.task_finished.disconnect(on_task)
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_task_finished_carries_the_finish_time_and_outcome_the_database_has(finished):
    """The worker sent its outcome signals with its copy of the job as claimed (no
    finished_at, the last_error of the attempt before): task_finished's result, and the
    job of a job_succeeded or job_dead receiver, said a finished task had not finished."""
    ok, bad = t.add.enqueue(1, 2), t.explode.enqueue("boom")
    burst()
    by_id = {result.id: result for result in finished["tasks"]}
    for enqueued in (ok, bad):
        sent, read = by_id[enqueued.id], default_task_backend.get_result(enqueued.id)
        assert sent.finished_at is not None
        assert (sent.status, sent.finished_at, sent.errors) == (
            read.status, read.finished_at, read.errors)  # fmt: skip
    for _signal, job in finished["jobs"]:
        row = Job.objects.get(pk=job.pk)
        assert (job.status, job.finished_at, job.last_error) == (
            row.status, row.finished_at, row.last_error)  # fmt: skip


def test_a_task_whose_worker_was_always_lost_finishes_with_the_reason(finished):
    """A job dead because each delivery's worker was lost has no failure of its own:
    its one error is the reason the worker wrote, in task_finished's result too."""
    result = t.add.enqueue(1, 2)
    for worker in ("lost-1", "lost-2", "lost-3"):  # MAX_DELIVERIES is 3 in the tests
        with transaction.atomic():  # a claim as Execution.claim writes it, never settled
            job = sql.claim(result.id, worker, timezone.now(), 3)
            assert job is not None
            sql.insert_event(job, "started", f"worker:{worker}", "attempt 1 of 1")
        # lost: its lease ended before the next delivery (a younger one is not taken over)
        Job.objects.filter(pk=result.id).update(started_at=timezone.now() - sql.takeover_delay())
    burst()
    assert Job.objects.get(pk=result.id).status == Status.DEAD
    (sent,) = finished["tasks"]
    read = default_task_backend.get_result(result.id)
    assert sent.status == read.status == TaskResultStatus.FAILED
    (error,) = sent.errors
    assert "never recorded an outcome" in error.traceback
    assert sent.errors == read.errors and sent.finished_at == read.finished_at


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # A delay, as Celery's countdown: the framework's own check raised AttributeError
        # ('datetime.timedelta' object has no attribute 'utcoffset').
        ({"run_after": datetime.timedelta(minutes=5)}, "timezone.now\\(\\) \\+ the timedelta"),
        ({"run_after": "2030-01-01T00:00:00+00:00"}, "not str"),
        ({"run_after": datetime.date(2030, 1, 1)}, "not date"),
        ({"run_after": 1_900_000_000}, "not int"),
        # The framework's check raised ValueError, TypeError or decimal.InvalidOperation.
        ({"priority": float("nan")}, "whole number"),
        ({"priority": decimal.Decimal("NaN")}, "whole number"),
        ({"priority": "5"}, "whole number"),
        ({"priority": 1j}, "whole number"),
    ],
)
def test_run_after_and_priority_of_the_wrong_kind_are_an_invalid_task(changes, message):
    with pytest.raises(InvalidTask, match=message):
        t.add.using(**changes)
    assert not Job.objects.exists()


def test_whole_number_priorities_and_aware_datetimes_still_pass():
    when = timezone.now() + datetime.timedelta(hours=1)
    for priority in (5, 5.0, decimal.Decimal("5"), True):
        result = t.add.using(priority=priority, run_after=when).enqueue(1, 2)
        assert Job.objects.get(pk=result.id).priority == int(priority)


#: Job on a database of its own ("jobs"), made after the project's: its content types are
#: numbered in another order than those of "default", which the models' are read from.
JOBS_APART = """
import json
from datetime import timedelta

import django

django.setup()
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.test.utils import setup_test_environment

call_command("migrate", verbosity=0)
call_command("migrate", database="jobs", verbosity=0)
# The same ids as the project's, each given to another model (the next one's).
rows = list(ContentType.objects.using("default").order_by("id").values_list("id", "app_label",
                                                                           "model"))
with connections["jobs"].cursor() as cursor:
    cursor.execute("PRAGMA foreign_keys = OFF")
    cursor.execute("DELETE FROM django_content_type")
    for (pk, _, _), (_, app_label, model) in zip(rows, rows[1:] + rows[:1]):
        cursor.execute("INSERT INTO django_content_type (id, app_label, model) "
                       "VALUES (%s, %s, %s)", [pk, app_label, model])
    cursor.execute("PRAGMA foreign_keys = ON")

from django_delayjobs import schedule
from tests.testapp.models import Thing

thing = Thing.objects.create()
job = schedule(thing.expire, in_=timedelta(hours=1))
setup_test_environment()  # ALLOWED_HOSTS for the test client
client = Client()
client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
page = client.get("/admin/django_delayjobs/job/").content.decode()
detail = client.get(f"/admin/django_delayjobs/job/{job.pk}/change/").content.decode()
label = f"Thing {thing.pk}"
print(json.dumps({"changelist": label in page, "detail": label in detail}))
"""


def test_the_admin_names_the_target_the_worker_runs_with_job_on_its_own_database(
    redis_url, tmp_path
):
    """The worker and the services read a target's content type where the project reads
    content types; the changelist joined the jobs database's table instead, which (made
    at another time) gives the id another model: the job of a Thing showed as another
    model's row, linked to that model's page."""
    env = {"DELAYJOBS_TEST_SQLITE": str(tmp_path / "default.sqlite3"),
           "DELAYJOBS_TEST_JOBS_DB": str(tmp_path / "jobs.sqlite3")}  # fmt: skip
    done = run_in_web_process(JOBS_APART, redis_url=redis_url, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-5000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "changelist": True, "detail": True}  # fmt: skip
