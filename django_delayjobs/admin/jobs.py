"""The Job admin: a read-only list and detail with history; changes only through actions.

Rows are never edited here. Saving a form would write a stale copy of a row a worker may
be updating; every change is an action that calls the service functions user code calls.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.core.paginator import Page, Paginator
from django.db import connections, transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..callbacks.action import shown_kwargs
from ..models import Job, JobEvent, Status
from ..rows import tolerant
from . import callbacks, database, display, operations, queue_views
from .changelist import ActionFilter, JobChangeList, QueueFilter
from .pagination import EstimatedCountPaginator

if TYPE_CHECKING:
    JobModelAdmin = admin.ModelAdmin[Job]
    EventInline = admin.TabularInline[JobEvent, Job]
else:
    JobModelAdmin = admin.ModelAdmin
    EventInline = admin.TabularInline


V = TypeVar("V", bound=Callable[..., Any])

#: Jobs listed on the purge confirmation page (all selected ones are purged).
PURGE_LISTED = 100


def own_transactions(view: V) -> V:
    """Mark ``view`` to run outside ``ATOMIC_REQUESTS``: an action commits job by job, as
    each service call does on its own. In the request's transaction its Redis calls ran
    at the end, each waiting for a Redis that does not answer (the action stops calling
    it after the first failure only while it runs), and the rows it changed stayed locked
    from the workers until the last job was done."""
    for alias in connections:
        transaction.non_atomic_requests(using=alias)(view)
    return view


def has_job_permission(request: HttpRequest, action: str) -> bool:
    """``request.user`` holds ``django_delayjobs.<action>_job``."""
    codename = get_permission_codename(action, Job._meta)
    return request.user.has_perm(f"{Job._meta.app_label}.{codename}")


class JobEventInline(EventInline):
    """A job's history: append-only, so shown and never edited; ``per_page`` events at a
    time (``?history=<page>``, the last page, the latest events, by default), in the order
    they happened."""

    model = JobEvent
    template = "admin/django_delayjobs/job/history_inline.html"
    extra = 0
    can_delete = False
    fields = ("at_display", "kind", "attempt", "actor", "message_display")
    readonly_fields = fields
    ordering = ("id",)  # as JobEvent's: the order of the changes (see its Meta)
    verbose_name_plural = _("History")
    #: Events per page: a job retried 1,000 times has over 2,000, each with up to 64 KiB of
    #: traceback, which one page showing them all would carry.
    per_page = 100
    page_param = "history"
    #: The page shown, and the links to the others (set per request: an inline is made
    #: for each request).
    page: Page[Any] | None = None
    page_links: tuple[tuple[str, str], ...] = ()

    def paged(
        self, request: HttpRequest, job: Job, events: QuerySet[JobEvent]
    ) -> QuerySet[JobEvent]:
        """The page of ``job``'s ``events`` that the request asks for: the last one (the
        latest events) if none, the nearest one for a number that is no page."""
        ids = events.filter(job=job).order_by(*self.ordering).values_list("pk", flat=True)
        pages = Paginator(ids, self.per_page, orphans=self.per_page // 4)  # no near-empty last page
        self.page = page = pages.get_page(request.GET.get(self.page_param, pages.num_pages))
        links = []
        if page.paginator.num_pages > 1:
            query = request.GET.copy()
            for label, number in (
                (_("first"), 1 if page.number > 1 else None),
                (_("previous"), page.previous_page_number() if page.has_previous() else None),
                (_("next"), page.next_page_number() if page.has_next() else None),
                (_("last"), page.paginator.num_pages if page.has_next() else None),
            ):
                if number is not None:
                    query[self.page_param] = str(number)
                    links.append((str(label), f"?{query.urlencode()}"))
        self.page_links = tuple(links)
        return tolerant(events.filter(pk__in=list(page.object_list)))

    @admin.display(description=_("at"))
    def at_display(self, event: JobEvent) -> str:
        return display.timestamp(event.at)

    @admin.display(description=_("message"))
    def message_display(self, event: JobEvent) -> SafeString | str:
        if "\n" in event.message:
            return display.pre(event.message)
        return event.message or display.EMPTY

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The history is part of the job: whoever may see the job sees how it got there.
        return has_job_permission(request, "view") or has_job_permission(request, "change")


class JobAdmin(JobModelAdmin):
    list_display = (
        "short_id", "status", "queue", "action", "target_link", "run_at_display",
        "attempts_display", "lateness_display",
    )  # fmt: skip
    list_display_links = ("short_id",)
    list_filter = ("status", callbacks.KindFilter, ("queue", QueueFilter), ("action", ActionFilter))
    # Not the target's content type: joined on the jobs' database, it is that database's,
    # and the services and the worker read the project's (display._model).
    list_select_related = ()
    # Only run_at has an index that serves ORDER BY ... LIMIT on a million rows.
    sortable_by = ("run_at_display",)
    date_hierarchy = "run_at"
    search_fields = ("id", "key", "target_id")  # exact matches: see get_search_results
    search_help_text = _("An exact job id, key or target id (at most 1,000 jobs are found).")
    search_limit = 1000
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would scan the whole table
    #: The lookups the filters and the date drill-down make (its year, month and day are
    #: turned into run_at bounds first); any other is refused (400). Django lets a lookup
    #: of any field through: ?last_error__regex= or ?kwargs__contains= would run over
    #: every row of a big table, and some are a 500 (a malformed regex; a JSON contains
    #: on SQLite).
    filter_lookups = frozenset({
        "status__exact", "status__isnull", "kind", "queue", "queue__isnull", "action",
        "action__isnull", "run_at__gte", "run_at__lt",
    })  # fmt: skip
    paginator = EstimatedCountPaginator
    list_per_page = 100
    actions = ["cancel_jobs", "run_now", "requeue_dead", "purge_dead"]
    inlines = [JobEventInline]
    fieldsets = (
        (None, {"fields": ("id", "status", "queue", "action", "target_link", "key")}),
        (_("Timing"), {"fields": (
            "run_at_exact", "expires_at_display", "created_at_display", "started_at_display",
            "finished_at_display", "lateness_display",
        )}),
        (_("Attempts"), {"fields": ("attempts", "max_attempts", "priority", "worker")}),
        (_("Arguments and result"), {"fields": ("args_display", "kwargs_display",
                                                "result_display")}),
        (_("Last error"), {"fields": ("last_error_display",)}),
    )  # fmt: skip
    readonly_fields = (
        "target_link", "run_at_exact", "expires_at_display", "created_at_display",
        "started_at_display", "finished_at_display", "lateness_display", "args_display",
        "kwargs_display", "result_display", "last_error_display", *callbacks.READONLY,
    )  # fmt: skip

    # -- permissions: the form is read-only, changes are actions -------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # dead jobs are purged (an action); others are never deleted here

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Cancel, run now, requeue: the model's change permission."""
        return has_job_permission(request, "change")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        """Purge dead jobs, forget ids without a row: the model's delete permission, and
        leave to see jobs (view or change). Purging lists the jobs it asks about, and
        nobody should destroy what they may not look at."""
        return has_job_permission(request, "delete") and self.has_view_permission(request)

    # -- list -------------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A NUL in a search or filter value would reach PostgreSQL, which refuses it with
        # a DataError (a 500); no stored value holds one, so it is a bad request.
        if any("\x00" in key + "".join(values) for key, values in request.GET.lists()):
            return HttpResponseBadRequest("NUL characters are not allowed in the query string.")
        # Django filters the selection with pk__in, which raises ValidationError (a 500)
        # for a value that is not a UUID: no checkbox of the list posts one.
        try:
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                uuid.UUID(value)
        except ValueError:
            return HttpResponseBadRequest("The selected jobs must be given by their ids.")
        return super().changelist_view(request, extra_context)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.filter_lookups

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # A row the door would refuse (an older version, a manual edit) is listed and
        # shown with its unreadable values as text, instead of failing the whole page.
        return tolerant(super().get_queryset(request))

    def get_formset_kwargs(
        self, request: HttpRequest, obj: Any, inline: Any, prefix: str
    ) -> dict[str, Any]:
        params = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, JobEventInline) and obj is not None:
            params["queryset"] = inline.paged(request, obj, params["queryset"])
        return params

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[JobChangeList]:
        return JobChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """Exact matches of id, key or target id; at most ``search_limit`` jobs.

        The matching ids are read once: the count, the page and the date hierarchy then
        look them up by primary key instead of each searching the table again. The term
        is not stripped: a key may begin or end with a space.
        """
        if not search_term:
            return queryset, False
        if "\x00" in search_term:  # PostgreSQL refuses it (a 500), and no key holds one
            return queryset.none(), False
        with contextlib.suppress(ValueError):  # not a UUID: no job has it as its id
            # A job's own id is not also some other job's key or target: done.
            by_id = queryset.filter(pk=uuid.UUID(search_term))
            if by_id.exists():
                return by_id, False
        match = Q(key=search_term) | Q(target_id=search_term)
        found = list(queryset.filter(match).values_list("pk", flat=True)[: self.search_limit])
        return queryset.filter(pk__in=found), False

    @admin.display(description=_("id"), ordering="pk")
    def short_id(self, job: Job) -> SafeString:
        # The tail: an id begins with the time it was made (the same for a minute's jobs).
        return format_html('<span title="{}">{}</span>', job.pk, display.short_id(job.pk))

    @admin.display(description=_("target"))
    def target_link(self, job: Job) -> SafeString | str:
        return display.link(display.target_url(job, self.admin_site), display.target_label(job))

    @admin.display(description=_("run at"), ordering="run_at")
    def run_at_display(self, job: Job) -> SafeString:
        # To the second in the list, to the millisecond on hover and on the detail page.
        full = display.timestamp(job.run_at)
        return format_html('<span title="{}">{}</span>', full, full[:19])

    @admin.display(description=_("attempts"))
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description=_("lateness"))
    def lateness_display(self, job: Job) -> str:
        late = display.lateness(job)
        return display.EMPTY if late is None else display.duration(late)

    # -- detail -----------------------------------------------------------------------

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Job | None:
        # ``?_to_field=`` (empty) skips Django's check of the field, which only a non-empty
        # name gets, and reached this as a field named "": a 500. Empty: the primary key.
        return super().get_object(request, object_id, from_field or None)

    @admin.display(description=_("run at"))
    def run_at_exact(self, job: Job) -> str:
        return display.timestamp(job.run_at)

    @admin.display(description=_("expires at"))
    def expires_at_display(self, job: Job) -> str:
        return display.timestamp(job.expires_at)

    @admin.display(description=_("created at"))
    def created_at_display(self, job: Job) -> str:
        return display.timestamp(job.created_at)

    @admin.display(description=_("started at"))
    def started_at_display(self, job: Job) -> str:
        return display.timestamp(job.started_at)

    @admin.display(description=_("finished at"))
    def finished_at_display(self, job: Job) -> str:
        return display.timestamp(job.finished_at)

    @admin.display(description=_("args"))
    def args_display(self, job: Job) -> SafeString | str:
        return display.as_json(job.args)

    @admin.display(description=_("kwargs"))
    def kwargs_display(self, job: Job) -> SafeString | str:
        return display.as_json(shown_kwargs(job.action, job.kwargs))

    @admin.display(description=_("result"))
    def result_display(self, job: Job) -> SafeString | str:
        return display.as_json(job.result)

    @admin.display(description=_("last error"))
    def last_error_display(self, job: Job) -> SafeString | str:
        return display.pre(job.last_error)

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if callbacks.is_callback(obj):
            fieldsets.insert(1, callbacks.fieldset())
        return fieldsets

    @admin.display(description=_("method"))
    def callback_method(self, job: Job) -> str:
        return callbacks.method(job)

    @admin.display(description=_("URL"))
    def callback_url(self, job: Job) -> str:
        return callbacks.url(job)

    @admin.display(description=_("last status"))
    def callback_last_status(self, job: Job) -> SafeString | str:
        return callbacks.last_status(job)

    # -- actions ----------------------------------------------------------------------

    def selection(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """The jobs an action works on: every job the list's filters match (select across),
        or the ticked ones whatever they are now, having said how many of those no longer
        exist. Not Django's ticked jobs that still match the filters: one that started
        since left a list of scheduled jobs unseen ("0 jobs cancelled.", not "too late"),
        and one purged since was not counted at all."""
        if forms.BooleanField(required=False).clean(request.POST.get("select_across")):
            return queryset
        ticked = {uuid.UUID(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)}
        chosen = self.get_queryset(request).filter(pk__in=ticked)
        operations.report_gone(request, self.message_user, len(ticked), chosen.count())
        return chosen

    @admin.action(description=_("Cancel selected jobs"), permissions=["operate"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        jobs = operations.walk(self.selection(request, queryset))
        operations.cancel(request, jobs, self.message_user)

    @admin.action(description=_("Run selected jobs now"), permissions=["operate"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        jobs = operations.walk(self.selection(request, queryset))
        operations.run_now(request, jobs, self.message_user)

    @admin.action(description=_("Requeue selected dead jobs"), permissions=["operate"])
    def requeue_dead(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        jobs = operations.walk(self.selection(request, queryset))
        operations.requeue(request, jobs, self.message_user)

    @admin.action(description=_("Purge selected dead jobs"), permissions=["purge"])
    def purge_dead(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        queryset = self.selection(request, queryset)
        shown = operations.shown_fence(request)
        if request.POST.get("post") != "yes" or shown is None:
            keep = ["action", "index", "select_across", helpers.ACTION_CHECKBOX_NAME]
            hidden = [(name, value) for name in keep for value in request.POST.getlist(name)]
            return self.purge_confirmation(
                request, queryset, form_url="", hidden=hidden, cancel_url=""
            )
        operations.purge(request, operations.walk(queryset), self.message_user, shown=shown)
        return None

    def purge_confirmation(
        self,
        request: HttpRequest,
        jobs: QuerySet[Job],
        *,
        form_url: str,
        hidden: list[tuple[str, str]],
        cancel_url: str,
    ) -> TemplateResponse:
        """Ask first: a purge deletes the jobs and their history for good.

        The dead jobs and the others are read apart, each sliced: the first jobs of a
        big selection may all be alive while dead ones follow (and an open iterator over
        a million selected jobs would have PostgreSQL copy them all, a cursor WITH HOLD).
        The form carries the newest job event before they were read (not the time: the
        workers stamp a death with their own clocks): the purge reads the selection again,
        and leaves a job that changed since (it died since: never shown here) alone.
        """
        hidden = [*hidden, ("shown", operations.shown_token())]
        dead = list(jobs.filter(status=Status.DEAD)[: PURGE_LISTED + 1])
        others = jobs.exclude(status=Status.DEAD)[: PURGE_LISTED + 1].count()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Purge dead jobs?"),
            "subtitle": None,
            "opts": self.opts,
            "dead": dead[:PURGE_LISTED],
            "others": min(others, PURGE_LISTED),
            "more_others": others > PURGE_LISTED,
            "more": len(dead) > PURGE_LISTED,
            "form_url": form_url,
            "hidden": hidden,
            "cancel_url": cancel_url,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/django_delayjobs/job/purge_confirmation.html", context
        )

    # -- the queue page ---------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        name = self.opts.app_label
        wrap = self.admin_site.admin_view

        def changes(view: Callable[[HttpRequest], HttpResponse]) -> Callable[..., HttpResponse]:
            return own_transactions(wrap(view))

        urls = [
            path("queues/", wrap(self.queues_view), name=f"{name}_queues"),
            path("queues/requeue/", changes(self.requeue_view), name=f"{name}_queues_requeue"),
            path("queues/purge/", changes(self.purge_view), name=f"{name}_queues_purge"),
            path("queues/forget/", changes(self.forget_view), name=f"{name}_queues_forget"),
            *super().get_urls(),
        ]
        for url in urls:  # the actions are posted to the job list
            if url.name == f"{name}_{self.opts.model_name}_changelist":
                own_transactions(url.callback)
            url.callback = database.guarded(url.callback, self.admin_site.each_context)
        return urls

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        return queue_views.queues_page(self, request)

    def requeue_view(self, request: HttpRequest) -> HttpResponse:
        return queue_views.requeue(self, request)

    def purge_view(self, request: HttpRequest) -> HttpResponse:
        return queue_views.purge(self, request)

    def forget_view(self, request: HttpRequest) -> HttpResponse:
        return queue_views.forget(self, request)
