"""The API's views. Every change goes through ``services`` with ``actor="api:<user>"``."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db.models import QuerySet
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from .. import door, services
from ..engine import EngineUnavailable
from ..exceptions import ConfigurationError, InvalidSchedule
from ..models import Job
from ..queues import readable_queue_states
from ..rows import tolerant
from . import serializers as s
from .filters import JobFilterSerializer, check_only, check_paging_only, filter_jobs
from .formats import SafeFormats
from .pagination import EventCursorPagination, JobCursorPagination
from .permissions import permissions_for
from .schema import auto_schema, document

logger = logging.getLogger("django_delayjobs")

_WRITES = frozenset({"cancel", "reschedule", "requeue"})
#: The body each verb takes.
_BODIES: dict[str, type[BaseSerializer[Any]]] = {
    "cancel": s.CancelSerializer, "reschedule": s.RescheduleSerializer,
    "requeue": s.RequeueSerializer,
}  # fmt: skip
# For the OpenAPI schema: a 400 body maps field names to lists of messages.
_REFUSED: dict[int, Any] = {403: s.DetailSerializer, 404: s.DetailSerializer}
_CHANGED = {200: s.JobDetailSerializer, 400: dict, 409: s.ConflictSerializer, **_REFUSED}


class RedisUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = (
        "Redis is unreachable, so the queue state cannot be read. "
        "The jobs endpoints still answer from the database."
    )
    default_code = "redis_unavailable"


class SettingsUnusable(APIException):
    """The settings give no Redis client (a web process runs no system checks)."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "settings_unusable"


def actor(request: Request) -> str:
    """The name recorded in the JobEvent of a change made through the API (cleaned: a
    username the column cannot hold must not refuse the change)."""
    return door.user_actor("api", request.user.get_username())


def _conflict(job: Job, detail: str) -> Response:
    try:
        job.refresh_from_db(fields=["status"])
    except Job.DoesNotExist:  # purged meanwhile
        raise NotFound("No job with this id.") from None
    return Response({"detail": detail, "status": job.status}, status=status.HTTP_409_CONFLICT)


class JobViewSet(
    SafeFormats, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Job]
):
    """Jobs, newest due first, and the verbs that change them."""

    schema = auto_schema()
    queryset = Job.objects.all()
    serializer_class = s.JobSerializer
    pagination_class = JobCursorPagination
    filter_backends: list[Any] = []  # our own filters; the project's defaults do not apply
    # Any segment, so that a malformed id gets a JSON 404 from get_object, not Django's page.
    lookup_value_regex = "[^/]+"

    def get_permissions(self) -> list[Any]:
        # The verb of the request's method, not self.action: for OPTIONS that is
        # "metadata", a read, also while DRF asks (with a copy of the request for each
        # method) whether to offer a POST.
        verb = self.action_map.get((self.request.method or "").lower(), self.action)
        return permissions_for(write=verb in _WRITES)

    def get_queryset(self) -> QuerySet[Job]:
        # A row the door would refuse is shown with its unreadable values as text.
        return tolerant(super().get_queryset())

    def get_serializer_class(self) -> type[BaseSerializer[Any]]:
        # By the request's method, as in get_permissions: OPTIONS (and the browsable API's
        # form) describe the body a verb takes, not the job's read-only fields.
        verb = self.action_map.get((self.request.method or "").lower(), self.action)
        if verb in _BODIES:
            return _BODIES[verb]
        if self.action == "events":
            return s.JobEventSerializer
        return s.JobDetailSerializer if self.action == "retrieve" else s.JobSerializer

    def get_object(self) -> Job:
        raw = self.kwargs["pk"]
        try:
            pk = uuid.UUID(raw)
        except ValueError:
            raise NotFound(f"No job with id {raw!r}: job ids are UUIDs.") from None
        try:
            job = self.get_queryset().get(pk=pk)
        except Job.DoesNotExist:
            raise NotFound("No job with this id.") from None
        self.check_object_permissions(self.request, job)
        return job

    def _detail(self, job: Job) -> Response:
        return Response(s.JobDetailSerializer(tolerant(Job.objects.all()).get(pk=job.pk)).data)

    @document(
        operation_id="jobs_list",
        parameters=[JobFilterSerializer],
        responses={200: s.JobSerializer, 400: dict, 403: s.DetailSerializer},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        params = JobFilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        jobs = filter_jobs(self.get_queryset(), params.validated_data)
        page = self.paginate_queryset(jobs)
        assert page is not None
        return self.get_paginated_response(s.JobSerializer(page, many=True).data)

    @document(
        operation_id="jobs_retrieve", responses={200: s.JobDetailSerializer, 400: dict, **_REFUSED}
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        check_only(request.query_params)
        return super().retrieve(request, *args, **kwargs)

    @document(
        operation_id="jobs_events",
        responses={200: s.JobEventSerializer(many=True), 400: dict, **_REFUSED},
    )
    @action(detail=True, methods=["get"], pagination_class=EventCursorPagination)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The job's whole history, oldest first, a page at a time."""
        check_paging_only(request.query_params)
        history = tolerant(self.get_object().events.all())
        page = self.paginate_queryset(history)  # type: ignore[arg-type]  # not of jobs
        return self.get_paginated_response(s.JobEventSerializer(page, many=True).data)

    @document(operation_id="jobs_cancel", request=s.CancelSerializer, responses=_CHANGED)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the job if it has not started (200), else say its status (409)."""
        check_only(request.query_params)  # it reads none: ?dry_run=1 would still act
        job = self.get_object()
        s.CancelSerializer(data=request.data).is_valid(raise_exception=True)
        if services.cancel(job, actor=actor(request)):
            return self._detail(job)
        return _conflict(job, "Too late to cancel: the job has started or finished.")

    @document(operation_id="jobs_reschedule", request=s.RescheduleSerializer, responses=_CHANGED)
    @action(detail=True, methods=["post"])
    def reschedule(self, request: Request, pk: str | None = None) -> Response:
        """Move the job to a new due time if it has not started (200), else 409."""
        check_only(request.query_params)  # it reads none: ?dry_run=1 would still act
        job = self.get_object()
        body = s.RescheduleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        (field, value), = body.validated_data.items()  # fmt: skip
        when = {"in_" if field == "in" else "at": value}
        try:
            # the service checks what a field cannot: at most 100 years, not past expires_at
            won = services.reschedule(job, **when, actor=actor(request))
        except InvalidSchedule as exc:
            raise ValidationError({field: [str(exc)]}) from None
        if won:
            return self._detail(job)
        return _conflict(job, "Too late to reschedule: the job has started or finished.")

    @document(operation_id="jobs_requeue", request=s.RequeueSerializer, responses=_CHANGED)
    @action(detail=True, methods=["post"])
    def requeue(self, request: Request, pk: str | None = None) -> Response:
        """Give a dead job more attempts, due now (200); any other job gives 409, and so
        does a dead job whose key another active job holds now."""
        check_only(request.query_params)  # it reads none: ?dry_run=1 would still act
        job = self.get_object()
        body = s.RequeueSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            won = services.requeue(job, actor=actor(request), **body.validated_data)
        except InvalidSchedule as exc:  # its key is held again, too many attempts, expired
            return _conflict(job, f"Cannot requeue: {exc}.")
        if won:
            return self._detail(job)
        return _conflict(job, "Only dead jobs can be requeued.")


class QueuesView(SafeFormats, APIView):
    """The state of every queue, as the admin's queue page shows it."""

    schema = auto_schema()

    def get_permissions(self) -> list[Any]:
        return permissions_for(write=False)

    @document(
        operation_id="queues_list",
        responses={
            200: s.QueuesSerializer,
            400: dict,
            403: s.DetailSerializer,
            503: s.DetailSerializer,
        },
    )
    def get(self, request: Request) -> Response:
        check_only(request.query_params)  # it reads none: ?queue=mail would list them all
        try:
            states, errors, unlisted = readable_queue_states()
        except ConfigurationError as exc:  # its text names the setting, never a password
            logger.error("queue state requested while the settings cannot work: %s", exc)
            raise SettingsUnusable(
                f"The DELAYJOBS settings cannot work, so the queue state cannot be read: {exc}"
            ) from exc
        except EngineUnavailable as exc:
            logger.warning("queue state requested while Redis is unreachable: %s", exc)
            raise RedisUnavailable() from exc
        data = {
            "queues": [state.as_dict() for state in states],
            "broken_queues": [{"queue": n, "error": e} for n, e in sorted(errors.items())],
            "unlisted": unlisted or None,
        }
        return Response(s.QueuesSerializer(data).data)


#: The views whose endpoints the OpenAPI schema describes.
API_VIEWS = (JobViewSet, QueuesView)
