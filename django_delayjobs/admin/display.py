"""How job values read in the admin: durations, targets, JSON and tracebacks."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import capfirst

from .. import door
from ..models import Job
from ..rows import Unreadable
from ..serialization import showable

EMPTY = "-"


def actor(request: HttpRequest) -> str:
    """The ``JobEvent.actor`` naming the admin user behind a change (cleaned: a username
    the column cannot hold must not refuse the change)."""
    return door.user_actor("admin", request.user.get_username())


def duration(delta: datetime.timedelta) -> str:
    """A short human reading of a duration: 85 ms, 4.2 s, 12 min, 3.5 h, 2.1 d."""
    seconds = delta.total_seconds()
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 1:
        text = f"{seconds * 1000:.0f} ms"
    elif seconds < 60:
        text = f"{seconds:.1f} s"
    elif seconds < 3600:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 86400:
        text = f"{seconds / 3600:.1f} h"
    else:
        text = f"{seconds / 86400:.1f} d"
    return sign + text


def timestamp(at: datetime.datetime | None) -> str:
    """``2026-11-22 03:25:20.833 UTC``: to the millisecond, in the current time zone.

    A time the row holds but Python cannot read (``Unreadable``) is shown as stored; one
    whose local date would fall outside years 1-9999 is shown in UTC.
    """
    if at is None:
        return EMPTY
    if isinstance(at, Unreadable):
        return f"{at} (unreadable)"
    if timezone.is_aware(at):
        try:
            at = timezone.localtime(at)
        except OverflowError:
            at = at.astimezone(datetime.UTC)
    return f"{at:%Y-%m-%d %H:%M:%S}.{at.microsecond // 1000:03d} {at.tzname() or ''}".rstrip()


def relative(at: datetime.datetime | None, now: datetime.datetime) -> str:
    """``in 4.2 s`` or ``3 min ago``."""
    if at is None or isinstance(at, Unreadable):
        return EMPTY
    delta = at - now
    if delta >= datetime.timedelta(0):
        return f"in {duration(delta)}"
    return f"{duration(-delta)} ago"


def lateness(job: Job) -> datetime.timedelta | None:
    """How long after its due time the job's latest attempt started, if it did.

    A start before ``run_at`` belongs to an earlier attempt (the row now holds the retry's
    due time), so it says nothing about this one.
    """
    if not isinstance(job.started_at, datetime.datetime) or isinstance(job.run_at, Unreadable):
        return None
    if isinstance(job.started_at, Unreadable) or job.started_at < job.run_at:
        return None
    return job.started_at - job.run_at


def _model(job: Job) -> type[models.Model] | None:
    """The target's model; None if it is gone, or its content type is."""
    # From ContentType's per-process cache (no query per job), on the database the project
    # reads content types from, as the services that wrote the id and the worker that
    # runs the target do: not ``job.target_type``, which is read on the database of Job
    # and, when that one numbers content types otherwise (made at another time), another
    # model's. The project's may have lost it (removed as stale) while the jobs' database
    # keeps it for its foreign key.
    assert job.target_type_id is not None
    try:
        return ContentType.objects.get_for_id(job.target_type_id).model_class()
    except ContentType.DoesNotExist:
        return None


def target_url(job: Job, site: admin.AdminSite) -> str | None:
    """The target's admin change page, if its model is registered on ``site``."""
    if job.target_type_id is None or not job.target_id:
        return None
    model = _model(job)
    if model is None or not site.is_registered(model):
        return None
    name = f"{site.name}:{model._meta.app_label}_{model._meta.model_name}_change"
    try:
        return reverse(name, args=[quote(job.target_id)])  # the admin unquotes object ids
    except NoReverseMatch:
        return None


def target_label(job: Job) -> str:
    """``Thing 42``: the target's model and primary key, without loading the row."""
    if job.target_type_id is None:
        return EMPTY
    model = _model(job)
    name = capfirst(model._meta.verbose_name) if model is not None else "(unknown model)"
    return f"{name} {job.target_id}"


def link(url: str | None, text: str, title: str = "") -> SafeString | str:
    if url is None:
        return text
    if title:
        return format_html('<a href="{}" title="{}">{}</a>', url, title, text)
    return format_html('<a href="{}">{}</a>', url, text)


def pre(text: str) -> SafeString | str:
    """Multi-line text (a traceback) as a preformatted block; one line stays inline."""
    if not text:
        return EMPTY
    return format_html('<pre class="delayjobs-pre">{}</pre>', text)


def short_id(job_id: object) -> str:
    """The last 8 characters of a job id: random, where the first 8 are the time it was
    made (the same for every job of a minute)."""
    return "\u2026" + str(job_id)[-8:]


def as_json(value: Any) -> SafeString | str:
    """A stored JSON value, indented; one that cannot be read or shown, as its text."""
    if isinstance(value, Unreadable):
        return pre(f"unreadable ({value.error}):\n{value}")
    value = showable(value)
    if value in (None, [], {}):
        return EMPTY if value is None else json.dumps(value)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    # A lone surrogate (in a row the door did not check) cannot be encoded as UTF-8.
    return pre(text.encode("utf-8", "backslashreplace").decode("utf-8"))


#: The first line the worker writes for a failure: the exception's class path, a colon.
_FAILURE_HEAD = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_<>][\w<>]*)+(?::|$)")


def error_summary(text: str) -> str:
    """One line of an error: a failure's first line (the raised exception's class and
    message, as the worker writes it); for other text, and a bare traceback written by an
    older version, its last non-empty line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0].strip()
    return first if _FAILURE_HEAD.match(first.split(" ", 1)[0]) else lines[-1].strip()
