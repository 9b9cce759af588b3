"""The queue-state page (``admin:django_delayjobs_queues``) and its requeue/purge/forget
POSTs.

Counts come from Redis through ``queues.py``; with Redis unreachable the page says so
(the database and the job list still work), and with settings that give no Redis client
(a web process runs no system checks) it says which setting is wrong and answers 503.
Buttons post to views that check the model's permissions and call the services, like the
changelist's actions.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import queues, services
from ..conf import delayjobs_settings
from ..engine import EngineUnavailable, validate_name
from ..exceptions import ConfigurationError
from ..models import Job, Status
from ..rows import tolerant
from . import charts, display, operations

if TYPE_CHECKING:
    from .jobs import JobAdmin

#: Dead jobs listed per queue; the job list (status = dead) has all of them.
GARBAGE_SHOWN = 50
#: Queues per page of the queue page (sorted by name).
QUEUES_SHOWN = 50
NEXT_DUE_SHOWN = 10
#: Characters of a dead job's error on the page (its job page has all of it): an error
#: may be megabytes, and the page lists many.
ERROR_SHOWN = 5_000
_PK = "00000000-0000-0000-0000-000000000000"


@dataclass
class Entry:
    """One listed job id: its row (None when the database has none) and a time."""

    id: str
    job: Job | None
    at: datetime.datetime | None
    when: str = ""
    url: str | None = None
    target: str = ""
    target_url: str | None = None
    error: str = ""

    @property
    def error_summary(self) -> str:
        return display.error_summary(self.error)

    @property
    def error_shown(self) -> str:
        return self.error[:ERROR_SHOWN]

    @property
    def error_cut(self) -> bool:
        return len(self.error) > ERROR_SHOWN

    @property
    def at_text(self) -> str:
        return display.timestamp(self.at)

    @property
    def is_dead(self) -> bool:
        return self.job is not None and self.job.status == Status.DEAD

    @property
    def is_orphan(self) -> bool:
        """One of our ids (a UUID) without a row: all that is left of it is this entry."""
        if self.job is not None:
            return False
        try:
            uuid.UUID(self.id)
        except ValueError:
            return False  # not written by us: left to whoever wrote it
        return True

    @property
    def is_stale(self) -> bool:
        """An id the garbage holds for nothing: one of ours without a row, or whose job is
        not dead (requeued while Redis was down, then cancelled before reconcile revived
        it): only an entry left behind, to forget."""
        return self.is_orphan or (self.job is not None and self.job.status != Status.DEAD)


@dataclass
class Worker:
    id: str
    host: str
    pid: Any
    roles: str
    concurrency: Any
    last_beat_at: datetime.datetime | None
    last_beat: str
    expires_at: datetime.datetime | None

    @property
    def expires_text(self) -> str:
        return display.timestamp(self.expires_at)


@dataclass
class Section:
    state: queues.QueueState
    next_due: list[Entry] = field(default_factory=list)
    garbage: list[Entry] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    list_url: str = ""
    next_due_in: str = ""
    oldest_lease: str = ""

    @property
    def name(self) -> str:
        return self.state.name

    # As text made here, not with the template's |date: a time in year 9999 (a poison
    # row's) would overflow when the filter converts it to a zone ahead of UTC.
    @property
    def next_due_at_text(self) -> str:
        return display.timestamp(self.state.next_due_at)

    @property
    def shards(self) -> list[tuple[queues.ShardState, str]]:
        """Each shard with its next due time as text (made here, for the same reason)."""
        return [(shard, display.timestamp(shard.next_due_at)) for shard in self.state.shards]

    @property
    def oldest_lease_at_text(self) -> str:
        return display.timestamp(self.state.oldest_lease_at)

    @property
    def garbage_hidden(self) -> int:
        return max(self.state.stats.garbage - len(self.garbage), 0)


def _entries(
    admin: JobAdmin,
    rows: list[tuple[Job | None, str, datetime.datetime | None]],
    now: datetime.datetime,
) -> list[Entry]:
    # One reverse() per page, not per row: they add up over a hundred rows.
    change_url = reverse(f"{admin.admin_site.name}:django_delayjobs_job_change", args=[_PK])
    entries = []
    for job, job_id, at in rows:
        entry = Entry(job_id, job, at, when=display.relative(at, now))
        if job is not None:
            entry.url = change_url.replace(_PK, str(job.pk))
            entry.target = display.target_label(job)
            entry.target_url = display.target_url(job, admin.admin_site)
            entry.error = job.last_error
        entries.append(entry)
    return entries


def _workers(state: queues.QueueState, now: datetime.datetime) -> list[Worker]:
    # A worker's heartbeat lives three beats (worker.py), so it beat three beats before
    # it expires, if it uses this process's HEARTBEAT_SECONDS.
    ttl_ms = delayjobs_settings.HEARTBEAT_SECONDS * 3000
    workers = []
    for info in state.workers:
        expires = info.get("expires_ms")
        beat = queues.ms_datetime(int(expires - ttl_ms)) if expires is not None else None
        workers.append(
            Worker(
                id=str(info.get("id", "")),
                host=str(info.get("host", "")),
                pid=info.get("pid", ""),
                roles=", ".join(info.get("roles") or []),
                concurrency=info.get("concurrency", ""),
                last_beat_at=beat,
                last_beat=display.relative(beat, now),
                expires_at=queues.ms_datetime(expires),
            )
        )
    return workers


def _sections(
    admin: JobAdmin, now: datetime.datetime, names: list[str], down: dict[str, str]
) -> tuple[list[Section], dict[str, str]]:
    """The sections of the queues ``names`` that can be read, and queue -> why for the
    others (``down``: as in ``Engine.stats``)."""
    changelist = reverse(f"{admin.admin_site.name}:django_delayjobs_job_changelist")
    sections = []
    states, errors, _ = queues.readable_queue_states(
        next_due=NEXT_DUE_SHOWN, garbage=GARBAGE_SHOWN, names=names, down=down
    )
    for state in states:
        sections.append(
            Section(
                state=state,
                next_due=_entries(admin, state.next_due, now),
                garbage=_entries(admin, state.dead, now),
                workers=_workers(state, now),
                list_url=f"{changelist}?queue={state.name}",
                next_due_in=display.relative(state.next_due_at, now),
                oldest_lease=display.relative(state.oldest_lease_at, now),
            )
        )
    return sections, errors


def _permissions(admin: JobAdmin, request: HttpRequest) -> dict[str, bool]:
    return {
        "can_requeue": admin.has_operate_permission(request),
        "can_purge": admin.has_purge_permission(request),
    }


def queues_page(admin: JobAdmin, request: HttpRequest) -> HttpResponse:
    """GET: every queue's counts, next due jobs, workers and garbage."""
    if not admin.has_view_permission(request):
        raise PermissionDenied
    now = timezone.now()
    sections: list[Section] = []
    queue_errors: dict[str, str] = {}
    redis_error = settings_error = unlisted = charts_error = ""
    graphs: charts.Charts | None = None
    page: Page[str] | None = None
    try:
        names, unlisted = queues.queue_names()
        page = Paginator(names, QUEUES_SHOWN).get_page(request.GET.get("page"))
        down: dict[str, str] = {}  # a Cluster master that does not answer: waited for once
        sections, queue_errors = _sections(admin, now, list(page.object_list), down)
        states = [section.state for section in sections]
        try:
            graphs = charts.build(request.GET.get("charts"), names, states, down)
        except EngineUnavailable as exc:  # a master down: the queues read above stay shown
            charts_error = str(exc)
    except ConfigurationError as exc:  # its text names the setting, never a password
        settings_error = str(exc)
    except EngineUnavailable as exc:
        redis_error = str(exc)
    context = {
        **admin.admin_site.each_context(request),
        "title": _("Queue state and garbage"),
        "subtitle": None,
        "opts": admin.opts,
        "sections": sections,
        "charts": graphs,
        "charts_error": charts_error,
        "redis_error": redis_error,
        "settings_error": settings_error,
        "queue_errors": sorted(queue_errors.items()),
        "unlisted": unlisted,
        "page": page,
        "queues_before": page.start_index() - 1 if page else 0,
        "queues_after": page.paginator.count - page.end_index() if page else 0,
        "now": now,
        "changelist_url": reverse(f"{admin.admin_site.name}:django_delayjobs_job_changelist"),
        "requeue_url": reverse(f"{admin.admin_site.name}:django_delayjobs_queues_requeue"),
        "purge_url": reverse(f"{admin.admin_site.name}:django_delayjobs_queues_purge"),
        "forget_url": reverse(f"{admin.admin_site.name}:django_delayjobs_queues_forget"),
        **_permissions(admin, request),
    }
    request.current_app = admin.admin_site.name
    status = 503 if settings_error else 200
    return TemplateResponse(request, "admin/django_delayjobs/queues.html", context, status=status)


def _posted_ids(request: HttpRequest) -> list[uuid.UUID]:
    """The job ids a form posted: one row's button (``one``) or the ticked boxes."""
    values = request.POST.getlist("one") or request.POST.getlist("job")
    ids = []
    for value in values:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue  # not a job of ours (an id Redis holds without a row)
    return ids


def _back(admin: JobAdmin) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:django_delayjobs_queues"))


def _jobs(admin: JobAdmin, request: HttpRequest) -> tuple[list[uuid.UUID], list[Job]]:
    ids = _posted_ids(request)
    # Tolerantly, as the page that listed them: a poison row has its buttons too.
    jobs = list(tolerant(Job.objects.filter(pk__in=ids))) if ids else []
    if not ids:
        admin.message_user(request, _("No job was selected."), "warning")
    operations.report_gone(request, admin.message_user, len(set(ids)), len(jobs))
    return ids, jobs


def requeue(admin: JobAdmin, request: HttpRequest) -> HttpResponse:
    """POST: requeue the posted dead jobs (change permission), back to the page."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not admin.has_operate_permission(request):
        raise PermissionDenied
    _, jobs = _jobs(admin, request)
    if jobs:
        operations.requeue(request, jobs, admin.message_user)
    return _back(admin)


def purge(admin: JobAdmin, request: HttpRequest) -> HttpResponse:
    """POST: ask, then purge the posted dead jobs (delete permission), back to the page."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not admin.has_purge_permission(request):
        raise PermissionDenied
    ids, jobs = _jobs(admin, request)
    if not jobs:
        return _back(admin)
    shown = operations.shown_fence(request)
    if request.POST.get("post") != "yes" or shown is None:
        return admin.purge_confirmation(
            request,
            tolerant(Job.objects.filter(pk__in=[job.pk for job in jobs])),
            form_url=reverse(f"{admin.admin_site.name}:django_delayjobs_queues_purge"),
            hidden=[("job", str(pk)) for pk in ids],
            cancel_url=reverse(f"{admin.admin_site.name}:django_delayjobs_queues"),
        )
    operations.purge(request, jobs, admin.message_user, shown=shown)
    return _back(admin)


def forget(admin: JobAdmin, request: HttpRequest) -> HttpResponse:
    """POST: remove a garbage id whose job is not dead (or has no row) from its queue's
    Redis garbage, back to the page.

    No confirmation step, unlike purge: the job is not dead (the service checks again),
    so no job and no history is lost, only an entry that would count as garbage for ever.
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not admin.has_purge_permission(request):
        raise PermissionDenied
    queue = request.POST.get("queue", "")
    try:
        validate_name(queue, "queue")
        pk = uuid.UUID(request.POST.get("one", ""))
    except ValueError:
        admin.message_user(request, _("No valid queue and job id were posted."), "warning")
        return _back(admin)
    if Job.objects.filter(pk=pk, status=Status.DEAD).exists():
        admin.message_user(
            request, _("Job %s has a database row: purge it instead.") % pk, "warning"
        )
        return _back(admin)
    try:
        gone = services.forget(queue, [pk])
    except ConfigurationError as exc:
        admin.message_user(request, _("The DELAYJOBS settings cannot work: %s") % exc, "error")
        return _back(admin)
    except EngineUnavailable as exc:
        admin.message_user(request, _("Redis is unreachable: %s") % exc, "error")
        return _back(admin)
    if gone:
        text = ngettext(
            "%(count)d id forgotten from the garbage of queue %(queue)s.",
            "%(count)d ids forgotten from the garbage of queue %(queue)s.",
            gone,
        )
        admin.message_user(request, text % {"count": gone, "queue": queue}, "success")
    else:
        text = _("%(id)s is not in the garbage of queue %(queue)s.")
        admin.message_user(request, text % {"id": pk, "queue": queue}, "warning")
    return _back(admin)
