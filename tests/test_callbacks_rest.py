"""The clock-service endpoints: POST callbacks/ (201 new, 200 existing by key), cancel and
reschedule by id or key, permissions, CSRF, throttling and hostile bodies."""

from __future__ import annotations

import datetime
import ipaddress
import json
import sys
import uuid

import pytest
from django.core.cache import cache
from django.utils import timezone

from django_delayjobs import schedule, services
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.action import ACTION
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.example.com/orders/42/expire"


@pytest.fixture(autouse=True)
def http(settings, redis_client):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "HTTP_DESTINATIONS": {"shop": {"url": "https://hooks.example.com/shop"}},
        "API_CALLBACK_QUEUES": ["default", "other", "q2"],
    }
    cache.clear()  # throttle history
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        yield settings


@pytest.fixture
def admin():
    return client_for(make_user(superuser=True))


def post(client, path, body):
    return client.post(url(*path.split("/")), body, format="json")


def test_create_returns_201_and_the_job(admin):
    response = post(admin, "callbacks", {
        "url": HOOK, "json": {"order": 42}, "in": 1800, "key": "order-42",
        "headers": {"X-Trace": "t"}, "max_attempts": 3, "expires": 600, "priority": -3,
    })  # fmt: skip
    assert response.status_code == 201, response.json()
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert (job.action, job.key, job.max_attempts, job.status) == (ACTION, "order-42", 3,
                                                                   Status.SCHEDULED)  # fmt: skip
    assert job.priority == body["priority"] == -3
    assert job.kwargs["body"] == '{"order":42}' and job.kwargs["url"] == HOOK
    assert job.expires_at - job.run_at == datetime.timedelta(seconds=600)
    assert body["kwargs"] == job.kwargs and body["status"] == "scheduled"
    assert job.events.get().actor == "api:ada"


def test_the_same_key_answers_200_with_the_active_job(admin):
    first = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "order-42"})
    again = post(admin, "callbacks", {"url": "shop:/other", "at": "2031-01-01T00:00:00Z",
                                      "key": "order-42"})  # fmt: skip
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1
    other_queue = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "order-42",
                                            "queue": "other"})  # fmt: skip
    assert other_queue.status_code == 201


def test_a_key_held_by_a_python_job_answers_409_without_showing_that_job(admin):
    python_job = schedule(tasks.record, in_=60, args=["private"], key="order-42")
    response = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "order-42"})
    assert response.status_code == 409, response.json()
    assert response.json() == {"detail": "The key is held by an active job that is not a callback."}
    assert str(python_job.pk) not in response.content.decode()
    assert list(Job.objects.values_list("pk", flat=True)) == [python_job.pk]
    assert post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "order-42",
                                     "queue": "other"}).status_code == 201  # fmt: skip


def test_expires_may_be_a_time(admin):
    response = post(admin, "callbacks", {"url": HOOK, "at": "2031-01-01T00:00:00Z",
                                         "expires": "2031-01-01T01:00:00+00:00"})  # fmt: skip
    assert response.status_code == 201
    assert Job.objects.get().expires_at == datetime.datetime(2031, 1, 1, 1, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": HOOK}, "non_field_errors"),
        ({"url": HOOK, "in": 1, "at": "2031-01-01T00:00:00Z"}, "non_field_errors"),
        ({"url": HOOK, "in": True}, "in"),
        ({"url": HOOK, "in": -1}, "in"),
        ({"url": HOOK, "at": "2031-01-01T00:00:00"}, "at"),
        ({"url": HOOK, "in": 1, "json": {}, "data": "x"}, "data"),
        ({"url": HOOK, "in": 1, "method": "TRACE"}, "method"),
        ({"url": HOOK, "in": 1, "token": "x"}, "token"),
        ({"url": HOOK, "in": 1, "max_attempts": 0}, "max_attempts"),
        ({"url": HOOK, "in": 1, "priority": 101}, "priority"),
        ({"url": HOOK, "in": 1, "priority": True}, "priority"),
        ({"url": HOOK, "in": 1, "priority": 1.5}, "priority"),
        ({"url": HOOK, "in": 1, "expires": True}, "expires"),
        ({"url": HOOK, "in": 1, "expires": "soon"}, "expires"),
        ({"url": HOOK, "in": 1, "headers": {"Authorization": "Bearer x"}}, "headers"),
        ({"url": HOOK, "in": 1, "headers": {"X": "a\r\nb"}}, "headers"),
        ({"url": HOOK, "in": 1, "headers": ["X"]}, "headers"),
        ({"url": HOOK, "in": 1, "method": "GET", "json": {"a": 1}}, "method"),
        ({"url": HOOK, "in": 1, "data": "a\u0000b"}, "data"),
        ({"url": HOOK, "in": 1, "key": ""}, "key"),
        ({"url": HOOK, "in": 1, "queue": "a:b"}, "queue"),
        # not trimmed to "default": schedule() refuses such a name too
        ({"url": HOOK, "in": 1, "queue": " default"}, "queue"),
        ({"url": HOOK, "in": 1, "queue": "default\n"}, "queue"),
        ({"url": HOOK, "in": 1, "queue": "unlisted"}, "queue"),  # API_CALLBACK_QUEUES
        ({"url": "https://evil.example/", "in": 1}, "url"),
        ({"url": "http://hooks.example.com@127.0.0.1/", "in": 1}, "url"),
        ({"url": "http://2130706433/", "in": 1}, "url"),
        ({"url": "nowhere:/x", "in": 1}, "url"),
        ({"url": "shop:/../admin", "in": 1}, "url"),
        ({"url": HOOK + "caf\u00e9", "in": 1}, "url"),
        ({"url": 5, "in": 1}, "url"),
    ],
)
def test_hostile_bodies_get_400_naming_the_field_and_write_nothing(admin, body, field):
    response = post(admin, "callbacks", body)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_a_body_over_max_json_bytes_gets_400_naming_the_setting(admin, http):
    http.DELAYJOBS = {**http.DELAYJOBS, "HTTP_MAX_REQUEST_BYTES": 1 << 20, "MAX_JSON_BYTES": 4096}
    response = post(admin, "callbacks", {"url": HOOK, "in": 1, "data": "x" * 5000})
    assert response.status_code == 400, response.content
    assert "MAX_JSON_BYTES" in response.json()["non_field_errors"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"a": "\ud800"},  # a lone surrogate: not UTF-8
        {"a": "x" * 70_000},  # over HTTP_MAX_REQUEST_BYTES
    ],
)
def test_a_json_body_that_cannot_be_sent_is_a_400_naming_json(admin, body):
    """The client sent ``json``: the 400 names that field (it named ``data``, never sent)."""
    payload = json.dumps({"url": HOOK, "in": 1, "json": body})  # \ud800 escaped: valid JSON
    response = admin.post(url("callbacks"), payload, content_type="application/json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["json"], response.json()
    assert not Job.objects.exists()


def test_permissions_add_job_on_top_of_the_configured_classes(settings):
    body = {"url": HOOK, "in": 60}
    assert post(client_for(None), "callbacks", body).status_code == 403
    assert post(client_for(make_user("staff")), "callbacks", body).status_code == 403
    service = make_user("svc", staff=False, perms=("add_job",))
    assert post(client_for(service), "callbacks", body).status_code == 403  # not admin
    authenticated = ["rest_framework.permissions.IsAuthenticated"]
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": authenticated}
    assert post(client_for(service), "callbacks", body).status_code == 201
    assert post(client_for(make_user("eve", staff=False)), "callbacks", body).status_code == 403
    staff = make_user("staffer", perms=("add_job",))
    assert post(client_for(staff), "callbacks/cancel", {"key": "x"}).status_code == 404
    settings.DELAYJOBS = {**settings.DELAYJOBS,
                          "API_CALLBACK_PERMISSIONS": ["django_delayjobs.change_job"]}  # fmt: skip
    assert post(client_for(staff), "callbacks", body).status_code == 403


RECEIPT = {"id", "queue", "key", "status", "run_at"}


def test_add_job_alone_does_not_read_another_callers_callback(settings):
    """A user with add_job only (a service account) learns of a callback, created, found
    by its key, cancelled or rescheduled, only its receipt: never its request (URL,
    headers, body), result, error or history, which may be another caller's."""
    authenticated = ["rest_framework.permissions.IsAuthenticated"]
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_PERMISSION_CLASSES": authenticated}
    payments = client_for(make_user("payments", staff=False, perms=("add_job",)))
    marketing = client_for(make_user("marketing", staff=False, perms=("add_job",)))
    body = {"url": f"{HOOK}?pay", "in": 600, "key": "order-42",
            "json": {"card_token": "tok_live_PRIVATE"}}  # fmt: skip
    first = post(payments, "callbacks", body)
    assert first.status_code == 201 and set(first.json()) == RECEIPT
    probe = post(marketing, "callbacks", {"url": HOOK, "in": 600, "key": "order-42"})
    assert probe.status_code == 200 and probe.json() == first.json()
    assert "tok_live_PRIVATE" not in probe.content.decode() and "?pay" not in probe.content.decode()
    moved = post(marketing, "callbacks/reschedule", {"key": "order-42", "in": 900})
    assert moved.status_code == 200 and set(moved.json()) == RECEIPT
    cancelled = post(marketing, "callbacks/cancel", {"key": "order-42"})
    assert cancelled.status_code == 200 and set(cancelled.json()) == RECEIPT
    assert cancelled.json()["status"] == "cancelled"
    # view_job (or change_job) reads them in full, as the admin and jobs/ would show them
    viewer = client_for(make_user("viewer", staff=False, perms=("add_job", "view_job")))
    again = post(viewer, "callbacks", body)
    assert again.status_code == 201 and "tok_live_PRIVATE" in again.content.decode()
    found = post(viewer, "callbacks", {"url": HOOK, "in": 600, "key": "order-42"})
    assert found.status_code == 200 and "tok_live_PRIVATE" in found.content.decode()
    cancelled = post(viewer, "callbacks/cancel", {"key": "order-42"})
    assert [e["kind"] for e in cancelled.json()["events"]] == ["scheduled", "cancelled"]


def test_a_session_needs_its_csrf_token():
    client = client_for(make_user(superuser=True), csrf=True)
    response = post(client, "callbacks", {"url": HOOK, "in": 60})
    assert response.status_code == 403 and "CSRF" in response.json()["detail"]


def test_throttling_is_configurable(admin, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_CALLBACK_THROTTLE_RATE": "2/minute"}
    codes = [post(admin, "callbacks", {"url": HOOK, "in": 60}).status_code for _ in range(3)]
    assert codes == [201, 201, 429]
    assert Job.objects.count() == 2


# -- cancel and reschedule by id or key ------------------------------------------------------


def test_cancel_by_key_then_too_late(admin):
    job_id = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "k1"}).json()["id"]
    response = post(admin, "callbacks/cancel", {"key": "k1"})
    assert response.status_code == 200
    assert response.json()["id"] == job_id and response.json()["status"] == "cancelled"
    assert [e["kind"] for e in response.json()["events"]] == ["scheduled", "cancelled"]
    again = post(admin, "callbacks/cancel", {"key": "k1"})
    assert again.status_code == 409 and again.json()["status"] == "cancelled"


def test_cancel_by_id_and_by_key_in_a_queue(admin):
    a = post(admin, "callbacks", {"url": HOOK, "in": 60}).json()["id"]
    b = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "k", "queue": "q2"}).json()["id"]
    assert post(admin, "callbacks/cancel", {"id": a}).json()["status"] == "cancelled"
    assert post(admin, "callbacks/cancel", {"key": "k"}).status_code == 404  # default queue
    done = post(admin, "callbacks/cancel", {"key": "k", "queue": "q2"})
    assert done.status_code == 200 and done.json()["id"] == b


@pytest.mark.parametrize(("verb", "body"), [("cancel", {}), ("reschedule", {"in": 5})])
def test_a_callback_purged_while_the_verb_lost_is_404(admin, monkeypatch, verb, body):
    """callbacks/cancel/ and callbacks/reschedule/ read the status of a callback they were
    too late for: one purged meanwhile (dead, then purged from the admin) raised
    Job.DoesNotExist there, a 500. jobs/<id>/cancel/ answers 404 then, and so do they."""
    job_id = post(admin, "callbacks", {"url": HOOK, "in": 60}).json()["id"]

    def lost_then_purged(job: Job, **kwargs: object) -> bool:
        Job.objects.filter(pk=job.pk).delete()  # a purge between the verb and the answer
        return False

    monkeypatch.setattr(services, verb, lost_then_purged)
    response = post(admin, f"callbacks/{verb}", {"id": job_id, **body})
    assert response.status_code == 404
    assert "detail" in response.json()


def test_a_key_with_spaces_is_kept_and_found_exactly(admin):
    """DRF's CharField trimmed keys: "k " was stored, cancelled and moved as "k"."""
    spaced = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "k "})
    plain = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "k"})
    assert (spaced.status_code, plain.status_code) == (201, 201)
    assert Job.objects.get(pk=spaced.json()["id"]).key == "k "
    moved = post(admin, "callbacks/reschedule", {"key": "k", "in": 3600})
    assert moved.status_code == 200 and moved.json()["id"] == plain.json()["id"]
    cancelled = post(admin, "callbacks/cancel", {"key": "k "})
    assert cancelled.status_code == 200 and cancelled.json()["id"] == spaced.json()["id"]
    assert Job.objects.get(pk=plain.json()["id"]).status == Status.SCHEDULED


def test_a_queue_with_spaces_is_not_trimmed_to_another_queue(admin):
    """DRF's CharField trimmed the queue: cancel by key in queue " default" cancelled the
    callback of queue "default". (" default" is not in API_CALLBACK_QUEUES: a 400 naming
    it as it was sent.)"""
    assert post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "k"}).status_code == 201
    for path in ("callbacks/cancel", "callbacks/reschedule"):
        body = {"key": "k", "queue": " default", **({"in": 5} if "resched" in path else {})}
        response = post(admin, path, body)
        assert response.status_code == 400 and "' default'" in response.json()["queue"][0]
    assert Job.objects.get().status == Status.SCHEDULED


def test_only_callbacks_are_found_here(admin):
    python_job = schedule(tasks.record, in_=60, args=["x"], key="k")
    assert post(admin, "callbacks/cancel", {"id": str(python_job.pk)}).status_code == 404
    assert post(admin, "callbacks/cancel", {"key": "k"}).status_code == 404
    assert post(admin, "callbacks/cancel", {"id": str(uuid.uuid4())}).status_code == 404
    assert Job.objects.get(pk=python_job.pk).status == Status.SCHEDULED


@pytest.mark.parametrize(
    "body",
    [{}, {"id": "x"}, {"id": str(uuid.uuid4()), "key": "k"}, {"id": str(uuid.uuid4()),
     "queue": "q"}, {"key": "k", "in": 5}, {"key": "k" * 300}],
)  # fmt: skip
def test_bad_lookups_are_400(admin, body):
    assert post(admin, "callbacks/cancel", body).status_code == 400


def test_reschedule_by_key(admin):
    job_id = post(admin, "callbacks", {"url": HOOK, "in": 60, "key": "k"}).json()["id"]
    before = timezone.now()
    response = post(admin, "callbacks/reschedule", {"key": "k", "in": 3600})
    assert response.status_code == 200 and response.json()["id"] == job_id
    run_at = Job.objects.get(pk=job_id).run_at
    assert before + datetime.timedelta(seconds=3599) < run_at
    at = post(admin, "callbacks/reschedule", {"id": job_id, "at": "2031-01-01T00:00:00Z"})
    assert at.status_code == 200 and at.json()["run_at"].startswith("2031-01-01T00:00:00")
    assert post(admin, "callbacks/reschedule", {"key": "k"}).status_code == 400
    assert post(admin, "callbacks/reschedule", {"key": "k", "in": 1, "at": at.json()["run_at"]}
                ).status_code == 400  # fmt: skip
    post(admin, "callbacks/cancel", {"key": "k"})
    late = post(admin, "callbacks/reschedule", {"key": "k", "in": 5})
    assert late.status_code == 409 and late.json()["status"] == "cancelled"


def test_without_urllib3_create_answers_501_naming_the_extra(admin, monkeypatch):
    """Without the ``http`` extra the ConfigurationError that names it was a 500."""
    monkeypatch.setitem(sys.modules, "urllib3", None)  # import urllib3 fails: not installed
    response = post(admin, "callbacks", {"url": HOOK, "in": 60})
    assert response.status_code == 501
    assert "django-delayjobs[http]" in response.json()["detail"]
    assert not Job.objects.exists()
