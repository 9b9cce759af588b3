"""The door for the columns of a job: what ``build_job``, ``schedule_many``, ``reschedule``
and ``requeue`` check beyond times (``timing``) and arguments (``serialization``), so
that every value they accept fits its column on SQLite and PostgreSQL alike."""

from __future__ import annotations

import datetime
import decimal
import uuid

from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import models

from . import registry, serialization, sql, timing
from .callbacks.action import check_scheduled
from .conf import delayjobs_settings
from .engine import PRIORITY_RANGE, validate_name
from .exceptions import InvalidSchedule
from .models import Job, JobEvent
from .serialization import short_repr

#: The most attempts a job may have: PostgreSQL's ``integer`` column (the narrowest of the
#: supported databases) holds no more.
MAX_ATTEMPTS_LIMIT = 2**31 - 1


def check_positive(value: object, what: str) -> int:
    """``value`` if it is an int from 1 to ``MAX_ATTEMPTS_LIMIT``, else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    value = int.__int__(value)  # the int it holds: a subclass's comparisons decide nothing
    if value < 1:
        # short_repr: str() of an int of more than 4,300 digits raises ValueError
        raise InvalidSchedule(f"{what} must be at least 1, got {short_repr(value)}")
    if value > MAX_ATTEMPTS_LIMIT:
        raise InvalidSchedule(f"{what} must be at most {MAX_ATTEMPTS_LIMIT} (a 32-bit column)")
    return value


def check_priority(value: object) -> int:
    """``value`` if it is an int from -100 to 100 (higher starts first), else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int, not {type(value).__name__}")
    # A plain int, read by int's own method (a subclass's __int__ may say another): redis-py
    # sends an int as its repr(), "<Priority.HIGH: 5>" for an IntEnum
    value = int.__int__(value)
    if value not in PRIORITY_RANGE:
        raise InvalidSchedule(f"priority must be from -100 to 100, got {short_repr(value)}")
    return value


def check_column(value: object, what: str, field: str, model: type[models.Model] = Job) -> str:
    """``value`` if it is a str the column ``field`` stores as it is, else raise."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    column = model._meta.get_field(field)
    assert isinstance(column, models.CharField)
    return serialization.check_text(value, what, column.max_length)


def plain(text: str) -> str:
    """``text`` as a str, not a subclass of str: an Enum mixing in str (``class
    Queue(str, Enum)``) formats as its member's name (``Queue.ORDERS``) in ``str()`` and
    f-strings, and so in Redis key names, while the database stores its text (``orders``)."""
    return str.__str__(text)


def target_id(instance: models.Model) -> str:
    """The text a job names ``instance`` by: its primary key as its field reads it back
    (a UUID given as text, in capitals or without dashes, is the UUID's one text), so that
    ``cancel_for`` finds a row's jobs whichever form of the key its instance holds."""
    what = "the target's primary key"
    check_column(str(instance.pk), what, "target_id")
    try:
        pk = instance._meta.pk.to_python(instance.pk)
    except ValidationError as exc:
        raise InvalidSchedule(f"{what} is not valid: {exc.messages[0]}") from None
    given = instance.pk
    # An integer field reads True and 1.5 as 1: the key of another row than the one meant.
    if (isinstance(given, bool) and not isinstance(pk, bool)) or (
        isinstance(given, float | decimal.Decimal) and pk != given
    ):
        raise InvalidSchedule(f"{what} {short_repr(given)} is not a key of this model")
    return check_column(_key_text(pk), what, "target_id")


def _key_text(pk: object) -> str:
    return plain(pk) if isinstance(pk, str) else str(pk)


def check_target_id(job: Job, model: type[models.Model]) -> None:
    """Refuse a ``target_id`` that is not how ``build_job`` names a row of ``model`` (its
    key as the pk field reads it back): one the field cannot read ("abc" for an integer
    key) fails the worker's lookup at every attempt, and another spelling of a key
    ("042") is missed by ``cancel_for``, which looks for "42"."""
    try:
        pk = None if model._meta.is_composite_pk else model._meta.pk.to_python(job.target_id)
    except ValidationError:
        pk = None
    if pk is None or _key_text(pk) != job.target_id:
        raise InvalidSchedule(
            f"job {job.pk}'s target_id {short_repr(job.target_id)} is not a key of "
            f"{model._meta.label} as build_job writes it: use build_job"
        )


def check_actor(actor: object) -> str:
    """``actor`` if ``JobEvent.actor`` stores it as it is, else raise."""
    return check_column(actor, "actor", "actor", JobEvent)


def user_actor(prefix: str, username: str) -> str:
    """The ``JobEvent.actor`` of a change a user makes in the admin or the API:
    ``<prefix>:<username>``, cleaned and cut to the column (a username the column cannot
    hold must not refuse the change)."""
    length = JobEvent._meta.get_field("actor").max_length
    return sql.clean_text(f"{prefix}:{username}")[:length]


def check_queue(value: object) -> str:
    """``value`` if Redis keys can carry it as a queue name, else raise."""
    try:
        return plain(validate_name(value, "queue"))
    except ValueError as exc:
        raise InvalidSchedule(str(exc)) from None


def check_key(key: object) -> str | None:
    """``key`` (or None) if ``Job.key`` stores it as it is, else raise."""
    if key is None:
        return None
    if not isinstance(key, str) or not str.__len__(key):  # str's own: not a subclass's
        raise TypeError(
            f"key must be a non-empty str (at most 255 characters), not {short_repr(key)}"
        )
    return check_column(key, "key", "key")


#: A job's run state: only the worker and the services change it. A job handed to
#: ``schedule_many`` must hold the defaults (one inserted as "succeeded" would never run).
RUN_STATE = ("status", "attempts", "deliveries", "worker", "started_at", "finished_at",
             "last_error", "result")  # fmt: skip


def check_batch(jobs: list[Job], now: datetime.datetime) -> None:
    """The door for ``schedule_many``: every job passes ``check_built``, and comes once."""
    seen: set[object] = set()
    for job in jobs:
        check_built(job, now)
        if job.pk in seen:
            raise InvalidSchedule(f"schedule_many got job {job.pk} twice: pass each job once")
        seen.add(job.pk)


def check_target(job: Job) -> type[models.Model] | None:
    """The model of ``job``'s target (None: it has none). Refuse a job whose target is half
    set, or of another model than its action names (``app_label.Model.method``, as
    ``build_job`` stores it, proxy models included): it would run that other model's
    method of the same name, or go dead."""
    if (job.target_type_id is None) != (job.target_id is None):
        raise InvalidSchedule(
            f"job {job.pk} has a target_type without a target_id or the other way round: "
            "use build_job"
        )
    if job.target_type_id is None:
        return None
    try:
        model = ContentType.objects.get_for_id(job.target_type_id).model_class()
    except ContentType.DoesNotExist:
        model = None
    except (TypeError, ValueError):  # Django's own error for a value that is no id
        raise InvalidSchedule(
            f"job {job.pk}'s target_type_id {short_repr(job.target_type_id)} is not a "
            "content type's id: use build_job"
        ) from None
    label = model._meta.label if model is not None else "an uninstalled model"
    if job.action.rpartition(".")[0] != label:
        raise InvalidSchedule(
            f"job {job.pk}'s action {job.action!r} is not a method of its target's model "
            f"({label}): use build_job"
        )
    return model


def check_created(value: object, now: datetime.datetime) -> datetime.datetime:
    """``value`` in UTC if it is an aware time from 1970 to ``MAX_AHEAD`` from ``now`` (a
    clock stepped back since ``build_job`` is no reason to refuse), else raise: a year near
    1 or 9999 overflows when converted (SQLite) or cannot be read back (PostgreSQL)."""
    created = timing.aware(value, "created_at")
    if not timing.EARLIEST <= created <= now + timing.MAX_AHEAD:
        raise InvalidSchedule(
            f"created_at ({created.isoformat()}) is not from 1970 to 100 years from now: "
            "use build_job"
        )
    return created.astimezone(datetime.UTC)


def check_built(job: Job, now: datetime.datetime) -> None:
    """The door for a job handed to ``schedule_many``: what ``build_job`` checks, on the
    values the job holds (it may have been changed, or built without ``build_job``)."""
    if not isinstance(job, Job):
        raise TypeError(f"schedule_many takes jobs made by build_job, not {short_repr(job)}")
    if not job._state.adding:
        raise InvalidSchedule(f"job {job.pk} is already saved: schedule_many inserts new jobs")
    fields = (field for field in Job._meta.concrete_fields if field.name in RUN_STATE)
    changed = [field.name for field in fields if getattr(job, field.name) != field.get_default()]
    if changed:
        raise InvalidSchedule(
            f"job {job.pk} is not new ({', '.join(changed)} changed): pass jobs as build_job "
            "made them"
        )
    if not isinstance(job.pk, uuid.UUID):  # Django would convert 42, and Redis get "42"
        raise TypeError(f"a job's id must be a UUID, not {short_repr(job.pk)}: use build_job")
    job.created_at = check_created(job.created_at, now)
    job.run_at = timing.within_range(timing.aware(job.run_at, "run_at"), "run_at", now)
    if job.expires_at is not None:
        expires_at = timing.aware(job.expires_at, "expires_at")
        job.expires_at = timing.within_range(expires_at, "expires_at", now)
        timing.check_runnable(job.run_at, job.expires_at, now)
    job.queue = check_queue(job.queue)
    # As plain text: what the checks below read (a subclass's rpartition, its hash in the
    # registry) is what is stored.
    job.action = check_column(job.action, "action", "action")
    if job.target_id is not None:
        job.target_id = check_column(job.target_id, "the target's primary key", "target_id")
    model = check_target(job)
    if model is not None:
        check_target_id(job, model)
    job.max_attempts = check_positive(job.max_attempts, "max_attempts")
    job.priority = check_priority(job.priority)
    if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
        raise TypeError("a job's args must be a list and its kwargs a dict: use build_job")
    serialization.check_stored(job.args, "args")
    serialization.check_stored(job.kwargs, "kwargs")
    limit = delayjobs_settings.MAX_JSON_BYTES
    serialization.check_size((job.args, job.kwargs), "args and kwargs", limit)
    args, kwargs = serialization.load(job.args), serialization.load(job.kwargs)
    registry.check_call(job.action, model, args, kwargs)  # what schedule() refuses
    check_scheduled(job.action, job.kwargs)
