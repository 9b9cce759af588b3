"""A hostile-input battery over every endpoint of the API, callbacks included (and the
admin's job list): query strings and bodies that try to overflow, nest, smuggle NUL and
surrogates, or send huge numbers get a 4xx, never a 500, and change nothing (issue 13,
finding 12)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.urls import reverse

from django_delayjobs import schedule
from django_delayjobs.rest.schema import spectacular_installed
from tests.testapp import tasks

from . import test_rest_helpers
from .test_rest_helpers import client_for, dead_job, make_user, snapshot, url

http = test_rest_helpers.http  # a fixture: callbacks to hooks.example.com allowed

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = 100_000


@pytest.fixture
def api():
    return client_for(make_user(superuser=True))


@pytest.fixture
def job():
    return schedule(tasks.record, in_=3600, args=["x"])


def cursor(*parts: Any, raw: str | None = None) -> str:
    text = raw if raw is not None else json.dumps(list(parts))
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode().rstrip("=")


JOB_ID = str(uuid.uuid4())
CURSORS = {
    "min +05:00": cursor("0001-01-01T00:00:00+05:00", JOB_ID, 0),
    "max -05:00": cursor("9999-12-31T23:59:59.999999-05:00", JOB_ID, 0),
    "year 10000": cursor("10000-01-01T00:00:00+00:00", JOB_ID, 0),
    "naive": cursor("2030-01-01T00:00:00", JOB_ID, 0),
    "nested 100k": cursor(raw="[" * DEEP + "]" * DEEP),
    "nested dict": cursor(raw='{"a":' * 50_000 + "1" + "}" * 50_000),
    "5000-digit int": cursor(raw="[" + "9" * 5000 + "]"),
    "1e999": cursor(raw='[1e999, "x", 0]'),
    "NaN": cursor(raw='[NaN, "x", 0]'),
    "surrogate": cursor(raw='["\\ud800", "x", 0]'),
    "NUL": cursor("2030-01-01T00:00:00\x00+00:00", JOB_ID, 0),
    "raw kind": cursor("not a date", JOB_ID, 0, "raw"),
    "raw kind, long": cursor("9" * 10_000, JOB_ID, 0, "raw"),
    "unknown kind": cursor("", JOB_ID, 0, "sideways"),
    "too many parts": cursor("2030-01-01T00:00:00+00:00", JOB_ID, 0, "", 5),
    "not a list": cursor(raw='{"a": 1}'),
    "bad id": cursor("2030-01-01T00:00:00+00:00", "x" * 1000, 0),
    "not base64": "%%%",
    "not UTF-8": base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
    "empty list": cursor(raw="[]"),
    "huge": "A" * 100_000,
}
QUERIES: dict[str, dict[str, str]] = {
    **{f"cursor {name}": {"cursor": token} for name, token in CURSORS.items()},
    "run_at_after min +05:00": {"run_at_after": "0001-01-01T00:00:00+05:00"},
    "run_at_before max -05:00": {"run_at_before": "9999-12-31T23:59:59.999999-05:00"},
    "run_at_after year 10000": {"run_at_after": "10000-01-01T00:00:00Z"},
    "run_at_after 1e999": {"run_at_after": "1e999"},
    "run_at_after NUL": {"run_at_after": "2030-01-01T00:00:00\x00Z"},
    "page_size 5000 digits": {"page_size": "9" * 5000},
    "page_size -1": {"page_size": "-1"},
    "page_size NUL": {"page_size": "\x00"},
    "status NUL": {"status": "\x00"},
    "status many": {"status": ",".join(["dead"] * 10_000)},
    "key NUL": {"key": "a\x00b"},
    "queue NUL": {"queue": "\x00"},
    "action NUL": {"action": "\x00"},
    "target NUL": {"target_type": "testapp.thing", "target_id": "\x00"},
    "target_type NUL": {"target_type": "\x00.\x00"},
    "target_type long": {"target_type": "a." * 50_000},
    "key long": {"key": "k" * 100_000},
    "ordering NUL": {"ordering": "\x00"},
    "unknown NUL": {"\x00": "1"},
    "surrogate bytes": {"key": "\udced\udca0\udc80"},  # sent as %ED%A0%80
}
#: Not refused, and harmless: a raw cursor is how SQLite walks past a due time it cannot
#: parse (any text only compares); Python's ``fromisoformat`` reads a NUL after the
#: seconds as a separator, so those are valid times.
VALID_ON = {
    "sqlite": {"cursor raw kind", "cursor NUL", "run_at_after NUL"},
    "postgresql": {"cursor NUL", "run_at_after NUL"},
}
GETS = [("jobs",), ("jobs", "{pk}"), ("queues",)] + (
    [("schema",)] if spectacular_installed() else []
)
IDS = ["\x00", "%ED%A0%80", "x" * 5000, "..", "{" + JOB_ID + "}", "0" * 32, "9" * 400]


def get(api, parts, query):
    # errors="surrogateescape" sends the lone surrogates as the raw bytes they stand for
    return api.get(url(*parts) + "?" + urlencode(query, errors="surrogateescape"))


@pytest.mark.parametrize("name", list(QUERIES))
def test_hostile_query_strings_get_4xx(api, job, name):
    query = QUERIES[name]
    before = snapshot(job)
    for parts in GETS:
        parts = tuple(p.format(pk=job.pk) for p in parts)
        response = get(api, parts, query)
        assert response.status_code < 500, (parts, response.status_code)
        refused = name.split()[0] in ("cursor", "page_size", "run_at_after")
        if parts == ("jobs",) and refused and name not in VALID_ON.get(connection.vendor, ()):
            assert response.status_code == 400, (name, response.content[:200])
    assert snapshot(job) == before


@pytest.mark.parametrize("job_id", IDS)
def test_hostile_job_ids_get_404(api, job_id):
    for suffix in ("", "cancel/", "reschedule/", "requeue/"):
        path = url("jobs") + job_id + "/" + suffix
        response = api.post(path, {}, format="json") if suffix else api.get(path)
        assert 400 <= response.status_code < 500, (path[:80], response.status_code)


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


BODIES: dict[str, bytes | str] = {
    "array nested 100k": nested(DEEP),
    "object nested 100k": '{"a":' * DEEP + "1" + "}" * DEEP,
    "in nested 100k": '{"in": ' + nested(DEEP) + "}",
    "in 400 digits": '{"in": ' + "9" * 400 + "}",
    "in 5000 digits": '{"in": ' + "9" * 5000 + "}",
    "in 1e999": '{"in": 1e999}',
    "in -1e999": '{"in": -1e999}',
    "in NaN": '{"in": NaN}',
    "in Infinity": '{"in": Infinity}',
    "in 1e308": '{"in": 1e308}',
    "in string of 1 MB": '{"in": "' + "9" * 1_000_000 + '"}',
    "at 1960": '{"at": "1960-01-01T00:00:00Z"}',
    "at 9999": '{"at": "9999-12-31T23:59:59Z"}',
    "at max -05:00": '{"at": "9999-12-31T23:59:59.999999-05:00"}',
    "at min +05:00": '{"at": "0001-01-01T00:00:00+05:00"}',
    "at year 10000": '{"at": "10000-01-01T00:00:00Z"}',
    "at surrogate": '{"at": "\\ud800"}',
    "at nested": '{"at": ' + nested(500) + "}",
    "surrogate field": '{"\\ud800": 1}',
    "NUL field": '{"\\u0000": 1}',
    "many fields": json.dumps({f"f{i}": i for i in range(10_000)}),
    "attempts 400 digits": '{"attempts": ' + "9" * 400 + "}",
    "attempts 1e308": '{"attempts": 1e308}',
    "attempts -2**63": '{"attempts": -9223372036854775808}',
    "attempts 2**31": '{"attempts": 2147483648}',
    "attempts surrogate": '{"attempts": "\\udfff"}',
    "top-level string": '"\\ud800"',
    "top-level number": "1e999",
    "top-level null": "null",
    "not JSON": "{",
    "not UTF-8": b'{"in": "\xff\xfe"}',
    "UTF-16 BOM": b"\xff\xfe{\x00}\x00",
}


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue"])
@pytest.mark.parametrize("name", list(BODIES))
def test_hostile_bodies_get_400_and_change_nothing(api, verb, name):
    job = dead_job() if verb == "requeue" else schedule(tasks.record, in_=3600, args=["x"])
    before = snapshot(job)
    response = api.post(url("jobs", job.pk, verb), BODIES[name], content_type="application/json")
    assert response.status_code == 400, (verb, name, response.status_code, response.content[:200])
    response.json()  # a JSON body that says why, whatever was sent
    assert snapshot(job) == before


@pytest.mark.parametrize(
    "body",
    [
        {"in": "\udfff"},
        {"at": "\ud800" * 1000},
        {"\ud800": "1"},
        {"attempts": "9" * 5000},
        {"in": "1e999"},
        {"at": "0001-01-01T00:00:00+05:00"},
    ],
)
def test_hostile_form_bodies_get_400(api, body):
    job = dead_job()
    before = snapshot(job)
    form = urlencode(body, errors="surrogatepass")  # lone surrogates as their UTF-8 bytes
    for verb in ("cancel", "reschedule", "requeue"):
        response = api.post(
            url("jobs", job.pk, verb), form, content_type="application/x-www-form-urlencoded"
        )
        assert 400 <= response.status_code < 500, (verb, response.status_code)
    assert snapshot(job) == before


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL stores no such name")
@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue"])
def test_a_user_whose_name_the_actor_column_cannot_hold_gets_no_500(verb):
    """A username with a NUL (SQLite stores one; a custom user model may make one) made
    the actor "api:a\\x00b", which the service refused: a 500 (cancel), a 400 blaming
    "in" (reschedule), a 409 (requeue)."""
    from django.contrib.auth.models import User

    user = User.objects.create_user("a\x00b", password="pw", is_staff=True, is_superuser=True)
    job = dead_job() if verb == "requeue" else schedule(tasks.record, in_=3600, args=["x"])
    body = {"in": 60} if verb == "reschedule" else {}
    response = client_for(user).post(url("jobs", job.pk, verb), body, format="json")
    assert response.status_code == 200, response.content[:300]
    assert job.events.last().actor == "api:a\\x00b"


def test_hostile_queries_of_the_admin_job_list_get_no_500(admin_client, job):
    base = reverse("admin:django_delayjobs_job_changelist")
    for query in [
        {"q": "\x00"}, {"q": "a\x00b"}, {"q": "k" * 100_000}, {"q": str(job.pk) + "\x00"},
        {"status__exact": "\x00"}, {"queue": "\x00"}, {"queue__exact": "\x00"},
        {"action__exact": "\x00"}, {"run_at__year": "9" * 5000}, {"run_at__year": "\x00"},
        {"run_at__year": "2026", "run_at__month": "13"}, {"o": "\x00"}, {"p": "9" * 5000},
    ]:  # fmt: skip
        response = admin_client.get(base, query)
        assert response.status_code in (200, 302, 400), (query, response.status_code)
    change = reverse("admin:django_delayjobs_job_change", args=["\x00"])
    assert admin_client.get(change).status_code in (302, 404)


# -- callbacks/, callbacks/cancel/, callbacks/reschedule/ ---------------------------------

HOOK = "https://hooks.example.com/orders/42/expire"


CALLBACK_BODIES: dict[str, bytes | str] = {
    **BODIES,
    "json nested 100k": '{"url": "' + HOOK + '", "in": 60, "json": ' + nested(DEEP) + "}",
    "at 9999": json.dumps({"url": HOOK, "at": "9999-12-31T23:59:59Z"}),
    "at 1969": json.dumps({"url": HOOK, "at": "1969-12-31T23:59:59Z"}),
    "at max -05:00": json.dumps({"url": HOOK, "at": "9999-12-31T23:59:59.999999-05:00"}),
    "in 400 digits": '{"url": "' + HOOK + '", "in": ' + "9" * 400 + "}",
    "expires 400 digits": '{"url": "' + HOOK + '", "in": 60, "expires": ' + "9" * 400 + "}",
    "expires 1e308": json.dumps({"url": HOOK, "in": 60, "expires": 1e308}),
    "key NUL": json.dumps({"url": HOOK, "in": 60, "key": "k\x00"}),
    "key surrogate": '{"url": "' + HOOK + '", "in": 60, "key": "\\ud800"}',
    "url surrogate": '{"url": "https://hooks.example.com/\\ud800", "in": 60}',
    "url NUL": json.dumps({"url": HOOK + "\x00", "in": 60}),
    "data surrogate": '{"url": "' + HOOK + '", "in": 60, "data": "\\udfff"}',
    "header surrogate": '{"url": "' + HOOK + '", "in": 60, "headers": {"X-A": "\\ud800"}}',
    "header name nested": '{"url": "' + HOOK + '", "in": 60, "headers": ' + nested(500) + "}",
    "id nested": '{"id": ' + nested(DEEP) + "}",
    "lookup key NUL": json.dumps({"key": "\x00", "in": 5}),
}


@pytest.mark.parametrize("path", ["callbacks", "callbacks/cancel", "callbacks/reschedule"])
@pytest.mark.parametrize("name", list(CALLBACK_BODIES))
def test_hostile_callback_bodies_get_400_and_write_nothing(api, http, path, name):
    from django_delayjobs.models import Job

    existing = schedule(tasks.record, in_=3600, args=["x"], key="k")
    before = snapshot(existing)
    response = api.post(url(*path.split("/")), CALLBACK_BODIES[name],
                        content_type="application/json")  # fmt: skip
    assert response.status_code == 400, (path, name, response.status_code, response.content[:200])
    response.json()
    assert Job.objects.count() == 1 and snapshot(existing) == before
