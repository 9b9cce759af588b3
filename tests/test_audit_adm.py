"""Hostile input, least privilege and failure modes of the admin and the REST API."""

from __future__ import annotations

import ipaddress
import uuid

import pytest
from django.urls import reverse

from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job

from .helpers import confirm_purge
from .test_rest_helpers import client_for, dead_job, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = "admin:django_delayjobs_queues"
FORGET = "admin:django_delayjobs_queues_forget"


# -- settings that give no Redis client ------------------------------------------------------

NO_CLIENT = {
    "cache alias not django-redis": {"CACHE_ALIAS": "default"},
    "unusable redis url": {"REDIS_URL": "foo://localhost:6379/0"},
}


@pytest.fixture(params=list(NO_CLIENT), ids=list(NO_CLIENT))
def no_client(request, settings):
    """Settings that pass a web process by (it runs no system checks) yet give no client."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DELAYJOBS = {**settings.DELAYJOBS, **NO_CLIENT[request.param]}
    return request.param


def test_admin_queue_page_says_the_settings_give_no_redis_client(no_client, client):
    """It answered 500: the page caught EngineUnavailable, not ConfigurationError."""
    client.raise_request_exception = False
    client.force_login(make_user(superuser=True))
    response = client.get(reverse(QUEUES))
    assert response.status_code == 503
    text = response.content.decode()
    assert 'id="delayjobs-settings-error"' in text
    assert "CACHE_ALIAS" in text or "REDIS_URL" in text


def test_admin_forget_says_the_settings_give_no_redis_client(no_client, client):
    client.raise_request_exception = False
    client.force_login(make_user(superuser=True))
    response = client.post(
        reverse(FORGET), {"queue": "default", "one": str(uuid.uuid4())}, follow=True
    )
    assert response.status_code == 503  # the queue page it is sent back to
    messages = [str(m) for m in response.context["messages"]]
    assert any("settings" in m for m in messages), messages


def test_api_queues_answer_503_with_a_json_detail(no_client):
    api = client_for(make_user(superuser=True))
    api.raise_request_exception = False
    response = api.get(url("queues"))
    assert response.status_code == 503
    assert "settings" in response.json()["detail"]


# -- least privilege: destructive queue actions ----------------------------------------------

PURGE = "admin:django_delayjobs_queues_purge"


def garbage_count() -> int:
    return get_engine().stats("default").garbage


def orphan_id() -> str:
    """A dead job's id left in the garbage after its row was deleted by hand."""
    dead = dead_job()
    Job.objects.filter(pk=dead.pk).delete()
    return str(dead.pk)


def test_delete_job_alone_may_not_purge_or_forget(client):
    """A user who may not see jobs (no view_job or change_job) was shown the purge
    confirmation (ids, actions, errors of the jobs) and could purge and forget."""
    client.force_login(make_user("deleter", perms=("delete_job",)))
    dead, orphan = dead_job(), orphan_id()
    assert client.get(reverse(QUEUES)).status_code == 403
    assert client.post(reverse(PURGE), {"one": str(dead.pk)}).status_code == 403
    assert client.post(reverse(PURGE), {"job": str(dead.pk), "post": "yes"}).status_code == 403
    assert client.post(reverse(FORGET), {"queue": "default", "one": orphan}).status_code == 403
    assert Job.objects.filter(pk=dead.pk).exists()
    assert garbage_count() == 2


@pytest.mark.parametrize("seeing", ["view_job", "change_job"])
def test_delete_job_with_a_permission_to_see_jobs_may_purge_and_forget(client, seeing):
    client.force_login(make_user("purger", perms=(seeing, "delete_job")))
    dead, orphan = dead_job(), orphan_id()
    html = client.get(reverse(QUEUES)).content.decode()
    assert ">Purge</button>" in html and reverse(FORGET) in html
    response = confirm_purge(client, reverse(PURGE), {"job": str(dead.pk)})
    assert response.status_code == 302 and not Job.objects.filter(pk=dead.pk).exists()
    response = client.post(reverse(FORGET), {"queue": "default", "one": orphan})
    assert response.status_code == 302 and garbage_count() == 0


# -- callbacks/: queues a caller may name -----------------------------------------------------

HOOK = "https://hooks.example.com/orders/42/expire"


@pytest.fixture
def http(settings):
    from django.core.cache import cache

    from django_delayjobs.callbacks import policy
    from django_delayjobs.callbacks.signing import new_secret

    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    cache.clear()  # throttle history
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        yield settings


def test_api_callback_queues_keeps_callers_out_of_new_queues(http):
    """Each new name cost Redis keys and a directory entry for ever, and every queue page,
    queues/ answer and metrics scrape then read every one of them."""
    http.DELAYJOBS = {**http.DELAYJOBS, "API_CALLBACK_QUEUES": ["default"]}
    caller = client_for(make_user("service", perms=("add_job",)))
    for n in range(3):
        body = {"url": HOOK, "in": 60, "queue": f"made-up-{n}"}
        response = caller.post(url("callbacks"), body, format="json")
        assert response.status_code == 400, response.json()
        assert "API_CALLBACK_QUEUES" in response.json()["queue"][0]
    assert not Job.objects.exists()
    assert not [q for q in get_engine().known_queues() if q.startswith("made-up")]
    body = {"url": HOOK, "in": 60}  # the default queue
    assert caller.post(url("callbacks"), body, format="json").status_code == 201


def test_without_api_callback_queues_a_caller_may_name_any_queue(http):
    caller = client_for(make_user("service", perms=("add_job",)))
    response = caller.post(url("callbacks"), {"url": HOOK, "in": 60, "queue": "alarms"},
                           format="json")  # fmt: skip
    assert response.status_code == 201 and response.json()["queue"] == "alarms"


def test_api_callback_queues_lets_callers_name_the_listed_queues(http):
    http.DELAYJOBS = {**http.DELAYJOBS, "API_CALLBACK_QUEUES": ["hooks"]}
    caller = client_for(make_user("service", perms=("add_job",)))
    body = {"url": HOOK, "in": 60, "queue": "hooks"}
    response = caller.post(url("callbacks"), body, format="json")
    assert response.status_code == 201 and response.json()["queue"] == "hooks"
    body = {"url": HOOK, "in": 60}  # the default queue is not listed
    assert caller.post(url("callbacks"), body, format="json").status_code == 400


# -- OPTIONS describes the bodies the verbs take -----------------------------------------------


@pytest.mark.parametrize(
    ("verb", "fields"),
    [("cancel", set()), ("reschedule", {"in", "at"}), ("requeue", {"attempts"})],
)
def test_options_of_a_verb_describes_its_body_not_the_job(verb, fields):
    """It described POST with the job's twenty read-only fields (JobSerializer), none of
    which the verb takes, and left out the ones it does take."""
    from django_delayjobs import schedule
    from tests.testapp import tasks

    job = schedule(tasks.record, in_=60, args=["a"])
    response = client_for(make_user(superuser=True)).options(url("jobs", job.pk, verb))
    assert response.status_code == 200
    post = response.json()["actions"]["POST"]
    assert set(post) == fields
    assert not any(field.get("read_only") for field in post.values())


# -- bodies too big for Django ------------------------------------------------------------------


def test_a_body_of_100000_ids_is_a_json_413():
    """Django refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE: the API answered with
    Django's HTML "Bad Request (400)" page, which says nothing to a JSON client."""
    from django_delayjobs import schedule
    from tests.testapp import tasks

    job = schedule(tasks.record, in_=60, args=["a"])
    api = client_for(make_user(superuser=True))
    body = {"ids": [str(job.pk)] * 100_000}
    for path in (url("jobs", job.pk, "cancel"), url("callbacks")):
        response = api.post(path, body, format="json")
        assert response.status_code == 413
        assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in response.json()["detail"]
    assert Job.objects.get(pk=job.pk).status == "scheduled"


def test_a_form_with_too_many_fields_is_a_json_400():
    from django_delayjobs import schedule
    from tests.testapp import tasks

    job = schedule(tasks.record, in_=60, args=["a"])
    api = client_for(make_user(superuser=True))
    form = "&".join(f"f{n}=1" for n in range(2000))
    response = api.post(
        url("jobs", job.pk, "reschedule"), form, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["detail"]


def test_a_body_of_many_unknown_fields_is_answered_briefly():
    """Each unknown field was named in the 400: 100,000 of them in 1.3 MB of body gave a
    5.8 MB answer."""
    from django_delayjobs import schedule
    from tests.testapp import tasks

    job = schedule(tasks.record, in_=60, args=["a"])
    api = client_for(make_user(superuser=True))
    body = {f"x{n}": 1 for n in range(100_000)}
    response = api.post(url("jobs", job.pk, "cancel"), body, format="json")
    assert response.status_code == 400
    assert len(response.content) < 5_000
    assert "99,980 more unknown fields" in str(response.json())
