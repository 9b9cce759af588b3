"""A ``django.tasks`` backend: Django's task API on the delayjobs engine.

``TASKS = {"default": {"BACKEND": "django_delayjobs.backends.DelayJobsBackend"}}`` on
Django 6 (native ``django.tasks``) or on Django 5.2 with the ``django-tasks`` backport.
``enqueue`` creates a Job through ``schedule`` (audit trail, outbox, validation); the
worker runs it like any action. Only ``@task`` functions whose module this process
imported can run: a Task registers itself when it is created, and nothing read from the
database is imported by path.

Django's own ``tests/tasks`` cases run against this backend in the project's test suite
(``tests/tasks_conformance``); docs/tasks.md lists the few that do not apply and why.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import uuid
from collections.abc import Awaitable, Iterable, Mapping
from inspect import Signature, iscoroutinefunction, signature
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from . import door, registry, serialization, signals, sql
from .engine import DelayJobsError, validate_name
from .execution import current_job
from .models import EventKind, Job, JobEvent, Status
from .rows import POISON, Unreadable, tolerant
from .task_api import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from .task_history import History

PREFIX = registry.TASK_PREFIX
ACTOR = "django.tasks:"  # + the backend alias: the actor of a task's "scheduled" event

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

#: The OPTIONS this backend reads, with their defaults. The framework has no retries: a
#: task that raises is FAILED at once unless MAX_ATTEMPTS allows more.
OPTIONS = {"MAX_ATTEMPTS": 1}

_tasks: dict[str, Task[Any, Any]] = {}


class TaskAction:
    """The registered action that runs one ``@task`` function, with context if it asks."""

    def __init__(self, task: Task[Any, Any]) -> None:
        self.delayable_name = PREFIX + task.module_path
        self.__qualname__ = self.__name__ = task.module_path
        params = list(signature(task.func).parameters.values())
        # What schedule() checks the arguments against: the function minus its context.
        self.__signature__ = Signature(params[1:] if task.takes_context else params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task = _tasks[self.delayable_name]
        if task.takes_context:
            job = current_job.get()
            if job is None:
                raise RuntimeError(f"{task.module_path} takes context: it runs in a worker")
            args = (TaskContext(task_result=to_result(job)), *args)
        if iscoroutinefunction(task.func):
            # A coroutine, which the worker awaits as an async action's (its ORM calls come
            # back to this thread, inside the worker's transaction; a child it forks ends
            # there), not Task.call's own async_to_sync.
            return _returned_async(task.acall(*args, **kwargs))
        return _returned(task.call(*args, **kwargs))


def _returned(value: Any) -> Any:
    """The framework's rule for return values: normalised to JSON types, and one that
    cannot be ("Unsupported type") fails the task, its database effects rolled back."""
    serialization.check_depth(value, "the task's return value")  # before recursing
    return json_keys(normalize_json(value), "the task's return value")


async def _returned_async(coroutine: Awaitable[Any]) -> Any:
    return _returned(await coroutine)


class DelayJobsBackend(BaseTaskBackend):
    supports_defer = True
    supports_get_result = True
    supports_async_task = True  # awaited by the worker, as an async action is
    supports_priority = True  # among jobs of a queue that become ready together (docs/tasks.md)

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, _params(alias, params))
        for queue in self.queues:
            try:
                validate_name(queue, "queue name")
            except (TypeError, ValueError) as exc:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['QUEUES']: {exc}") from None
        try:  # every enqueue writes it: refused here, not by each enqueue
            door.check_actor(ACTOR + alias)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]: the alias cannot name the actor 'django.tasks:<alias>' of "
                f"its tasks' history ({exc})"
            ) from None
        self.max_attempts = _options(alias, self.options)["MAX_ATTEMPTS"]
        connect_signals()

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Validate like every backend, then register the task as an action."""
        _check_kinds(task)
        try:  # before the framework's check, which looks the name up in a set (unhashable)
            validate_name(task.queue_name, "queue name")
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from None
        super().validate_task(task)
        if "<lambda>" in task.func.__qualname__:
            # Every lambda of a module has the same module_path: the worker would run
            # whichever registered last for all of them.
            raise InvalidTask(
                f"{task.module_path}: a lambda has no name of its own; define the task with def"
            )
        name = PREFIX + task.module_path
        try:  # refused here, when the task is defined, not by each enqueue
            door.check_column(name, "the task's action name ('task:' + its module_path)", "action")
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from None
        if name not in _tasks:
            registry.register(name, TaskAction(task))
        _tasks[name] = task  # .using() makes copies; any of them runs the same function

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        self.validate_task(task)
        try:  # before normalize_json, which recurses: schedule()'s depth limit, no RecursionError
            serialization.check_depth(args, "args")
            serialization.check_depth(kwargs, "kwargs")
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None
        # The framework's rule for arguments (TypeError "Unsupported type" otherwise, an
        # iterator's included), applied before anything is written.
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        try:
            args, kwargs = json_keys(args, "args"), json_keys(kwargs, "kwargs")
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None
        from .services import schedule

        try:
            job = schedule(
                registry._functions[PREFIX + task.module_path],
                at=task.run_after or timezone.now(),
                args=args,
                kwargs=kwargs,
                queue=task.queue_name,
                max_attempts=self.max_attempts,
                # validate_task (the framework's rule) allows any whole number (50.0, True)
                priority=int(task.priority),
                actor=ACTOR + self.alias,
            )
        except (TypeError, ValueError) as exc:
            raise InvalidTask(str(exc)) from exc
        result = to_result(job, task, History.enqueued(job, ACTOR + self.alias))
        # After the commit, the caller's enqueue is done: a receiver that raises is logged
        # (signals.send_logged), not raised from the atomic block's exit, where Django would
        # drop the transaction's later hooks (another job's hand-over to Redis, the caller's).
        transaction.on_commit(
            lambda: signals.send_logged(task_enqueued, type(self), task_result=result),
            using=sql.db(),
        )
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        try:
            pk = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        # Tolerantly: a row whose JSON Python cannot parse (written past every check) is
        # still this result, READY until a worker settles it as dead, then FAILED.
        job = tolerant(Job.objects.filter(pk=pk, action__startswith=PREFIX)).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return to_result(job)


def task_attempts(job: Job) -> int | None:
    """The MAX_ATTEMPTS of the backend that enqueued ``job``'s task (the alias its
    ``scheduled`` event names), or None when TASKS has no DelayJobsBackend by that alias."""
    actor = (
        JobEvent.objects.filter(job=job, kind=EventKind.SCHEDULED)
        .order_by("id").values_list("actor", flat=True).first()
    )  # fmt: skip
    if actor is None or not actor.startswith(ACTOR):
        return None
    try:
        backend = task_backends[actor.removeprefix(ACTOR)]
    except ImproperlyConfigured:  # InvalidTaskBackend: not in TASKS (any more)
        return None
    return backend.max_attempts if isinstance(backend, DelayJobsBackend) else None


def _check_kinds(task: Task[Any, Any]) -> None:
    """Refuse a ``run_after`` that is not a datetime or whose time zone gives no offset,
    or a ``priority`` that cannot be compared with numbers, as ``InvalidTask``: the
    framework's own checks compare and convert them, and raised ``AttributeError`` for a
    timedelta (it has no ``utcoffset``), ``NotImplementedError`` for a bare ``tzinfo``,
    ``TypeError`` for a str, ``ValueError`` for a NaN."""
    run_after = task.run_after
    if run_after is not None and not isinstance(run_after, datetime.datetime):
        delay = isinstance(run_after, datetime.timedelta)
        raise InvalidTask(
            f"run_after must be an aware datetime, not {type(run_after).__name__}"
            + (" (for a delay, pass run_after=timezone.now() + the timedelta)" if delay else "")
        )
    try:  # the framework's check asks for the offset and lets a bare tzinfo's error out
        if run_after is not None:
            run_after.utcoffset()
    except serialization.TZINFO_ERRORS as exc:
        raise InvalidTask(
            f"run_after={serialization.short_repr(run_after)} has a time zone that fails: {exc}"
        ) from None
    priority = task.priority
    try:  # what the framework's check computes; it says itself why a number is refused
        _ = (int(priority) == priority, priority < 0)
    except (ArithmeticError, TypeError, ValueError):  # int(nan), "5" < 0, Decimal("NaN") < 0
        raise InvalidTask(
            f"priority must be a whole number between -100 and 100, "
            f"not {serialization.short_repr(priority)}"
        ) from None


def json_keys(value: Any, path: str) -> Any:
    """``value`` (normalised by ``normalize_json``) with each dict key a str, as JSON
    writes it: ``1`` is ``"1"``, ``True`` ``"true"``, ``None`` ``"null"``. The framework
    keeps such keys (its database-backed backends store them as JSON's strings), while
    ``schedule()`` refuses them. Two keys that would become one raise ``ValueError``."""
    if isinstance(value, list):
        return [json_keys(item, path) for item in value]
    if not isinstance(value, dict):
        return value
    converted: dict[Any, Any] = {}
    original: dict[Any, Any] = {}
    for key, item in value.items():
        name = key if isinstance(key, str) else _json_key(key)
        if name in converted:
            raise ValueError(
                f"{path} has the keys {original[name]!r} and {key!r}, which JSON makes one "
                f"({name!r})"
            )
        converted[name], original[name] = json_keys(item, path), key
    return converted


def _json_key(key: object) -> object:
    """A key as JSON writes it; anything else (a float's nan) as it is, for dump to refuse."""
    if key is None or isinstance(key, bool):
        return {None: "null", True: "true", False: "false"}[key]
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float) and key == key and key not in (float("inf"), float("-inf")):
        return float.__repr__(key)
    return key


def _params(alias: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with OPTIONS None read as {} (as Django's backends read a missing one),
    or ImproperlyConfigured for QUEUES or OPTIONS of the wrong shape, not the TypeError
    (or, for a bare string, the set of its letters) the base class would make of them."""
    params = dict(params)
    options = params.get("OPTIONS")
    if options is None:
        params["OPTIONS"] = {}
    elif not isinstance(options, Mapping):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'] must be a dict, not {type(options).__name__}"
        )
    if "QUEUES" in params:
        queues = params["QUEUES"]
        if isinstance(queues, str | bytes) or not isinstance(queues, Iterable):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names, "
                f"not {type(queues).__name__}"
            )
        params["QUEUES"] = queues = list(queues)
        for queue in queues:
            if not isinstance(queue, str):
                raise ImproperlyConfigured(
                    f"TASKS[{alias!r}]['QUEUES']: a queue name must be a str, not {queue!r}"
                )
    return params


def _options(alias: str, options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']: unknown {', '.join(unknown)} "
            f"(DelayJobsBackend reads {', '.join(OPTIONS)})"
        )
    merged = {**OPTIONS, **options}
    attempts = merged["MAX_ATTEMPTS"]
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be an int from 1 to 1000, "
            f"not {attempts!r}"
        )
    return merged


def to_result(
    job: Job, task: Task[Any, Any] | None = None, history: History | None = None
) -> TaskResult[Any, Any]:
    """Map a Job (and its events, unless ``history`` is given) to the framework's TaskResult.

    ``task`` is the Task that was enqueued, when the caller has it; otherwise it is
    rebuilt from the registered task and what the job recorded of it.
    """
    registered = _tasks.get(job.action) or _discovered(job.action)
    if registered is None:
        raise TaskResultDoesNotExist(
            f"{job.pk}: task {job.action.removeprefix(PREFIX)} is not imported in this process"
        )
    deferred = job.get_deferred_fields()  # a signal's copy of the job may leave some out
    if deferred:  # read as get_result reads them: a corrupt value is an Unreadable
        job.refresh_from_db(fields=list(deferred), from_queryset=tolerant(Job.objects.all()))
    history = history or History.of(job)
    alias = history.actor.removeprefix(ACTOR) if history.actor.startswith(ACTOR) else None
    if task is None:
        task = _as_enqueued(
            registered,
            queue_name=job.queue,
            priority=job.priority,
            run_after=history.first_due if history.deferred else None,
            backend=alias or registered.backend,
        )
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=str(job.pk),
        status=STATUS[Status(job.status)],
        enqueued_at=job.created_at,
        started_at=history.started[0].at if history.started else None,
        finished_at=job.finished_at,
        last_attempted_at=history.started[-1].at if history.started else None,
        args=_loaded(job.args),
        kwargs=_loaded(job.kwargs),
        backend=alias or task.backend,
        errors=history.errors(job),
        worker_ids=[attempt.worker for attempt in history.started],
    )
    if job.status == Status.SUCCEEDED:
        object.__setattr__(result, "_return_value", _loaded(job.result))
    return result


def _loaded(value: Any) -> Any:
    """A stored value as the task gave it, or, when the row holds one that cannot be read
    (see ``rows``), an ``Unreadable``: the stored text, as the admin and the API show it."""
    if isinstance(value, Unreadable):
        return value
    try:
        return serialization.load(value)
    except POISON as exc:  # a tag whose value is no such thing ({"$dt": "not a time"})
        return Unreadable(serialization.short_repr(value), f"{type(exc).__name__}: {exc}")


_discovered_once = False
_discovering = threading.local()  # .active: this thread is importing the tasks modules


def _discovered(name: str) -> Task[Any, Any] | None:
    """The task ``name`` after importing every installed app's ``tasks`` module, as the
    worker does at start-up (once per process): a web process that reads a result by id
    has not necessarily imported the module of the task that made it.

    No lock of ours around the imports: a ``tasks.py`` that reads a result (or cancels a
    task's job) at import comes back here in the same thread, and waited for ever on a
    lock its own thread held. Python's import locks already import each module once,
    make another thread wait for a module under way, and, unlike a lock of ours held
    across imports, detect two threads each waiting for the other's module. The nested
    call imports the modules not reached yet; only the outermost marks the work done.
    """
    global _discovered_once
    if not _discovered_once:
        nested = getattr(_discovering, "active", False)
        _discovering.active = True
        try:
            autodiscover_modules("tasks")
        finally:
            _discovering.active = nested
        _discovered_once = _discovered_once or not nested
    return _tasks.get(name)


def _as_enqueued(task: Task[Any, Any], **fields: Any) -> Task[Any, Any]:
    """A copy of ``task`` with ``fields`` changed, without validating it again: a result
    stays readable when the settings that validated its task have changed since."""
    if all(getattr(task, name) == value for name, value in fields.items()):
        return task
    copy = object.__new__(type(task))
    for field in dataclasses.fields(task):
        object.__setattr__(copy, field.name, fields.get(field.name, getattr(task, field.name)))
    return copy


def connect_signals() -> None:
    """Translate the jobs' signals into the framework's. Idempotent (dispatch_uid): every
    backend instance connects them, and so does ``AppConfig.ready()``, for a process that
    creates none (a web process cancelling a task's job from the admin sends
    ``task_finished`` too)."""
    signals.job_started.connect(_started, dispatch_uid="delayjobs-tasks-started")
    signals.job_succeeded.connect(_finished, dispatch_uid="delayjobs-tasks-succeeded")
    signals.job_dead.connect(_finished, dispatch_uid="delayjobs-tasks-dead")
    signals.job_skipped.connect(_finished, dispatch_uid="delayjobs-tasks-skipped")
    signals.job_cancelled.connect(_finished, dispatch_uid="delayjobs-tasks-cancelled")


def _is_task(job: Job) -> bool:
    """Whether ``job`` runs a task this process has, or finds in an app's ``tasks.py``."""
    return job.action.startswith(PREFIX) and (
        job.action in _tasks or _discovered(job.action) is not None
    )


def _started(sender: Any, job: Job, **kwargs: Any) -> None:
    if _is_task(job):
        _send(task_started, to_result(job))


def requeued(job: Job) -> None:
    """``task_enqueued`` for a task's dead job that ``services.requeue`` made READY again,
    after its commit; in any process, one that has not imported the task included (found
    as ``_finished`` finds a cancelled one). Logged, never raised, like a receiver's
    error: the requeue has committed."""
    try:
        if _is_task(job):
            _send(task_enqueued, to_result(job))
    except Exception as exc:
        signals.logger.error("task_enqueued for requeued job %s was not sent", job.pk,
                             exc_info=exc)  # fmt: skip


def _send(signal: Any, result: TaskResult[Any, Any]) -> None:
    """Send ``signal`` from the class of the backend that enqueued the task, as Django's
    backends send theirs (``type(self)``); ``DelayJobsBackend`` for an alias gone since
    (or given to another backend)."""
    try:
        backend = task_backends[result.backend]
    except ImproperlyConfigured:  # InvalidTaskBackend: not in TASKS (any more)
        backend = None
    sender = type(backend) if isinstance(backend, DelayJobsBackend) else DelayJobsBackend
    signals.send_logged(signal, sender, task_result=result)


class TaskFailed(DelayJobsError):
    """Carries a failed task's traceback to ``task_finished`` receivers.

    The signal follows the committed outcome, after the task's own exception is gone;
    receivers that read ``sys.exc_info()`` (Django's, which logs a failed task with its
    exception) find this one, whose message is the task's traceback as recorded.
    """


def _finished(sender: Any, job: Job, error: str = "", **kwargs: Any) -> None:
    if not _is_task(job):
        return
    result = to_result(job)
    if result.status != TaskResultStatus.FAILED or not error:
        _send(task_finished, result)
        return
    try:
        raise TaskFailed(error)
    except TaskFailed:
        _send(task_finished, result)


__all__ = ["STATUS", "DelayJobsBackend", "TaskFailed", "connect_signals"]
