"""Audit of the REST API, fifth round: a body that gives a field twice (a JSON object with
a duplicate key, a form field sent twice) was read as its last value, where the query
string's filters answer the same ambiguity with a 400: a proxy or validator that reads
the first value approved one request and the API carried out another."""

from __future__ import annotations

import json

import pytest

from django_delayjobs import schedule
from django_delayjobs.models import Job
from tests.testapp import tasks

from . import test_audit_api2, test_rest_helpers
from .test_audit_api2 import HOOK
from .test_rest_helpers import dead_job, snapshot, url

http = test_rest_helpers.http  # a fixture: callbacks to hooks.example.com allowed

pytestmark = pytest.mark.django_db(transaction=True)

api = test_audit_api2.api  # a fixture: a superuser's client, a 500 a status


# -- a field given twice in a body is a 400, not its last value ---------------------------

TWICE = {
    "reschedule": ('{"in": 5, "in": 7200}', "in=5&in=7200"),
    "requeue": ('{"attempts": 1, "attempts": 9}', "attempts=1&attempts=9"),
    "cancel": ('{"x": 1, "x": 2}', "x=1&x=2"),
}


@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
@pytest.mark.parametrize("verb", list(TWICE))
def test_a_verb_given_a_field_twice_is_400_and_changes_nothing(api, verb, form):
    job = dead_job() if verb == "requeue" else schedule(tasks.record, in_=3600, args=["x"])
    before = snapshot(job)
    body = TWICE[verb][form]
    kind = "application/x-www-form-urlencoded" if form else "application/json"
    response = api.post(url("jobs", job.pk, verb), body, content_type=kind)
    assert response.status_code == 400, response.content[:300]
    assert "give it once" in json.dumps(response.json()), response.json()
    assert snapshot(job) == before


@pytest.mark.parametrize(
    "body",
    [
        '{"url": "HOOK", "in": 60, "key": "mine", "key": "theirs"}',
        '{"url": "https://evil.example.com/", "url": "HOOK", "in": 60}',
        # in the body to send, too: it would be sent as {"a": 2}, not as given
        '{"url": "HOOK", "in": 60, "json": {"a": 1, "a": 2}}',
    ],
    ids=["key", "url", "nested in json"],
)
def test_a_callback_given_a_field_twice_is_400_and_writes_nothing(api, http, body):
    body = body.replace("HOOK", HOOK)
    response = api.post(url("callbacks"), body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert "give it once" in json.dumps(response.json()), response.json()
    assert not Job.objects.exists()


def test_a_callback_lookup_given_its_key_twice_is_400(api, http):
    created = api.post(url("callbacks"), {"url": HOOK, "in": 600, "key": "a"}, format="json")
    assert created.status_code == 201, created.content[:300]
    response = api.post(
        url("callbacks", "cancel"), '{"key": "b", "key": "a"}', content_type="application/json"
    )
    assert response.status_code == 400, response.content[:300]
    assert Job.objects.get().status == "scheduled"


def test_the_same_names_in_different_objects_are_not_duplicates(api, http):
    body = '{"url": "HOOK", "in": 60, "json": {"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]}}'
    body = body.replace("HOOK", HOOK)
    response = api.post(url("callbacks"), body, content_type="application/json")
    assert response.status_code == 201, response.content[:300]


def test_a_json_body_in_a_bytes_codec_is_still_refused(api):
    """The parser that refuses repeated keys reads the body itself: a charset such as
    bz2_codec (which would decompress it past the size limit) stays a 400."""
    import bz2

    job = schedule(tasks.record, in_=3600, args=["x"])
    before = snapshot(job)
    response = api.post(
        url("jobs", job.pk, "reschedule"), bz2.compress(b'{"in": 5}'),
        content_type="application/json; charset=bz2_codec",
    )  # fmt: skip
    assert response.status_code == 400, response.content[:300]
    assert "charset" in response.json()["detail"]
    assert snapshot(job) == before


def test_a_callbacks_json_given_in_a_form_with_a_key_twice_is_400(api, http):
    """A form gives ``json`` as text, which the field parses itself."""
    form = {"url": HOOK, "in": "60", "json": '{"a": 1, "a": 2}'}
    response = api.post(url("callbacks"), form, format="multipart")
    assert response.status_code == 400, response.content[:300]
    assert "once" in json.dumps(response.json()["json"])
    assert not Job.objects.exists()
    form["json"] = '{"a": 1, "b": {"a": 2}}'
    response = api.post(url("callbacks"), form, format="multipart")
    assert response.status_code == 201, response.content[:300]


# -- a write refuses query parameters, as the reads do ----------------------------------


@pytest.mark.parametrize(
    ("verb", "query", "body"),
    [
        ("cancel", "?dry_run=1", {}),
        ("reschedule", "?notify=0", {"in": 600}),
        ("requeue", "?attempts=1", {}),  # was requeued with MAX_ATTEMPTS more, not 1
    ],
)
def test_a_verb_given_a_query_parameter_it_does_not_read_is_400(api, verb, query, body):
    job = dead_job() if verb == "requeue" else schedule(tasks.record, in_=3600, args=["x"])
    before = snapshot(job)
    response = api.post(url("jobs", job.pk, verb) + query, body, format="json")
    assert response.status_code == 400, response.content[:300]
    assert snapshot(job) == before


@pytest.mark.parametrize("path", ["callbacks", "callbacks/cancel", "callbacks/reschedule"])
def test_the_callback_endpoints_refuse_query_parameters_they_do_not_read(api, http, path):
    created = api.post(url("callbacks"), {"url": HOOK, "in": 600, "key": "a"}, format="json")
    assert created.status_code == 201, created.content[:300]
    before = snapshot(Job.objects.get())
    body = {"url": HOOK, "in": 60} if path == "callbacks" else {"key": "a", "in": 5}
    if path == "callbacks/cancel":
        del body["in"]
    response = api.post(f"/api/delayjobs/{path}/?queue=mail", body, format="json")
    assert response.status_code == 400, response.content[:300]
    assert Job.objects.count() == 1 and snapshot(Job.objects.get()) == before


def test_a_verb_still_takes_the_format_parameter(api):
    job = schedule(tasks.record, in_=3600, args=["x"])
    response = api.post(url("jobs", job.pk, "cancel") + "?format=json", {}, format="json")
    assert response.status_code == 200, response.content[:300]
