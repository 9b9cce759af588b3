"""The verbs: schedule, cancel, reschedule, requeue, purge, forget. Admin, API and user code all
call these; nothing else writes Job rows outside the worker.

Every change is a conditional UPDATE (the database is the judge), recorded by a JobEvent in
the same transaction; Redis follows on commit and is repaired by reconcile if it can't.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any

from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from . import door, serialization, signals, sql, timing
from .callbacks.action import check_scheduled
from .conf import delayjobs_settings
from .connection import get_engine
from .engine import MAX_BATCH, EngineUnavailable, PerShard, validate_name
from .exceptions import AlreadyRunning, InvalidSchedule
from .models import ACTIVE, WAITING, EventKind, Job, JobEvent, Status
from .outcomes import Outage, follow_row
from .registry import (
    TASK_PREFIX,
    BoundAction,
    DelayableMethod,
    check_arguments,
    check_database,
    describe,
    instance_name,
)
from .rows import Unreadable, tolerant

logger = logging.getLogger("django_delayjobs")

#: One warning when Redis stops taking this process's changes, one when it takes them
#: again: not a traceback per ``schedule()`` while it is down.
_outage = Outage(
    "django_delayjobs", "changes are committed to the database; reconcile hands them to Redis"
)


class RedisSkipped:
    """What ``skip_redis_after_a_failure`` saw: whether a Redis call failed (``down``)."""

    down = False


_skipping: ContextVar[RedisSkipped | None] = ContextVar("delayjobs_skipping", default=None)


@contextlib.contextmanager
def skip_redis_after_a_failure() -> Iterator[RedisSkipped]:
    """Within: once a Redis call after a commit has failed, skip the later ones, leaving
    them to reconcile as a failed call does. For a series of changes (an admin action
    over many jobs): a Redis that does not answer costs each call its read timeout, and
    a hundred jobs took minutes."""
    state = RedisSkipped()
    token = _skipping.set(state)
    try:
        yield state
    finally:
        _skipping.reset(token)


def _skip() -> bool:
    """Whether to skip this Redis call (a call within the scope above has failed)."""
    state = _skipping.get()
    return state is not None and state.down


def _unavailable(exc: EngineUnavailable) -> None:
    _outage.failed(exc)
    state = _skipping.get()
    if state is not None:
        state.down = True


def _after_commit(fn: Callable[[], Any]) -> None:
    transaction.on_commit(fn, using=sql.db())


def _send(signal: Any, job: Job, **kwargs: Any) -> None:
    _after_commit(lambda: signals.send(signal, job, **kwargs))


def _event(job: Job, kind: str, actor: str, message: str = "") -> None:
    """Append an event at the attempt the row holds (the caller's copy may be older)."""
    sql.insert_event_at_row(job, kind, actor, message)


# -- Redis side, after commit ---------------------------------------------------------


def push(jobs: Iterable[Job]) -> int:
    """Hand jobs to the engine; on failure log and leave them to reconcile. Never raises."""
    if _skip():
        return 0
    by_queue: dict[str, dict[str, float]] = defaultdict(dict)
    priorities: dict[str, int] = {}
    for job in jobs:
        by_queue[job.queue][str(job.pk)] = timing.to_ms(job.run_at)
        if job.priority:
            priorities[str(job.pk)] = job.priority
    added = 0
    try:
        engine = get_engine()
        # A shard whose master is down leaves the others' adds be; on one Redis that does
        # not answer, the first add's wait is the only one (each would wait as long).
        each = PerShard(one_server=not engine.is_cluster)
        for queue, items in by_queue.items():
            ids = list(items)
            for start in range(0, len(ids), MAX_BATCH):
                chunk = {i: items[i] for i in ids[start : start + MAX_BATCH]}
                ranks = {i: priorities[i] for i in chunk if i in priorities}
                added += len(each.run(partial(engine.add, queue, chunk, ranks), list[str]()))
        each.check()
        _outage.ok()
    except EngineUnavailable as exc:
        # The rows are committed and scheduled: reconcile re-adds what Redis lacks.
        _unavailable(exc)
    except Exception:  # a bug: still never the caller's problem, whose rows committed
        logger.exception("could not hand jobs to Redis; reconcile will")
    return added


def _redis(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` as an on-commit hook that never raises: a hook raising after the commit
    would reach the caller, and Django would skip the transaction's later hooks."""

    def run() -> None:
        if _skip():
            return
        try:
            fn()
            _outage.ok()
        except EngineUnavailable as exc:
            _unavailable(exc)
        except Exception:  # a bug, or a row no Redis key can name: reconcile skips it too
            logger.exception("could not update Redis after a commit; reconcile will")

    return run


# -- schedule ---------------------------------------------------------------------------


def _check_arguments(fn: Any, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    if not isinstance(args, list | tuple):
        raise TypeError(f"args must be a list or tuple, not {type(args).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, not {type(kwargs).__name__}")
    # Both checks read one plain copy, keys as exact text: a subclass binds through
    # keys()/__getitem__ (a key through its own __hash__ and __eq__), which may differ
    # from the items() that dump() reads.
    args = list(args)
    if type(kwargs) is not dict or any(type(key) is not str for key in kwargs):
        pairs = list(kwargs.items())
        kwargs = {str.__str__(k) if isinstance(k, str) else k: v for k, v in pairs}
        if len(kwargs) != len(pairs):
            raise InvalidSchedule("kwargs has two keys of the same text: pass each once")
    if isinstance(fn, BoundAction):
        check_arguments(fn.method.func, args, kwargs, method=True)
    else:
        check_arguments(fn, args, kwargs, method=False)
    stored = serialization.dump(args, "args"), serialization.dump(kwargs, "kwargs")
    serialization.check_size(stored, "args and kwargs", delayjobs_settings.MAX_JSON_BYTES)
    return stored


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
    priority: int = 0,
) -> Job:
    """Validate one ``schedule`` call and return its unsaved Job. Touches nothing."""
    ref = describe(fn)
    now = timezone.now()
    run_at = timing.due_time(in_, at, now)
    stored_args, stored_kwargs = _check_arguments(fn, args, kwargs)
    check_scheduled(ref.name, stored_kwargs)
    attempts = delayjobs_settings.MAX_ATTEMPTS if max_attempts is None else max_attempts
    job = Job(
        queue=door.check_queue(delayjobs_settings.DEFAULT_QUEUE if queue is None else queue),
        action=door.check_column(ref.name, "the action's name", "action"),
        args=stored_args,
        kwargs=stored_kwargs,
        key=door.check_key(key),
        run_at=run_at,
        expires_at=timing.expiry(expires, run_at, now),
        max_attempts=door.check_positive(attempts, "max_attempts"),
        priority=door.check_priority(priority),
    )
    if ref.target is not None:
        job.target_type = ContentType.objects.get_for_model(ref.target, for_concrete_model=False)
        job.target_id = door.target_id(ref.target)
    return job


def _scheduled(job: Job, actor: str) -> tuple[Job, str, str, str]:
    """The ``scheduled`` event of a new job (for ``sql.insert_events``)."""
    return (job, EventKind.SCHEDULED, actor, f"due {job.run_at.isoformat()}")


def _existing(job: Job) -> Job | None:
    """The active job holding ``job``'s key, read by ``tolerant``: a holder whose row cannot
    be read back (a poison row) is returned, or cancelled by ``replace``, like any other."""
    holders = Job.objects.filter(queue=job.queue, key=job.key, status__in=ACTIVE)
    return tolerant(holders).first()


def _insert(job: Job, replace: bool, actor: str) -> Job:
    """Insert one job honouring its key; return the job now holding the key."""
    # The row is written from ``job``: its copy is exact (no read of the row).
    if job.key is None:
        sql.insert_jobs([job], [_scheduled(job, actor)])  # both through one cursor
    elif (holder := _insert_keyed(job, replace, actor)) is not None:
        return holder
    else:
        sql.insert_events([_scheduled(job, actor)])
    return job


def _insert_keyed(job: Job, replace: bool, actor: str) -> Job | None:
    """Insert ``job`` unless an active job holds its key; return that job, or None once
    ``job`` is in. ``replace`` cancels a waiting holder first; a running one stays.

    Concurrent calls with the key make what was read stale: the holder was cancelled or
    finished meanwhile (another ``replace``, a worker), its running attempt failed and it
    waits for the next (a holder to cancel again), or a rival's job committed first (the
    INSERT hits the key's constraint). Each time, the key is read again.
    """
    refused = 0
    while True:
        current = _existing(job)
        if current is not None:
            if not replace:
                return current
            if not cancel(current, actor=actor):
                still = tolerant(Job.objects.filter(pk=current.pk, status=Status.RUNNING)).first()
                if still is not None:  # running: it cannot be replaced
                    return still
                continue  # finished, or its attempt failed since (waiting again)
        try:
            with transaction.atomic(using=sql.db()):
                sql.insert_jobs([job])
            return None
        except IntegrityError:
            refused += 1
            if refused == 3:  # not the key's constraint (or a storm of rivals): say so
                raise


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
    priority: int = 0,
    replace: bool = False,
    actor: str = "code",
) -> Job:
    """Schedule ``fn`` (a ``@delayable`` function or model method) and return its Job."""
    job = build_job(
        fn, in_=in_, at=at, args=args, kwargs=kwargs, queue=queue, key=key,
        max_attempts=max_attempts, expires=expires, priority=priority,
    )  # fmt: skip
    return submit(job, replace=replace, actor=actor)


def submit(job: Job, *, replace: bool = False, actor: str = "code") -> Job:
    """Insert a job built by ``build_job``, honouring its key; return the job that holds
    the key now (``job`` itself unless an active job already held it)."""
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be a bool, not {type(replace).__name__}")
    if replace and job.key is None:  # ignored, it would schedule one more job each time
        raise TypeError("replace=True needs a key=: it replaces the job holding that key")
    actor = door.check_actor(actor)
    with transaction.atomic(using=sql.db()):
        stored = _insert(job, replace, actor)
    if stored is job:
        # Pushed before the signal, as schedule_many does: a receiver that cancels or
        # reschedules the job finds its id in Redis, not added again after its change.
        _after_commit(lambda: push([job]))
        _send(signals.job_scheduled, job)
    return stored


def schedule_many(jobs: Iterable[Job], *, actor: str = "code") -> list[Job]:
    """Insert jobs built by ``build_job`` in one transaction; one Redis call per queue
    (per shard of a sharded queue, and per 5,000 jobs), on commit.

    Keys are not allowed here (use ``schedule`` for deduplicated jobs).
    """
    batch = list(jobs)
    if any(getattr(job, "key", None) is not None for job in batch):
        raise InvalidSchedule("schedule_many does not take keyed jobs; use schedule(key=...)")
    door.check_batch(batch, timezone.now())
    actor = door.check_actor(actor)
    try:
        with transaction.atomic(using=sql.db()):
            sql.insert_jobs(batch, (_scheduled(job, actor) for job in batch))

            def after() -> None:
                push(batch)
                for job in batch:
                    signals.send(signals.job_scheduled, job)

            _after_commit(after)
    except IntegrityError:  # rolled back (to the savepoint, in the caller's transaction)
        taken = Job.objects.filter(pk__in=[job.pk for job in batch]).first()
        if taken is None:
            raise
        raise InvalidSchedule(
            f"job {taken.pk} is already scheduled: schedule_many inserts new jobs"
        ) from None
    return batch


# -- cancel, reschedule, requeue, purge ---------------------------------------------------


def _job(job: Job | Any) -> Job:
    """``job``, or the Job whose id it is (a UUID, its text or its int).

    Anything else is ``ValidationError``, as Django's UUID field says of a bad text:
    the field lets bytes through to ``uuid.UUID``, whose ``TypeError`` escaped, and
    read None as "no job" and True as the id 1. An id without a row is ``DoesNotExist``.
    """
    if isinstance(job, Job):
        return job
    if isinstance(job, bool) or not isinstance(job, uuid.UUID | str | int):
        raise ValidationError(
            f"a job is given as a Job or its id (a UUID), not {type(job).__name__}",
            code="invalid",
        )
    pk: uuid.UUID = Job._meta.pk.to_python(job)  # ValidationError for a bad text or int
    return tolerant(Job.objects.filter(pk=pk)).get()  # a poison row can still be changed


def cancel(job: Job | Any, *, actor: str = "code") -> bool:
    """Cancel a job that has not started; True when this call won."""
    actor = door.check_actor(actor)
    job = _job(job)
    while True:
        now = timezone.now()
        with transaction.atomic(using=sql.db()):
            queue = sql.cancel_waiting(job.pk, now)
            if queue is not None:
                job.status, job.finished_at = Status.CANCELLED, now
                _event(job, EventKind.CANCELLED, actor)
                _after_commit(_redis(partial(_remove, queue, str(job.pk))))
                _send(signals.job_cancelled, job)
                return True
        if not _waiting_again(job):
            return False


def _remove(queue: str, job_id: str) -> None:
    get_engine().remove(queue, [job_id])


def _waiting_again(job: Job) -> bool:
    """After a verb found ``job`` neither scheduled nor retrying: whether it is one now.
    An attempt running then may have failed since, and the job waits for its next one:
    the verb, in time for that attempt, tries again rather than say it came too late.
    (Each try lost to a new claim of the job: they end with its attempts.)"""
    return Job.objects.filter(pk=job.pk, status__in=WAITING).exists()


def cancel_for(
    obj: models.Model, action: Any = None, *, actor: str = "code", fail_if_running: bool = False
) -> int:
    """Cancel the waiting jobs bound to ``obj`` (only ``action``'s, if given); return how many.

    With ``fail_if_running``, raise ``AlreadyRunning`` if a matching job has already
    started, with this call's cancels undone: inside the caller's transaction that rolls
    the caller back too (a payment that arrives while the auto-cancel runs is refused,
    instead of racing it). Called by an action, its own job is not one of them.
    """
    if not isinstance(obj, models.Model):
        raise TypeError(f"cancel_for takes a model instance, not {type(obj).__name__}")
    if not isinstance(fail_if_running, bool):  # not its truth: "false" would be True
        raise TypeError(f"fail_if_running must be a bool, not {type(fail_if_running).__name__}")
    actor = door.check_actor(actor)  # here, not only when a job is found
    family = _same_row_models(obj)
    names = None if action is None else _action_names(obj, action, family)
    for name in names or ():
        # before any query: the database refuses a NUL or a lone surrogate (PostgreSQL
        # aborting the caller's transaction)
        serialization.check_text(name, "action")
    if obj.pk is None:
        raise ValueError(f"this {type(obj).__name__} is not saved, so no job can target it")
    if obj._meta.is_composite_pk:  # schedule() refuses it: no job can target it
        return 0
    try:
        check_database(obj)
    except InvalidSchedule:  # schedule() refuses it: its pk names a row of another database
        return 0
    try:
        # and the key's text as the instance holds it, which older versions stored
        target_ids = {door.target_id(obj), serialization.check_text(str(obj.pk), "pk")}
    except InvalidSchedule:  # schedule() refuses it: no job can target it
        return 0
    types = ContentType.objects.get_for_models(*family, for_concrete_models=False).values()
    jobs = Job.objects.filter(target_type__in=list(types), target_id__in=target_ids)
    if names is not None:
        jobs = jobs.filter(action__in=names)
    # tolerant: a poison row among them is cancelled too, and stops no other
    if not fail_if_running:
        return sum(cancel(job, actor=actor) for job in tolerant(jobs.filter(status__in=WAITING)))
    from .execution import current_job

    if (calling := current_job.get()) is not None:  # an action: its own job is no rival
        jobs = jobs.exclude(pk=calling.pk)
    # One transaction: a refusal undoes this call's cancels even where no caller's
    # transaction would (autocommit), so a call that raises has changed nothing.
    with transaction.atomic(using=sql.db()):
        return sum(
            _cancel_unless_running(job, obj, actor)
            for job in tolerant(jobs.filter(status__in=ACTIVE))
        )


def _cancel_unless_running(job: Job, obj: models.Model, actor: str) -> bool:
    """Cancel ``job``; False if it finished meanwhile; ``AlreadyRunning`` if it runs.

    A lost cancel reads the status again: a job seen running may have failed its attempt
    since, and waits for its next one (``retrying``), which this cancel must still stop.
    """
    while not cancel(job, actor=actor):
        status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()
        if status == Status.RUNNING:
            raise AlreadyRunning(
                f"{job.action} for {instance_name(obj)} is already running ({job.pk})"
            )
        if status not in WAITING:
            return False
    return True


def _same_row_models(obj: models.Model) -> list[type[models.Model]]:
    """The models whose instance of ``obj``'s key is ``obj``'s row: its concrete model, the
    multi-table parents and children sharing that key, and their proxies. A job scheduled
    through an instance of any of them names that model (its content type, its label in
    the action), and targets ``obj``'s row all the same. A sibling child is another row."""
    concrete = obj._meta.concrete_model
    mine = _key_chain(concrete)
    others = (model for model in apps.get_models()
              if model._meta.concrete_model in mine or concrete in _key_chain(model))  # fmt: skip
    return list(dict.fromkeys([type(obj), *others]))


def _key_chain(model: type[models.Model] | None) -> list[type[models.Model]]:
    """``model``'s concrete model and the multi-table parents whose key its key is."""
    chain: list[type[models.Model]] = []
    current: Any = model and model._meta.concrete_model
    while current is not None:
        chain.append(current)
        key = current._meta.pk
        parent_link = key.remote_field is not None and key.remote_field.parent_link
        current = key.related_model._meta.concrete_model if parent_link else None
    return chain


def _action_names(obj: models.Model, action: Any, family: list[type[models.Model]]) -> list[str]:
    if isinstance(action, str):
        return [action]
    if isinstance(action, BoundAction):  # obj.cancel: the method, whoever it is bound to
        action = action.method
    if isinstance(action, DelayableMethod):
        # The name is the model's the job was scheduled through (a proxy's own, as
        # schedule() stores it): a method of an unrelated model would name the object's
        # own method of that name.
        owner = action.owner or object
        if not any(issubclass(model, owner) for model in family):
            raise TypeError(
                f"{action!r} is a method of {owner.__name__}, and {instance_name(obj)} is not "
                "one (nor the row of one)"
            )
        return [f"{model._meta.label}.{action.name}" for model in family
                if issubclass(model, owner)]  # fmt: skip
    return [describe(action).name]


def reschedule(job: Job | Any, *, in_: Any = None, at: Any = None, actor: str = "code") -> bool:
    """Move a job that has not started to a new due time; True when this call won."""
    job = _job(job)
    run_at = timing.due_time(in_, at)
    actor = door.check_actor(actor)
    while True:
        with transaction.atomic(using=sql.db()):
            # The row as it is now, locked until the UPDATE: its due time is the one
            # replaced, and its queue, priority and expiry the ones that count, whatever
            # copy of the job the caller holds (one it changed, a poison row's).
            waiting = Job.objects.select_for_update().filter(pk=job.pk, status__in=WAITING)
            row = tolerant(waiting.only("run_at", "queue", "priority", "expires_at")).first()
            if row is not None:
                _check_expiry(row, run_at)
            if row is not None and waiting.update(run_at=run_at):
                before, job.run_at, row.run_at = row.run_at, run_at, run_at
                _event(
                    job,
                    EventKind.RESCHEDULED,
                    actor,
                    # a due time that could not be read (a poison row) is repaired here
                    f"from {_iso(before)} to {run_at.isoformat()}",
                )
                # add() moves a pending id; an id already promoted is handed back by the
                # worker, which sees the new run_at when it claims the row.
                _after_commit(partial(_push_rescheduled, row))
                return True
        if not _waiting_again(job):
            return False


def _push_rescheduled(row: Job) -> None:
    """Give Redis the due time a reschedule committed, then the row's until they agree.

    Reschedules of one job commit in the order of its row's lock, but their pushes may
    reach Redis in the other order, leaving it the older due time: the job ran late (until
    reconcile, which only moves an id earlier) or was handed out early and deferred. So
    the row is read back after each push (``follow_row``, the worker's rule after a nack).
    """
    added = push([row])
    try:
        follow_row(get_engine(), row.queue, str(row.pk), timing.to_ms(row.run_at),
                   held=bool(added))  # fmt: skip
    except EngineUnavailable as exc:
        _unavailable(exc)
    except Exception:  # as in _redis: an on-commit hook never raises
        logger.exception("could not update Redis after a reschedule of job %s; reconcile "
                         "will", row.pk)  # fmt: skip


def _check_expiry(row: Job, run_at: datetime.datetime) -> None:
    """Refuse ``run_at`` for a job that would never run then (``build_job``'s rule)."""
    if isinstance(row.expires_at, Unreadable):  # a poison row read by rows.tolerant()
        raise InvalidSchedule(f"the job's expires_at cannot be read ({row.expires_at}): cancel it")
    if row.expires_at is not None:
        timing.check_runnable(run_at, row.expires_at)


def _iso(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime.datetime) else str(value)


def requeue(job: Job | Any, *, actor: str = "code", attempts: int | None = None) -> bool:
    """Give a dead job ``attempts`` more tries, due now (default: MAX_ATTEMPTS, or for a
    ``django.tasks`` task the MAX_ATTEMPTS of the backend that enqueued it)."""
    from .callbacks.action import check_requeue

    job = _job(job)
    if job.status == Status.DEAD:  # else the UPDATE below says it is not dead
        check_requeue(job.action, job.kwargs)  # a request no attempt sends: it would die again
    extra = door.check_positive(_attempts_for(job) if attempts is None else attempts, "attempts")
    most = door.MAX_ATTEMPTS_LIMIT - extra  # the row's attempts, not a copy's: see below
    actor = door.check_actor(actor)
    dead = Job.objects.filter(pk=job.pk, status=Status.DEAD)
    with transaction.atomic(using=sql.db()):
        won = _revive(job, extra, most)
        if won:
            # Tolerantly: a poison row (JSON Python cannot parse) is requeued all the same,
            # and its worker settles it as dead with the reason.
            job.refresh_from_db(from_queryset=tolerant(Job.objects.all()))
            _event(job, EventKind.REQUEUED, actor, f"{extra} more attempt(s)")
            _after_commit(lambda: _requeue_in_redis(job))
            _task_requeued(job)
        elif refused := tolerant(dead.only("attempts", "expires_at")).first():
            if refused.attempts > most:  # max_attempts would overflow its column
                raise InvalidSchedule(
                    f"{refused.attempts} + {extra} attempts exceed {door.MAX_ATTEMPTS_LIMIT}"
                )
            raise InvalidSchedule(
                f"the job expired at {_iso(refused.expires_at)}: it would be skipped at once"
            )
    return bool(won)


def _revive(job: Job, extra: int, most: int) -> int:
    """Make ``job`` scheduled, due now, with ``extra`` more attempts if it is dead, has at
    most ``most`` and is not past its expiry; return the rows changed (0 or 1).

    The key's constraint refuses it while an active job holds the key: that job is named.
    A holder that finished before it was looked up leaves the key free, and the UPDATE is
    tried again, as ``_insert_keyed`` tries an INSERT (a rival may take the key first)."""
    dead, key = Job.objects.filter(pk=job.pk, status=Status.DEAD), job.key
    for _ in range(3):
        now = timezone.now()
        # one past its expiry would be skipped at once: never to run, as reschedule
        unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        try:
            with transaction.atomic(using=sql.db()):  # the key's constraint may refuse it
                return dead.filter(unexpired, attempts__lte=most).update(
                    status=Status.SCHEDULED, run_at=now, finished_at=None,
                    # Attempts only grow: the attempt number is the fencing token of outcomes.
                    max_attempts=F("attempts") + extra,
                )  # fmt: skip
        except IntegrityError:
            # the key, not a copy's; gone if a purge committed since: not requeued
            row = Job.objects.only("queue", "key").filter(pk=job.pk).first()
            if row is None:
                return 0
            key, holder = row.key, _existing(row)
            if holder is not None:
                raise InvalidSchedule(
                    f"job {holder.pk} holds the key {key!r} now: cancel it first"
                ) from None
    raise InvalidSchedule(
        f"the key {key!r} was taken by another job as this one was requeued: try again"
    )


def _task_requeued(job: Job) -> None:
    """After the requeue commits, ``task_enqueued`` for a ``django.tasks`` task's job: it
    is READY again and will send ``task_started`` and ``task_finished`` again."""
    # Told by its name, as in _attempts_for: a plain job imports no django.tasks.
    if isinstance(job.action, str) and job.action.startswith(TASK_PREFIX):
        try:
            from .backends import requeued
        except ImportError:  # neither django.tasks nor the backport: no backend enqueued it
            return
        _after_commit(lambda: requeued(job))


def _attempts_for(job: Job) -> int:
    """The attempts a requeue gives ``job`` by default: what its enqueue gave it."""
    # Told by its name: importing ``backends`` for any other job would import django.tasks
    # (or the backport, whose import connects a receiver) into a process that uses neither.
    if isinstance(job.action, str) and job.action.startswith(TASK_PREFIX):
        try:  # Django 6's django.tasks or the backport; neither: no backend enqueued it
            from .backends import task_attempts
        except ImportError:
            pass
        else:
            attempts = task_attempts(job)
            if attempts is not None:
                return attempts
    return delayjobs_settings.MAX_ATTEMPTS


def _requeue_in_redis(job: Job) -> None:
    if _skip():
        return
    try:
        if not get_engine().requeue(job.queue, [str(job.pk)]):
            push([job])  # not in garbage (Redis lost it): add it afresh
        _outage.ok()
    except EngineUnavailable as exc:
        _unavailable(exc)
    except Exception:  # as in _redis: an on-commit hook never raises
        logger.exception("could not requeue job %s in Redis; reconcile will", job.pk)


def last_event() -> int:
    """The id of the newest job event (0 for none): every later change to a job writes
    an event with a higher one (see ``JobEvent.Meta``)."""
    return JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def purge(job: Job | Any, *, unchanged_since: int | None = None) -> bool:
    """Delete a dead job and its history for good; True when it was dead and is gone.

    ``unchanged_since``: only if none of its events is newer than this one (``last_event()``
    read before a confirmation read the job, so it shows what was purged; not a time: a
    death is stamped by its worker's clock). A job a model's ``PROTECT`` foreign key refers
    to raises Django's ``ProtectedError`` (and stays, with its history).
    """
    job = _job(job)
    with transaction.atomic(using=sql.db()):
        # Locked first: Django's delete reads the rows, then deletes by primary key alone,
        # so a requeue committing in between would be deleted with its revived job.
        dead = Job.objects.select_for_update().filter(pk=job.pk, status=Status.DEAD)
        if unchanged_since is not None:
            newer = JobEvent.objects.filter(job=OuterRef("pk"), pk__gt=unchanged_since)
            dead = dead.exclude(Exists(newer))
        # Its id is in the garbage of the queue its row names, whatever the caller's copy says.
        queue = dead.values_list("queue", flat=True).first()
        if queue is None:
            return False
        # Django's collector reads the rows it deletes: tolerantly, or a poison row (the
        # very row a purge is for) could never be deleted.
        deleted = tolerant(dead).delete()[0]
        if deleted:
            _after_commit(_redis(lambda: get_engine().purge(queue, [str(job.pk)])))
    return bool(deleted)


def forget(queue: str, ids: Iterable[uuid.UUID]) -> int:
    """Remove ids whose job is not dead from a queue's Redis garbage; return how many
    were there.

    An id whose row is gone (deleted by hand, or pruned while Redis was down), or whose
    job is no longer dead (requeued while Redis was down, then cancelled before reconcile,
    which looks at waiting jobs only, revived it): Redis would count it as garbage for
    ever. A dead job's id is left alone: it goes with its history through ``purge``.
    Raises ``EngineUnavailable`` when Redis cannot be reached.
    """
    validate_name(queue, "queue")
    wanted = set(ids)
    dead = Job.objects.filter(pk__in=wanted, status=Status.DEAD)
    wanted -= set(dead.values_list("pk", flat=True))
    return get_engine().purge(queue, [str(pk) for pk in wanted]) if wanted else 0
