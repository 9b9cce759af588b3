"""Audit of the operations endpoints in a project that requires a login for every view
(Django's ``LoginRequiredMiddleware``): ``health/`` needs none, and says so."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.test import Client

from django_delayjobs.callbacks.signing import new_secret, sign
from django_delayjobs.connection import get_engine
from tests.test_health import private_redis  # noqa: F401 (a fixture)
from tests.test_metrics import user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("method", ["get", "head"])
def test_the_health_view_answers_behind_a_login_wall(settings, method):
    """A load balancer (or a kubelet) asks without a session: it was sent a 302 to the
    login page, which a probe that takes 3xx as success reads as healthy whatever the
    checks say, and one that wants a 200 reads as down for good."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE,
                           "django.contrib.auth.middleware.LoginRequiredMiddleware"]  # fmt: skip
    response = getattr(Client(), method)("/delayjobs/health/", {"min_workers": "0"})
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    refused = getattr(Client(), method)("/delayjobs/health/", {"min_workers": "x"})
    assert refused.status_code == 400


def test_the_rest_api_answers_its_own_authentication_behind_a_login_wall(settings):
    """DRF authenticates inside its views (HTTP Basic here, a token in many projects),
    after the middleware ran: the API's views are exempt from it (DRF 3.16+, which this
    app requires a later one), and an anonymous caller gets the API's own refusal, not a
    redirect."""
    import base64

    settings.MIDDLEWARE = [*settings.MIDDLEWARE,
                           "django.contrib.auth.middleware.LoginRequiredMiddleware"]  # fmt: skip
    settings.REST_FRAMEWORK = {"DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.BasicAuthentication"]}  # fmt: skip
    user("boss", su=True)
    get_user_model().objects.filter(username="boss").update(password=make_password("secret"))
    basic = "Basic " + base64.b64encode(b"boss:secret").decode()
    response = Client().get("/api/delayjobs/jobs/", HTTP_AUTHORIZATION=basic)
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    assert Client().get("/api/delayjobs/jobs/").status_code in (401, 403)


@pytest.mark.parametrize("path", ["/hooks/receive/", "/hooks/receive-async/"])
def test_a_webhook_receiver_answers_a_signed_request_behind_a_login_wall(settings, path):
    """The signature is a webhook's authentication, as it is its CSRF protection: the
    sender has no session, and ``@verify_webhook``'s view was never reached (a 302 to the
    login page, which a sender takes as delivered, or as a failure to retry for ever)."""
    secret = new_secret()
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_SIGNING_SECRETS": [secret]}
    settings.MIDDLEWARE = [*settings.MIDDLEWARE,
                           "django.contrib.auth.middleware.LoginRequiredMiddleware"]  # fmt: skip
    body = b'{"order": 7}'
    headers = {f"HTTP_{name.upper().replace('-', '_')}": value
               for name, value in sign("msg-1", body, [secret]).items()}  # fmt: skip
    response = Client().post(path, body, content_type="application/json", **headers)
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    unsigned = Client().post(path, body, content_type="application/json")
    assert unsigned.status_code == 401


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_a_json_body_over_the_sites_limit_is_a_413_and_writes_nothing(settings, content_type):
    """DRF before 3.17.2 handed its JSON parser the request itself, whose ``read()``
    Django does not hold to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``request.body`` alone checks
    it): any size was read into memory (CVE-2026-73228). The app requires 3.18.2."""
    from django_delayjobs.models import Job
    from tests.test_audit_api2 import HOOK
    from tests.test_rest_helpers import client_for, make_user

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"]}
    api = client_for(make_user(superuser=True))
    body = json.dumps({"url": HOOK, "in": 60, "json": {"pad": "x" * 2_000}})
    response = api.post("/api/delayjobs/callbacks/", body, content_type=content_type)
    assert response.status_code == 413, response.content
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in response.json()["detail"]
    assert not Job.objects.exists()
    small = json.dumps({"url": HOOK, "in": 60, "json": {"pad": "x" * 500}})
    assert (
        api.post("/api/delayjobs/callbacks/", small, content_type=content_type).status_code == 201
    )


def test_a_probe_key_of_another_type_is_no_refusal(request):
    """Redis refuses a write (OOM, MISCONF, NOREPLICAS, READONLY) before it runs it: a
    ``WRONGTYPE`` from the write probe says Redis took the write, to a key another
    program made a list. The check read it as a refusal, for as long as the key stayed."""
    from tests.test_health import health, names

    client = request.getfixturevalue("private_redis")  # its own: the suite's is emptied
    key = f"{{{get_engine().prefix}}}:write-probe"
    client.rpush(key, "another program's")
    code, lines = health("--min-workers", "0")
    assert code == 0 and names(lines, "FAIL") == [], lines
    assert client.lrange(key, 0, -1) == [b"another program's"]  # left as it was
