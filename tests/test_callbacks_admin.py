"""Callback jobs in the admin: the detail shows method, URL (destination + path for named
ones) and the last answer; the list filters callbacks from Python actions."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_delayjobs import schedule, schedule_http
from django_delayjobs.callbacks.action import deliver
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job, JobEvent
from tests.callback_server import Reply
from tests.helpers import planted_callback
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "Bearer admin-must-not-show-this"


@pytest.fixture
def http(settings, redis_client, callback_server):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "HTTP_DESTINATIONS": {
            "local": {"url": callback_server.url("/base"), "headers": {"Authorization": TOKEN}}
        },
        "RETRY_BACKOFF_SECONDS": 60,
    }
    return callback_server


@pytest.fixture
def client(django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def detail(client: Client, job: Job) -> str:
    response = client.get(reverse("admin:django_delayjobs_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def test_detail_shows_method_url_and_the_last_status(client, http):
    http.script("/hook", Reply(503, b"busy"))
    job = schedule_http(http.url(), method="PATCH", json={"a": 1}, in_=0)
    assert "HTTP callback" in detail(client, job)  # before any attempt
    burst()
    page = detail(client, job)
    assert "HTTP callback" in page and "PATCH" in page and http.url() in page
    assert "<strong>503</strong>" in page and "busy" in page


def test_a_success_shows_its_status(client, http, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "RETRY_BACKOFF_SECONDS": 0.01}
    http.script("/base/x", Reply(500), Reply(201, b"created"))
    job = schedule_http("local:/x", in_=0)
    for _ in range(20):
        burst()
        job.refresh_from_db()
        if job.status == "succeeded":
            break
    page = detail(client, job)
    assert "local:/x" in page and "<strong>201</strong>" in page
    assert "admin-must-not-show-this" not in page and http.url("/base") not in page


def test_a_refusal_and_a_malformed_row_render(client, http):
    refused = schedule(deliver, in_=0, kwargs={"method": "POST", "url": "http://10.0.0.1/"})
    malformed = planted_callback({"method": "TRACE"})
    burst()
    assert "not in HTTP_ALLOWED_HOSTS" in detail(client, refused)
    page = detail(client, malformed)
    assert "(malformed request)" in page and "refused, nothing sent" in page


def test_an_attempt_whose_history_line_is_blank_renders(client, http):
    """A row written by anything (an older version, a manual edit): a blank message was an
    IndexError, the detail page a 500."""
    job = schedule_http(http.url(), in_=60)
    JobEvent.objects.create(job=job, kind="failed", actor="worker:w", message=" \n")
    assert "HTTP callback" in detail(client, job)


def test_python_jobs_have_no_callback_section(client, http):
    job = schedule(tasks.record, in_=60, args=["x"])
    assert "HTTP callback" not in detail(client, job)


def test_the_list_filters_callbacks(client, http):
    callback = schedule_http(http.url(), in_=60)
    python = schedule(tasks.record, in_=60, args=["x"])
    changelist = reverse("admin:django_delayjobs_job_changelist")
    page = client.get(changelist).content.decode()
    assert "HTTP callbacks" in page and "Python actions" in page
    only = client.get(changelist, {"kind": "callback"}).content.decode()
    assert str(callback.pk)[-8:] in only and str(python.pk)[-8:] not in only
    others = client.get(changelist, {"kind": "python"}).content.decode()
    assert str(python.pk)[-8:] in others and str(callback.pk)[-8:] not in others
