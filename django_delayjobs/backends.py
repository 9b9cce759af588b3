"""A ``django.tasks`` backend: Django's task API on the delayjobs engine.

``TASKS = {"default": {"BACKEND": "django_delayjobs.backends.DelayJobsBackend"}}`` on
Django 6 (native ``django.tasks``) or on Django 5.2 with the ``django-tasks`` backport.
``enqueue`` creates a Job through ``schedule`` (audit trail, outbox, validation); the
worker runs it like any action. Only ``@task`` functions whose module this process
imported can run: a Task registers itself when it is created, and nothing read from the
database is imported by path.
"""

from __future__ import annotations

import datetime
import uuid
from inspect import Signature, signature
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from . import registry, serialization, signals
from .engine import validate_name
from .models import EventKind, Job, JobEvent, Status

if TYPE_CHECKING:  # type-check against Django 6's own module (django-stubs has it)
    from django.tasks import TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
else:
    try:  # Django 6.0+
        from django.tasks import TaskResultStatus
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks import TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started

from .execution import current_job

PREFIX = "task:"

#: How each job status reads in the task framework, which has only four. A cancelled or
#: skipped job never ran to success and will not run again: FAILED ("was unable to start").
STATUS = {
    Status.SCHEDULED: TaskResultStatus.READY,
    Status.RETRYING: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    Status.DEAD: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
    Status.SKIPPED: TaskResultStatus.FAILED,
}

_tasks: dict[str, Task[Any, Any]] = {}


class TaskAction:
    """The registered action that runs one ``@task`` function, with context if it asks."""

    def __init__(self, task: Task[Any, Any]) -> None:
        self.task = task
        self.delayable_name = PREFIX + task.module_path
        self.__qualname__ = self.__name__ = task.module_path
        params = list(signature(task.func).parameters.values())
        # What schedule() checks the arguments against: the function minus its context.
        self.__signature__ = Signature(params[1:] if task.takes_context else params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task = _tasks[self.delayable_name]
        if task.takes_context:
            job = current_job.get()
            assert job is not None, "a task with context runs only in a worker"
            return task.call(TaskContext(task_result=to_result(job)), *args, **kwargs)
        return task.call(*args, **kwargs)


class DelayJobsBackend(BaseTaskBackend):
    supports_defer = True
    supports_get_result = True
    supports_async_task = False  # the worker runs actions in threads, not an event loop
    supports_priority = False  # queues are served in strict order; no per-task priority

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        for queue in self.queues:
            validate_name(queue, "queue name")
        # The framework has no retries: a task that raises is FAILED. OPTIONS may allow more.
        self.max_attempts = int(self.options.get("MAX_ATTEMPTS", 1))
        # Idempotent (dispatch_uid): every backend instance translates the same signals.
        signals.job_started.connect(_started, dispatch_uid="delayjobs-tasks-started")
        signals.job_succeeded.connect(_finished, dispatch_uid="delayjobs-tasks-succeeded")
        signals.job_dead.connect(_finished, dispatch_uid="delayjobs-tasks-dead")

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Validate like every backend, then register the task as an action."""
        super().validate_task(task)
        try:
            validate_name(task.queue_name, "queue name")
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None
        name = PREFIX + task.module_path
        if name not in _tasks:
            registry.register(name, TaskAction(task))
        _tasks[name] = task  # .using() makes copies; any of them runs the same function

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        self.validate_task(task)
        run_after = task.run_after
        if isinstance(run_after, datetime.timedelta):  # older backport versions allow it
            run_after = timezone.now() + run_after
        from .services import schedule

        try:
            job = schedule(
                registry._functions[PREFIX + task.module_path],
                at=run_after or timezone.now(),
                args=list(args),
                kwargs=dict(kwargs),
                queue=task.queue_name,
                max_attempts=self.max_attempts,
                actor=f"django.tasks:{self.alias}",
            )
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from exc
        result = to_result(job, task)
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result))
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        try:
            job = Job.objects.get(pk=uuid.UUID(str(result_id)), action__startswith=PREFIX)
        except (ValueError, Job.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        return to_result(job)


def to_result(job: Job, task: Task[Any, Any] | None = None) -> TaskResult[Any, Any]:
    """Map a Job (and its events) to the framework's TaskResult."""
    task = task or _tasks.get(job.action)
    if task is None:
        raise TaskResultDoesNotExist(
            f"{job.pk}: task {job.action.removeprefix(PREFIX)} is not imported in this process"
        )
    events = list(
        JobEvent.objects.filter(job=job, kind__in=[EventKind.STARTED, EventKind.FAILED])
        .order_by("at", "id").values_list("kind", "actor", "message", "at")
    )  # fmt: skip
    started = [(actor, at) for kind, actor, _, at in events if kind == EventKind.STARTED]
    errors = [TaskError(exception_class_path=_exception_path(message), traceback=message)
              for kind, _, message, _ in events if kind == EventKind.FAILED]  # fmt: skip
    if job.status in (Status.DEAD, Status.SKIPPED, Status.CANCELLED) and not errors:
        errors.append(
            TaskError(
                exception_class_path="django_delayjobs.exceptions.DelayJobsError",
                traceback=job.last_error or f"the job was {job.status}",
            )
        )
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=str(job.pk),
        status=STATUS[Status(job.status)],
        enqueued_at=job.created_at,
        started_at=started[0][1] if started else None,
        finished_at=job.finished_at,
        last_attempted_at=started[-1][1] if started else None,
        args=serialization.load(job.args),
        kwargs=serialization.load(job.kwargs),
        backend=task.backend,
        errors=errors,
        worker_ids=[actor.removeprefix("worker:") for actor, _ in started],
    )
    if job.status == Status.SUCCEEDED:
        object.__setattr__(result, "_return_value", serialization.load(job.result))
    return result


def _exception_path(traceback_text: str) -> str:
    """Read the exception's class path off the last line of a formatted traceback."""
    last = traceback_text.strip().splitlines()[-1] if traceback_text.strip() else ""
    name = last.split(":", 1)[0].strip()
    if not name or " " in name:
        return "builtins.Exception"
    return name if "." in name else f"builtins.{name}"


def _started(sender: Any, job: Job, **kwargs: Any) -> None:
    if job.action.startswith(PREFIX) and job.action in _tasks:
        task_started.send(DelayJobsBackend, task_result=to_result(job))


def _finished(sender: Any, job: Job, **kwargs: Any) -> None:
    if job.action.startswith(PREFIX) and job.action in _tasks:
        task_finished.send(DelayJobsBackend, task_result=to_result(job))


__all__ = ["STATUS", "DelayJobsBackend"]
