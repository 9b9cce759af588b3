"""The audit trail tells the truth: every job's history, complete and in order, wherever
it is shown, however long it is. And hostile input at the public entry points: a callback
answer's header line without a colon, a health query parameter given twice, a drill-down
month or day of 0, an empty ``?_to_field=``, whole numbers as ``int()`` reads them, and
admin actions on ticked jobs purged or changed meanwhile."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from django.urls import reverse

from django_delayjobs import schedule, services
from django_delayjobs.models import EventKind, Job, JobEvent, Status
from django_delayjobs.sql import insert_events
from tests.helpers import ROOT, worker_env
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)


def retried(times: int, error: str = "boom") -> tuple[str, list[tuple[str, str]]]:
    """A job with the history of ``times`` failed attempts (its events as the worker writes
    them: a started and a failed per attempt, many in the same microsecond)."""
    job = schedule(tasks.record, in_=60, args=["a"])
    events = []
    for attempt in range(1, times + 1):
        job.attempts = attempt
        events += [(job, EventKind.STARTED, "worker:w", f"attempt {attempt}"),
                   (job, EventKind.FAILED, "worker:w", f"{error} {attempt}")]  # fmt: skip
    insert_events(events)  # one timestamp for all of them: only the id orders them
    wanted = list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", "message"))
    return str(job.pk), wanted


def shown(html: str) -> list[tuple[str, str]]:
    rows = re.findall(
        r'<tr class="form-row" data-kind="(\w+)">.*?<td class="field-message_display">(.*?)</td>',
        html, re.S,
    )  # fmt: skip
    return [(kind, message) for kind, message in rows]


@pytest.mark.slow
def test_the_admin_pages_a_long_history_completely_and_in_order(admin_client):
    """A job retried 1,000 times has 2,001 events: the change page rendered every one of
    them (with up to 64 KiB of traceback each, a page of over 100 MB). It shows a page of
    them at a time, with links to the others; read page by page, the history is complete,
    in order, each event once."""
    pk, wanted = retried(1000)
    url = reverse("admin:django_delayjobs_job_change", args=[pk])
    html = admin_client.get(url).content.decode()
    assert shown(html) == wanted[1900:]  # the last page (101 events): the latest events
    seen, page = [], 1
    while True:
        response = admin_client.get(url, {"history": page})
        assert response.status_code == 200
        rows = shown(response.content.decode())
        seen += rows
        if not re.search(rf'href="\?history={page + 1}#', response.content.decode()):
            break
        page += 1
    assert seen == wanted
    assert page == 20  # 100 a page, the last one left alone taken in; a page number that is
    # no page: the nearest (Django's rule)
    for asked, expected in (("x", wanted[:100]), ("99999", wanted[1900:]), ("-1", wanted[1900:])):
        assert shown(admin_client.get(url, {"history": asked}).content.decode()) == expected


#: How far the clock of the worker's host is ahead of this one's, in seconds.
WORKER_AHEAD = 30


@pytest.mark.slow
def test_the_history_is_in_the_order_things_happened_whatever_each_hosts_clock(
    redis_url, admin_client
):
    """Each event's ``at`` is its writer's clock, and a worker's host may be ahead of the
    web host's. The history was ordered by ``at``: a dead job requeued here a moment after
    a worker (its clock 30 s ahead) buried it showed ``requeued`` before the attempt that
    killed it. Every event of a job is written under its row's lock (the change it records
    comes first), so the events' ids are the order in which the changes were committed:
    the history is shown in that order, everywhere."""
    faketime = shutil.which("faketime")
    if faketime is None:
        pytest.skip("needs libfaketime's faketime command (Debian: apt-get install faketime)")
    job = schedule(tasks.fail, in_=0, args=["x"], max_attempts=1)
    worker = [faketime, "-f", f"+{WORKER_AHEAD}s", sys.executable, "-m", "django",
              "run_delayworker", "--settings", "tests.settings", "-v", "0", "--burst"]  # fmt: skip
    # Its wall clock only: timed waits on a faked monotonic clock never end.
    env = worker_env(redis_url, DONT_FAKE_MONOTONIC="1")
    # In a process group of its own: faketime forks the worker and waits for it, so that
    # killing faketime alone would leave the worker running.
    burst = subprocess.Popen(worker, cwd=ROOT, env=env, start_new_session=True)
    try:
        assert burst.wait(60) == 0
    finally:
        if burst.poll() is None:
            os.killpg(burst.pid, signal.SIGKILL)
            burst.wait(10)
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert services.requeue(job, actor="here")
    happened = ["scheduled", "started", "failed", "dead", "requeued"]
    assert [event.kind for event in job.events.all()] == happened
    page = admin_client.get(reverse("admin:django_delayjobs_job_change", args=[job.pk]))
    assert [kind for kind, _ in shown(page.content.decode())] == happened
    detail = client_for(make_user(superuser=True)).get(url("jobs", job.pk))
    assert [event["kind"] for event in detail.data["events"]] == happened


# -- hostile input at the public entry points ------------------------------------------------


def test_a_header_line_without_a_colon_is_said_in_the_attempts_outcome(
    raw_server, settings, caplog
):
    """http.client takes a header line without a colon for the end of the headers: the
    ones after it (here ``Retry-After``) were dropped without a word, so the job retried
    after its own backoff, not the hour the receiver asked for, and its history did not
    say why (urllib3 logged a warning with a traceback and the URL's query, unmasked).
    The attempt's line now says the answer's head was malformed."""
    from django.core.management import call_command

    from django_delayjobs import schedule_http
    from django_delayjobs.callbacks.signing import new_secret

    server = raw_server(
        b"HTTP/1.1 503 Service Unavailable\r\nX-Broken header\r\nRetry-After: 3600\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    job = schedule_http(server.url(), in_=0, json={"a": 1})
    call_command("run_delayworker", "--burst", "-v", "0")
    job.refresh_from_db()
    assert job.status == Status.RETRYING
    assert "-> 503 Service Unavailable" in job.last_error
    assert "malformed header line: 'X-Broken header'" in job.last_error, job.last_error
    assert "Failed to parse headers" not in caplog.text


@pytest.mark.parametrize("name", ["queues", "max_overdue", "min_workers", "max_garbage"])
def test_the_health_view_refuses_a_parameter_given_twice(client, name):
    """``?queues=b&queues=a`` checked queue a alone, and said ok while b, which the
    monitor also asked about, had no worker: each parameter read its last value only."""
    from tests.test_health import URL, beat

    beat("a")
    values = {"queues": ["b", "a"], "max_overdue": ["0", "60"], "min_workers": ["5", "1"],
              "max_garbage": ["0", "5"]}  # fmt: skip
    query = {"queues": "a", name: values[name]}
    response = client.get(URL, query)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == f"bad query: {name} given 2 times: give it once"


@pytest.mark.parametrize(
    "query",
    [{"run_at__year": "2030", "run_at__month": "0"},
     {"run_at__year": "2030", "run_at__month": "11", "run_at__day": "0"}],
)  # fmt: skip
def test_the_date_drill_down_takes_month_or_day_0_for_a_bad_filter(admin_client, query):
    """A month (or day) of 0 was checked as the first (``month or 1``), so the list drew
    the days of month 0 of 2030: a 500. It is Django's "?e=1" redirect, as month 13 is."""
    import datetime

    schedule(tasks.record, at=datetime.datetime(2030, 11, 5, tzinfo=datetime.UTC), args=["x"])
    response = admin_client.get(reverse("admin:django_delayjobs_job_changelist"), query)
    assert response.status_code == 302
    assert response.url.endswith("?e=1")


@pytest.mark.parametrize("page", ["change", "delete", "history"])
def test_a_job_page_with_an_empty_to_field_is_no_500(admin_client, page):
    """``?_to_field=`` (empty) passed Django's check of the field (only a non-empty one is
    checked) and reached ``get_object`` as a field named "": a 500 (a KeyError)."""
    job = schedule(tasks.record, in_=60, args=["x"])
    path = reverse(f"admin:django_delayjobs_job_{page}", args=[job.pk])
    response = admin_client.get(path, {"_to_field": ""})
    assert response.status_code < 500


#: What Python's int() reads and no one writes as a whole number.
ODD_WHOLE_NUMBERS = ["1_0", " 3 ", "3\n", "\u0663", "\uff13", "3.000"]


@pytest.mark.parametrize("form", [False, True])
@pytest.mark.parametrize("text", ODD_WHOLE_NUMBERS)
@pytest.mark.parametrize("field", ["attempts", "max_attempts", "priority"])
def test_the_apis_whole_numbers_are_ascii_digits(settings, field, text, form):
    """``attempts`` (requeue), ``max_attempts`` and ``priority`` (callbacks/) were read by
    DRF's int(), which takes group underscores, spaces around and other scripts' digits:
    ``"1_0"`` gave a job 10 attempts, ``"\\u0663"`` 3. Each is a 400 naming the field, as
    such seconds are (test_audit_api3)."""
    import ipaddress

    from django.core.cache import cache

    from django_delayjobs.callbacks import policy
    from django_delayjobs.callbacks.signing import new_secret
    from django_delayjobs.models import Job

    from .test_rest_helpers import dead_job

    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
                          "HTTP_SIGNING_SECRETS": [new_secret()]}  # fmt: skip
    cache.clear()
    api = client_for(make_user(superuser=True))
    if field == "attempts":
        job = dead_job()
        path, body = url("jobs", job.pk, "requeue"), {field: text}
    else:
        path, body = url("callbacks"), {"url": "https://hooks.example.com/x", "in": 5, field: text}
    before = Job.objects.count()
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        response = api.post(path, body, format=None if form else "json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert Job.objects.count() == before
    if field == "attempts":
        job.refresh_from_db()
        assert job.status == Status.DEAD


@pytest.mark.parametrize(
    ("action", "said"),
    [("cancel_jobs", "1 job cancelled."), ("run_now", "1 job is due now."),
     ("requeue_dead", "1 dead job requeued."), ("purge_dead", "1 dead job purged.")],
)  # fmt: skip
def test_an_admin_action_says_how_many_selected_jobs_no_longer_exist(admin_client, action, said):
    """Jobs ticked on the list and purged before the action ran were left out without a
    word: "0 dead jobs requeued." for two ticked dead jobs, as if none had been selected.
    The action says they no longer exist, as the queue page's buttons do."""
    import uuid

    from django.contrib.admin import helpers

    from django_delayjobs.admin import operations

    from .test_rest_helpers import dead_job

    dead = action in ("requeue_dead", "purge_dead")
    job = dead_job() if dead else schedule(tasks.record, in_=3600, args=["x"])
    ticked = [str(job.pk), str(uuid.uuid4()), str(uuid.uuid4())]  # two purged meanwhile
    body = {"action": action, helpers.ACTION_CHECKBOX_NAME: ticked}
    if action == "purge_dead":
        body.update(post="yes", shown=operations.shown_token())
    response = admin_client.post(
        reverse("admin:django_delayjobs_job_changelist"), body, follow=True
    )
    messages = [str(m) for m in response.context["messages"]]
    assert messages == ["2 jobs no longer exist.", said], messages


def test_an_admin_action_on_a_filtered_list_reports_a_ticked_job_that_left_the_filter(
    admin_client,
):
    """Django acts on the ticked jobs that still match the list's filters: a job ticked on
    the list of scheduled jobs that started meanwhile was left out, and "Cancel" said "0
    jobs cancelled." The action works on the ticked jobs, and says it came too late."""
    from django.contrib.admin import helpers

    job = schedule(tasks.record, in_=3600, args=["x"])
    listed = reverse("admin:django_delayjobs_job_changelist") + "?status__exact=scheduled"
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING, attempts=1)  # claimed
    body = {"action": "cancel_jobs", helpers.ACTION_CHECKBOX_NAME: [str(job.pk)]}
    response = admin_client.post(listed, body, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert messages == ["1 job was not cancelled: it had already started or finished."]
