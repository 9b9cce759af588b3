"""The query parameters of ``GET jobs/``: validated like a body, so a typo is a 400."""

from __future__ import annotations

from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from django.http import QueryDict
from rest_framework import serializers

from ..models import Job, Status
from .serializers import AwareDateTimeField

#: Read by DRF itself, on every endpoint (the renderer a client asks for).
FORMAT_PARAMETERS = frozenset({"format"})
#: Read by the paginator (and DRF's ``?format=``), not by the filter.
PAGINATION_PARAMETERS = frozenset({"cursor", "page_size"}) | FORMAT_PARAMETERS
#: May be given more than once: each ``status`` is one more status; ``format`` is DRF's.
REPEATABLE = frozenset({"status", "format"})


class JobFilterSerializer(serializers.Serializer[Any]):
    status = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="One or more statuses: repeat the parameter or separate them by commas.",
    )  # fmt: skip
    # Exact values: DRF would trim "k " to "k" and find another job's key.
    queue = serializers.CharField(required=False, max_length=64, trim_whitespace=False)
    action = serializers.CharField(required=False, max_length=255, trim_whitespace=False)
    key = serializers.CharField(required=False, max_length=255, trim_whitespace=False)
    target_type = serializers.CharField(
        required=False, help_text="The target's model as app_label.model, e.g. shop.order."
    )
    target_id = serializers.CharField(
        required=False, max_length=64, trim_whitespace=False,
        help_text="The target's primary key; needs target_type.",
    )  # fmt: skip
    run_at_after = AwareDateTimeField(
        required=False, help_text="Only jobs due at or after this time (ISO 8601 with offset)."
    )
    run_at_before = AwareDateTimeField(
        required=False, help_text="Only jobs due before this time (ISO 8601 with offset)."
    )
    ordering = serializers.ChoiceField(
        choices=["-run_at", "run_at"], required=False,
        help_text="-run_at (latest due first, the default) or run_at (soonest first).",
    )  # fmt: skip

    def to_internal_value(self, data: Any) -> Any:
        unknown = sorted(set(data) - set(self.fields) - PAGINATION_PARAMETERS)
        if unknown:
            raise serializers.ValidationError(
                {name: ["Unknown query parameter."] for name in unknown}
            )
        if isinstance(data, QueryDict):
            errors = ambiguous(data, set(self.fields))
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    def validate_status(self, value: list[str]) -> list[str]:
        statuses = [s.strip() for item in value for s in item.split(",") if s.strip()]
        wrong = [s for s in statuses if s not in Status.values]
        if wrong or not statuses:
            raise serializers.ValidationError(
                f"Not a status: {', '.join(wrong) or '(empty)'}. Use {', '.join(Status.values)}."
            )
        return statuses

    def validate_target_type(self, value: str) -> ContentType:
        app_label, _, model = value.partition(".")
        try:
            return ContentType.objects.get_by_natural_key(app_label, model.lower())
        except ContentType.DoesNotExist:
            raise serializers.ValidationError(
                f"No model {value!r}: give app_label.model, e.g. shop.order."
            ) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "target_id" in attrs and "target_type" not in attrs:
            raise serializers.ValidationError(
                {"target_id": ["Give target_type too: ids are only unique within a model."]}
            )
        after, before = attrs.get("run_at_after"), attrs.get("run_at_before")
        if after is not None and before is not None and after >= before:
            raise serializers.ValidationError(
                {"run_at_before": ["Must be later than run_at_after."]}
            )
        return attrs


def check_only(query: QueryDict, known: frozenset[str] = FORMAT_PARAMETERS) -> None:
    """Raise a 400 for a parameter not in ``known``, or one given twice (an endpoint that
    reads no filter): a typo must not answer another question."""
    errors = {name: ["Unknown query parameter."] for name in query if name not in known}
    errors.update(ambiguous(query, set()))
    if errors:
        raise serializers.ValidationError(errors)


def check_paging_only(query: QueryDict) -> None:
    """``check_only`` with the paging parameters (the events endpoint)."""
    check_only(query, PAGINATION_PARAMETERS)


def ambiguous(query: QueryDict, filters: set[str]) -> dict[str, list[str]]:
    """The parameters DRF would read otherwise than meant: one given twice (a field reads
    the last value alone) and an empty filter (a field that is not required drops it, so
    ``?key=`` would list every job)."""
    errors: dict[str, list[str]] = {}
    for name, values in query.lists():
        if len(values) > 1 and name not in REPEATABLE:
            errors[name] = [f"Given {len(values)} times: give it once."]
        elif name in filters and "" in values:
            errors[name] = ["An empty value: give one, or leave the parameter out."]
    return errors


def filter_jobs(jobs: QuerySet[Job], params: dict[str, Any]) -> QuerySet[Job]:
    """Apply validated ``JobFilterSerializer`` data to a queryset of jobs."""
    lookups = {
        "status": "status__in", "queue": "queue", "action": "action", "key": "key",
        "target_type": "target_type", "target_id": "target_id",
        "run_at_after": "run_at__gte", "run_at_before": "run_at__lt",
    }  # fmt: skip
    return jobs.filter(
        **{lookups[name]: value for name, value in params.items() if name in lookups}
    )
