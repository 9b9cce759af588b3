"""Audit of the django.tasks backend, round 6: requeue, autodiscovery, corrupt rows."""

from __future__ import annotations

import datetime
import zoneinfo

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_delayjobs.backends import TaskResultDoesNotExist, TaskResultStatus
from django_delayjobs.models import Job, Status
from django_delayjobs.rows import Unreadable
from tests.testapp import task_functions as t

from .helpers import run_in_web_process
from .test_poison import plant
from .test_rest_helpers import client_for, url

try:
    from django.tasks import default_task_backend
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


def dead_task() -> Job:
    """A task that raised on its only attempt (the backend's MAX_ATTEMPTS, 1)."""
    result = t.explode.enqueue("boom")
    burst()
    job = Job.objects.get(pk=result.id)
    assert (job.status, job.attempts, job.max_attempts) == (Status.DEAD, 1, 1)
    return job


# -- 1. a requeued task gets the attempts of its backend ----------------------------------


def test_a_dead_task_requeued_in_the_admin_gets_its_backends_attempts(admin_client, settings):
    """Requeue gave a dead task DELAYJOBS['MAX_ATTEMPTS'] (5) more attempts, where the
    backend that enqueued it gives a task one: a requeued task that raised again was
    retried four times, READY between, against its backend's OPTIONS."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "MAX_ATTEMPTS": 5}
    job = dead_task()
    selection = {"action": "requeue_dead", ACTION_CHECKBOX_NAME: [str(job.pk)], "index": "0"}
    assert admin_client.post(reverse(CHANGELIST), selection).status_code == 302
    job.refresh_from_db()
    assert (job.status, job.max_attempts) == (Status.SCHEDULED, 2)
    burst()
    assert default_task_backend.get_result(str(job.pk)).status == TaskResultStatus.FAILED
    assert Job.objects.get(pk=job.pk).attempts == 2


def test_a_dead_task_requeued_through_the_api_gets_its_backends_attempts(admin_user):
    job = dead_task()
    response = client_for(admin_user).post(url("jobs", job.pk, "requeue"), {}, format="json")
    assert response.status_code == 200, response.content
    assert Job.objects.get(pk=job.pk).max_attempts == 2
    # attempts given in the request still win
    job = dead_task()
    body = {"attempts": 3}
    response = client_for(admin_user).post(url("jobs", job.pk, "requeue"), body, format="json")
    assert response.status_code == 200, response.content
    assert Job.objects.get(pk=job.pk).max_attempts == 4


# -- 2. autodiscovery is re-entrant ---------------------------------------------------------

#: A web process (no task module imported) reads a task's result by id: that imports the
#: apps' tasks.py, and tests/testapp/tasks.py, with DELAYJOBS_TEST_RESULT_ON_IMPORT set,
#: reads another result at import, of a task no module defines (one removed since).
RESULT_IN_WEB_PROCESS = """
import sys
import django
django.setup()
assert "tests.testapp.task_functions" not in sys.modules
try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend
print(default_task_backend.get_result(sys.argv[1]).status)
"""


def test_a_tasks_module_that_reads_a_result_at_import_does_not_deadlock(redis_url):
    """The first read of a task this process had not imported took a lock and imported
    the apps' tasks.py; one of them that read a result at import (or cancelled a task's
    job, whose signal reads one) asked for the same lock in the same thread: the process
    hung for ever."""
    outer = t.add.enqueue(1, 2)
    gone = Job.objects.create(action="task:tests.testapp.removed.task", queue="default",
                              run_at=timezone.now())  # fmt: skip
    child = run_in_web_process(RESULT_IN_WEB_PROCESS, outer.id, redis_url=redis_url,
                               env={"DELAYJOBS_TEST_RESULT_ON_IMPORT": str(gone.pk)},
                               timeout=30)  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["at-import:TaskResultDoesNotExist", "READY"], child.stderr


# -- 3. a corrupt row reads back, and ends visibly dead --------------------------------------


@pytest.mark.parametrize(
    "name", ["args nested 1500 deep", "kwargs 5000-digit int", "created_at year 20000"]
)
def test_a_corrupt_tasks_result_reads_back_and_ends_failed(name, admin_client, admin_user):
    """A task's row whose arguments Python cannot parse (written past every check, with
    raw SQL) made get_result raise the parser's RecursionError or ValueError: not
    TaskResultDoesNotExist (the row is there), nor a result. It now reads as what it is,
    READY, then FAILED once a worker has settled it as dead, the stored text in place of
    the value that cannot be read. Its death sends task_finished (its receiver read the
    row the same way, and failed)."""
    finished = []

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result.status)

    task_signals.task_finished.connect(on_finished)
    try:
        corrupt_task_reads_back_and_ends_failed(name, admin_client, admin_user)
    finally:
        task_signals.task_finished.disconnect(on_finished)
    assert finished == [TaskResultStatus.FAILED]


def corrupt_task_reads_back_and_ends_failed(name, admin_client, admin_user):
    result = t.add.enqueue(1, 2)
    plant(Job.objects.get(pk=result.id), name)
    read = default_task_backend.get_result(result.id)
    assert read.status == TaskResultStatus.READY
    field = {"created_at": "enqueued_at"}.get(name.split()[0], name.split()[0])
    assert isinstance(getattr(read, field), Unreadable)
    burst()
    read = default_task_backend.get_result(result.id)
    assert read.status == TaskResultStatus.FAILED
    assert Job.objects.filter(pk=result.id).values_list("status", flat=True).get() == Status.DEAD
    assert "cannot" in read.errors[-1].traceback
    change = reverse("admin:django_delayjobs_job_change", args=[result.id])
    assert admin_client.get(change).status_code == 200
    assert client_for(admin_user).get(url("jobs", result.id)).status_code == 200


def test_a_task_whose_arguments_hold_a_broken_tag_reads_back():
    """Valid JSON whose value cannot be loaded (a datetime tag holding no time)."""
    result = t.add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(args=[{"$dt": "not a time"}, 2])
    read = default_task_backend.get_result(result.id)
    assert isinstance(read.args, Unreadable) and read.status == TaskResultStatus.READY


def test_an_unknown_id_is_still_task_result_does_not_exist():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("00000000-0000-0000-0000-000000000000")


# -- 4. what a result reads back ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "read"),
    [
        (Status.SCHEDULED, TaskResultStatus.READY),
        (Status.RETRYING, TaskResultStatus.READY),
        (Status.RUNNING, TaskResultStatus.RUNNING),
        (Status.SUCCEEDED, TaskResultStatus.SUCCESSFUL),
        (Status.DEAD, TaskResultStatus.FAILED),
        (Status.CANCELLED, TaskResultStatus.FAILED),
        (Status.SKIPPED, TaskResultStatus.FAILED),
    ],
)
def test_every_job_status_reads_as_docs_tasks_says(status, read):
    result = t.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(status=status, result=3)
    assert default_task_backend.get_result(result.id).status == read


def test_run_after_in_another_zone_reads_back_as_the_same_instant_and_a_past_one_as_none():
    kolkata = zoneinfo.ZoneInfo("Asia/Kolkata")
    later = (timezone.now() + datetime.timedelta(hours=1)).astimezone(kolkata)
    result = t.add.using(run_after=later).enqueue(1, 2)
    assert default_task_backend.get_result(result.id).task.run_after == later
    past = (timezone.now() - datetime.timedelta(days=1)).astimezone(kolkata)
    result = t.add.using(run_after=past).enqueue(1, 2)
    assert Job.objects.get(pk=result.id).run_at == past  # due at once
    assert default_task_backend.get_result(result.id).task.run_after is None
