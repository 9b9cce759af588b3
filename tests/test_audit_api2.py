"""Audit of the REST API, second round: what test_audit_api and the test_rest_* files did
not try. Poison callback rows through callbacks/, the callback throttle with its cache
down, the events endpoint (database down, its OpenAPI paging, parameters it does not
read), multipart bodies of too many files, cancel/reschedule losing to an attempt that
fails before they return, and callbacks/ errors reported by field."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_delayjobs import schedule
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

from . import test_rest_helpers
from .test_poison import POISON, plant
from .test_rest_helpers import client_for, make_user, url

http = test_rest_helpers.http  # a fixture: callbacks to hooks.example.com allowed

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.example.com/orders/42/expire"


@pytest.fixture
def api():
    client = client_for(make_user(superuser=True))
    client.raise_request_exception = False  # a 500 is a status to assert on, not a raise
    return client


# -- a callback whose row cannot be read the ordinary way (a poison row) ----------------------

CALLBACK_POISON = ["run_at 30 February", "run_at infinity", "args nested 1500 deep",
                   "kwargs 5000-digit int"]  # fmt: skip


@pytest.mark.parametrize("name", CALLBACK_POISON)
def test_the_callback_endpoints_find_and_change_a_poison_callback(api, http, name):
    """jobs/<id>/cancel/ cancels a poison row; callbacks/cancel/ and callbacks/reschedule/
    read the callback the ordinary way: by key it was "not found" (404: its ValueError was
    taken for a key no job can hold), by id a 500, and callbacks/ with its key a 400 that
    blamed the request ("day is out of range for month") or a 500."""
    if POISON[name][0] not in (None, connection.vendor):
        pytest.skip(f"{name!r} cannot be stored in {connection.vendor}")

    def poison_callback() -> str:
        Job.objects.filter(status__in=[Status.SCHEDULED]).update(status=Status.CANCELLED)
        created = api.post(url("callbacks"), {"url": HOOK, "in": 60, "key": "k"}, format="json")
        assert created.status_code == 201, created.content[:300]
        plant(Job.objects.get(pk=created.json()["id"]), name)
        return str(created.json()["id"])

    job_id = poison_callback()
    again = api.post(url("callbacks"), {"url": HOOK, "in": 60, "key": "k"}, format="json")
    assert (again.status_code, again.json()["id"]) == (200, job_id), again.content[:300]
    for path, lookup in [
        ("reschedule", {"key": "k"}), ("reschedule", {"id": job_id}),
        ("cancel", {"key": "k"}), ("cancel", {"id": job_id}),
    ]:  # fmt: skip
        if path == "cancel" and "id" in lookup:
            job_id = poison_callback()
            lookup = {"id": job_id}
        body = {**lookup, **({"in": 5} if path == "reschedule" else {})}
        response = api.post(url("callbacks", path), body, format="json")
        assert response.status_code == 200, (path, lookup, response.content[:300])
        assert response.json()["id"] == job_id
    assert Job.objects.filter(pk=job_id).values_list("status", flat=True).get() == "cancelled"


@pytest.mark.parametrize("name", ["run_at 30 February", "run_at infinity"])
def test_the_verbs_take_the_id_of_a_poison_row_and_schedule_returns_it_as_the_holder(name):
    """What the callback endpoints stood on: ``schedule(key=...)`` whose key a poison row
    held, and ``cancel(<its id>)``, raised the row's ValueError."""
    from django_delayjobs.services import cancel

    if POISON[name][0] not in (None, connection.vendor):
        pytest.skip(f"{name!r} cannot be stored in {connection.vendor}")
    held = schedule(tasks.record, in_=60, args=["x"], key="k")
    plant(held, name)
    assert schedule(tasks.record, in_=60, args=["y"], key="k").pk == held.pk
    assert cancel(str(held.pk)) is True


# -- the callback throttle's cache down ---------------------------------------------------------


def test_the_callback_throttle_with_its_cache_down_is_a_json_503(api, http, tmp_path):
    """``API_CALLBACK_THROTTLE_RATE`` counts in the project's cache, often django-redis on
    the Redis the jobs use: with that Redis down, every callbacks/ request was Django's
    HTML 500 page (the cache's ConnectionInterrupted went through DRF)."""
    pytest.importorskip("django_redis")
    http.DELAYJOBS = {**http.DELAYJOBS, "API_CALLBACK_THROTTLE_RATE": "100/minute"}
    http.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"unix://{tmp_path}/no-redis.sock",  # nothing listens: refused at once
        }
    }
    job = schedule(tasks.record, in_=3600, args=["x"])
    for path, body in [
        ("callbacks", {"url": HOOK, "in": 60}),
        ("callbacks/cancel", {"id": str(job.pk)}),
        ("callbacks/reschedule", {"id": str(job.pk), "in": 5}),
    ]:
        response = api.post(url(*path.split("/")), body, format="json")
        assert response.status_code == 503, (path, response.status_code, response.content[:200])
        assert "throttl" in response.json()["detail"], path
    assert Job.objects.count() == 1


# -- the events endpoint ----------------------------------------------------------------------


def test_the_events_endpoint_with_the_database_down_is_a_json_503(api, tmp_path):
    """test_audit_api's 503 battery predates ``jobs/<id>/events/``."""
    from tests.helpers import database_down

    job = schedule(tasks.record, in_=3600, args=["x"])
    with database_down(tmp_path):
        response = api.get(url("jobs", job.pk, "events"))
        assert response.status_code == 503, response.content[:200]
        assert "database" in response.json()["detail"]
    assert api.get(url("jobs", job.pk, "events")).status_code == 200


def test_the_schema_gives_the_bounds_of_the_events_page_size(api):
    """The events endpoint answers a page_size outside 1..500 with 400, and its OpenAPI
    parameter said any integer ("Number of results to return per page.")."""
    import json

    from django_delayjobs.rest.schema import spectacular_installed

    if not spectacular_installed():
        pytest.skip("drf-spectacular is not installed")
    doc = json.loads(api.get(url("schema"), {"format": "json"}).content)
    operation = doc["paths"]["/api/delayjobs/jobs/{id}/events/"]["get"]
    size = next(p for p in operation["parameters"] if p["name"] == "page_size")
    assert (size["schema"]["minimum"], size["schema"]["maximum"]) == (1, 500), size
    assert "100" in size["description"], size  # the default
    job = schedule(tasks.record, in_=60, args=["x"])
    for wrong in ("0", "501"):
        assert api.get(url("jobs", job.pk, "events"), {"page_size": wrong}).status_code == 400


# -- bodies Django refuses ----------------------------------------------------------------------


def test_a_multipart_body_with_too_many_files_is_a_json_400(api, http):
    """A ``multipart/form-data`` body of more than ``DATA_UPLOAD_MAX_NUMBER_FILES`` files
    (100) was Django's HTML "Bad Request" page (``TooManyFilesSent`` went through DRF),
    where too many form fields are a JSON 400 that names the limit."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    job = schedule(tasks.record, in_=3600, args=["x"])
    files = {f"f{i}": SimpleUploadedFile(f"f{i}.txt", b"x") for i in range(101)}
    for path in [url("jobs", job.pk, "cancel"), url("callbacks"), url("callbacks", "cancel")]:
        response = api.post(path, files, format="multipart")
        assert response.status_code == 400, (path, response.status_code)
        assert "DATA_UPLOAD_MAX_NUMBER_FILES" in response.json()["detail"], path
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED


# -- a verb that loses to a running attempt which then fails -------------------------------------


def after_nth_statement_on_jobs(n: int, fn: Any) -> Any:
    """An execute wrapper that calls ``fn`` once, right after the ``n``-th statement on the
    jobs table of this connection."""
    seen = [0]

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if '"django_delayjobs_job"' in sql:
            seen[0] += 1
            if seen[0] == n:
                fn()
        return result

    return wrapper


@pytest.mark.parametrize("verb", ["cancel", "reschedule"])
def test_a_verb_that_lost_to_an_attempt_that_failed_meanwhile_still_wins(api, verb):
    """The verb's conditional UPDATE found the job running; its attempt failed before the
    answer was written (the worker made it ``retrying``: waiting for its next attempt), and
    the answer was 409 "Too late: the job has started or finished" with status
    ``retrying``, a job the verb takes. The job ran again at its retry, though the caller
    had cancelled it in time for that attempt. The verb now tries again (as ``cancel_for``
    does): 200."""
    from django.db import connection

    from .test_rest_helpers import running

    job = running(schedule(tasks.record, in_=3600, args=["x"]))

    def attempt_fails() -> None:  # what the worker commits when the attempt raises
        Job.objects.filter(pk=job.pk).update(status=Status.RETRYING)

    body = {"in": 60} if verb == "reschedule" else {}
    # statement 1 reads the job (get_object), statement 2 is the verb's, which loses
    with connection.execute_wrapper(after_nth_statement_on_jobs(2, attempt_fails)):
        response = api.post(url("jobs", job.pk, verb), body, format="json")
    assert response.status_code == 200, response.content[:300]
    expected = Status.CANCELLED if verb == "cancel" else Status.RETRYING  # at its new time
    assert response.json()["status"] == expected
    assert Job.objects.get(pk=job.pk).status == expected
    last = response.json()["events"][-1]
    assert (last["kind"], last["actor"]) == ({"cancel": "cancelled"}.get(verb, "rescheduled"),
                                             "api:ada")  # fmt: skip


# -- callbacks/: errors by field ----------------------------------------------------------------


def test_callback_values_the_service_refuses_are_reported_by_field(api, http):
    """docs/callbacks.md: "bad values get 400 naming the field". A queue name Redis keys
    cannot carry, an ``in``/``at`` more than 100 years away and an ``expires`` not after
    the due time were refused by the service, and reported under ``non_field_errors`` (the
    delay as ``in_``, the Python parameter): a client could not tell which field to fix."""
    import json

    cases = [
        ({"queue": "q:x"}, "queue"),
        ({"in": 4e9}, "in"),
        ({"in": None, "at": "2300-01-01T00:00:00Z"}, "at"),
        ({"expires": 1e300}, "expires"),
        ({"expires": "2000-01-01T00:00:00Z"}, "expires"),
        ({"expires": 1e-9}, "expires"),
    ]
    for extra, field in cases:
        body = {k: v for k, v in {"url": HOOK, "in": 60, **extra}.items() if v is not None}
        response = api.post(url("callbacks"), json.dumps(body), content_type="application/json")
        assert response.status_code == 400, (extra, response.content[:300])
        assert list(response.json()) == [field], (extra, response.json())
        assert "in_" not in response.json()[field][0], response.json()
    assert not Job.objects.exists()


def test_the_events_endpoint_refuses_parameters_it_does_not_read(api):
    """jobs/ answers an unknown parameter or one given twice with 400, "so that a typo does
    not silently" answer another question; jobs/<id>/events/ ignored ``?pagesize=5`` (100
    events came back) and read ``?page_size=5&page_size=500`` as 500."""
    job = schedule(tasks.record, in_=3600, args=["x"])
    events = url("jobs", job.pk, "events")
    for query, field in [
        ("pagesize=5", "pagesize"), ("ordering=-id", "ordering"),
        ("page_size=5&page_size=500", "page_size"), ("cursor=cD0x&cursor=cD0y", "cursor"),
    ]:  # fmt: skip
        response = api.get(f"{events}?{query}")
        assert response.status_code == 400, (query, response.content[:200])
        assert list(response.json()) == [field], response.json()
    assert api.get(f"{events}?page_size=5&format=json").status_code == 200
