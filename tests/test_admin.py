"""The Job admin and the queue page, through Django's test client, against a real Redis.

Every change is a POST through the service functions, checked by model permissions and
CSRF, and recorded by a JobEvent naming the admin user.
"""

from __future__ import annotations

import datetime
import re
import sys
import types
import uuid
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.db.models import Count
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import path, reverse
from django.utils import timezone

from django_delayjobs import schedule
from django_delayjobs.admin import display
from django_delayjobs.admin.pagination import EstimatedCountPaginator
from django_delayjobs.connection import get_engine
from django_delayjobs.models import EventKind, Job, JobEvent, Status
from django_delayjobs.services import build_job, schedule_many
from tests.helpers import confirm_purge
from tests.testapp import tasks
from tests.testapp.models import Receipt, Sku, Thing

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayjobs_job_changelist"
QUEUES = "admin:django_delayjobs_queues"
REQUEUE = "admin:django_delayjobs_queues_requeue"
PURGE = "admin:django_delayjobs_queues_purge"
FORGET = "admin:django_delayjobs_queues_forget"


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def dead_job(label: str = "boom", queue: str = "default") -> Job:
    """A job that really failed its only attempt: dead in the database, buried in Redis."""
    job = schedule(tasks.fail, in_=0, args=[label], max_attempts=1, queue=queue)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    return job


def garbage_count(queue: str = "default") -> int:
    return get_engine().stats(queue).garbage


def user_with(django_user_model, name: str, *codenames: str, staff: bool = True):
    user = django_user_model.objects.create_user(username=name, password="pw", is_staff=staff)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_delayjobs",
                                   codename__in=codenames)
    )  # fmt: skip
    return user


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(user_with(django_user_model, "viewer", "view_job"))
    return client


@pytest.fixture
def operator(client, django_user_model):
    """May cancel, run now and requeue (change_job), but not purge (delete_job)."""
    client.force_login(user_with(django_user_model, "operator", "view_job", "change_job"))
    return client


@pytest.fixture
def nobody(client, django_user_model):
    """Staff, but without any permission on jobs."""
    client.force_login(user_with(django_user_model, "nobody"))
    return client


@pytest.fixture
def target_admin(settings):
    """Thing and Sku registered on the admin site, so a job's target links to its page."""
    admin.site.register([Thing, Sku])
    urls = types.ModuleType("delayjobs_admin_test_urls")
    urls.urlpatterns = [path("admin/", admin.site.urls)]  # type: ignore[attr-defined]
    sys.modules[urls.__name__] = urls
    settings.ROOT_URLCONF = urls.__name__
    yield
    admin.site.unregister([Thing, Sku])
    del sys.modules[urls.__name__]


def selected(name: str, *jobs: Job) -> dict[str, Any]:
    return {"action": name, "_selected_action": [str(job.pk) for job in jobs], "index": "0"}


def action(client: Client, name: str, *jobs: Job, **extra: str):
    return client.post(reverse(CHANGELIST), {**selected(name, *jobs), **extra}, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def actors(job: Job) -> list[tuple[str, str]]:
    return list(job.events.values_list("kind", "actor"))


# -- the job list --------------------------------------------------------------------


def test_changelist_shows_columns_filters_and_queue_link(admin_client, target_admin):
    thing = Thing.objects.create(name="t")
    job = schedule(thing.expire, in_=3600, queue="orders", key="order-1")
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    html = response.content.decode()
    for header in ("Status", "Queue", "Action", "Target", "Run at", "Attempts", "Lateness"):
        assert f">{header}<" in html or f">{header}</a>" in html, header
    assert str(job.pk)[-8:] in html
    assert "testapp.Thing.expire" in html
    thing_url = reverse("admin:testapp_thing_change", args=[thing.pk])
    assert f'<a href="{thing_url}">Thing {thing.pk}</a>' in html
    assert 'id="changelist-filter"' in html
    for parameter in ("status__exact=dead", "queue=orders", "action=testapp.Thing.expire"):
        assert parameter in html, parameter
    assert reverse(QUEUES) in html
    assert "toplinks" in html  # the date hierarchy


def test_target_without_admin_page_is_plain_text(admin_client):
    thing = Thing.objects.create(name="t")
    schedule(thing.expire, in_=3600)
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert f"Thing {thing.pk}" in html
    assert "/testapp/thing/" not in html


def test_changelist_queries_do_not_grow_with_rows(admin_client):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(reverse(CHANGELIST)).status_code == 200
        return len(captured)

    schedule(Thing.objects.create().expire, in_=60)
    few = queries()
    for _ in range(30):
        schedule(Thing.objects.create().expire, in_=60)
    assert queries() == few


def test_filters_narrow_the_list(admin_client):
    keep = schedule(tasks.record, in_=60, args=["a"], queue="orders")
    other = schedule(tasks.record, in_=60, args=["b"])
    html = admin_client.get(reverse(CHANGELIST), {"queue": "orders"}).content.decode()
    assert str(keep.pk)[-8:] in html and str(other.pk)[-8:] not in html
    cancelled = schedule(tasks.record, in_=60, args=["c"])
    cancelled.cancel()
    html = admin_client.get(reverse(CHANGELIST), {"status__exact": "cancelled"}).content.decode()
    assert str(cancelled.pk)[-8:] in html and str(keep.pk)[-8:] not in html
    echo = schedule(tasks.echo, in_=60)
    html = admin_client.get(reverse(CHANGELIST), {"action": echo.action}).content.decode()
    assert str(echo.pk)[-8:] in html and str(keep.pk)[-8:] not in html


@pytest.mark.parametrize("by", ["id", "key", "target id"])
def test_search_finds_a_job_by_exact_id_key_or_target_id(admin_client, by):
    thing = Thing.objects.create()
    job = schedule(thing.expire, in_=60, key="order-77-autocancel")
    other = schedule(Thing.objects.create().expire, in_=60, key="order-78-autocancel")
    term = {"id": str(job.pk), "key": job.key, "target id": str(thing.pk)}[by]
    response = admin_client.get(reverse(CHANGELIST), {"q": term})
    html = response.content.decode()
    assert str(job.pk)[-8:] in html and str(other.pk)[-8:] not in html


@pytest.mark.parametrize(("term", "expected"), [("k ", "spaced"), ("k", "plain"), (" k", None)])
def test_search_matches_a_key_exactly_spaces_included(admin_client, term, expected):
    jobs = {
        "spaced": schedule(tasks.record, in_=60, args=["a"], key="k "),
        "plain": schedule(tasks.record, in_=60, args=["b"], key="k"),
    }
    response = admin_client.get(reverse(CHANGELIST), {"q": term})
    found = [job.pk for job in response.context["cl"].result_list]
    assert found == ([jobs[expected].pk] if expected else [])


@pytest.mark.parametrize("term", ["\x00", "k\x00"])
def test_the_admin_autocomplete_of_jobs_takes_a_nul_without_a_500(admin_client, term):
    """Django's autocomplete view searches jobs through JobAdmin.get_search_results (for
    JobEvent.job), past the job list's refusal of NUL characters: PostgreSQL refused the
    term with a DataError, a 500. No stored key or target id holds a NUL: nothing found."""
    schedule(tasks.record, in_=3600, args=["x"], key="k")
    query = {"app_label": "django_delayjobs", "model_name": "jobevent", "field_name": "job",
             "term": term}  # fmt: skip
    response = admin_client.get("/admin/autocomplete/", query)
    assert response.status_code == 200
    assert response.json()["results"] == []


def test_search_for_nothing_known_finds_nothing(admin_client):
    schedule(tasks.record, in_=60, args=["a"])
    response = admin_client.get(reverse(CHANGELIST), {"q": "no-such-thing"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_date_hierarchy_drills_down_by_run_at(admin_client):
    job = schedule(tasks.record, in_=60, args=["a"])
    past = schedule(tasks.record, at=timezone.now() - datetime.timedelta(days=400), args=["b"])
    year = job.run_at.year
    html = admin_client.get(reverse(CHANGELIST), {"run_at__year": year}).content.decode()
    assert str(job.pk)[-8:] in html and str(past.pk)[-8:] not in html
    assert f"run_at__month={job.run_at.month}" in html


@pytest.mark.parametrize(
    "query",
    [
        {"run_at__day": "31"}, {"run_at__day": "0"}, {"run_at__day": "9" * 30},
        {"run_at__month": "11"}, {"run_at__year": "2030", "run_at__day": "5"},
        {"run_at__year": "2030", "run_at__month": "11", "run_at__day": "9" * 30},
    ],
)  # fmt: skip
def test_date_hierarchy_redirects_a_day_or_month_without_a_year_as_a_bad_filter(
    admin_client, query
):
    """All jobs in one 30-day month used to put its year and month with the query's day 31:
    a 500. A drill-down that is not year[, month[, day]] is Django's "?e=1" redirect."""
    for day in (5, 20):
        schedule(tasks.record, at=datetime.datetime(2030, 11, day, tzinfo=datetime.UTC), args=["x"])
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 302
    assert response.url.endswith("?e=1")


def test_the_job_list_sorts_only_by_run_at_whatever_o_says(admin_client):
    """?o=<column index> sorted by any column (queue, status, action, id): Django's
    ChangeList ignores sortable_by, so a hostile ?o= made every page a sort of the whole
    table, which only run_at's index can serve. A ?o= it refuses keeps the list's order,
    not the primary key's (creation's, ids being time-ordered: the other way here)."""
    schedule(tasks.record, in_=7200, args=["x"], queue="b")
    schedule(tasks.record, in_=3600, args=["x"], queue="a")
    for o in ("2", "-2", "1.2", "0", "99", "x"):  # queue, queue desc, status then queue, id
        response = admin_client.get(reverse(CHANGELIST), {"o": o})
        assert response.status_code == 200
        queues = [job.queue for job in response.context["cl"].result_list]
        assert queues == ["b", "a"], o  # latest due first, as without ?o=


@pytest.mark.parametrize(
    "query",
    [
        {"kwargs__contains": "x"},  # SQLite: NotSupportedError, a 500
        {"args__contains": "x"},
        {"key__regex": "("},  # a malformed regex: a 500 on SQLite and PostgreSQL
        {"last_error__regex": "(a+)+$"},  # a regex run over every row
        {"last_error__icontains": "password"},  # a scan of the whole table
        {"kwargs__reason": "x"},
        {"id__startswith": "0"},
    ],
)
def test_the_job_list_refuses_lookups_its_filters_do_not_offer(admin_client, query):
    """Django's admin lets ?<field>__<lookup>= through for any local field: a JSON
    contains (500 on SQLite), a malformed regex (500), a regex or a substring search run
    over every row of a big table. Only the filters' own lookups are offered."""
    schedule(tasks.record, in_=3600, args=["x"])
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 400


@pytest.mark.parametrize(
    "query",
    [
        {"run_at__gte": "0001-01-01T00:00:00+05:00"},
        {"run_at__lt": "9999-12-31T23:59:59.999999-05:00"},
        {"run_at__gte": "2030-01-01T00:00:00Z"},
    ],
)
def test_the_job_list_takes_run_at_bounds_only_from_the_date_drill_down(admin_client, query):
    """?run_at__gte= and ?run_at__lt= straight from the query string reached the database
    as given: a time whose UTC is outside years 1-9999 was an OverflowError on SQLite (a
    500). The bounds are the drill-down's (year, month, day), which are checked; given
    directly they are refused like any other lookup (400)."""
    schedule(tasks.record, in_=3600, args=["x"])
    response = admin_client.get(reverse("admin:django_delayjobs_job_changelist"), query)
    assert response.status_code == 400


def test_the_job_list_filters_still_work(admin_client):
    """The allowed lookups: every filter and the date drill-down (guards the fix above)."""
    job = schedule(tasks.record, in_=3600, args=["x"], queue="orders")
    year = timezone.localtime(job.run_at).year
    for query in [
        {"status__exact": "scheduled"}, {"queue": "orders"}, {"action": job.action},
        {"kind": "python"}, {"run_at__year": str(year)}, {"q": str(job.pk)},
        {"queue__isnull": "False"}, {"status__isnull": "False"}, {"action__isnull": "False"},
    ]:  # fmt: skip
        response = admin_client.get(reverse(CHANGELIST), query)
        assert response.status_code == 200, query
        assert [j.queue for j in response.context["cl"].result_list] == ["orders"], query


def test_lateness_is_start_minus_due_time(admin_client):
    job = schedule(tasks.record, in_=60, args=["a"])
    Job.objects.filter(pk=job.pk).update(
        status=Status.SUCCEEDED, attempts=1, started_at=job.run_at + datetime.timedelta(seconds=3)
    )
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "3.0 s" in html


def test_no_add_and_no_bulk_delete(admin_client):
    job = schedule(tasks.record, in_=60, args=["a"])
    assert admin_client.get(reverse("admin:django_delayjobs_job_add")).status_code == 403
    delete = reverse("admin:django_delayjobs_job_delete", args=[job.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "delete_selected" not in html
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        # the worker's first line, whatever the message and notes quote after it
        (
            "builtins.ValueError: a\nnote\nTraceback (most recent call last):\nKeyError: b\n",
            "builtins.ValueError: a",
        ),
        (
            "django_delayjobs.exceptions.GiveUp: gone\nHTTP 404",
            "django_delayjobs.exceptions.GiveUp: gone",
        ),
        # an older version's bare traceback, and other reasons: the last line
        ("Traceback (most recent call last):\n  File x\nValueError: v\n", "ValueError: v"),
        ("the target object no longer exists", "the target object no longer exists"),
        ("", ""),
    ],
)
def test_an_errors_summary_is_the_workers_first_line(text, line):
    assert display.error_summary(text) == line


# -- the detail page -------------------------------------------------------------------


def test_detail_is_read_only_with_history_and_error(admin_client):
    job = dead_job("kaput")
    url = reverse("admin:django_delayjobs_job_change", args=[job.pk])
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html and 'name="queue"' not in html
    head = '<pre class="delayjobs-pre">builtins.RuntimeError: failing on purpose: kaput\n'
    assert re.search(re.escape(head) + r"Traceback.*failing on purpose: kaput", html, re.S)
    assert "History" in html
    kinds = re.findall(r'<tr class="form-row" data-kind="(\w+)">', html)
    assert kinds == ["scheduled", "started", "failed", "dead"]
    assert '<td class="field-actor">code</td>' in html
    before = Job.objects.get(pk=job.pk)
    response = admin_client.post(url, {"status": "scheduled", "queue": "x"})
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).status == before.status == Status.DEAD


def test_detail_links_the_target(admin_client, target_admin):
    thing = Thing.objects.create(name="linked")
    job = schedule(thing.expire, in_=60)
    html = admin_client.get(
        reverse("admin:django_delayjobs_job_change", args=[job.pk])
    ).content.decode()
    assert reverse("admin:testapp_thing_change", args=[thing.pk]) in html


def test_detail_links_a_target_whose_primary_key_the_admin_quotes(admin_client, target_admin):
    """The admin unquotes object ids ("_25" is "%"): an unquoted link to Sku "sku_25off"
    opened "sku%off", which does not exist."""
    sku = Sku.objects.create(code="sku_25off")
    job = schedule(sku.touch, in_=60)
    page = admin_client.get(reverse("admin:django_delayjobs_job_change", args=[job.pk]))
    link = reverse("admin:testapp_sku_change", args=[quote(sku.pk)])
    assert f'href="{link}"' in page.content.decode()
    assert admin_client.get(link).status_code == 200


def test_viewer_sees_the_history_too(viewer):
    job = schedule(tasks.record, in_=60, args=["a"])
    response = viewer.get(reverse("admin:django_delayjobs_job_change", args=[job.pk]))
    assert response.status_code == 200
    assert "field-actor" in response.content.decode()


# -- actions -----------------------------------------------------------------------------


def test_cancel_action_cancels_through_the_service(admin_client):
    waiting = schedule(tasks.record, in_=3600, args=["a"])
    done = schedule(tasks.record, in_=0, args=["b"])
    burst()
    response = action(admin_client, "cancel_jobs", waiting, done)
    assert messages_of(response) == [
        "1 job cancelled.",
        "1 job was not cancelled: it had already started or finished.",
    ]
    waiting.refresh_from_db()
    assert waiting.status == Status.CANCELLED
    assert actors(waiting)[-1] == (EventKind.CANCELLED, "admin:admin")
    assert Job.objects.get(pk=done.pk).status == Status.SUCCEEDED
    assert get_engine().stats("default").pending == 0


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL stores no such name")
def test_an_action_by_a_user_whose_name_the_actor_column_cannot_hold_is_recorded(
    client, django_user_model
):
    """A username with a NUL (SQLite stores one; a custom user model may make one) made
    the actor "admin:a\\x00b", which the service refused: the action was a 500."""
    user = django_user_model.objects.create_superuser("a\x00b", password="pw")
    client.force_login(user)
    waiting = schedule(tasks.record, in_=3600, args=["a"])
    response = action(client, "cancel_jobs", waiting)
    assert messages_of(response) == ["1 job cancelled."]
    assert actors(waiting)[-1] == (EventKind.CANCELLED, "admin:a\\x00b")


def test_run_now_moves_the_due_time_to_now(admin_client):
    job = schedule(tasks.record, in_=3600, args=["a"])
    before = timezone.now()
    response = action(admin_client, "run_now", job)
    assert messages_of(response) == ["1 job is due now."]
    job.refresh_from_db()
    assert before <= job.run_at <= timezone.now()
    assert actors(job)[-1] == (EventKind.RESCHEDULED, "admin:admin")
    stats = get_engine().stats("default")
    assert stats.overdue + stats.ready == 1 and stats.pending == stats.overdue  # due, not later
    burst()
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


def test_run_now_across_every_job_moves_each_once(admin_client):
    """Run now on "select all" (select_across) walked the list ordered by run_at while
    moving each job's run_at: on SQLite the cursor met the moved rows again, so 2,100
    jobs were reported as 4,100 due now and 2,000 got two "rescheduled" events."""
    now = timezone.now()
    jobs = [build_job(tasks.record, at=now + datetime.timedelta(hours=1, seconds=i), args=[i])
            for i in range(2100)]  # fmt: skip
    schedule_many(jobs)
    data = {"action": "run_now", "_selected_action": [str(jobs[0].pk)], "select_across": "1",
            "index": "0"}  # fmt: skip
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["2100 jobs are due now."]
    twice = (
        JobEvent.objects.filter(kind=EventKind.RESCHEDULED)
        .values("job").annotate(n=Count("id")).filter(n__gt=1)
    )  # fmt: skip
    assert not twice.exists()


def test_run_now_of_an_expired_job_is_refused(admin_client):
    job = schedule(tasks.record, in_=3600, args=["a"], expires=datetime.timedelta(hours=2))
    Job.objects.filter(pk=job.pk).update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    response = action(admin_client, "run_now", job)
    assert messages_of(response) == [
        "1 job was not moved: it had already started, finished or expired."
    ]
    assert Job.objects.get(pk=job.pk).run_at == job.run_at


def test_requeue_action_revives_dead_jobs_only(admin_client):
    dead = dead_job()
    alive = schedule(tasks.record, in_=3600, args=["a"])
    assert garbage_count() == 1
    response = action(admin_client, "requeue_dead", dead, alive)
    assert messages_of(response) == [
        "1 dead job requeued.",
        "1 job was not requeued: it was not dead.",
    ]
    dead.refresh_from_db()
    assert dead.status == Status.SCHEDULED
    assert actors(dead)[-1] == (EventKind.REQUEUED, "admin:admin")
    assert garbage_count() == 0


def test_requeue_action_says_why_a_dead_job_whose_key_is_held_again_stays_dead(admin_client):
    dead, other = dead_job(), dead_job("other")
    Job.objects.filter(pk=dead.pk).update(key="order-7")
    holder = schedule(tasks.record, in_=3600, args=["a"], key="order-7")
    response = action(admin_client, "requeue_dead", dead, other)
    assert messages_of(response) == [
        f"Job {dead.pk} was not requeued: job {holder.pk} holds the key 'order-7' now: "
        "cancel it first.",
        "1 dead job requeued.",
    ]
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    assert Job.objects.get(pk=other.pk).status == Status.SCHEDULED
    response = action(admin_client, "requeue_dead", dead)  # alone: only why
    assert [m.split(":")[0] for m in messages_of(response)] == [f"Job {dead.pk} was not requeued"]


def test_purge_action_asks_then_deletes_dead_jobs_and_logs_who(admin_client, admin_user):
    dead = dead_job()
    alive = schedule(tasks.record, in_=3600, args=["a"])
    response = action(admin_client, "purge_dead", dead, alive)
    html = response.content.decode()
    assert "Purge dead jobs?" in html and str(dead.pk) in html
    assert "1 selected job is not dead and will be left alone." in html
    assert 'name="post" value="yes"' in html and "csrfmiddlewaretoken" in html
    assert Job.objects.filter(pk=dead.pk).exists()
    response = confirm_purge(
        admin_client, reverse(CHANGELIST), selected("purge_dead", dead, alive), follow=True
    )
    assert messages_of(response) == [
        "1 dead job purged.",
        "1 job was not purged: it was not dead.",
    ]
    assert not Job.objects.filter(pk=dead.pk).exists()
    assert not JobEvent.objects.filter(job_id=dead.pk).exists()
    assert Job.objects.filter(pk=alive.pk).exists()
    assert garbage_count() == 0
    entry = LogEntry.objects.get(object_id=str(dead.pk))
    assert (entry.user, entry.action_flag) == (admin_user, DELETION)


def test_the_purge_confirmation_of_every_job_reads_only_the_jobs_it_lists(admin_client):
    """Asking to purge every job of the list (select_across) read the selection with an
    unbounded iterator to list its first 100: on PostgreSQL a server-side cursor WITH HOLD
    copies every selected row (a million) before the first is read. It reads 101 now."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    data = {"action": "purge_dead", "_selected_action": [str(job.pk)], "select_across": "1",
            "index": "0"}  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 200 and b"None of the selected jobs is dead" in response.content
    column = '"django_delayjobs_job"."kwargs"'  # a read of whole job rows
    reads = [q["sql"] for q in queries.captured_queries if column in q["sql"]]
    assert reads and all("LIMIT 101" in sql for sql in reads), reads


def test_viewer_is_not_offered_actions_and_cannot_post_one(viewer):
    job = schedule(tasks.record, in_=3600, args=["a"])
    response = viewer.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert 'name="action"' not in response.content.decode()
    response = action(viewer, "cancel_jobs", job)
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


def test_operator_may_change_but_not_purge(operator):
    dead = dead_job()
    html = operator.get(reverse(CHANGELIST)).content.decode()
    for name in ("cancel_jobs", "run_now", "requeue_dead"):
        assert f'value="{name}"' in html, name
    assert 'value="purge_dead"' not in html
    action(operator, "purge_dead", dead, post="yes")
    assert Job.objects.filter(pk=dead.pk).exists()
    action(operator, "requeue_dead", dead)
    assert Job.objects.get(pk=dead.pk).status == Status.SCHEDULED
    assert actors(dead)[-1] == (EventKind.REQUEUED, "admin:operator")


def test_staff_without_permission_gets_403_and_anonymous_goes_to_login(nobody):
    job = schedule(tasks.record, in_=3600, args=["a"])
    assert nobody.get(reverse(CHANGELIST)).status_code == 403
    assert (
        nobody.get(reverse("admin:django_delayjobs_job_change", args=[job.pk])).status_code == 403
    )
    anonymous = Client()
    response = anonymous.get(reverse(CHANGELIST))
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))


@pytest.mark.parametrize("selected", ["not-a-uuid", "1", "\x00"])
def test_an_action_on_a_selection_that_is_not_a_job_id_is_400(admin_client, selected):
    """A posted _selected_action that is not a UUID raised ValidationError in Django's
    queryset.filter(pk__in=...): a 500. Now a 400, and nothing changes."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    data = {"action": "cancel_jobs", "_selected_action": [selected, str(job.pk)], "index": "0"}
    response = admin_client.post(reverse(CHANGELIST), data)
    assert response.status_code == 400
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


def test_action_post_without_csrf_token_is_403(admin_user):
    job = schedule(tasks.record, in_=3600, args=["a"])
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    response = client.post(
        reverse(CHANGELIST),
        {"action": "cancel_jobs", "_selected_action": [str(job.pk)], "index": "0"},
    )
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


# -- the queue page -------------------------------------------------------------------------


def summary(html: str, queue: str, count: str) -> str:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row, f"no summary row for {queue}"
    cell = re.search(rf'data-count="{count}">(?:<a [^>]*>)?(\d+)', row.group(1))
    assert cell, f"no {count} cell"
    return cell.group(1)


def test_queue_page_shows_counts_next_due_and_garbage(admin_client):
    dead = dead_job("kaput")
    upcoming = schedule(tasks.record, in_=3600, args=["later"], queue="orders")
    schedule(tasks.record, in_=3600, args=["later too"], queue="orders")
    Job.objects.filter(pk=upcoming.pk).update(status=Status.RETRYING)  # as after a failure
    response = admin_client.get(reverse(QUEUES))
    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_delayjobs/queues.html"
    html = response.content.decode()
    assert summary(html, "default", "garbage") == "1"
    assert summary(html, "orders", "pending") == "2"
    assert summary(html, "orders", "retrying") == "1"
    assert summary(html, "orders", "overdue") == "0"
    assert summary(html, "orders", "live_workers") == "0"
    assert "No live worker serves this queue." in html
    assert str(upcoming.pk)[-8:] in html and "in 60 min" in html
    garbage = re.search(r'id="garbage-default"(.*?)</form>', html, re.S).group(1)
    assert f'data-job="{dead.pk}"' in garbage
    assert "<summary>builtins.RuntimeError: failing on purpose: kaput</summary>" in garbage
    assert f'name="one" value="{dead.pk}"' in garbage and ">Purge</button>" in garbage
    assert 'name="csrfmiddlewaretoken"' in garbage


def test_queue_page_shows_buried_ids_without_a_row_and_offers_only_forget(admin_client):
    engine, orphan, foreign = get_engine(), str(uuid.uuid4()), "not-one-of-ours"
    engine.add("default", {orphan: 0, foreign: 0})
    engine.promote("default")
    assert engine.bury("default", engine.claim("default", count=2)) == 2
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert summary(html, "default", "garbage") == "2"
    row = re.search(rf'<tr data-job="{orphan}">(.*?)</tr>', html, re.S).group(1)
    assert "(no database row)" in row and re.findall(r"<button[^>]*>(\w+)<", row) == ["Forget"]
    row = re.search(rf'<tr data-job="{foreign}">(.*?)</tr>', html, re.S).group(1)
    assert "(no database row)" in row and "<button" not in row


def test_queue_page_lists_live_workers(admin_client):
    info = {"host": "box", "pid": 4242, "roles": ["worker"], "concurrency": 2}
    get_engine().heartbeat("default", "w-1", 30_000, info)
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert summary(html, "default", "live_workers") == "1"
    assert "<code>w-1</code>" in html and "box" in html and "4242" in html


def test_queue_page_when_redis_is_unreachable_says_so(admin_client, settings):
    dead_job()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "REDIS_URL": "redis://127.0.0.1:1/0"}
    response = admin_client.get(reverse(QUEUES))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Redis is unreachable, so the queue state cannot be shown." in html
    assert 'class="errornote"' in html
    assert admin_client.get(reverse(CHANGELIST)).status_code == 200


def test_queue_page_is_linked_from_the_app_index_and_job_list(admin_client):
    url = reverse(QUEUES)
    app_index = reverse("admin:app_list", args=["django_delayjobs"])
    assert f'href="{url}"' in admin_client.get(app_index).content.decode()
    assert f'href="{url}"' in admin_client.get(reverse(CHANGELIST)).content.decode()


def test_viewer_sees_the_queue_page_without_buttons(viewer):
    dead_job()
    response = viewer.get(reverse(QUEUES))
    assert response.status_code == 200
    html = response.content.decode()
    assert summary(html, "default", "garbage") == "1"
    assert ">Requeue</button>" not in html and ">Purge</button>" not in html


def test_queue_page_denies_staff_without_permission_and_anonymous(nobody):
    assert nobody.get(reverse(QUEUES)).status_code == 403
    app_index = reverse("admin:app_list", args=["django_delayjobs"])
    assert nobody.get(app_index).status_code in (403, 404)
    response = Client().get(reverse(QUEUES))
    assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))


def test_requeue_button_revives_a_dead_job(admin_client):
    dead = dead_job()
    response = admin_client.post(reverse(REQUEUE), {"one": str(dead.pk)}, follow=True)
    assert response.redirect_chain == [(reverse(QUEUES), 302)]
    assert messages_of(response) == ["1 dead job requeued."]
    assert summary(response.content.decode(), "default", "garbage") == "0"
    dead.refresh_from_db()
    assert dead.status == Status.SCHEDULED
    assert actors(dead)[-1] == (EventKind.REQUEUED, "admin:admin")
    burst()  # and it runs again (and fails again: it is tasks.fail)
    assert Job.objects.get(pk=dead.pk).attempts == 2


def test_requeue_selected_takes_the_ticked_boxes(admin_client):
    first, second, third = dead_job("1"), dead_job("2"), dead_job("3")
    response = admin_client.post(
        reverse(REQUEUE), {"job": [str(first.pk), str(second.pk)]}, follow=True
    )
    assert messages_of(response) == ["2 dead jobs requeued."]
    assert Job.objects.get(pk=third.pk).status == Status.DEAD
    assert garbage_count() == 1


def test_requeue_of_unknown_or_no_ids_says_so(admin_client):
    response = admin_client.post(reverse(REQUEUE), {}, follow=True)
    assert messages_of(response) == ["No job was selected."]
    response = admin_client.post(reverse(REQUEUE), {"one": str(uuid.uuid4())}, follow=True)
    assert messages_of(response) == ["1 job no longer exists."]


def test_requeue_and_purge_need_post_permission_and_csrf(viewer, admin_user):
    dead = dead_job()
    assert viewer.post(reverse(REQUEUE), {"one": str(dead.pk)}).status_code == 403
    assert viewer.post(reverse(PURGE), {"one": str(dead.pk), "post": "yes"}).status_code == 403
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(admin_user)
    assert csrf.get(reverse(REQUEUE)).status_code == 405
    assert csrf.post(reverse(REQUEUE), {"one": str(dead.pk)}).status_code == 403
    assert csrf.post(reverse(PURGE), {"one": str(dead.pk), "post": "yes"}).status_code == 403
    assert Job.objects.get(pk=dead.pk).status == Status.DEAD
    assert garbage_count() == 1
    assert Client().post(reverse(REQUEUE), {"one": str(dead.pk)}).status_code == 302


def test_operator_may_requeue_but_not_purge_from_the_queue_page(operator):
    dead = dead_job()
    html = operator.get(reverse(QUEUES)).content.decode()
    assert ">Requeue</button>" in html and ">Purge</button>" not in html
    assert operator.post(reverse(PURGE), {"one": str(dead.pk), "post": "yes"}).status_code == 403
    assert operator.post(reverse(REQUEUE), {"one": str(dead.pk)}).status_code == 302
    assert Job.objects.get(pk=dead.pk).status == Status.SCHEDULED


def test_purge_button_asks_then_deletes(admin_client, admin_user):
    dead = dead_job()
    response = admin_client.post(reverse(PURGE), {"one": str(dead.pk)})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Purge dead jobs?" in html
    assert f'name="job" value="{dead.pk}"' in html and 'name="post" value="yes"' in html
    assert Job.objects.filter(pk=dead.pk).exists() and garbage_count() == 1
    response = confirm_purge(admin_client, reverse(PURGE), {"job": str(dead.pk)}, follow=True)
    assert messages_of(response) == ["1 dead job purged."]
    assert not Job.objects.filter(pk=dead.pk).exists()
    assert garbage_count() == 0
    assert LogEntry.objects.get(object_id=str(dead.pk)).user == admin_user


def test_a_dead_job_another_model_refers_to_is_not_purged_and_the_rest_are(admin_client):
    """A model's ``PROTECT`` foreign key makes Django refuse the delete (``ProtectedError``):
    it was a 500 that also left the other selected jobs unpurged."""
    kept, other = dead_job("kept"), dead_job("other")
    Receipt.objects.create(job=kept)
    response = confirm_purge(
        admin_client, reverse(CHANGELIST), selected("purge_dead", kept, other), follow=True
    )
    assert messages_of(response) == [
        f"Job {kept.pk} was not purged: testapp.Receipt refers to it.",
        "1 dead job purged.",
    ]
    assert Job.objects.filter(pk=kept.pk, status=Status.DEAD).exists()
    assert JobEvent.objects.filter(job_id=kept.pk).exists()  # its history stays with it
    assert not Job.objects.filter(pk=other.pk).exists()
    assert [i for i, _ in get_engine().garbage("default")] == [str(kept.pk)]
    assert not LogEntry.objects.filter(object_id=str(kept.pk)).exists()
    response = confirm_purge(admin_client, reverse(PURGE), {"job": str(kept.pk)}, follow=True)
    assert messages_of(response) == [f"Job {kept.pk} was not purged: testapp.Receipt refers to it."]


def orphan_id() -> str:
    """A dead job's id left in the garbage after its row was deleted by hand."""
    dead = dead_job()
    Job.objects.filter(pk=dead.pk).delete()
    assert garbage_count() == 1
    return str(dead.pk)


def test_forget_button_removes_an_id_without_a_row_from_the_garbage(admin_client):
    orphan = orphan_id()
    html = admin_client.get(reverse(QUEUES)).content.decode()
    row = re.search(rf'<tr data-job="{orphan}">(.*?)</tr>', html, re.S).group(1)
    assert "(no database row)" in row
    assert f'name="one" value="{orphan}" formaction="{reverse(FORGET)}"' in row
    garbage = re.search(r'id="garbage-default"(.*?)</form>', html, re.S).group(1)
    assert '<input type="hidden" name="queue" value="default">' in garbage
    response = admin_client.post(reverse(FORGET), {"queue": "default", "one": orphan}, follow=True)
    assert response.redirect_chain == [(reverse(QUEUES), 302)]
    assert messages_of(response) == ["1 id forgotten from the garbage of queue default."]
    assert garbage_count() == 0
    assert summary(response.content.decode(), "default", "garbage") == "0"


def test_forget_leaves_a_dead_job_with_a_row_to_purge(admin_client):
    dead = dead_job()
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert reverse(FORGET) not in re.search(rf'<tr data-job="{dead.pk}">(.*?)</tr>', html, re.S)[1]
    response = admin_client.post(
        reverse(FORGET), {"queue": "default", "one": str(dead.pk)}, follow=True
    )
    assert messages_of(response) == [f"Job {dead.pk} has a database row: purge it instead."]
    assert garbage_count() == 1 and Job.objects.get(pk=dead.pk).status == Status.DEAD


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"queue": "default"},
        {"queue": "default", "one": "not-a-uuid"},
        {"one": "ORPHAN"},
        {"queue": "", "one": "ORPHAN"},
        {"queue": "no}such:queue", "one": "ORPHAN"},
        {"queue": "x" * 65, "one": "ORPHAN"},
    ],
)
def test_forget_of_hostile_input_says_so_and_changes_nothing(admin_client, data):
    orphan = orphan_id()
    data = {key: value.replace("ORPHAN", orphan) for key, value in data.items()}
    response = admin_client.post(reverse(FORGET), data, follow=True)
    assert response.redirect_chain == [(reverse(QUEUES), 302)]
    assert messages_of(response) == ["No valid queue and job id were posted."]
    assert garbage_count() == 1


def test_forget_in_another_queue_or_of_an_unknown_id_says_so(admin_client):
    orphan = orphan_id()
    for queue, job_id in (("orders", orphan), ("default", str(uuid.uuid4()))):
        response = admin_client.post(reverse(FORGET), {"queue": queue, "one": job_id}, follow=True)
        assert messages_of(response) == [f"{job_id} is not in the garbage of queue {queue}."]
    assert garbage_count() == 1


def test_forget_with_redis_unreachable_says_so(admin_client, settings):
    orphan, reachable = orphan_id(), settings.DELAYJOBS
    settings.DELAYJOBS = {**reachable, "REDIS_URL": "redis://127.0.0.1:1/0"}
    response = admin_client.post(reverse(FORGET), {"queue": "default", "one": orphan}, follow=True)
    assert response.redirect_chain == [(reverse(QUEUES), 302)]
    [message] = messages_of(response)
    assert message.startswith("Redis is unreachable: ")
    settings.DELAYJOBS = reachable
    assert garbage_count() == 1


def test_forget_needs_purge_permission_post_and_csrf(operator, admin_user):
    orphan = orphan_id()
    html = operator.get(reverse(QUEUES)).content.decode()
    assert reverse(FORGET) not in html
    assert operator.post(reverse(FORGET), {"queue": "default", "one": orphan}).status_code == 403
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(admin_user)
    assert csrf.get(reverse(FORGET)).status_code == 405
    assert csrf.post(reverse(FORGET), {"queue": "default", "one": orphan}).status_code == 403
    assert garbage_count() == 1


# -- counting a big table ------------------------------------------------------------------


def test_paginator_counts_small_results_exactly(admin_client):
    for n in range(3):
        schedule(tasks.record, in_=60, args=[str(n)])
    response = admin_client.get(reverse(CHANGELIST))
    cl = response.context["cl"]
    assert cl.result_count == 3 and not cl.paginator.estimated
    assert "about" not in re.search(r'<p class="paginator">(.*?)</p>', response.content.decode(),
                                    re.S).group(1)  # fmt: skip


@pytest.mark.skipif(connection.vendor != "postgresql", reason="estimates are PostgreSQL's")
def test_paginator_estimates_big_results_on_postgresql(admin_client, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 5)
    for n in range(30):
        schedule(tasks.record, in_=60 + n, args=[str(n)], queue="big" if n < 20 else "small")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(reverse(CHANGELIST))
    cl = response.context["cl"]
    assert cl.paginator.estimated and cl.result_count == 30
    assert not any("COUNT(*)" in q["sql"].upper() for q in captured.captured_queries)
    assert "about 30" in response.content.decode()
    response = admin_client.get(reverse(CHANGELIST), {"queue": "big"})
    cl = response.context["cl"]
    assert cl.paginator.estimated and cl.result_count >= 6
    response = admin_client.get(reverse(CHANGELIST), {"queue": "small"})
    cl = response.context["cl"]
    assert cl.paginator.estimated and cl.result_count >= 6  # 10 rows > 5: estimated
    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 10)
    cl = admin_client.get(reverse(CHANGELIST), {"queue": "small"}).context["cl"]
    assert cl.result_count == 10 and not cl.paginator.estimated
    # Deep pages cost an OFFSET over every row before them: an estimate offers a few.
    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 5)
    monkeypatch.setattr(EstimatedCountPaginator, "max_pages", 2)
    paginator = EstimatedCountPaginator(Job.objects.order_by("run_at"), 5)
    assert paginator.count == 30 and paginator.estimated and paginator.num_pages == 2
    assert EstimatedCountPaginator(Job.objects.filter(queue="small"), 5).num_pages == 2
