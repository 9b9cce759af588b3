"""HTTP callback jobs in the admin: a list filter, and what the detail page shows of the
request (method, URL or destination + path) and of its latest answer."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..callbacks.action import ACTION
from ..callbacks.outcome import status_in
from ..callbacks.request import CallbackRequest, InvalidCallback, load
from ..models import EventKind, Job
from .display import EMPTY

READONLY = ("callback_method", "callback_url", "callback_last_status")


def fieldset() -> Any:
    """The detail page's section for a callback job."""
    return (_("HTTP callback"), {"fields": READONLY})


class KindFilter(admin.SimpleListFilter):
    """HTTP callbacks or Python actions (an equality on ``action``: no scan to draw it)."""

    title = _("kind")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("callback", _("HTTP callbacks")), ("python", _("Python actions"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value() == "callback":
            return queryset.filter(action=ACTION)
        if self.value() == "python":
            return queryset.exclude(action=ACTION)
        return queryset


def is_callback(job: Job | None) -> bool:
    return job is not None and job.action == ACTION


def request_of(job: Job) -> CallbackRequest | None:
    """The stored request, or None if the row holds something malformed."""
    try:
        return load(job.kwargs if isinstance(job.kwargs, dict) else {})
    except (InvalidCallback, TypeError, ValueError):
        return None


def method(job: Job) -> str:
    request = request_of(job)
    return request.method if request else "(malformed request)"


def url(job: Job) -> str:
    request = request_of(job)
    return request.where if request else EMPTY


def last_status(job: Job) -> SafeString | str:
    """The latest attempt's answer: its status (or "no answer") and its history line."""
    event = (
        job.events.filter(kind__in=[EventKind.SUCCEEDED, EventKind.FAILED])
        .order_by("-id")  # the latest written (see JobEvent's Meta)
        .first()
    )
    lines = event.message.strip().splitlines() if event is not None else []
    if not lines:  # no attempt yet, or a blank message (a row written by hand)
        return EMPTY
    line = lines[0]
    status = status_in(line)
    if status is None:
        return line[:300]
    return format_html("<strong>{}</strong> <span title=\"{}\">{}</span>", status, line,
                       line[:300])  # fmt: skip
