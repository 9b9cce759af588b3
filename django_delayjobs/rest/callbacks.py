"""The clock-service endpoints: ``callbacks/`` creates an HTTP callback job (idempotent by
``key``), ``callbacks/cancel/`` and ``callbacks/reschedule/`` find one by id or by key.

For any service in any language: "call this URL at that time unless I cancel first".
They need ``API_CALLBACK_PERMISSIONS`` (``add_job`` by default) on top of
``API_PERMISSION_CLASSES`` (whose object permissions are asked about the job found),
and only ever see callback jobs. Throttled by ``API_CALLBACK_THROTTLE_RATE`` (and the
project's own DRF throttles).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from django.utils import timezone
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import APIView

from .. import door, services, timing
from ..callbacks.action import ACTION
from ..callbacks.policy import Refused
from ..callbacks.request import METHODS, InvalidCallback, check_method, destination_named
from ..callbacks.service import KeyHeld, active_callback, create
from ..conf import delayjobs_settings
from ..exceptions import ConfigurationError, InvalidSchedule
from ..models import Job
from ..rows import tolerant
from . import serializers as s
from .filters import check_only
from .formats import SafeFormats, UniqueKeysDecoder
from .permissions import can_view, configured_permissions
from .schema import auto_schema, document, field_schema, one_of
from .views import actor

logger = logging.getLogger("django_delayjobs")


@field_schema(
    {"oneOf": [{"type": "number", "minimum": 0}, {"type": "string", "format": "date-time"}]}
)
class ExpiresField(serializers.Field[Any, Any, Any, Any]):
    """Seconds after the due time (a number), or the latest start time (ISO 8601)."""

    default_error_messages = {
        "invalid": "Give seconds after the due time (a number > 0) or an ISO 8601 datetime "
        "with an offset.",
    }

    def to_internal_value(self, data: Any) -> float | datetime.datetime:
        if isinstance(data, str) and not _is_number(data):
            return s.AwareDateTimeField().run_validation(data)  # type: ignore[no-any-return]
        if isinstance(data, int | float | str) and not isinstance(data, bool):
            # a number, or one as text as a form sends it (read as "in" reads it)
            return s.SecondsField(min_value=0).run_validation(data)  # type: ignore[no-any-return]
        self.fail("invalid")

    def to_representation(self, value: Any) -> Any:
        return value


def _is_number(text: str) -> bool:
    """``text`` reads as a number (no ISO 8601 datetime does): it is meant as seconds,
    and the seconds' field refuses it if it is not written as they are (``" 12 "``)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


class BodyJSONField(serializers.JSONField):
    """DRF's JSONField; a value nested too deep for Python's ``json`` is a 400. A form
    gives the field as text, which the field parses itself (``SafeJSONParser`` guards only
    a JSON body): 100,000 brackets raised ``RecursionError``, an HTML 500; and an object
    in it that gives a key twice was read as its last value, as a JSON body's is not."""

    default_error_messages = {
        "nested": "Nested too deeply.",
        "invalid": "Value must be valid JSON, each object giving a key once.",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(decoder=UniqueKeysDecoder, **kwargs)

    def to_internal_value(self, data: Any) -> Any:
        try:
            return super().to_internal_value(data)
        except RecursionError:
            self.fail("nested")


class MethodField(serializers.ChoiceField):
    """One of ``METHODS``, in any case (stored in upper case): checked as ``schedule_http``
    checks it."""

    def to_internal_value(self, data: Any) -> str:
        try:
            return check_method(data)
        except InvalidCallback as exc:
            raise ValidationError(str(exc)) from None


class CallbackSerializer(s.StrictSerializer):
    """One HTTP request to make later; ``url`` is an absolute http(s) URL or
    ``destination:/path`` (a name of ``HTTP_DESTINATIONS``)."""

    url = serializers.CharField(max_length=2048, trim_whitespace=False)
    method = MethodField(choices=METHODS, default="POST", help_text="In any case.")
    json = BodyJSONField(required=False, help_text="A JSON body (or give data).")
    headers = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False,
        help_text="Extra request headers (names of letters, digits and '-'); credentials "
        "belong in HTTP_DESTINATIONS.",
    )  # fmt: skip
    at = s.AwareDateTimeField(required=False, help_text="When to call (ISO 8601 with offset).")
    key = serializers.CharField(
        max_length=255, required=False, trim_whitespace=False,  # a key is kept as it is
        help_text="Idempotency key: while a job with this key is active, it is returned (200).",
    )  # fmt: skip
    # Not trimmed: " orders" is refused, as schedule() refuses it, not made "orders".
    queue = serializers.CharField(max_length=64, required=False, trim_whitespace=False)
    expires = ExpiresField(
        required=False, help_text="Never call after this: seconds after the due time, or a time."
    )
    max_attempts = s.WholeNumberField(required=False, min_value=1, max_value=5000)
    priority = s.WholeNumberField(
        required=False, min_value=-100, max_value=100,
        help_text="Among callbacks of the queue due together, higher is called first.",
    )  # fmt: skip

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # "in" is a keyword and "data" a Serializer attribute: neither can be declared.
        fields["in"] = s.SecondsField(
            required=False, min_value=0, help_text="Seconds from now until the call."
        )
        fields["data"] = serializers.CharField(
            required=False, allow_blank=True, trim_whitespace=False, help_text="A text body."
        )
        return fields

    def validate_url(self, value: str) -> str:
        """A destination ``API_CALLBACK_DESTINATIONS`` does not list is refused as an
        unknown one is (naming the listed ones only): its credentials are the
        application's."""
        allowed = delayjobs_settings.API_CALLBACK_DESTINATIONS  # None: every one
        named = destination_named(value)
        if allowed is not None and named and named[0] not in allowed:
            raise ValidationError(
                f"{named[0]!r} names no destination API_CALLBACK_DESTINATIONS allows "
                f"({', '.join(allowed) or 'none'})"
            )
        return value

    def validate_queue(self, value: str) -> str:
        try:
            return door.check_queue(value)
        except InvalidSchedule as exc:
            raise ValidationError(str(exc)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("in" in attrs) == ("at" in attrs):
            raise ValidationError("Give exactly one of 'in' (seconds from now) and 'at'.")
        now = timezone.now()  # the service checks again; here each refusal names its field
        run_at = s.due_time(attrs, now)
        try:
            timing.expiry(attrs.get("expires"), run_at, now)
        except InvalidSchedule as exc:
            raise ValidationError({"expires": [str(exc)]}) from None
        if "json" in attrs and "data" in attrs:
            raise ValidationError({"data": ["Give json or data, not both."]})
        check_queue_allowed(attrs)
        return attrs


def check_queue_allowed(attrs: dict[str, Any]) -> None:
    """Refuse a ``queue`` (given, or the default one) that ``API_CALLBACK_QUEUES`` does not
    list: a caller kept to its queues neither creates nor finds callbacks in others."""
    queue = attrs.get("queue", delayjobs_settings.DEFAULT_QUEUE)
    allowed = delayjobs_settings.API_CALLBACK_QUEUES  # None: any queue
    if allowed is not None and queue not in allowed:
        raise ValidationError({"queue": [
            f"Callbacks may not go to queue {queue!r}: API_CALLBACK_QUEUES allows "
            f"{', '.join(allowed)}."
        ]})  # fmt: skip


class LookupSerializer(s.StrictSerializer):
    """Which callback: its ``id``, or its ``key`` (in ``queue``, default the default queue)."""

    id = serializers.UUIDField(required=False)
    key = serializers.CharField(max_length=255, required=False, trim_whitespace=False)
    queue = serializers.CharField(max_length=64, required=False, trim_whitespace=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("id" in attrs) == ("key" in attrs):
            raise ValidationError("Give exactly one of 'id' and 'key'.")
        if "queue" in attrs and "key" not in attrs:
            raise ValidationError({"queue": ["A queue goes with a key, not with an id."]})
        if "key" in attrs:
            check_queue_allowed(attrs)
        return attrs


class CallbackRescheduleSerializer(LookupSerializer):
    at = s.AwareDateTimeField(required=False, help_text="The new time (ISO 8601 with offset).")

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        fields["in"] = s.SecondsField(required=False, min_value=0,
                                      help_text="Seconds from now until the call.")  # fmt: skip
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if ("in" in attrs) == ("at" in attrs):
            raise ValidationError("Give exactly one of 'in' (seconds from now) and 'at'.")
        s.due_time(attrs, timezone.now())
        return attrs


class CanManageCallbacks(BasePermission):
    """The user holds every permission of ``API_CALLBACK_PERMISSIONS``."""

    message = "Managing callbacks needs the permissions of API_CALLBACK_PERMISSIONS."

    def has_permission(self, request: Request, view: APIView) -> bool:
        needed = delayjobs_settings.API_CALLBACK_PERMISSIONS
        return bool(request.user and request.user.has_perms(needed))


class CallbackReceiptSerializer(s.ShownModelSerializer):
    """What a caller without ``view_job`` learns of a callback: enough to know it and its
    state, nothing of its request, result, error or history (it may be another caller's,
    found by its key)."""

    class Meta:
        model = Job
        fields = ["id", "queue", "key", "status", "run_at"]
        read_only_fields = fields


def shown(request: Request, job: Job, detail: bool = False) -> Any:
    """The answer about ``job``: in full (with its events when ``detail``) to a user who
    may read jobs (``view_job`` or ``change_job``, the admin's rule), else its receipt."""
    if not can_view(request):
        return CallbackReceiptSerializer(job).data
    if detail:
        return s.JobDetailSerializer(tolerant(Job.objects.filter(pk=job.pk)).get()).data
    return s.JobSerializer(job).data


class ThrottleUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = (
        "The cache that counts requests for throttling cannot be reached; try again later."
    )
    default_code = "throttle_unavailable"


class CallbackThrottle(UserRateThrottle):
    """``API_CALLBACK_THROTTLE_RATE`` per user (or per address when anonymous); None: off."""

    scope = "delayjobs_callbacks"

    def get_rate(self) -> str | None:
        return delayjobs_settings.API_CALLBACK_THROTTLE_RATE

    def allow_request(self, request: Request, view: APIView) -> bool:
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # the cache backend's own error, of its own type
            # (django-redis on the jobs' Redis, down): a JSON 503, not Django's HTML 500;
            # and no request let through uncounted
            logger.warning("callbacks/ throttled while its cache cannot be read: %s", exc)
            raise ThrottleUnavailable() from exc


class CallbackView(SafeFormats, APIView):
    schema = auto_schema()

    def get_permissions(self) -> list[Any]:
        return [make() for make in configured_permissions()] + [CanManageCallbacks()]

    def get_throttles(self) -> list[Any]:
        return [*super().get_throttles(), CallbackThrottle()]


_REFUSED: dict[int, Any] = {403: s.DetailSerializer, 429: s.DetailSerializer}
#: The full job with view_job (or change_job), else the receipt.
_JOB_OR_RECEIPT = one_of("CallbackJobOrReceipt", s.JobSerializer, CallbackReceiptSerializer)
_DETAIL_OR_RECEIPT = one_of(
    "CallbackJobDetailOrReceipt", s.JobDetailSerializer, CallbackReceiptSerializer
)


class CallbackCreateView(CallbackView):
    """Create a callback job (201), or return the active one holding ``key`` (200); 409
    when a job that is not a callback holds ``key``."""

    @document(
        operation_id="callbacks_create",
        request=CallbackSerializer,
        responses={
            201: _JOB_OR_RECEIPT,
            200: _JOB_OR_RECEIPT,
            400: dict,
            409: s.DetailSerializer,
            501: s.DetailSerializer,
            **_REFUSED,
        },
    )
    def post(self, request: Request) -> Response:
        check_only(request.query_params)  # the body says it all: ?queue= would not
        body = CallbackSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        given = dict(body.validated_data)
        when = {"in_": given.pop("in")} if "in" in given else {"at": given.pop("at")}
        try:
            job, created = create(given.pop("url"), **when, **given, actor=actor(request))
        except ConfigurationError as exc:  # the http extra (urllib3) is not installed
            return Response({"detail": str(exc)}, status=status.HTTP_501_NOT_IMPLEMENTED)
        except KeyHeld:  # say nothing of that job: it is not this endpoint's to show
            return Response(
                {"detail": "The key is held by an active job that is not a callback."},
                status=status.HTTP_409_CONFLICT,
            )
        except InvalidCallback as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        except Refused as exc:
            raise ValidationError({"url": [str(exc)]}) from None
        except (TypeError, ValueError) as exc:
            raise ValidationError({"non_field_errors": [str(exc)]}) from None
        if not created:  # another caller's job, perhaps: shown only to one who may act on it
            self.check_object_permissions(request, job)
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(shown(request, job), status=code)


def _find(lookup: dict[str, Any]) -> Job:
    """The callback job an id or a key names: for a key, its active job, else its latest.
    Read tolerantly, as jobs/<id>/ reads: a poison row is found, shown and changed."""
    callbacks = tolerant(Job.objects.filter(action=ACTION))
    if "id" in lookup:
        allowed = delayjobs_settings.API_CALLBACK_QUEUES  # a key's queue is checked already
        if allowed is not None:
            callbacks = callbacks.filter(queue__in=allowed)
        job = callbacks.filter(pk=lookup["id"]).first()
    else:
        queue = lookup.get("queue", delayjobs_settings.DEFAULT_QUEUE)
        try:
            active = active_callback(lookup["key"], queue)
        except (TypeError, ValueError):  # a key or queue no job can hold: none is found
            raise NotFound("No callback with this id or key.") from None
        job = active or (
            callbacks.filter(queue=queue, key=lookup["key"]).order_by("-created_at").first()
        )
    if job is None:
        raise NotFound("No callback with this id or key.")
    return job


def _changed(request: Request, job: Job, won: bool, verb: str) -> Response:
    if won:
        return Response(shown(request, job, detail=True))
    try:
        job.refresh_from_db(fields=["status"])
    except Job.DoesNotExist:  # purged meanwhile, as jobs/<id>/ says too
        raise NotFound("No callback with this id or key.") from None
    return Response(
        {"detail": f"Too late to {verb}: the callback has started or finished.",
         "status": job.status},
        status=status.HTTP_409_CONFLICT,
    )  # fmt: skip


_CHANGED = {200: _DETAIL_OR_RECEIPT, 400: dict, 404: s.DetailSerializer,
            409: s.ConflictSerializer, **_REFUSED}  # fmt: skip


class CallbackCancelView(CallbackView):
    """Cancel a callback by id or key if it has not started (200), else 409."""

    @document(operation_id="callbacks_cancel", request=LookupSerializer, responses=_CHANGED)
    def post(self, request: Request) -> Response:
        check_only(request.query_params)  # the body says it all: ?queue= would not
        body = LookupSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = _find(body.validated_data)
        self.check_object_permissions(request, job)  # as jobs/<id>/cancel/ asks them
        return _changed(request, job, services.cancel(job, actor=actor(request)), "cancel")


class CallbackRescheduleView(CallbackView):
    """Move a callback, found by id or key, to a new time if it has not started (200)."""

    @document(
        operation_id="callbacks_reschedule",
        request=CallbackRescheduleSerializer,
        responses=_CHANGED,
    )
    def post(self, request: Request) -> Response:
        check_only(request.query_params)  # the body says it all: ?queue= would not
        body = CallbackRescheduleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = _find(body.validated_data)
        self.check_object_permissions(request, job)  # as jobs/<id>/reschedule/ asks them
        field = "in" if "in" in body.validated_data else "at"
        when = {"in_" if field == "in" else "at": body.validated_data[field]}
        try:
            won = services.reschedule(job, **when, actor=actor(request))
        except (TypeError, ValueError) as exc:
            raise ValidationError({field: [str(exc)]}) from None
        return _changed(request, job, won, "reschedule")


#: The views whose endpoints the OpenAPI schema describes (with ``views.API_VIEWS``).
CALLBACK_VIEWS = (CallbackCreateView, CallbackCancelView, CallbackRescheduleView)
