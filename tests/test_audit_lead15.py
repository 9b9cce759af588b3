"""Audit of the operations endpoints in a project that requires a login for every view
(Django's ``LoginRequiredMiddleware``): ``health/`` needs none, and says so."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.test import Client

from django_delayjobs.callbacks.signing import new_secret, sign
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
    app requires), and an anonymous caller gets the API's own refusal, not a redirect."""
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
