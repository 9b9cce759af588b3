"""Keyset pagination of jobs on (run_at, id), and of a job's events on their id: no
COUNT(*), no OFFSET, any number of ties.

DRF's ``CursorPagination`` keys on one field and breaks ties with an offset capped at
1,000, and ``schedule_many`` can give thousands of jobs the same ``run_at``; the id makes
the key unique. The filter ``run_at <= x AND (run_at < x OR id < y)`` lets the database
walk its ``run_at`` (or ``status, run_at``) index from the cursor on. Events have a unique
key of their own, so DRF's class pages them, with a cursor checked before it is used.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from django.db import connections
from django.db.models import Q, QuerySet, Value
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import BasePagination, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from ..models import Job
from ..numbers import whole_number
from ..rows import Unreadable


class Cursor(NamedTuple):
    run_at: datetime.datetime | str
    id: uuid.UUID
    backwards: bool  # the page ends just before this job (a ``previous`` link)
    #: How ``run_at`` is meant, for a job whose due time cannot be read (a poison row):
    #: "" a datetime; "raw" the text SQLite holds (SQLite compares it as text);
    #: "above"/"below" past every time Python represents (PostgreSQL's 'infinity',
    #: year 10000, BC), where the walk goes on with the readable rows or ends.
    kind: str = ""


KINDS = frozenset({"", "raw", "above", "below"})
INVALID = {"cursor": ["Invalid cursor: use the next/previous links."]}


def encode(cursor: Cursor) -> str:
    when = (
        cursor.run_at.isoformat() if isinstance(cursor.run_at, datetime.datetime) else cursor.run_at
    )
    parts = [when, str(cursor.id), int(cursor.backwards), *([cursor.kind] if cursor.kind else [])]
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


def decode(token: str, vendor: str) -> Cursor:
    """The cursor of a next/previous link, or a 400 for anything else: a hostile token
    never reaches the database as a value it cannot take."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        when, job_id, backwards, *rest = json.loads(raw)
        # as encode() writes them: any other JSON type would reach .astimezone or UUID()
        if not isinstance(when, str) or not isinstance(job_id, str) or len(rest) > 1:
            raise ValueError(rest)
        if type(backwards) is not int or backwards not in (0, 1):
            raise ValueError(backwards)
        kind = rest[0] if rest else ""
        if kind not in KINDS or (kind == "raw" and vendor != "sqlite"):
            raise ValueError(kind)
        run_at = when if kind else datetime.datetime.fromisoformat(when)
        if not isinstance(run_at, str):
            run_at.astimezone(datetime.UTC)  # the database gets it in UTC: it must exist
            if run_at.tzinfo is None:
                raise ValueError(when)
        elif len(run_at) > 64:
            raise ValueError(when)
        return Cursor(run_at, uuid.UUID(job_id), bool(backwards), kind)
    except (binascii.Error, UnicodeError, TypeError, ValueError, OverflowError, RecursionError):
        raise ValidationError(INVALID) from None


def strict_page_size(request: Request, param: str, default: int, maximum: int) -> int:
    """``?<param>=``: a whole number from 1 to ``maximum`` written in ASCII digits, or a
    400 (DRF's own falls back to the default for anything else)."""
    raw = request.query_params.get(param)
    if raw is None:
        return default
    if not 1 <= _whole(raw) <= maximum:
        raise ValidationError({param: [f"Give a whole number from 1 to {maximum}."]})
    return _whole(raw)


def _whole(text: object) -> int:
    """``text``'s whole number if it is one in ASCII digits, else -1."""
    try:
        return whole_number(text) if isinstance(text, str) else -1
    except ValueError:
        return -1


class JobCursorPagination(BasePagination):
    """Pages of jobs; ``?ordering=run_at`` walks them soonest first (default: latest first)."""

    page_size = 50
    max_page_size = 500
    cursor_query_param = "cursor"
    page_size_query_param = "page_size"

    def paginate_queryset(
        self, queryset: QuerySet[Any] | Sequence[Any], request: Request, view: APIView | None = None
    ) -> list[Any] | None:
        assert isinstance(queryset, QuerySet)
        self.request = request
        size = self.get_page_size(request)
        token = request.query_params.get(self.cursor_query_param)
        self.vendor = connections[queryset.db].vendor
        cursor = decode(token, self.vendor) if token else None
        backwards = cursor is not None and cursor.backwards
        # ascending when the caller asked for it, flipped while walking backwards
        ascending = (request.query_params.get("ordering") == "run_at") != backwards
        jobs = queryset.order_by(*(("run_at", "id") if ascending else ("-run_at", "-id")))
        if cursor is not None:
            jobs = jobs.filter(after(cursor, ascending))
        rows: list[Job] = list(jobs[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if backwards:
            rows.reverse()
        has_next, has_previous = (True, more) if backwards else (more, cursor is not None)
        self.next = self._link(rows[-1], False) if has_next and rows else None
        self.previous = self._link(rows[0], True) if has_previous and rows else None
        return rows

    def get_page_size(self, request: Request) -> int:
        return strict_page_size(
            request, self.page_size_query_param, self.page_size, self.max_page_size
        )

    def _link(self, job: Job, backwards: bool) -> str:
        url = self.request.build_absolute_uri()
        return replace_query_param(
            url, self.cursor_query_param, encode(self._cursor(job, backwards))
        )

    def _cursor(self, job: Job, backwards: bool) -> Cursor:
        if not isinstance(job.run_at, Unreadable):
            return Cursor(job.run_at, job.id, backwards)
        if self.vendor == "sqlite":
            return Cursor(str(job.run_at), job.id, backwards, "raw")
        below = job.run_at.startswith("-") or job.run_at.endswith(" BC")
        return Cursor("", job.id, backwards, "below" if below else "above")

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"next": self.next, "previous": self.previous, "results": data})

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        return paging_parameters("Jobs", self.page_size, self.max_page_size)


def paging_parameters(items: str, default: int, maximum: int) -> list[dict[str, Any]]:
    """The OpenAPI description of ``?cursor=`` and ``?page_size=`` as they are checked."""
    return [
        {"name": "cursor", "required": False, "in": "query",
         "description": "Opaque position from a next/previous link.",
         "schema": {"type": "string"}},
        {"name": "page_size", "required": False, "in": "query",
         "description": f"{items} per page, 1 to {maximum} (default {default}).",
         "schema": {"type": "integer", "minimum": 1, "maximum": maximum}},
    ]  # fmt: skip


def after(cursor: Cursor, ascending: bool) -> Q:
    """Jobs strictly past the cursor in the walking order."""
    if cursor.kind in ("above", "below"):
        if (cursor.kind == "above") == ascending:
            return Q(pk__in=[])  # nothing readable lies beyond
        return Q(run_at__gte=_EDGES[0], run_at__lte=_EDGES[1])
    at: Any = Value(cursor.run_at) if cursor.kind == "raw" else cursor.run_at
    if ascending:
        return Q(run_at__gte=at) & (Q(run_at__gt=at) | Q(id__gt=cursor.id))
    return Q(run_at__lte=at) & (Q(run_at__lt=at) | Q(id__lt=cursor.id))


_EDGES = (datetime.datetime.min.replace(tzinfo=datetime.UTC),
          datetime.datetime.max.replace(tzinfo=datetime.UTC))  # fmt: skip


class EventCursorPagination(CursorPagination):
    """A job's events, oldest first, a page at a time."""

    page_size = 100
    max_page_size = 500
    page_size_query_param = "page_size"
    ordering = "id"

    def get_page_size(self, request: Request) -> int:
        return strict_page_size(request, "page_size", self.page_size, self.max_page_size)

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        return paging_parameters("Events", self.page_size, self.max_page_size)

    def decode_cursor(self, request: Request) -> Any:
        """DRF's cursor, from a token DRF wrote: its position (an event id) reaches the
        database only as a number the id column holds, its offset is one DRF writes (at
        most ``offset_cutoff``, which DRF would take a larger one as), and anything else
        is a 400."""
        token = request.query_params.get(self.cursor_query_param)
        if token is None:
            return None
        try:
            text = base64.b64decode(token.encode("ascii"), validate=True).decode("ascii")
            fields = parse_qs(text, keep_blank_values=True, strict_parsing=True)
            cursor = super().decode_cursor(request)
        except (binascii.Error, UnicodeError, ValueError, NotFound):
            raise ValidationError(INVALID) from None
        assert cursor is not None
        position = cursor.position
        if not fields.keys() <= {"o", "r", "p"} or any(len(v) > 1 for v in fields.values()):
            raise ValidationError(INVALID)
        if position is not None and not 0 <= _whole(position) < 2**63:
            raise ValidationError(INVALID)
        if not 0 <= _whole(fields.get("o", ["0"])[0]) <= self.offset_cutoff:
            raise ValidationError(INVALID)
        return cursor
