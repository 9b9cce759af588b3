"""Audit of the django.tasks backend, round 4: async tasks, queue names, the signals' sender,
errors after a failed attempt, enqueue's queries."""

from __future__ import annotations

import datetime

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_delayjobs import schedule, sql
from django_delayjobs.backends import DelayJobsBackend, InvalidTask, TaskResultStatus
from django_delayjobs.models import Job
from tests.helpers import burst_worker, run_in_web_process
from tests.testapp import task_functions as t
from tests.testapp.backends import SubclassBackend
from tests.testapp.models import Record
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_delayjobs.backends.DelayJobsBackend"
SUBCLASS = "tests.testapp.backends.SubclassBackend"

try:
    from django.tasks import default_task_backend
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks import signals as task_signals


@pytest.mark.slow
@pytest.mark.parametrize(("child", "code"), [("exit", 3), ("return", 0), ("raise", 1)])
def test_a_child_an_async_task_forks_ends_with_the_task(redis_url, tmp_path, child, code):
    """An async task ran its coroutine through the framework's ``Task.call`` (asgiref's
    ``async_to_sync``), not the worker's await of an async action: a child it forked in the
    event loop's thread came back into asgiref's loop thread with no parent thread to hand
    its result to, and waited there forever (the parent's wait killed it)."""
    result = t.fork_and_wait.enqueue(child, 10.0)
    log = tmp_path / "worker.log"
    assert burst_worker(redis_url, log, "-v", "3") == 0, log.read_text()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == code


@pytest.mark.parametrize("queues", [["default", "other"], []])
@pytest.mark.parametrize("name", [["default"], {"default": 1}, b"default", 5])
def test_a_queue_name_that_is_not_a_str_is_an_invalid_task(queues, name):
    """With QUEUES set, the framework's check looks the name up in a set: a list or a dict
    raised TypeError ("unhashable type")."""
    with (
        override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": queues}}),
        pytest.raises(InvalidTask, match="queue name must be a str"),
    ):
        t.add.using(queue_name=name)
    assert not Job.objects.exists()


@override_settings(TASKS={"default": {"BACKEND": BACKEND},
                          "own": {"BACKEND": SUBCLASS}})  # fmt: skip
def test_the_signals_of_a_task_name_the_class_of_the_backend_that_enqueued_it():
    """Django's backends send each signal with ``type(self)``: a receiver connected with
    ``sender=`` the project's subclass missed ``task_started`` and ``task_finished``, sent
    with ``DelayJobsBackend`` whatever backend enqueued the task."""
    seen: list[tuple[str, type, str]] = []

    def receiver(signal_name):
        def note(sender, task_result, **kwargs):
            seen.append((signal_name, sender, task_result.backend))

        return note

    names = ("task_enqueued", "task_started", "task_finished")
    receivers = {name: receiver(name) for name in names}
    for name in names:
        getattr(task_signals, name).connect(receivers[name])
    try:
        t.add.using(backend="own").enqueue(1, 2)
        t.add.enqueue(3, 4)
        call_command("run_delayworker", "--burst", "-v", "0")
    finally:
        for name in names:
            getattr(task_signals, name).disconnect(receivers[name])
    assert len(seen) == 6 and set(seen) == {
        (name, backend, alias)
        for backend, alias in ((SubclassBackend, "own"), (DelayJobsBackend, "default"))
        for name in names
    }


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit"])
def test_an_async_task_that_unwinds_fails_and_the_worker_goes_on(kind):
    """asyncio lets KeyboardInterrupt and SystemExit out of the event loop itself: the task
    has failed with it, its write rolled back, and the worker runs the next task."""
    failed, after = t.async_unwind.enqueue(kind), t.add.enqueue(1, 2)
    call_command("run_delayworker", "--burst", "-v", "0")
    failed.refresh()
    assert failed.status == TaskResultStatus.FAILED
    (error,) = failed.errors
    assert error.exception_class_path == f"builtins.{kind}"
    assert t.add.get_result(after.id).return_value == 3
    assert list(Record.objects.values_list("label", flat=True)) == ["add:1+2"]


TWO_ATTEMPTS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "other"]},
                "twice": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 2}}}  # fmt: skip


@override_settings(TASKS=TWO_ATTEMPTS)
@pytest.mark.parametrize("end", ["cancelled", "worker lost"])
def test_a_task_that_ends_without_an_error_of_its_own_after_a_failure_says_why(end):
    """A task's errors told why it ended (cancelled, its worker lost) only when no attempt
    had failed before: after one, they ended with that attempt's error, as if the task had
    died of it."""
    result = t.flaky.using(backend="twice").enqueue("f")
    call_command("run_delayworker", "--burst", "-v", "0")  # attempt 1 fails: retrying
    if end == "cancelled":
        assert Job.objects.get(pk=result.id).cancel()
        reason = "the job was cancelled"
    else:
        assert Job.objects.get(pk=result.id).reschedule(in_=0)  # skip the backoff
        for worker in ("lost-1", "lost-2", "lost-3"):  # MAX_DELIVERIES is 3 in the tests
            with transaction.atomic():  # a claim as Execution.claim writes it, never settled
                job = sql.claim(result.id, worker, timezone.now(), 3)
                assert job is not None
                sql.insert_event(job, "started", f"worker:{worker}", "attempt 2 of 2")
            # lost: its lease ended before the next delivery (a younger one is not taken over)
            lease_ended = timezone.now() - sql.takeover_delay()
            Job.objects.filter(pk=result.id).update(started_at=lease_ended)
        call_command("run_delayworker", "--burst", "-v", "0")
        reason = "never recorded an outcome"
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    first, last = result.errors
    assert first.exception_class is ValueError and "attempt 1 fails" in first.traceback
    assert last.exception_class_path == "django_delayjobs.exceptions.DelayJobsError"
    assert reason in last.traceback


def test_enqueue_makes_the_queries_of_schedule_and_no_more():
    """The result ``enqueue`` returns was read back from the events just written (one more
    query per enqueue than ``schedule()`` makes): a job just enqueued has no attempt yet."""
    t.add.enqueue(0, 0)  # the first of a process may read more (content types, say)
    schedule(record, in_=0, args=["first"])
    with CaptureQueriesContext(connection) as scheduling:
        schedule(record, in_=0, args=["x"])
    with CaptureQueriesContext(connection) as enqueueing:
        result = t.add.enqueue(1, 2)
    assert len(enqueueing) == len(scheduling), enqueueing.captured_queries
    assert result == default_task_backend.get_result(result.id)


#: A web process whose TASKS names a subclass of the backend: Django set up, no task
#: module imported, no backend made; it cancels a task's job by id, as the admin does.
CANCEL_IN_WEB_PROCESS = f"""
import sys
from django.conf import settings
settings.TASKS = {{"default": {{"BACKEND": {SUBCLASS!r}, "QUEUES": ["default", "other"]}}}}
import django
django.setup()
assert "tests.testapp.task_functions" not in sys.modules
try:
    from django.tasks.signals import task_finished
except ImportError:
    from django_tasks.signals import task_finished
from django_delayjobs.models import Job

finished = []
task_finished.connect(lambda sender, task_result, **kw: finished.append(
    (task_result.id, str(task_result.status), sender.__name__)), weak=False)
assert Job.objects.get(pk=sys.argv[1]).cancel()
print(finished)
"""


def test_a_task_cancelled_in_a_web_process_sends_task_finished_with_a_subclass_backend(
    redis_url,
):
    """The receivers that send task_finished were connected at start-up only when TASKS
    named DelayJobsBackend itself: with a project's subclass of it, a task cancelled in a
    process that made no backend (the admin's) finished without the signal."""
    result = t.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 2)
    child = run_in_web_process(CANCEL_IN_WEB_PROCESS, result.id, redis_url=redis_url)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == str([(result.id, "FAILED", "SubclassBackend")]), child.stderr


#: A process whose TASKS names only the framework's own backends (Django 6's default).
SET_UP_WITHOUT_THE_BACKEND = """
from django.conf import settings
package = "django.tasks" if __import__("django").VERSION >= (6,) else "django_tasks"
settings.TASKS = {"default": {"BACKEND": f"{package}.backends.immediate.ImmediateBackend"}}
import django
django.setup()
from django_delayjobs import signals
print(signals.job_started.has_listeners(), signals.job_succeeded.has_listeners())
"""


def test_a_project_that_does_not_use_the_backend_has_no_task_receivers(redis_url):
    """The receivers that translate the jobs' signals cost each job a few microseconds
    (the worker copies the job for job_started's receivers only when there are any)."""
    child = run_in_web_process(SET_UP_WITHOUT_THE_BACKEND, redis_url=redis_url)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "False False"
