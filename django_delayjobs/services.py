"""The verbs: schedule, cancel, reschedule, requeue, purge. Admin, API and user code all
call these; nothing else writes Job rows outside the worker.

Every change is a conditional UPDATE (the database is the judge), recorded by a JobEvent in
the same transaction; Redis follows on commit and is repaired by reconcile if it can't.
"""

from __future__ import annotations

import datetime
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, models, transaction
from django.db.models import F
from django.utils import timezone

from . import serialization, signals, sql, timing
from .conf import delayjobs_settings
from .connection import get_engine
from .engine import MAX_BATCH, EngineUnavailable, validate_name
from .exceptions import AlreadyRunning, InvalidSchedule
from .models import ACTIVE, WAITING, EventKind, Job, JobEvent, Status
from .outcomes import Outage
from .registry import BoundAction, DelayableMethod, describe
from .rows import Unreadable

logger = logging.getLogger("django_delayjobs")

#: One warning when Redis stops taking this process's changes, one when it takes them
#: again: not a traceback per ``schedule()`` while it is down.
_outage = Outage(
    "django_delayjobs", "changes are committed to the database; reconcile hands them to Redis"
)


def _after_commit(fn: Callable[[], Any]) -> None:
    transaction.on_commit(fn, using=sql.db())


def _send(signal: Any, job: Job, **kwargs: Any) -> None:
    _after_commit(lambda: signals.send(signal, job, **kwargs))


def _event(job: Job, kind: str, actor: str, message: str = "") -> None:
    sql.insert_event(job, kind, actor, message)


# -- Redis side, after commit ---------------------------------------------------------


def push(jobs: Iterable[Job]) -> int:
    """Hand jobs to the engine; on failure log and leave them to reconcile. Never raises."""
    by_queue: dict[str, dict[str, int]] = defaultdict(dict)
    for job in jobs:
        by_queue[job.queue][str(job.pk)] = timing.to_ms(job.run_at)
    added = 0
    try:
        engine = get_engine()
        for queue, items in by_queue.items():
            ids = list(items)
            for start in range(0, len(ids), MAX_BATCH):
                chunk = {i: items[i] for i in ids[start : start + MAX_BATCH]}
                added += len(engine.add(queue, chunk))
        _outage.ok()
    except EngineUnavailable as exc:
        # The rows are committed and scheduled: reconcile re-adds what Redis lacks.
        _outage.failed(exc)
    except Exception:  # a bug: still never the caller's problem, whose rows committed
        logger.exception("could not hand jobs to Redis; reconcile will")
    return added


def _redis(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
            _outage.ok()
        except EngineUnavailable as exc:
            _outage.failed(exc)

    return run


# -- schedule ---------------------------------------------------------------------------


_signature = cache(inspect.signature)  # actions are registered functions: a few, for good


def _check_arguments(fn: Any, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(args, list | tuple):
        raise TypeError(f"args must be a list or tuple, not {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, not {type(kwargs).__name__}")
    func = fn.method.func if isinstance(fn, BoundAction) else fn
    try:
        signature = _signature(func)
        if isinstance(fn, BoundAction):
            signature.bind(fn.instance, *args, **kwargs)
        else:
            signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"the arguments do not fit {func.__qualname__}: {exc}") from None
    return serialization.dump(list(args), "args"), serialization.dump(kwargs, "kwargs")


#: The most attempts a job may have: PostgreSQL's ``integer`` column (the narrowest of the
#: supported databases) holds no more.
MAX_ATTEMPTS_LIMIT = 2**31 - 1


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 1:
        raise InvalidSchedule(f"{what} must be at least 1, got {value}")
    if value > MAX_ATTEMPTS_LIMIT:
        raise InvalidSchedule(f"{what} must be at most {MAX_ATTEMPTS_LIMIT} (a 32-bit column)")
    return value


def _text(value: object, what: str, field: str, model: type[models.Model] = Job) -> str:
    """``value`` if it is a str the column ``field`` stores as it is, else raise."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    column = model._meta.get_field(field)
    assert isinstance(column, models.CharField)
    return serialization.check_text(value, what, column.max_length)


def _actor(actor: object) -> str:
    return _text(actor, "actor", "actor", JobEvent)


def _queue(value: object) -> str:
    try:
        return validate_name(value, "queue")
    except ValueError as exc:
        raise InvalidSchedule(str(exc)) from None


def _key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise TypeError(f"key must be a non-empty str (at most 255 characters), not {key!r}")
    return _text(key, "key", "key")


def _check_built(job: Job, now: datetime.datetime) -> None:
    """The door for a job handed to ``schedule_many``: what ``build_job`` checks, on the
    values the job holds (it may have been changed, or built without ``build_job``)."""
    if not isinstance(job, Job):
        raise TypeError(f"schedule_many takes jobs made by build_job, not {job!r}")
    job.run_at = timing.within_range(timing.aware(job.run_at, "run_at"), "run_at", now)
    if job.expires_at is not None:
        expires_at = timing.aware(job.expires_at, "expires_at")
        job.expires_at = timing.within_range(expires_at, "expires_at", now)
        if job.expires_at <= job.run_at:
            raise InvalidSchedule("expires_at must be later than run_at")
    _queue(job.queue)
    _text(job.action, "action", "action")
    if job.target_id is not None:
        _text(job.target_id, "the target's primary key", "target_id")
    _positive_int(job.max_attempts, "max_attempts")
    if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
        raise TypeError("a job's args must be a list and its kwargs a dict: use build_job")
    serialization.check_stored(job.args, "args")
    serialization.check_stored(job.kwargs, "kwargs")


def build_job(
    fn: Callable[..., Any],
    *,
    in_: Any = None,
    at: Any = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
    expires: Any = None,
) -> Job:
    """Validate one ``schedule`` call and return its unsaved Job. Touches nothing."""
    ref = describe(fn)
    now = timezone.now()
    run_at = timing.due_time(in_, at, now)
    stored_args, stored_kwargs = _check_arguments(fn, args, kwargs)
    attempts = delayjobs_settings.MAX_ATTEMPTS if max_attempts is None else max_attempts
    job = Job(
        queue=_queue(delayjobs_settings.DEFAULT_QUEUE if queue is None else queue),
        action=_text(ref.name, "the action's name", "action"),
        args=stored_args,
        kwargs=stored_kwargs,
        key=_key(key),
        run_at=run_at,
        expires_at=timing.expiry(expires, run_at, now),
        max_attempts=_positive_int(attempts, "max_attempts"),
    )
    if ref.target is not None:
        job.target_type = ContentType.objects.get_for_model(ref.target, for_concrete_model=False)
        job.target_id = _text(str(ref.target.pk), "the target's primary key", "target_id")
    return job


def _existing(job: Job) -> Job | None:
    return Job.objects.filter(queue=job.queue, key=job.key, status__in=ACTIVE).first()


def _insert(job: Job, replace: bool, actor: str) -> Job:
    """Insert one job honouring its key; return the job now holding the key."""
    if job.key is None:
        job.save(force_insert=True)
    else:
        current = _existing(job)
        if current is not None and not (replace and cancel(current, actor=actor)):
            return current
        try:
            with transaction.atomic(using=sql.db()):
                job.save(force_insert=True)
        except IntegrityError:
            # A concurrent schedule with the same key committed first: its job is the one.
            current = _existing(job)
            if current is None:
                raise
            return current
    _event(job, EventKind.SCHEDULED, actor, f"due {job.run_at.isoformat()}")
    _send(signals.job_scheduled, job)
    return job


def schedule(
    fn: Callable[..., Any],
    *,
    in_: Any = None,
    at: Any = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    key: str | None = None,
    max_attempts: int | None = None,
    expires: Any = None,
    replace: bool = False,
    actor: str = "code",
) -> Job:
    """Schedule ``fn`` (a ``@delayable`` function or model method) and return its Job."""
    job = build_job(
        fn, in_=in_, at=at, args=args, kwargs=kwargs, queue=queue, key=key,
        max_attempts=max_attempts, expires=expires,
    )  # fmt: skip
    return submit(job, replace=replace, actor=actor)


def submit(job: Job, *, replace: bool = False, actor: str = "code") -> Job:
    """Insert a job built by ``build_job``, honouring its key; return the job that holds
    the key now (``job`` itself unless an active job already held it)."""
    actor = _actor(actor)
    with transaction.atomic(using=sql.db()):
        stored = _insert(job, replace, actor)
    if stored is job:
        _after_commit(lambda: push([job]))
    return stored


def schedule_many(jobs: Iterable[Job], *, actor: str = "code") -> list[Job]:
    """Insert jobs built by ``build_job`` in one transaction and one Redis round trip.

    Keys are not allowed here (use ``schedule`` for deduplicated jobs).
    """
    batch = list(jobs)
    if any(getattr(job, "key", None) is not None for job in batch):
        raise InvalidSchedule("schedule_many does not take keyed jobs; use schedule(key=...)")
    now = timezone.now()
    for job in batch:
        _check_built(job, now)
    actor = _actor(actor)
    with transaction.atomic(using=sql.db()):
        Job.objects.bulk_create(batch)
        sql.insert_events(
            (job, EventKind.SCHEDULED, actor, f"due {job.run_at.isoformat()}") for job in batch
        )

        def after() -> None:
            push(batch)
            for job in batch:
                signals.send(signals.job_scheduled, job)

        _after_commit(after)
    return batch


# -- cancel, reschedule, requeue, purge ---------------------------------------------------


def _job(job: Job | Any) -> Job:
    if isinstance(job, Job):
        return job
    return Job.objects.get(pk=job)


def cancel(job: Job | Any, *, actor: str = "code") -> bool:
    """Cancel a job that has not started; True when this call won."""
    job = _job(job)
    now = timezone.now()
    with transaction.atomic(using=sql.db()):
        won = Job.objects.filter(pk=job.pk, status__in=WAITING).update(
            status=Status.CANCELLED, finished_at=now
        )
        if won:
            job.status, job.finished_at = Status.CANCELLED, now
            _event(job, EventKind.CANCELLED, actor)
            _after_commit(_redis(lambda: get_engine().remove(job.queue, [str(job.pk)])))
            _send(signals.job_cancelled, job)
    return bool(won)


def cancel_for(
    obj: models.Model, action: Any = None, *, actor: str = "code", fail_if_running: bool = False
) -> int:
    """Cancel the waiting jobs bound to ``obj`` (only ``action``'s, if given); return how many.

    With ``fail_if_running``, raise ``AlreadyRunning`` if a matching job has already
    started: inside the caller's transaction that rolls the caller back too (a payment that
    arrives while the auto-cancel runs is refused, instead of racing it).
    """
    if obj.pk is None:
        raise ValueError(f"{obj!r} is not saved, so no job can target it")
    jobs = Job.objects.filter(
        target_type=ContentType.objects.get_for_model(obj, for_concrete_model=False),
        target_id=str(obj.pk),
    )
    if action is not None:
        jobs = jobs.filter(action=_action_name(obj, action))
    cancelled = sum(cancel(job, actor=actor) for job in jobs.filter(status__in=WAITING))
    if fail_if_running:
        running = jobs.filter(status=Status.RUNNING).first()
        if running is not None:
            raise AlreadyRunning(f"{running.action} for {obj!r} is already running ({running.pk})")
    return cancelled


def _action_name(obj: models.Model, action: Any) -> str:
    if isinstance(action, str):
        return action
    if isinstance(action, DelayableMethod):
        return f"{obj._meta.label}.{action.name}"
    return describe(action).name


def reschedule(job: Job | Any, *, in_: Any = None, at: Any = None, actor: str = "code") -> bool:
    """Move a job that has not started to a new due time; True when this call won."""
    job = _job(job)
    run_at = timing.due_time(in_, at)
    actor = _actor(actor)
    if isinstance(job.expires_at, Unreadable):  # a poison row read by rows.tolerant()
        raise InvalidSchedule(f"the job's expires_at cannot be read ({job.expires_at}): cancel it")
    if job.expires_at is not None and run_at > job.expires_at:
        raise InvalidSchedule(
            f"the new due time {run_at} is after the job expires ({job.expires_at})"
        )
    with transaction.atomic(using=sql.db()):
        won = Job.objects.filter(pk=job.pk, status__in=WAITING).update(run_at=run_at)
        if won:
            before, job.run_at = job.run_at, run_at
            _event(
                job,
                EventKind.RESCHEDULED,
                actor,
                # a due time that could not be read (a poison row) is repaired here
                f"from {_iso(before)} to {run_at.isoformat()}",
            )
            # add() moves a pending id; an id already promoted is handed back by the
            # worker, which sees the new run_at when it claims the row.
            _after_commit(lambda: push([job]))
    return bool(won)


def _iso(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime.datetime) else str(value)


def requeue(job: Job | Any, *, actor: str = "code", attempts: int | None = None) -> bool:
    """Give a dead job ``attempts`` more tries (default: MAX_ATTEMPTS), due now."""
    job = _job(job)
    extra = _positive_int(
        delayjobs_settings.MAX_ATTEMPTS if attempts is None else attempts, "attempts"
    )
    if job.attempts > MAX_ATTEMPTS_LIMIT - extra:  # a dead job's attempts no longer change
        raise InvalidSchedule(f"{job.attempts} + {extra} attempts exceed {MAX_ATTEMPTS_LIMIT}")
    actor = _actor(actor)
    now = timezone.now()
    with transaction.atomic(using=sql.db()):
        won = Job.objects.filter(pk=job.pk, status=Status.DEAD).update(
            status=Status.SCHEDULED, run_at=now, finished_at=None,
            # Attempts only grow: the attempt number is the fencing token of outcomes.
            max_attempts=F("attempts") + extra,
        )  # fmt: skip
        if won:
            job.refresh_from_db()
            _event(job, EventKind.REQUEUED, actor, f"{extra} more attempt(s)")
            _after_commit(lambda: _requeue_in_redis(job))
    return bool(won)


def _requeue_in_redis(job: Job) -> None:
    try:
        if get_engine().requeue(job.queue, [str(job.pk)]) == 0:
            push([job])  # not in garbage (Redis lost it): add it afresh
        _outage.ok()
    except EngineUnavailable as exc:
        _outage.failed(exc)


def purge(job: Job | Any) -> bool:
    """Delete a dead job and its history for good; True when it was dead and is gone."""
    job = _job(job)
    with transaction.atomic(using=sql.db()):
        deleted, _ = Job.objects.filter(pk=job.pk, status=Status.DEAD).delete()
        if deleted:
            _after_commit(_redis(lambda: get_engine().purge(job.queue, [str(job.pk)])))
    return bool(deleted)
