"""Audit of the HTTP callbacks, round 3: what the admin and the API show of a stored
request, ...

Every delivery here goes to a real server on 127.0.0.1, run by a real (in-process,
``--burst``) worker."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_delayjobs import schedule_http
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job
from tests.callback_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def allow(settings, *netlocs: str, **more: object) -> None:
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": list(netlocs),
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,  # the servers are on 127.0.0.1
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "RETRY_BACKOFF_SECONDS": 60,
        **more,
    }


def burst() -> None:
    call_command("run_delayworker", "--burst", "-v", "0")


@pytest.fixture
def admin_client(django_user_model) -> Client:
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


# -- a credential in a stored URL is not shown ---------------------------------------------------


@pytest.mark.parametrize("named", [False, True], ids=["url", "destination"])
def test_a_token_in_a_callback_url_is_shown_masked_by_the_admin_and_the_api(
    named, callback_server, settings, redis_client, admin_client
):
    from tests.test_rest_helpers import client_for, make_user, url

    allow(settings, callback_server.netloc,
          HTTP_DESTINATIONS={"hooks": {"url": callback_server.url("/base")}})  # fmt: skip
    callback_server.script("/base/hook" if named else "/hook", Reply(503, b"busy"))
    query = "?token=s3cret&order=42"
    where = "hooks:/hook" if named else callback_server.url("/hook")
    job = schedule_http(where + query, in_=0, json={"a": 1})
    burst()
    assert callback_server.wait_for(1)[0].path.endswith(query)  # sent as given
    api = client_for(make_user(superuser=True))
    answers = [
        api.get(url("jobs", job.pk)).content.decode(),
        api.get(url("jobs")).content.decode(),
        api.post(
            url("callbacks"), {"url": where + query, "in": 60}, format="json"
        ).content.decode(),
        admin_client.get(
            reverse("admin:django_delayjobs_job_change", args=[job.pk])
        ).content.decode(),
    ]
    for shown in answers:
        assert "s3cret" not in shown
        assert "token=***&amp;order=42" in shown or "token=***&order=42" in shown
    assert Job.objects.get(pk=job.pk).kwargs == job.kwargs  # the row keeps what is sent
