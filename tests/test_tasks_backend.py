"""The django.tasks backend, on Django 6 (native) and Django 5.2 (django-tasks backport)."""

from __future__ import annotations

import datetime

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_delayjobs import sql
from django_delayjobs.backends import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from django_delayjobs.models import Job, Status
from tests.testapp import task_functions as t
from tests.testapp.models import Record

try:
    from django.tasks import default_task_backend, task
    from django.tasks import signals as task_signals
except ImportError:
    from django_tasks import default_task_backend, task
    from django_tasks import signals as task_signals

pytestmark = pytest.mark.django_db(transaction=True)

#: Module-level lambdas: every one of them has the module_path "<module>.<lambda>".
FIRST_LAMBDA = lambda: "first"  # noqa: E731
SECOND_LAMBDA = lambda: "second"  # noqa: E731


def burst() -> None:
    call_command("run_delayworker", "--burst", "--queues", "default,other", "-v", "0")


def test_backend_declares_its_capabilities():
    backend = default_task_backend
    assert (backend.supports_defer, backend.supports_get_result) == (True, True)
    assert (backend.supports_async_task, backend.supports_priority) == (True, True)


def test_enqueue_creates_a_job_and_runs_it():
    result = t.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    job = Job.objects.get(pk=result.id)
    assert (job.action, job.queue, job.status) == ("task:tests.testapp.task_functions.add",
                                                   "default", Status.SCHEDULED)  # fmt: skip
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert t.add.get_result(result.id).return_value == 5


def test_run_after_defers_the_task():
    when = timezone.now() + datetime.timedelta(hours=1)
    result = t.add.using(run_after=when).enqueue(1, 1)
    assert Job.objects.get(pk=result.id).run_at == when
    burst()
    assert t.add.get_result(result.id).status == TaskResultStatus.READY
    assert not Record.objects.exists()


def test_running_task_sees_its_context():
    result = t.introspect.enqueue("ctx")
    burst()
    assert t.introspect.get_result(result.id).return_value == {"attempt": 1, "status": "RUNNING"}


def test_an_attempt_delivered_twice_is_one_attempt_run_by_its_last_worker():
    """A worker claimed the attempt and was lost before it recorded an outcome; the
    attempt is delivered again. The task sees attempt 1, and its result one attempt."""
    result = t.introspect.enqueue("ctx")
    with transaction.atomic():  # the lost worker's claim, as Execution.claim writes it
        job = sql.claim(result.id, "lost", timezone.now(), 5)
        assert job is not None and job.attempts == 1
        sql.insert_event(job, "started", "worker:lost", "attempt 1 of 1")
    # Long enough ago for its lease to have ended (a younger running row is not taken over)
    Job.objects.filter(pk=result.id).update(started_at=timezone.now() - sql.takeover_delay())
    burst()
    read = t.introspect.get_result(result.id)
    assert Job.objects.get(pk=result.id).deliveries == 2
    assert read.return_value == {"attempt": 1, "status": "RUNNING"}
    assert read.attempts == 1 and len(read.worker_ids) == 1
    assert read.worker_ids != ["lost"]


def test_a_task_that_raises_is_failed_with_its_error():
    result = t.explode.enqueue("bad input")
    burst()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert "bad input" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_cancelled_job_reads_as_failed():
    result = t.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 2)
    assert Job.objects.get(pk=result.id).cancel()
    assert t.add.get_result(result.id).status == TaskResultStatus.FAILED


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: t.add.using(run_after=datetime.datetime(2030, 1, 1)), "aware"),
        (lambda: t.add.using(queue_name="nope"), "nope"),
        (lambda: t.add.using(priority=101), "priority"),
        (lambda: t.add.using(priority=-101), "priority"),
    ],
)
def test_invalid_tasks_are_refused(make, message):
    with pytest.raises(InvalidTask, match=message):
        make()


def test_a_task_priority_is_stored_and_read_back():
    result = t.add.using(priority=-100, run_after=timezone.now() + datetime.timedelta(hours=1)
                         ).enqueue(1, 2)  # fmt: skip
    assert Job.objects.get(pk=result.id).priority == -100
    assert t.add.get_result(result.id).task.priority == -100


def test_a_whole_number_priority_that_validate_task_accepts_is_enqueued_as_an_int():
    """The framework's validate_task accepts any whole number (int(p) == p): 50.0, True."""
    future = timezone.now() + datetime.timedelta(hours=1)
    for priority, stored in [(50.0, 50), (True, 1)]:
        result = t.add.using(priority=priority, run_after=future).enqueue(1, 2)
        job = Job.objects.get(pk=result.id)
        assert job.priority == stored and type(job.priority) is int


def nested(depth: int) -> list[object]:
    deep: list[object] = []
    inner = deep
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return deep


def containing_itself() -> dict[str, object]:
    loop: dict[str, object] = {}
    loop["me"] = [loop]
    return loop


@pytest.mark.parametrize("make", [lambda: nested(5000), containing_itself, lambda: nested(40)])
def test_arguments_nested_too_deep_are_refused_not_a_recursion_error(make):
    """schedule()'s depth limit (32), before the framework's recursive normalize_json."""
    value = make()
    with pytest.raises(InvalidTask, match="levels deep"):
        t.add.enqueue(value, 1)
    with pytest.raises(InvalidTask, match="levels deep"):
        t.add.enqueue(1, b=value)
    assert not Job.objects.exists()


def test_a_lambda_is_refused_as_a_task():
    """Django's module-level rule lets a module-level lambda through, but all the lambdas
    of a module share one module_path: a worker would run the last one registered for
    every one of them."""
    with pytest.raises(InvalidTask, match="lambda"):
        task(FIRST_LAMBDA)
    with pytest.raises(InvalidTask, match="lambda"):
        task(SECOND_LAMBDA)
    assert not Job.objects.exists()


def long_named() -> None:
    pass


long_named.__qualname__ = "Outer." * 50 + "long_named"  # as nested classes make it


def test_a_task_whose_action_name_the_column_cannot_hold_is_refused_when_defined():
    """The job's action is "task:" + module_path, in a 255-character column: refused when
    the task is defined (validate_task), not left to fail at each enqueue."""
    with pytest.raises(InvalidTask, match="at most 255 fit"):
        task(long_named)


def test_argument_keys_are_json_keys():
    """normalize_json keeps a key 3 or None; JSON (and the framework's database-backed
    backends) make it "3" or "null". Two keys that JSON makes one are refused."""
    future = timezone.now() + datetime.timedelta(hours=1)
    result = t.add.using(run_after=future).enqueue({3: "a", None: "b", True: "c"}, b={2.5: 0})
    assert result.args == [{"3": "a", "null": "b", "true": "c"}] and result.kwargs == {
        "b": {"2.5": 0}}  # fmt: skip
    assert t.add.get_result(result.id).args == result.args
    for value in ({1: "int", "1": "str"}, [{"true": 1, True: 2}]):
        with pytest.raises(InvalidTask, match="which JSON makes one"):
            t.add.enqueue(value, 1)
    with pytest.raises(InvalidTask, match="key nan"):
        t.add.enqueue({float("nan"): 1}, 1)
    assert Job.objects.count() == 1


def test_a_queue_name_that_is_not_a_str_is_an_invalid_task():
    """With QUEUES empty the framework checks no queue name: ours refuses one that is
    not a str as InvalidTask, as it refuses a malformed one."""
    backend = "django_delayjobs.backends.DelayJobsBackend"
    with override_settings(TASKS={"default": {"BACKEND": backend, "QUEUES": []}}):
        for name in (5, "a b"):
            with pytest.raises(InvalidTask, match="queue name"):
                t.add.using(queue_name=name)


def test_bad_arguments_are_refused_and_nothing_is_written():
    with pytest.raises(InvalidTask):
        t.add.enqueue(1)  # missing b
    with pytest.raises((InvalidTask, TypeError)):
        t.add.enqueue(1, object())
    with pytest.raises(InvalidTask, match="MAX_JSON_BYTES"):
        t.add.enqueue(1, "x" * (1 << 20))
    assert not Job.objects.exists()


def test_enqueue_inside_a_rolled_back_transaction_leaves_nothing(redis_client):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        t.add.enqueue(1, 2)
        1 / 0  # noqa: B018
    assert not Job.objects.exists()
    assert redis_client.dbsize() == 0


def test_unknown_result_ids():
    for bad in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bad)


def test_framework_signals_are_sent():
    seen: list[tuple[str, str]] = []

    def on(name):
        def receiver(sender, task_result, **kwargs):
            seen.append((name, str(task_result.status)))

        return receiver

    receivers = {name: on(name) for name in ("task_enqueued", "task_started", "task_finished")}
    for name, receiver in receivers.items():
        getattr(task_signals, name).connect(receiver)
    try:
        t.add.enqueue(4, 4)
        burst()
    finally:
        for name, receiver in receivers.items():
            getattr(task_signals, name).disconnect(receiver)
    assert seen == [("task_enqueued", "READY"), ("task_started", "RUNNING"),
                    ("task_finished", "SUCCESSFUL")]  # fmt: skip
