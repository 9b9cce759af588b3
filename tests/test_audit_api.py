"""Audit of the REST API as a hostile user would use it: what the earlier batteries
(test_rest_hostile, test_rest_jobs, test_rest_access) did not try."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from django_delayjobs import schedule
from django_delayjobs.rest.schema import spectacular_installed
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, snapshot, url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api():
    client = client_for(make_user(superuser=True))
    client.raise_request_exception = False  # a 500 is a status to assert on, not a raise
    return client


def cursor(*parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


JOB_ID = str(uuid.uuid4())
WHEN = "2030-01-01T00:00:00+00:00"


# One test per finding, its cases in a loop: a user (a password hash) and a flush per case
# would cost far more than the requests.
WRONG_TYPES = [
    ({}, JOB_ID, 0, "above"),  # the due time of an "above"/"below" cursor not a string
    (5, JOB_ID, 0, "below"),
    (None, JOB_ID, 0, "above"),
    (WHEN, 5, 0),  # the job id not a string
    (WHEN, None, 0),
    (WHEN, [JOB_ID], 0),
    (WHEN, JOB_ID, {}),  # "backwards" neither 0 nor 1
    (WHEN, JOB_ID, "yes"),
]


def test_a_cursor_of_the_wrong_json_types_is_400(api):
    """A cursor whose parts had the wrong JSON types reached ``.astimezone``/``UUID()``
    and raised AttributeError: a 500."""
    schedule(tasks.record, in_=3600, args=["x"])
    for parts in WRONG_TYPES:
        response = api.get(url("jobs"), {"cursor": cursor(*parts)})
        assert response.status_code == 400, (parts, response.status_code)
        assert list(response.json()) == ["cursor"], parts


def test_an_empty_filter_is_400_not_every_job(api):
    """``?key=`` (a script's empty variable) was dropped as if not given: the answer
    listed every job, which a caller then cancels one by one."""
    schedule(tasks.record, in_=3600, args=["x"], key="k")
    for name in ("queue", "action", "key", "target_id", "run_at_after", "ordering"):
        query = {name: "", **({"target_type": "testapp.thing"} if name == "target_id" else {})}
        response = api.get(url("jobs"), query)
        assert response.status_code == 400, (name, response.content[:200])
        assert list(response.json()) == [name]
        assert "empty" in response.json()[name][0]


REPEATED = [
    ("queue=nope", "queue=default", "queue"),
    ("key=nope", "key=k", "key"),
    ("run_at_after=2030-01-01T00:00:00Z", "run_at_after=2020-01-01T00:00:00Z", "run_at_after"),
    ("ordering=run_at", "ordering=-run_at", "ordering"),
    ("page_size=1", "page_size=2", "page_size"),
    ("cursor=" + cursor(WHEN, JOB_ID, 0), "cursor=" + cursor(WHEN, JOB_ID, 1), "cursor"),
]


def test_a_parameter_given_twice_is_400_not_its_last_value(api):
    """``?queue=a&queue=b`` matched queue b alone (QueryDict's last value), silently: a
    caller who meant either got an answer to another question."""
    schedule(tasks.record, in_=3600, args=["x"], key="k")
    for first, second, name in REPEATED:
        response = api.get(url("jobs") + f"?{first}&{second}")
        assert response.status_code == 400, (name, response.content[:200])
        assert list(response.json()) == [name]
    # status is the one parameter that may be repeated: each value is one more status
    both = api.get(url("jobs") + "?status=dead&status=scheduled")
    assert both.status_code == 200 and len(both.json()["results"]) == 1


def test_the_database_down_is_a_json_503_on_every_endpoint(api, tmp_path, settings):
    """With the database unreachable every endpoint answered Django's HTML 500 page (the
    session's user is read from the database before any view code), where ``queues/``
    answers Redis down with a JSON 503 and ``metrics/`` the database down with a 503."""
    from django.core.cache import cache

    from tests.helpers import database_down

    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_CALLBACK_THROTTLE_RATE": None}
    cache.clear()
    job = schedule(tasks.record, in_=3600, args=["x"])
    requests = [
        ("get", url("jobs"), None),
        ("get", url("jobs", job.pk), None),
        ("get", url("queues"), None),
        ("post", url("jobs", job.pk, "cancel"), {}),
        ("post", url("callbacks"), {"url": "https://hooks.example.com/x", "in": 60}),
        ("post", url("callbacks", "cancel"), {"id": str(job.pk)}),
    ]
    if spectacular_installed():
        requests.append(("get", url("schema") + "?format=json", None))
    with database_down(tmp_path):
        for method, path, body in requests:
            response = getattr(api, method)(path, body, format="json")
            assert response.status_code == 503, (path, response.status_code)
            assert "database" in response.json()["detail"], path
    assert api.get(url("jobs", job.pk)).status_code == 200  # and back once it answers


def test_expires_in_seconds_may_be_given_as_a_numeric_string_as_in_is(api, settings):
    """A form (curl -d, the browsable API) sends every value as text: ``in=60`` was read
    as seconds but ``expires=3600`` as a datetime, refused with "Datetime has wrong
    format", so a form could not give ``expires`` in seconds at all."""
    import datetime
    import ipaddress
    from urllib.parse import urlencode

    from django.core.cache import cache

    from django_delayjobs.callbacks import policy
    from django_delayjobs.callbacks.signing import new_secret
    from django_delayjobs.models import Job

    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "API_CALLBACK_THROTTLE_RATE": None,
    }
    cache.clear()
    body = {"url": "https://hooks.example.com/x", "in": "60", "expires": "3600"}
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        form = api.post(
            url("callbacks"), urlencode(body), content_type="application/x-www-form-urlencoded"
        )
        text = api.post(url("callbacks"), {**body, "expires": "1.5"}, format="json")
        refused = api.post(url("callbacks"), {**body, "expires": "-1"}, format="json")
    assert (form.status_code, text.status_code) == (201, 201), (form.content, text.content)
    for response, seconds in ((form, 3600), (text, 1.5)):
        job = Job.objects.get(pk=response.json()["id"])
        assert job.expires_at - job.run_at == datetime.timedelta(seconds=seconds)
    assert refused.status_code == 400 and list(refused.json()) == ["expires"]


def test_a_form_in_a_charset_whose_codec_raises_is_400(api):
    """``Content-Type: application/x-www-form-urlencoded; charset=punycode``: Django's
    QueryDict decodes with errors="replace", which the punycode codec ignores (before
    Python 3.13), and its UnicodeError went through DRF's form parser: a 500 on every POST
    endpoint."""
    try:
        b"in=5".decode("punycode", "replace")
    except UnicodeError:
        raises = True
    else:  # Python 3.13 on: the codec replaces, and the body is a form like any other
        raises = False
    job = schedule(tasks.record, in_=3600, args=["x"])
    before = snapshot(job)
    paths = [url("jobs", job.pk, verb) for verb in ("cancel", "reschedule", "requeue")]
    paths += [url("callbacks"), url("callbacks", "cancel"), url("callbacks", "reschedule")]
    form = "application/x-www-form-urlencoded; charset=punycode"
    for path in paths:
        response = api.post(path, b"in=5", content_type=form)
        assert response.status_code < 500, (path, response.status_code)
        if raises:
            assert response.status_code == 400, (path, response.status_code)
            assert "charset" in response.json()["detail"], path
    if raises:
        assert snapshot(job) == before
