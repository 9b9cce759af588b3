"""Audit of the django.tasks backend and of the services' job references."""

from __future__ import annotations

import datetime
import logging
import uuid
import zoneinfo

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from django_delayjobs import services
from django_delayjobs.backends import TaskResultStatus
from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job, Status
from tests.testapp import task_functions as t

try:
    from django.tasks import default_task_backend
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_delayjobs.backends.DelayJobsBackend"
DEFAULT = {"BACKEND": BACKEND, "QUEUES": ["default", "other"]}
TWO_ALIASES = {"default": DEFAULT, "second": {"BACKEND": BACKEND}}


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


def held() -> int:
    """How many ids Redis holds for the default queue, waiting or ready."""
    stats = get_engine().stats("default")
    return stats.pending + stats.ready


def _raise(sender, task_result, **kwargs):
    raise RuntimeError(f"receiver failed for {task_result.id}")


def test_a_task_enqueued_receiver_that_raises_skips_no_hook_of_the_transaction(caplog):
    """The signal follows the commit: a receiver raising there reached the caller as the
    atomic block's exit (the rows committed), and Django dropped the transaction's later
    hooks: the next job's hand-over to Redis (until reconcile) and the caller's own."""
    hooks: list[str] = []
    task_signals.task_enqueued.connect(_raise)
    try:
        with caplog.at_level(logging.ERROR), transaction.atomic():
            first = t.add.enqueue(1, 2)
            second = t.add.enqueue(3, 4)
            transaction.on_commit(lambda: hooks.append("caller's hook"))
    finally:
        task_signals.task_enqueued.disconnect(_raise)
    assert hooks == ["caller's hook"]
    assert held() == 2 and Job.objects.filter(pk__in=[first.id, second.id]).count() == 2
    assert f"receiver failed for {second.id}" in caplog.text


def test_a_task_enqueued_receiver_that_raises_outside_a_transaction(caplog):
    """The same without a transaction: enqueue returns the result of the job it wrote
    (a caller told it failed would enqueue the task again), the receiver's error logged,
    and the receivers after it are still called."""
    seen: list[str] = []

    def after(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_signals.task_enqueued.connect(_raise)
    task_signals.task_enqueued.connect(after)
    try:
        with caplog.at_level(logging.ERROR):
            result = t.add.enqueue(1, 2)
    finally:
        task_signals.task_enqueued.disconnect(_raise)
        task_signals.task_enqueued.disconnect(after)
    assert seen == [result.id]
    assert held() == 1
    assert f"receiver failed for {result.id}" in caplog.text
    burst()
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_started_or_finished_receiver_that_raises_stops_no_other_receiver(caplog):
    seen: list[str] = []

    def after(sender, task_result, **kwargs):
        seen.append(str(task_result.status))

    for signal in (task_signals.task_started, task_signals.task_finished):
        signal.connect(_raise)
        signal.connect(after)
    try:
        with caplog.at_level(logging.ERROR):
            result = t.add.enqueue(1, 2)
            burst()
    finally:
        for signal in (task_signals.task_started, task_signals.task_finished):
            signal.disconnect(_raise)
            signal.disconnect(after)
    assert seen == ["RUNNING", "SUCCESSFUL"]
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_run_after_reads_back_as_the_same_aware_instant_to_the_microsecond():
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    when = datetime.datetime(2090, 7, 1, 12, 30, 45, 123457, tzinfo=paris)
    result = t.add.using(run_after=when).enqueue(1, 2)
    read = default_task_backend.get_result(result.id).task.run_after
    assert read == when and read.utcoffset() is not None
    assert read.astimezone(datetime.UTC).microsecond == 123457


def test_the_worker_runs_a_task_of_an_alias_removed_since_and_its_result_reads(caplog):
    """A result names the alias that enqueued it; with that alias gone from TASKS, the
    worker still runs the job (a task runs by its function), and the result is read
    through another alias as the django-tasks database backend reads one (any alias's
    row), without the removed alias's settings being looked up."""
    with override_settings(TASKS=TWO_ALIASES):
        result = t.introspect.using(backend="second").enqueue("gone")
    with caplog.at_level(logging.ERROR):
        burst()
    job = Job.objects.get(pk=result.id)
    assert job.status == Status.SUCCEEDED, job.last_error
    assert job.result == {"attempt": 1, "status": "RUNNING"}
    read = default_task_backend.get_result(result.id)
    assert (read.status, read.backend, read.task.backend) == ("SUCCESSFUL", "second", "second")
    assert read.return_value == {"attempt": 1, "status": "RUNNING"}
    assert "Traceback" not in caplog.text


MALFORMED = ["not-a-uuid", b"0" * 32, 1.5, [1], "", "\x00", -1, 2**200, None, True]
MISSING = [uuid.uuid4(), str(uuid.uuid4()).upper(), 42]


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue", "purge"])
def test_services_refuse_a_malformed_job_id_with_validation_error(verb):
    call = {"reschedule": lambda ref: services.reschedule(ref, in_=60)}.get(
        verb, getattr(services, verb)
    )
    for ref in MALFORMED:
        with pytest.raises(ValidationError):
            call(ref)
    for ref in MISSING:
        with pytest.raises(Job.DoesNotExist):
            call(ref)


def test_the_django_tasks_versions_pyproject_allows_have_the_api_the_backend_uses():
    """django-tasks 0.9 to 0.11 name a task's status SUCCEEDED (Django 6 and 0.12:
    SUCCESSFUL): on them ``django_delayjobs.backends`` failed at import, with an
    AttributeError from its STATUS table (checked against their wheels). The ``tasks``
    extra and ``dev`` both allowed them."""
    import tomllib

    from tests.helpers import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = [req for req in extras["tasks"] + extras["dev"] if req.startswith("django-tasks")]
    assert pins == ["django-tasks>=0.12", "django-tasks>=0.12"]
