"""Audit of the operations endpoints in a project that requires a login for every view
(Django's ``LoginRequiredMiddleware``): ``health/`` needs none, and says so."""

from __future__ import annotations

import pytest
from django.test import Client

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
