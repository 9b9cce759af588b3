"""Security audit: what a stored callback request and its receiver's answer may leave in a
job's history, result and error, which the admin and the API show to whoever may read jobs;
which callbacks a caller of the callbacks/ endpoints may change; what a compressed answer
costs; and what a row edited to name another method of its target runs (nothing).

Every delivery here goes to a real server on 127.0.0.1, run by a real (in-process,
``--burst``) worker."""

from __future__ import annotations

import gzip

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_delayjobs import schedule, schedule_http
from django_delayjobs.callbacks.request import InvalidCallback
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job, Status
from tests.callback_server import Reply
from tests.helpers import planted_callback
from tests.test_rest_helpers import client_for, make_user, url
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "s3cret-t0ken-value"


def allow(settings, server, **more: object) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the server is on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "RETRY_BACKOFF_SECONDS": 60,
        **more,
    }


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


def shown(job: Job) -> list[str]:
    """What the admin's page and the API's detail show of ``job`` to a superuser."""
    admin = Client()
    admin.force_login(make_user("root", superuser=True))
    api = client_for(make_user("reader", perms=("view_job",)))
    return [
        admin.get(reverse("admin:django_delayjobs_job_change", args=[job.pk])).content.decode(),
        api.get(url("jobs", job.pk)).content.decode(),
        api.get(url("jobs", job.pk, "events")).content.decode(),
    ]


# -- a refused destination path does not quote its token ----------------------------------------


@pytest.mark.parametrize("path", ["/a/../b", "/a#b", "/a\\b"])
def test_a_refused_destination_path_is_quoted_with_its_token_masked(
    path, callback_server, settings, redis_client
):
    """A URL's ``?token=`` is masked in every message; a destination's path refused for its
    form was quoted whole, at the door (an exception a caller logs) and, for a row written
    by anything else, in the dead job's error the admin and the API show."""
    allow(settings, callback_server, HTTP_DESTINATIONS={"hooks": {"url": callback_server.url()}})
    with pytest.raises(InvalidCallback) as refused:
        schedule_http(f"hooks:{path}?token={TOKEN}", in_=0)
    assert TOKEN not in str(refused.value) and "token=***" in str(refused.value)
    stored = {"method": "POST", "destination": "hooks", "path": f"{path}?token={TOKEN}"}
    job = planted_callback(stored)
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD and "token=***" in job.last_error
    assert all(TOKEN not in page for page in [job.last_error, *shown(job)])
    assert callback_server.count() == 0


# -- a receiver that echoes its request does not put our credentials in the job -----------------


@pytest.mark.parametrize("status", [200, 503, 404, 302])
def test_credentials_a_receiver_echoes_are_masked_in_the_jobs_result_and_history(
    status, callback_server, settings, redis_client
):
    """A destination's ``Authorization`` lives in the settings so that no job row holds it.
    A receiver that echoes the request it got (a debug endpoint, an error page quoting the
    headers) put it back in the job's result, history and error; so did a header a job may
    carry, shown masked (``X-Access-Token``). Each is masked there, whole or the credential
    after its scheme alone."""
    allow(settings, callback_server, HTTP_DESTINATIONS={"hooks": {
        "url": callback_server.url("/base"), "headers": {"Authorization": f"Bearer {TOKEN}"},
    }})  # fmt: skip
    echoed = f"Authorization: Bearer {TOKEN}; token {TOKEN}; x-access-token: k3y-of-the-job"
    callback_server.script("/base/echo", Reply(
        status, echoed.encode(), headers={"Location": f"/x?t={TOKEN}", "X-Echo": TOKEN}
    ))  # fmt: skip
    job = schedule_http("hooks:/echo", in_=0, headers={"X-Access-Token": "k3y-of-the-job"})
    burst()
    sent = callback_server.wait_for(1)[0].headers
    assert sent["authorization"] == f"Bearer {TOKEN}"  # sent as configured
    job.refresh_from_db()
    assert job.status != Status.SCHEDULED and job.events.count() >= 3
    kept = [str(job.result), job.last_error, *job.events.values_list("message", flat=True)]
    for text in kept + shown(job):
        assert TOKEN not in text and "k3y-of-the-job" not in text
    assert "***" in "".join(kept)


def test_a_credential_cut_by_the_kept_bytes_leaves_no_part_of_it(
    callback_server, settings, redis_client
):
    """Only ``HTTP_RESPONSE_KEEP_BYTES`` of the body are kept: an echo whose credential
    straddles that end kept all of it but its last characters, unmasked."""
    allow(settings, callback_server, HTTP_RESPONSE_KEEP_BYTES=4096, HTTP_DESTINATIONS={"hooks": {
        "url": callback_server.url("/base"), "headers": {"Authorization": f"Bearer {TOKEN}"},
    }})  # fmt: skip
    page = b"<html>" + b"x" * (4096 - 6 - 12) + f"Bearer {TOKEN} and more".encode()  # cut: s3cre
    callback_server.script("/base/echo", Reply(200, page))
    job = schedule_http("hooks:/echo", in_=0)
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED and job.result["truncated"]
    kept = [job.result["body"], *job.events.values_list("message", flat=True)]
    for text in kept + shown(job):
        assert TOKEN[:4] not in text
    assert job.result["body"].endswith("x***...")


# -- API_CALLBACK_QUEUES bounds what a caller finds, not only what it creates -------------------


@pytest.mark.parametrize("verb", ["cancel", "reschedule"])
def test_a_caller_kept_to_its_queues_cannot_change_a_callback_of_another_queue(
    verb, callback_server, settings, redis_client
):
    """With ``API_CALLBACK_QUEUES`` a service may name its queues only ("any other is a 400");
    ``callbacks/cancel/`` and ``reschedule/`` still found, and changed, the application's own
    callback of another queue by its key (a guessable name) or by its id."""
    allow(settings, callback_server, API_CALLBACK_QUEUES=["partner"])
    own = schedule_http(callback_server.url(), in_=3600, key="order-42", queue="internal")
    caller = client_for(make_user("service", perms=("add_job",)))
    extra = {"in": 60} if verb == "reschedule" else {}
    by_key = caller.post(url("callbacks", verb), {"key": "order-42", "queue": "internal", **extra},
                         format="json")  # fmt: skip
    assert by_key.status_code == 400 and "API_CALLBACK_QUEUES" in by_key.json()["queue"][0]
    by_id = caller.post(url("callbacks", verb), {"id": str(own.pk), **extra}, format="json")
    assert by_id.status_code == 404
    assert Job.objects.get(pk=own.pk).run_at == own.run_at
    assert Job.objects.get(pk=own.pk).status == Status.SCHEDULED
    body = {"url": callback_server.url(), "in": 3600, "key": "k", "queue": "partner"}
    mine = caller.post(url("callbacks"), body, format="json")
    assert mine.status_code == 201
    found = caller.post(url("callbacks", verb), {"id": mine.json()["id"], **extra}, format="json")
    assert found.status_code == 200


# -- a compressed answer is kept as it came, never inflated --------------------------------------


def test_a_compressed_answer_is_kept_as_sent_not_inflated(callback_server, settings,
                                                          redis_client):  # fmt: skip
    """A gzip bomb (50 MB of zeros in 50 KB) costs its kept bytes: the client asks for no
    encoding (``Accept-Encoding: identity``) and does not decode one it is sent anyway, or
    one a job asks for."""
    allow(settings, callback_server, HTTP_RESPONSE_KEEP_BYTES=4096)
    bomb = gzip.compress(b"\0" * (50 << 20))
    for headers in ({}, {"Accept-Encoding": "gzip"}):
        callback_server.script("/hook", Reply(200, bomb, headers={"Content-Encoding": "gzip"}))
        job = schedule_http(callback_server.url(), in_=0, headers=headers)
        burst()
        job.refresh_from_db()
        assert job.status == Status.SUCCEEDED and job.result["truncated"]
        assert job.result["body"].startswith("\x1f\ufffd\x08")  # gzip's magic, as sent
    sent = [request.headers.get("accept-encoding") for request in callback_server.requests]
    assert sent == ["identity", "gzip"]


# -- a row edited to name a method that is not @delayable runs nothing ------------------------


@pytest.mark.parametrize(
    "method", ["pay", "not_delayable", "delete", "save", "__init__", "__class__", "__reduce__"]
)
def test_a_row_naming_a_method_that_is_not_delayable_ends_dead_having_run_nothing(
    method, redis_client
):
    """The action is (model, pk, method name) from the row: only a method marked
    ``@delayable`` runs; any other attribute of the target (a plain method that changes
    the row, a model method, a dunder) leaves the job dead saying so."""
    thing = Thing.objects.create(name="t")
    job = schedule(thing.touch, in_=0)
    Job.objects.filter(pk=job.pk).update(action=f"testapp.Thing.{method}")
    burst()
    job.refresh_from_db()
    assert job.status == Status.DEAD
    assert f"Thing.{method} is not a @delayable method" in job.last_error
    assert Thing.objects.filter(pk=thing.pk, state="new", touched=0).exists()


# -- API_CALLBACK_DESTINATIONS: which destinations (and their credentials) callers may use ---------


def _destinations(settings, server, **more: object) -> None:
    base = server.url().rstrip("/")
    allow(settings, server, HTTP_DESTINATIONS={
        "payments": {"url": base + "/payments", "headers": {"Authorization": "Bearer " + TOKEN}},
        "partner": {"url": base + "/partner"},
    }, **more)  # fmt: skip


def test_a_caller_kept_to_its_destinations_cannot_send_with_another_ones_credentials(
    callback_server, settings, redis_client
):
    """Every ``callbacks/`` caller could name every ``HTTP_DESTINATIONS`` entry at any path,
    so a partner service could have the application's own credentials sent where it chose
    (and a 400 listed every destination's name). With ``API_CALLBACK_DESTINATIONS`` the
    others are refused as unknown ones are, naming only the listed ones."""
    _destinations(settings, callback_server, API_CALLBACK_DESTINATIONS=["partner"])
    caller = client_for(make_user("service", perms=("add_job",)))
    for name in ("payments", "nowhere"):
        response = caller.post(url("callbacks"), {"url": f"{name}:/refund", "in": 0},
                               format="json")  # fmt: skip
        assert response.status_code == 400, response.content
        [message] = response.json()["url"]
        assert "API_CALLBACK_DESTINATIONS" in message and "partner" in message, message
        assert name == "payments" or "payments" not in message, message  # no other's name
    assert not Job.objects.exists()
    for where in ("partner:/hook", callback_server.url()):  # a listed one, and a plain URL
        response = caller.post(url("callbacks"), {"url": where, "in": 0}, format="json")
        assert response.status_code == 201, response.content
    # schedule_http, the application's own, is not bound by the API's setting
    schedule_http("payments:/refund", in_=0)
    assert Job.objects.count() == 3


@pytest.mark.parametrize("value", ["partner", ["Partner"], ["a b"], [1], "", {"partner": 1}])
def test_api_callback_destinations_takes_a_list_of_destination_names(value, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_CALLBACK_DESTINATIONS": value}
    from django_delayjobs.checks import check_settings

    [error] = [e for e in check_settings(None) if "API_CALLBACK_DESTINATIONS" in e.msg]
    assert error.id == "django_delayjobs.E009", error


@pytest.mark.parametrize("value", [None, [], ["partner", "payments"]])
def test_api_callback_destinations_accepts_none_or_names(value, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_CALLBACK_DESTINATIONS": value}
    from django_delayjobs.checks import check_settings

    assert not [e for e in check_settings(None) if "API_CALLBACK_DESTINATIONS" in e.msg]


def test_no_destination_for_api_callers_leaves_plain_urls(callback_server, settings,
                                                          redis_client):  # fmt: skip
    _destinations(settings, callback_server, API_CALLBACK_DESTINATIONS=[])
    caller = client_for(make_user("service", perms=("add_job",)))
    refused = caller.post(url("callbacks"), {"url": "partner:/x", "in": 0}, format="json")
    assert refused.status_code == 400 and "none" in refused.json()["url"][0], refused.content
    plain = caller.post(url("callbacks"), {"url": callback_server.url(), "in": 0}, format="json")
    assert plain.status_code == 201, plain.content
