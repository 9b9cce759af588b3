"""Audit of the metrics, round 3: the view behind a project's login wall, and the worker's
metrics port against hostile requests. Real servers only (the suite's Redis, the test
database, the port's own HTTP server)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.test_metrics import TOKEN, get, parser, user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def login_wall(settings):
    """A project that requires a login for every view (Django's LoginRequiredMiddleware)."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE,
                           "django.contrib.auth.middleware.LoginRequiredMiddleware"]  # fmt: skip
    settings.DELAYJOBS = {**settings.DELAYJOBS, "METRICS_TOKEN": TOKEN}


def test_a_project_that_requires_logins_still_answers_the_scrapers_token(login_wall):
    """Behind ``LoginRequiredMiddleware`` (Django 5.1+, which this app requires) the view
    was never reached without a session: Prometheus, with the right token, was sent a 302
    to the login page (and, following it, parsed the login form's HTML as metrics), and a
    caller without credentials got that redirect instead of the view's 401 and
    ``WWW-Authenticate: Bearer``. The view does its own access control (a token, or a
    staff user who may view jobs), so it opts out of the middleware's."""
    response = get(Client(), TOKEN)
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    families = {f.name for f in parser.text_string_to_metric_families(response.content.decode())}
    assert "delayjobs_jobs" in families
    anonymous = get(Client())
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    staff = Client()
    staff.force_login(user("boss", su=True))
    assert get(staff).status_code == 200
    clerk = Client()
    clerk.force_login(user("clerk", staff=False))
    assert get(clerk).status_code == 403
