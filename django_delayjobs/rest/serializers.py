"""What the API reads and writes: jobs with their events, action bodies, queue state."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.http import QueryDict
from django.utils import timezone
from rest_framework import ISO_8601, serializers

from .. import timing
from ..callbacks.action import shown_kwargs
from ..exceptions import InvalidSchedule
from ..models import Job, JobEvent, Status
from ..numbers import decimal_number, whole_number
from ..rows import Unreadable, tolerant
from ..serialization import showable


def type_label(content_type_id: int | None) -> str | None:
    """Return ``app_label.model`` of a content type id (cached by Django), or None (also
    for one the project no longer has: see ``admin.display._model``)."""
    if content_type_id is None:
        return None
    try:
        ct = ContentType.objects.get_for_id(content_type_id)
    except ContentType.DoesNotExist:
        return None
    return f"{ct.app_label}.{ct.model}"


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its offset: a naive one is ambiguous."""

    default_error_messages = {
        "naive": "Give a time zone offset (e.g. 2030-01-31T09:00:00Z or +01:00): "
        "a datetime without one is ambiguous.",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(input_formats=[ISO_8601], **kwargs)

    def enforce_timezone(self, value: datetime.datetime) -> datetime.datetime:
        if timezone.is_naive(value):
            self.fail("naive")
        return super().enforce_timezone(value)


class SecondsField(serializers.FloatField):
    """A finite number of seconds: a JSON number, or a text in ASCII digits as a form sends
    it (``90``, ``1.5``, ``1e3``). Not ``true``, though Python would take it as 1, nor what
    else ``float()`` reads: ``"1_000"``, ``" 12 "``, other scripts' digits (``"١٢"``)."""

    default_error_messages = {
        "invalid": "Give a number of seconds in ASCII digits, e.g. 90 or 1.5.",
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, str):
            try:
                data = decimal_number(data)
            except ValueError:
                self.fail("invalid")
        seconds = super().to_internal_value(data)
        if not math.isfinite(seconds):  # 1e400 in JSON is read as infinity
            self.fail("invalid")
        return seconds


class WholeNumberField(serializers.IntegerField):
    """A whole number: a JSON number, or a text in ASCII digits with an optional sign as a
    form sends it (``5``, ``-3``). Not what else ``int()`` reads: ``"1_0"``, ``" 3 "``,
    other scripts' digits (``"\u0663"``), which would give a job attempts nobody wrote."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str):
            try:
                data = whole_number(data)
            except ValueError:
                self.fail("invalid")
        return super().to_internal_value(data)


#: Sent by HTML forms (the browsable API's among them) along with the fields.
NOT_FIELDS = frozenset({"csrfmiddlewaretoken"})
#: Unknown fields named in a 400; the rest are counted, so that a body of 100,000 of them
#: is not answered with megabytes.
UNKNOWN_NAMED = 20


class StrictSerializer(serializers.Serializer[Any]):
    """A body serializer that answers unknown fields with 400 instead of ignoring them."""

    def to_internal_value(self, data: Any) -> Any:
        given = set(data) - NOT_FIELDS if isinstance(data, Mapping) else set()
        unknown = sorted(given - set(self.fields))
        errors: dict[str, Any] = {}
        value: Any = None
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not isinstance(exc.detail, dict):
                raise
            errors.update(exc.detail)
        for name in unknown[:UNKNOWN_NAMED]:
            errors[name] = ["Unknown field: this action does not take it."]
        for name, times in repeated(data)[:UNKNOWN_NAMED]:
            errors[name] = [f"Given {times} times: give it once."]
        if len(unknown) > UNKNOWN_NAMED:
            more = len(unknown) - UNKNOWN_NAMED
            errors.setdefault("non_field_errors", []).append(
                f"... and {more:,} more unknown fields."
            )
        if errors:
            raise serializers.ValidationError(errors)
        return value


def repeated(data: Any) -> list[tuple[str, int]]:
    """The fields a form sends more than once, with how many times: DRF reads the last
    value alone, a proxy or validator in front may have read the first (a JSON body's
    repeated key is refused by ``formats.SafeJSONParser``)."""
    if not isinstance(data, QueryDict):
        return []
    return [(n, len(v)) for n, v in data.lists() if len(v) > 1 and n not in NOT_FIELDS]


# -- jobs -------------------------------------------------------------------------------


class ShownDateTimeField(serializers.DateTimeField):
    """A stored time as ISO 8601; in UTC if the current zone would leave years 1-9999, and
    as the stored text if the row holds one Python cannot read (a poison row)."""

    def to_representation(self, value: Any) -> Any:
        if isinstance(value, Unreadable):
            return str(value)
        try:
            return super().to_representation(value)
        except serializers.ValidationError:  # DRF's "overflow" converting to the zone
            return value.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


class ShownJSONField(serializers.JSONField):
    """A stored JSON value; one a poison row holds that cannot be rendered, as text."""

    def to_representation(self, value: Any) -> Any:
        return str(value) if isinstance(value, Unreadable) else showable(value)


class ShownModelSerializer(serializers.ModelSerializer[Any]):
    """Read-only model fields rendered by the two fields above."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DateTimeField: ShownDateTimeField,
        models.JSONField: ShownJSONField,
    }


class JobEventSerializer(ShownModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["kind", "at", "attempt", "actor", "message"]
        read_only_fields = fields


class JobSerializer(ShownModelSerializer):
    target_type = serializers.SerializerMethodField(
        help_text="The target's model as app_label.model, or null for a plain function "
        "(or a model whose content type is gone)."
    )

    class Meta:
        model = Job
        fields = [
            "id", "queue", "action", "status", "target_type", "target_id", "args", "kwargs",
            "key", "run_at", "expires_at", "attempts", "max_attempts", "priority",
            "worker", "created_at", "started_at", "finished_at", "last_error", "result",
        ]  # fmt: skip
        read_only_fields = fields

    def get_target_type(self, job: Job) -> str | None:
        return type_label(job.target_type_id)

    def to_representation(self, job: Job) -> dict[str, Any]:
        shown: dict[str, Any] = super().to_representation(job)
        shown["kwargs"] = shown_kwargs(job.action, shown["kwargs"])  # no ?token= value
        return shown


#: The most events a job's answer embeds (its latest); ``jobs/<id>/events/`` pages them all.
EMBEDDED_EVENTS = 100


class JobDetailSerializer(JobSerializer):
    """A job with its latest events: a job retried a thousand times must not make its
    answer a hundred megabytes."""

    events = JobEventSerializer(
        source="latest_events", many=True, read_only=True,
        help_text=f"The latest {EMBEDDED_EVENTS} events at most, oldest first.",
    )  # fmt: skip
    events_omitted = serializers.IntegerField(
        read_only=True,
        help_text="How many earlier events `events` leaves out; events/ has every one.",
    )

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "events", "events_omitted"]
        read_only_fields = fields

    def to_representation(self, job: Job) -> Any:
        newest = list(tolerant(job.events.order_by("-id"))[: EMBEDDED_EVENTS + 1])
        shown = newest[:EMBEDDED_EVENTS]
        job.latest_events = shown[::-1]  # type: ignore[attr-defined]
        job.events_omitted = (  # type: ignore[attr-defined]
            job.events.filter(id__lt=shown[-1].pk).count() if len(newest) > len(shown) else 0
        )
        return super().to_representation(job)


# -- action bodies ------------------------------------------------------------------------


class CancelSerializer(StrictSerializer):
    """Cancel takes no fields; the body may be empty or ``{}``."""


def due_time(attrs: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime:
    """The due time a body's ``in`` or ``at`` gives, checked as ``schedule()`` checks it
    (from 1970, at most 100 years ahead); a refusal is the error of that field."""
    field = "in" if "in" in attrs else "at"
    try:
        if field == "in":
            return timing.within_range(now + timing.delay(attrs["in"], "in"), "in", now)
        return timing.within_range(attrs["at"], "at", now)
    except InvalidSchedule as exc:
        raise serializers.ValidationError({field: [str(exc)]}) from None


class RescheduleSerializer(StrictSerializer):
    """Exactly one of ``in`` (seconds from now, at least 0) and ``at``; nothing else."""

    at = AwareDateTimeField(required=False, help_text="The new due time (ISO 8601 with offset).")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # "in" is a Python keyword, so it cannot be a class attribute.
        fields["in"] = SecondsField(
            required=False, min_value=0, help_text="Seconds from now until the job is due."
        )
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs) != 1:
            raise serializers.ValidationError(
                "Give exactly one of 'in' (seconds from now) and 'at' (an ISO 8601 datetime)."
            )
        due_time(attrs, timezone.now())
        return attrs


class RequeueSerializer(StrictSerializer):
    """Optionally how many more attempts the dead job gets; nothing else."""

    attempts = WholeNumberField(
        required=False, min_value=1, max_value=5000,
        help_text=(
            "How many more attempts the job gets (default: the MAX_ATTEMPTS setting; for a "
            "django.tasks task, the MAX_ATTEMPTS option of the backend that enqueued it)."
        ),
    )  # fmt: skip


class DetailSerializer(serializers.Serializer[Any]):
    """An error: what went wrong."""

    detail = serializers.CharField()


class ConflictSerializer(DetailSerializer):
    """Too late: the verb lost to a worker or an earlier change; the job's status now."""

    status = serializers.ChoiceField(choices=Status.choices, help_text="The job's status now.")


# -- queues --------------------------------------------------------------------------------


class NextDueSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    action = serializers.CharField(allow_null=True)
    run_at = ShownDateTimeField(allow_null=True)


class WorkerSerializer(serializers.Serializer[Any]):
    """A live worker: these fields, and whatever else its heartbeat carries, as it is."""

    id = serializers.CharField()
    expires_at = ShownDateTimeField(allow_null=True)
    host = serializers.CharField(required=False)
    pid = serializers.IntegerField(required=False)
    roles = serializers.ListField(child=serializers.CharField(), required=False)
    concurrency = serializers.IntegerField(required=False)
    queues = serializers.ListField(child=serializers.CharField(), required=False)

    def to_representation(self, instance: Any) -> dict[str, Any]:
        extra = {k: v for k, v in instance.items() if k != "expires_ms"}  # shown as expires_at
        return {**extra, **super().to_representation(instance)}


class ShardStateSerializer(serializers.Serializer[Any]):
    """One shard of a queue (a queue of 1 shard has one, named like the queue)."""

    shard = serializers.CharField()
    master = serializers.CharField(
        allow_null=True, help_text="Its Cluster master (null: one Redis)."
    )
    pending = serializers.IntegerField()
    overdue = serializers.IntegerField()
    ready = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    expired_leases = serializers.IntegerField()
    garbage = serializers.IntegerField()
    next_due_at = ShownDateTimeField(allow_null=True)
    oldest_lease_at = ShownDateTimeField(allow_null=True)


class QueueStateSerializer(serializers.Serializer[Any]):
    """One queue as ``QueueState.as_dict()`` gives it (the admin's queue page)."""

    queue = serializers.CharField()
    pending = serializers.IntegerField()
    overdue = serializers.IntegerField()
    ready = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    expired_leases = serializers.IntegerField()
    retrying = serializers.IntegerField()
    garbage = serializers.IntegerField()
    next_due_at = ShownDateTimeField(allow_null=True)
    oldest_lease_at = ShownDateTimeField(allow_null=True)
    live_workers = serializers.IntegerField(
        allow_null=True, help_text="Null when they cannot be read: on a Redis Cluster, the "
        "master of a sharded queue's own name (where workers record their heartbeats) is down.",
    )  # fmt: skip
    counters = serializers.DictField(child=serializers.IntegerField())
    next_due = NextDueSerializer(many=True)
    workers = WorkerSerializer(many=True)
    shards = ShardStateSerializer(many=True)
    incomplete = serializers.CharField(
        allow_null=True, help_text="Why some shards could not be read (their master is down): "
        "the counts and lists leave them out. Null when every shard was read.",
    )  # fmt: skip
    missing_shards = serializers.ListField(
        child=serializers.CharField(), help_text="The shards left out (see incomplete)."
    )


class QueueErrorSerializer(serializers.Serializer[Any]):
    """A queue that cannot be read (a key of the wrong type, which the error names)."""

    queue = serializers.CharField()
    error = serializers.CharField()


class QueuesSerializer(serializers.Serializer[Any]):
    queues = QueueStateSerializer(many=True)
    broken_queues = QueueErrorSerializer(many=True)
    unlisted = serializers.CharField(
        allow_null=True, help_text="Why the directory of queues could not be read (its master "
        "is down), so a queue known only to Redis may be missing. Null when it was read.",
    )  # fmt: skip
